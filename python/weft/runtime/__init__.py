"""weft.runtime: run a plan on PyTorch's distributed engine, one process per device.

    >>> result = weft.run(plan, step, cluster=cluster, steps=3)          # 4 local gloo processes
    >>> result.max_relative_error(weft.execute_reference(step)) < 1e-5

The plan is lowered to a :class:`weft.Program` (one instruction list per rank); each process runs its
rank's list with torch kernels (one per IR op kind), torch.distributed collectives and transfers
(gloo on CPU, NCCL on GPUs), leaves initialised from the same counter-based values as the CPU
reference executor. ``python -m weft.run`` is the same under ``torchrun`` (across nodes).
torch is imported only when a run starts: ``import weft`` and planning work without it.
"""
from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from .. import _weft

__all__ = ["run", "load_program", "model_step", "save_result", "describe"]


def _program_of(plan_or_program, step, cluster):
    from ..execution import lower

    if isinstance(plan_or_program, _weft.Program):
        return plan_or_program
    if isinstance(plan_or_program, _weft.Plan):
        if step is None or cluster is None:
            raise ValueError("run: a Plan is lowered first, which needs step= (the training graph) and cluster=")
        return lower(plan_or_program, step, cluster)
    raise TypeError(f"run: expected a weft.Plan or weft.Program, got {type(plan_or_program).__name__}")


def run(plan, step=None, cluster=None, *, nproc: Optional[int] = None, steps: int = 3, backend: str = "gloo",
        seed: int = 0, dtype: Optional[str] = "f32", inputs: Optional[Mapping[str, np.ndarray]] = None,
        timeout_s: float = 60.0, init: Optional[str] = None):
    """Runs ``steps`` training steps of a plan on ``nproc`` local processes (one per rank of the
    lowered program) on torch.distributed, and returns the same :class:`weft.ExecutionResult` as
    :func:`weft.execute`: losses, global parameters and gradients (gathered on rank 0), per-rank
    bytes sent, peak live bytes and wall time per step.

    ``plan``: a :class:`weft.Plan` (lowered with ``step`` and ``cluster``) or a :class:`weft.Program`.
    ``backend``: "gloo" (CPU) or "nccl" (one GPU per process). ``dtype``: storage dtype of every float
    tensor ("f64", "f32", "bf16", "f16"), or None for the graph's own dtypes. ``inputs``: name -> global
    array of Input leaves, used at every step (Inputs not given are synthetic data from ``seed``, as in
    :func:`weft.execute`). Parameters, buffers and constants start from the values the graph carries
    (an imported module's own; :func:`weft.load_values`); ``init="seed"`` draws parameters without a
    value from ``seed``. A leaf that needs a value and has none, or an ``inputs`` name that is not an
    Input, is a ValueError before any process starts. A failing rank stops the others (RuntimeError
    naming the rank and the instruction); every wait is bounded by ``timeout_s``."""
    from .._checks import integer
    from .launch import run as _run

    seed = integer("run: seed", seed, 0)

    return _run(_program_of(plan, step, cluster), steps=steps, backend=backend, seed=seed, dtype=dtype,
                inputs=inputs, timeout_s=timeout_s, nproc=nproc, init=init)


def model_step(model: str, plan_text: Optional[str] = None):
    """The training graph ``model`` names for a plan: a graph JSON file as saved (its own batch and
    dtypes), or a zoo preset built at the plan's global batch, in f16 when the plan lays out master
    copies (mixed precision, as ``weft plan``'s default) and f32 otherwise; batch 1 without a plan."""
    from .._args import graph_arg
    from ..planning import _training_graph

    batch, dtype = 1, "f32"
    if plan_text is not None:
        batch = int(_weft.Plan.from_json(plan_text).global_batch)
        dtype = "f16" if '"master:' in plan_text else "f32"
    return _training_graph(graph_arg(model, batch, dtype))


def load_program(path: str, model: Optional[str] = None, cluster: Optional[str] = None):
    """A program from a file: a lowered program's JSON (``Program.to_json``), or a plan's JSON
    (``Plan.to_json``) lowered with the training graph ``model`` (a graph JSON file, or a zoo preset
    name: :func:`model_step`) and ``cluster`` (a cluster JSON file, or a preset spec as the CLI's --cluster)."""
    import json
    import os

    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file" if not os.path.exists(path) else f"{path}: not a file")
    text = open(path).read()
    try:
        head = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if isinstance(head, dict) and str(head.get("format", "")).startswith("weft.program"):
        return _weft.Program.from_json(text, base_dir=os.path.dirname(os.path.abspath(path)))
    if model is None or cluster is None:
        raise ValueError(f"{path} is a plan: give --model (the graph JSON or a zoo preset) and --cluster "
                         "(a cluster JSON or a preset spec) to lower it")
    from .._args import cluster_arg

    plan = _weft.Plan.from_json(text)
    return _program_of(plan, model_step(model, text), cluster_arg(cluster, 1))


def save_result(result, path: str) -> None:
    import numpy as np

    arrays = {"losses": np.asarray(result.losses)}
    arrays.update({f"param/{k}": v for k, v in result.parameters.items()})
    arrays.update({f"grad/{k}": v for k, v in result.gradients.items()})
    if result.step_seconds:
        arrays["step_seconds"] = np.asarray(result.step_seconds)
    from .._files import write_atomically

    # exactly `path` (np.savez would add ".npz" to a name without it), replaced atomically
    write_atomically(path, lambda f: np.savez(f, **arrays), binary=True)


def describe(result) -> str:
    """The losses, and each rank's step times with a readable unit (ms, s, ...)."""
    from ..display import _seconds

    lines = ["losses " + " ".join(f"{x:.6f}" for x in result.losses)]
    for r, s in enumerate(result.step_seconds):
        lines.append(f"rank {r}: " + ", ".join(_seconds(t) for t in s) + " per step")
    return "\n".join(lines)
