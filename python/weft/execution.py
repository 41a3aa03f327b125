"""Lowering and execution: a plan -> per-rank programs -> real values on the CPU executor.

    >>> step = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=4).train_step()
    >>> c = weft.Cluster.preset("p3.8xlarge")
    >>> mesh = weft.DeviceMesh([2, 2], range(4))
    >>> prog = weft.lower_spmd(step, c, mesh, weft.spmd_search(step, c, mesh))
    >>> got, ref = weft.execute(prog), weft.execute_reference(step)
    >>> got.max_relative_error(ref) < 1e-10
    True

Every rank of a :class:`weft.Program` is a thread of this process holding its tiles; collectives move
real values between them. :func:`execute_reference` runs the same steps on one device with the same
kernels, so the two results agree to rounding. Data and initial values are a pure function of the
seed (and of ``inputs`` for Input leaves given explicitly).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional

import numpy as np

from . import _weft
from ._weft import Program
from . import values as _values
from ._checks import integer, of_type
from .planning import _training_graph

__all__ = ["ExecutionResult", "Program", "lower", "lower_adaptive", "lower_spmd", "lower_random", "execute", "execute_reference"]

_DTYPES = ("f64", "f32")


@dataclass
class ExecutionResult:
    """What :func:`execute` / :func:`execute_reference` return.

    ``losses``: one per step. ``parameters`` / ``gradients``: name -> global float64 array (after
    the last step / of the last step). Per rank (empty for the reference): ``bytes_sent`` and
    ``bytes_received`` (collective kind -> bytes, resharding edges; "send": cross-stage transfers), ``internal_bytes_sent``
    (collectives inside an op, e.g. vocab-parallel statistics), ``collective_calls`` (weft.run: collective
    kind -> launches over the run; a gradient bucket is one), ``peak_bytes`` (largest live
    buffer bytes in f64 storage; weft.run: in the run's dtype), ``rank_seconds``, ``step_seconds`` (weft.run:
    per rank, the wall time of each step). ``seconds``: wall time of the run.
    """

    losses: List[float]
    parameters: Dict[str, np.ndarray]
    gradients: Dict[str, np.ndarray]
    bytes_sent: List[Dict[str, int]] = field(default_factory=list)
    bytes_received: List[Dict[str, int]] = field(default_factory=list)
    internal_bytes_sent: List[int] = field(default_factory=list)
    collective_calls: List[Dict[str, int]] = field(default_factory=list)
    peak_bytes: List[int] = field(default_factory=list)
    seconds: float = 0.0
    rank_seconds: List[float] = field(default_factory=list)
    step_seconds: List[List[float]] = field(default_factory=list)  # per rank, per step (weft.run)

    @property
    def total_bytes_sent(self) -> int:
        """Bytes sent by all ranks on resharding edges (internal collectives excluded)."""
        return sum(sum(d.values()) for d in self.bytes_sent)

    def max_relative_error(self, other: "ExecutionResult", atol: float = 0.0) -> float:
        """Largest relative difference to ``other`` over the losses and every parameter and gradient
        (per tensor: max |a - b| / max(max |b|, atol)). ``atol``: a floor under the scale, so that an
        analytically-zero gradient (rounding noise on both sides) does not read as 100 % error. inf
        when either side has a NaN or an infinity the other does not share. Raises ValueError when
        the names or shapes differ. :meth:`worst` says which tensor it is."""
        return self.worst(other, atol)[1]

    def worst(self, other: "ExecutionResult", atol: float = 0.0):
        """``(what, error)`` of :meth:`max_relative_error`: the tensor ("loss[2]", "parameters['w']",
        "gradients['b']") with the largest relative difference, and that difference."""
        if len(self.losses) != len(other.losses):
            raise ValueError(f"{len(self.losses)} losses vs {len(other.losses)}")
        if not atol >= 0:
            raise ValueError(f"atol must be >= 0, got {atol}")

        def rel(a, b) -> float:
            a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
            if a.size == 0:
                return 0.0
            fa, fb = np.isfinite(a), np.isfinite(b)
            if not (fa.all() and fb.all()):
                same = (np.isnan(a) & np.isnan(b)) | (a == b)
                if np.isnan(a).any() or np.isnan(b).any() or not np.all(same | (fa & fb)):
                    return float("inf")
            ok = fa & fb
            if not ok.any():
                return 0.0
            scale = max(float(np.max(np.abs(b[ok]))), float(atol))
            diff = float(np.max(np.abs(a[ok] - b[ok])))
            return diff / scale if scale > 0 else diff

        worst = ("", 0.0)
        for i, (a, b) in enumerate(zip(self.losses, other.losses)):
            e = rel(a, b)
            if e > worst[1]:
                worst = (f"loss[{i}]", e)
        for kind in ("parameters", "gradients"):
            mine, theirs = getattr(self, kind), getattr(other, kind)
            if set(mine) != set(theirs):
                raise ValueError(f"{kind} differ in names: {sorted(set(mine) ^ set(theirs))}")
            for name, a in mine.items():
                b = theirs[name]
                if a.shape != b.shape:
                    raise ValueError(f"{kind}['{name}']: shape {a.shape} vs {b.shape}")
                e = rel(a, b)
                if e > worst[1]:
                    worst = (f"{kind}['{name}']", e)
        return worst

    def __repr__(self) -> str:
        from .display import _bytes, _seconds

        losses = ", ".join(f"{x:.6g}" for x in self.losses)
        ranks = f", {len(self.peak_bytes)} ranks, {_bytes(self.total_bytes_sent)} sent" if self.peak_bytes else ""
        return f"ExecutionResult(losses=[{losses}], {len(self.parameters)} parameters{ranks}, {_seconds(self.seconds)})"


def _result(d) -> ExecutionResult:
    return ExecutionResult(losses=[float(x) for x in d["losses"]], parameters=dict(d["parameters"]),
                           gradients=dict(d["gradients"]),
                           bytes_sent=[{str(k): int(v) for k, v in r.items()} for r in d["bytes_sent"]],
                           bytes_received=[{str(k): int(v) for k, v in r.items()} for r in d["bytes_received"]],
                           internal_bytes_sent=[int(x) for x in d["internal_bytes_sent"]],
                           peak_bytes=[int(x) for x in d["peak_bytes"]], seconds=float(d["seconds"]),
                           rank_seconds=[float(x) for x in d["rank_seconds"]])


def _dtype(dtype) -> str:
    key = str(dtype).strip().lower()
    key = {"float64": "f64", "float32": "f32", "double": "f64", "float": "f32"}.get(key, key)
    if key not in _DTYPES:
        raise ValueError(f"execute: dtype must be 'f64' or 'f32', got {dtype!r}")
    return key


def _inputs(inputs: Optional[Mapping[str, np.ndarray]]) -> dict:
    if inputs is None:
        return {}
    if not isinstance(inputs, Mapping):
        raise ValueError("execute: inputs must be a dict name -> numpy array")
    return {str(k): np.ascontiguousarray(_values._array(str(k), v), dtype=np.float64) for k, v in inputs.items()}


def lower(plan, step, cluster) -> Program:
    """Lowers a plan of :func:`weft.plan` (or :func:`weft.megatron_plan`, :func:`weft.layout_plan`,
    :func:`weft.data_parallel_plan`) to a :class:`weft.Program`: one instruction list per device, its
    stage's ops in the plan's schedule order (GPipe, 1F1B, kFkB, eager-1F1B, ZB-H1), micro-batches,
    data-parallel replicas, and the cross-stage send / recv transfers. ``step``: the graph the plan
    was made for (a forward graph is turned into its Adam training step, as :func:`weft.plan` does);
    ``cluster``: the plan's cluster. Not lowered yet (ValueError): the interleaved schedule, uneven
    replica shares, the uneven tensor split."""
    if not isinstance(plan, _weft.Plan):
        raise ValueError(f"lower: expected a weft.Plan, got {type(plan).__name__}")
    of_type("lower: step", step, _weft.Graph, "a weft.Graph (the training step the plan was made for)")
    of_type("lower: cluster", cluster, _weft.Cluster, "a weft.Cluster")
    return _weft._lower(plan, _training_graph(step), cluster)


def lower_adaptive(plan, step, cluster, policy=None) -> list:
    """Ada-Grouper at run time: lowers a plan with an adaptive policy (``weft.plan(...,
    schedule="adaptive")`` or ``bandwidth_trace=``; :attr:`Plan.adaptive`) to one :class:`weft.Program`
    per kFkB group size of its frontier. Returns a list of dicts ``{"k", "microbatch_size",
    "num_microbatches", "windows", "program"}`` in frontier order; ``windows`` are the indices of the
    policy's windows that run that program (empty for a point this trace never picks). Every program holds the parameters and optimizer states in
    the same layouts, so a runtime switches program between steps at a window boundary. ValueError
    when the plan has no policy. ``policy``: a :class:`weft.AdaptivePolicy` of this plan computed apart
    (:func:`weft.adaptive_policy`) instead of :attr:`Plan.adaptive`."""
    if not isinstance(plan, _weft.Plan):
        raise ValueError(f"lower_adaptive: expected a weft.Plan, got {type(plan).__name__}")
    if policy is not None and not isinstance(policy, _weft.AdaptivePolicy):
        raise TypeError(f"lower_adaptive: policy must be a weft.AdaptivePolicy, got {type(policy).__name__}")
    return _weft._lower_adaptive(plan, _training_graph(step), cluster, policy)


def lower_spmd(step, cluster, mesh, spmd_plan) -> Program:
    """Lowers the layout an SPMD search chose (the return value of :func:`weft.spmd_search`, or its
    ``.plan``) for ``step`` on ``mesh`` of ``cluster`` to a :class:`weft.Program` (rank = position
    in the mesh, row-major)."""
    raw = getattr(spmd_plan, "plan", spmd_plan)
    if not isinstance(raw, _weft.spmd.SpmdPlan):
        raise ValueError(f"lower_spmd: expected a weft.spmd_search result, got {type(spmd_plan).__name__}")
    return _weft._lower_spmd(step, cluster, mesh, raw)


def lower_random(step, cluster, mesh, seed: int = 0) -> Program:
    """A :class:`weft.Program` of ``step`` on ``mesh`` under a random valid layout: every op a random
    strategy of its index map, every leaf a random spec (a pure function of ``seed``). No search
    would choose such layouts; they move data with every collective kind, which makes them the
    stress test of an executor (:func:`execute`, :func:`weft.run`)."""
    if not isinstance(mesh, _weft.DeviceMesh):
        raise TypeError(f"lower_random: mesh must be a weft.DeviceMesh, got {type(mesh).__name__}")
    if int(seed) < 0:
        raise ValueError(f"lower_random: seed must be >= 0, got {seed}")
    return _weft._lower_random(_training_graph(step), cluster, mesh, int(seed))


def execute(program_or_plan, step=None, cluster=None, steps: int = 3, seed: int = 0, dtype: str = "f64",
            inputs: Optional[Mapping[str, np.ndarray]] = None, timeout_s: float = 30.0,
            init: Optional[str] = None) -> ExecutionResult:
    """Runs ``steps`` training steps of a :class:`weft.Program` (or of a :class:`weft.Plan`, lowered
    first: ``step`` and ``cluster`` are required then) on the CPU executor, one thread per rank.

    ``dtype``: "f64" or "f32" (storage precision). ``inputs``: name -> global numpy array of Input
    leaves, used at every step (Inputs not given are synthetic data drawn from ``seed``; a name that is
    not an Input is a ValueError listing the Inputs). Parameters, buffers and constants take the
    values the graph carries (:func:`weft.load_values`); ``init="seed"`` draws parameters without
    one from ``seed`` (graphs built in code do so anyway). A leaf that needs a value and has none
    is a ValueError naming it. A rank blocked at a collective longer than ``timeout_s`` fails
    (ValueError naming the rank and the instruction), never a hang."""
    dt = _dtype(dtype)
    seed_all = _values.check_init(init)
    feeds = _inputs(inputs)
    if isinstance(program_or_plan, _weft.Plan):
        if step is None or cluster is None:
            raise ValueError("execute: a Plan is lowered first, which needs step= (the training graph) and "
                             "cluster=")
        program = lower(program_or_plan, step, cluster)
    elif isinstance(program_or_plan, Program):
        program = program_or_plan
    else:
        raise ValueError(f"execute: expected a weft.Program or weft.Plan, got {type(program_or_plan).__name__}")
    steps, seed = integer("execute: steps", steps, 1), integer("execute: seed", seed, 0)
    return _result(_weft._execute_program(program, steps=int(steps), seed=int(seed), dtype=dt, inputs=feeds,
                                          timeout_s=float(timeout_s), seed_all_parameters=seed_all))


def execute_reference(step, steps: int = 3, seed: int = 0, dtype: str = "f64",
                      inputs: Optional[Mapping[str, np.ndarray]] = None, init: Optional[str] = None) -> ExecutionResult:
    """Runs ``steps`` training steps of ``step`` on one device with the executor's kernels: the
    values :func:`execute` must reproduce (per-rank lists empty). A forward graph is turned into its
    Adam training step first. ``inputs`` and ``init`` as in :func:`execute`."""
    dt = _dtype(dtype)
    seed_all = _values.check_init(init)
    steps, seed = integer("execute_reference: steps", steps, 1), integer("execute_reference: seed", seed, 0)
    return _result(_weft._execute_reference(_training_graph(step), steps=int(steps), seed=int(seed), dtype=dt,
                                            inputs=_inputs(inputs), seed_all_parameters=seed_all))
