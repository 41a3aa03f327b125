"""The planner from Python: ``weft.plan(model_graph, cluster, ...)`` -> :class:`weft.Plan`.

The graph is one training step of the GLOBAL batch (its inputs' leading dimension); the planner
splits it into micro-batches and data-parallel replicas itself. A forward graph (no optimizer
update) is turned into its training step with Adam first. See docs/modules/plan.md.
"""
from __future__ import annotations

import json
import logging
import os
import time
from typing import Optional, Union

from . import _weft
from ._weft import Plan
from .log import logger, verbosity

_SCHEDULES = {
    "1f1b": "1f1b",
    "gpipe": "gpipe",
    "kfkb": "kfkb",
    "eager": "eager_1f1b",
    "eager_1f1b": "eager_1f1b",
    "eager-1f1b": "eager_1f1b",
    "interleaved": "interleaved",
    "zb_h1": "zb_h1",
    "zb-h1": "zb_h1",
    "zbh1": "zb_h1",
    "zb_interleaved": "zb_interleaved",
    "zb-interleaved": "zb_interleaved",
    "interleavedzerobubble": "zb_interleaved",
    "zbv": "zbv",
    "zb-v": "zbv",
    "zb_v": "zbv",
    "zbvzerobubble": "zbv",
    "dualpipev": "dualpipev",
    "dualpipe-v": "dualpipev",
    "dualpipe_v": "dualpipev",
    "kfkb_interleaved": "kfkb_interleaved",
    "kfkb-interleaved": "kfkb_interleaved",
    "adaptive": "adaptive",  # weft.plan only: Ada-Grouper's k per window of bandwidth_trace
}


def _schedule_name(name: str) -> str:
    key = name.strip().lower()
    if key not in _SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; one of 1F1B, GPipe, kFkB, eager-1F1B, interleaved, ZB-H1, "
                         f"zb_interleaved, ZB-V, DualPipeV, kfkb_interleaved, adaptive (weft.plan)")
    return _SCHEDULES[key]


def _training_graph(graph):
    if _weft.is_training_graph(graph):
        return graph
    return graph.train_step(optimizer="adam")


def load_calibration(calibration) -> "_weft.Calibration":
    """A ``weft.Calibration`` from one, a dict in its JSON form, a path to the JSON ``weft calibrate
    --out`` writes (or one written by hand), or a :class:`weft.calibration.CalibrationReport`."""
    if isinstance(calibration, _weft.Calibration):
        return calibration
    if hasattr(calibration, "calibration") and isinstance(calibration.calibration, _weft.Calibration):
        return calibration.calibration  # a CalibrationReport
    if isinstance(calibration, dict):
        return _weft.Calibration.from_json(json.dumps(calibration))
    if isinstance(calibration, (str, os.PathLike)):
        path = os.fspath(calibration)
        if not os.path.isfile(path):
            raise ValueError(f"calibration file {path!r} does not exist")
        with open(path, encoding="utf-8") as f:
            return _weft.Calibration.from_json(f.read())
    raise TypeError("calibration must be a weft.Calibration, a dict, a path to a calibration JSON file or a "
                    f"CalibrationReport, got {type(calibration).__name__}")


def calibrated_cluster(cluster, calibration):
    """The cluster as ``calibration`` measured it (any form :func:`load_calibration` takes): every
    device's peak FLOP/s times its compute efficiency, memory bandwidth times its memory efficiency,
    the kernel overhead (s) added to every op; link latency times alpha_scale, bandwidth over
    beta_scale. Memory capacities are unchanged."""
    if not isinstance(cluster, _weft.Cluster):
        raise TypeError(f"cluster must be a weft.Cluster, got {type(cluster).__name__}")
    return _weft.calibrated_cluster(cluster, load_calibration(calibration))


def _calibrated(cluster, options: dict):
    """The cluster the planner prices with: as measured when ``options`` has a calibration."""
    cal = options.pop("calibration", None)
    return cluster if cal is None else calibrated_cluster(cluster, cal)


def _logging_progress(inner):
    """A progress callback that logs each new phase at DEBUG (and calls ``inner`` too)."""
    state = {"phase": None}

    def cb(phase: str, fraction: float, message: str) -> None:
        if phase != state["phase"]:
            state["phase"] = phase
            logger.debug("plan: %s (%.0f %%) %s", phase, 100 * fraction, message)
        if inner is not None:
            inner(phase, fraction, message)

    return cb


def _options(schedule, progress, kwargs):
    from ._checks import fraction, integer

    opts = dict(kwargs)
    if not isinstance(schedule, str):
        raise TypeError(f"schedule must be a name (e.g. '1F1B'), got {type(schedule).__name__}")
    opts["schedule"] = _schedule_name(schedule)
    if opts.get("threads") is not None:
        opts["threads"] = integer("threads", opts["threads"], 0)  # 0: the machine's cores
    if opts.get("compute_efficiency") is not None:
        opts["compute_efficiency"] = fraction("compute_efficiency", opts["compute_efficiency"])
    if opts.get("num_microbatches") is None:
        opts["num_microbatches"] = 0
    for key in [k for k, v in opts.items() if v is None]:
        del opts[key]
    bar = None
    if progress is True:
        from tqdm.auto import tqdm

        bar = tqdm(total=100, desc="planning", unit="%", leave=False)
        state = {"n": 0}

        def cb(phase: str, fraction: float, message: str) -> None:
            n = int(round(fraction * 100))
            if n > state["n"]:
                bar.update(n - state["n"])
                state["n"] = n
            bar.set_postfix_str(f"{phase}: {message}"[:60], refresh=False)

        opts["progress"] = cb
    elif callable(progress):
        opts["progress"] = progress
    return opts, bar


def plan(model_graph, cluster, schedule: str = "1F1B", *, num_microbatches: Optional[int] = None,
         progress=False, verbose: Union[bool, int] = False, **options) -> Plan:
    """Plan a model on a cluster: the plan with the lowest simulated step time that fits in memory.

    ``schedule``: 1F1B (default), GPipe, kFkB (``schedule_k``), eager-1F1B, interleaved
    (``schedule_v``), ZB-H1, zb_interleaved (interleaved zero bubble, ``schedule_v``), ZB-V (two
    chunks per stage in the V placement), DualPipeV (the same V, torch's ScheduleDualPipeV), kfkb_interleaved
    (``schedule_k``, ``schedule_v``), adaptive (Ada-Grouper: the layout planned under 1F1B, then
    ``Plan.adaptive``, the k to run in each window of ``bandwidth_trace``). ``bandwidth_trace``: a
    ``weft.BandwidthTrace`` (fraction of nominal bandwidth over time) on the inter-stage links:
    the plan then carries ``Plan.adaptive`` (a ``weft.AdaptivePolicy``: the (k, micro-batch)
    frontier under the memory limit, the point per window, and the expected step under the trace
    against every fixed k and 1F1B; ``adaptive_window`` s per window, default 60, ``adaptive_k_max``
    default 8, ``adaptive_duration`` s of trace, default its last change + one window,
    ``adaptive_forward_overhead`` / ``adaptive_backward_overhead`` s per micro-batch and stage, default 0;
    see :func:`adaptive_policy`).
    ``num_microbatches``: None = auto (every power of two dividing the batch, ``max_microbatches``
    caps it when > 0; pairs of (micro-batches, replicas) whose replica cannot hold the parameter
    state plus one micro-batch of saved activations are left out).
    The search space scales by itself (rules in docs/modules/plan.md, "Defaults that scale", and in
    ``Plan.search_space``): beyond 8 nodes, whole-node submeshes of a power-of-two node count or one
    that divides the node count (``all_node_counts=True``: every count); (micro-batches, replicas)
    pairs searched in the order of a lower bound and skipped once the bound reaches the best step
    found (``bound_search=False``: every pair).
    ``recompute``: activation recomputation per stage — "auto" (default: the planner picks per
    stage none / selective / full, the fastest that fits, so it is used when memory forces it or
    when it lets a faster layout fit), "none", "selective" (attention scores, softmax and dropout
    recomputed in the backward, Korthikanti et al. 2022) or "full" (only each block's inputs kept,
    one extra forward of the stage in the backward). With "auto", a stage that cannot keep every
    activation may also run a mode per block (selective on some blocks, full on others).
    ``Plan.recompute`` lists the choice per stage (the strongest mode of its blocks),
    ``PlanStage.recompute_blocks`` / ``PlanStage.selective_blocks`` which blocks when not every
    one, and the summary shows it.
    ``zero``: sharded data parallelism across a stage's data-parallel replicas — "auto" (default:
    per stage the fastest ZeRO level that fits, searched together with ``recompute``) or a level
    0 (replicated states, DDP), 1 (optimizer states sharded), 2 (+ gradients), 3 (+ parameters:
    FSDP); ``hybrid_sharding`` (default True) also tries shard groups of one node's replicas,
    replicated across nodes (FSDP's HYBRID_SHARD); with "auto" also ZeRO-3 on some blocks only
    (the most parameter bytes first: an embedding before the layers) and 1 or 2 on the others.
    ``Plan.zero`` / ``PlanStage.zero_group`` / ``PlanStage.zero_blocks`` say what was chosen; the
    closed forms are :func:`weft.zero_memory` and :func:`weft.zero_traffic`.
    ``progress``: True for a tqdm bar, or a callable ``(phase, fraction, message)``.
    Other options (keyword): num_blocks, max_stages, spmd_level ("O2"/"O3"), spmd_time_limit (seconds
    per SPMD search of a block on a mesh), shared_resharding (default True: a tensor several readers
    need in one layout is resharded once, see ``weft.spmd_search``), time_limit (seconds for the whole planning, default 300: at
    the limit the best plan found so far is returned with ``search_status == "timeout"``, within
    1.5 x the limit + 0.5 s; ValueError only when nothing was found), threads (SPMD searches in
    parallel; default 0 = every core; the plan is the same for any count), memory_limit (bytes per device;
    default the device's), memory_reserve (bytes per device the plan may not use: the CUDA context,
    NCCL buffers; default None = 1 GiB on devices of 8 GiB or more, none under a memory_limit),
    memory_fraction (of the rest; default 0.9: the allocator's fragmentation margin) — usable memory
    = (memory_limit or the device's - memory_reserve) x memory_fraction, overlap_grad_sync (default True:
    gradient synchronisation overlapped with the last backward in buckets), grad_bucket_bytes,
    step_allreduce_bytes (default 16: the Trainer's per-step all-reduce of the gradient norm and loss over
    every device, priced before the updates; 0 for weft.run's bare programs), whole_nodes_only,
    power_of_two_nodes, all_node_counts, bound_search, max_logical_shapes, two_d_meshes, pipeline, max_data_parallel, stage_ilp,
    compare_megatron, uneven_split (mixed GPUs: Whale's uneven tensor split), max_alternatives. Raises ValueError for bad input and when the model cannot
    fit (the message says how much memory is missing).
    ``calibration``: a ``weft.Calibration``, a dict, or a path to the JSON ``weft calibrate`` writes:
    the plan is priced on the cluster as measured (every function here takes it).
    ``verbose``: True (INFO: what is planned, the chosen plan) or 2 (DEBUG: each planner phase too)
    logs through the ``weft`` logger for this call (stderr when logging is not configured)."""
    with verbosity(verbose):
        g = _training_graph(model_graph)
        cluster = _calibrated(cluster, options)
        opts, bar = _options(schedule, progress, {"num_microbatches": num_microbatches, **options})
        logger.info("planning %s (%d ops, %.4g M parameters) on %r, schedule %s, options %s", g.name, len(g.ops),
                    g.num_params() / 1e6, cluster, opts["schedule"],
                    {k: v for k, v in opts.items() if k not in ("schedule", "progress")})
        if logger.isEnabledFor(logging.DEBUG):  # the planner's phases
            opts["progress"] = _logging_progress(opts.get("progress"))
        t0 = time.perf_counter()
        try:
            p = _weft.make_plan(g, cluster, **opts)
        finally:
            if bar is not None:
                bar.close()
        from .display import _bytes, _seconds

        logger.info("plan: %s, step %s, %.4g samples/s, MFU %.1f %%, peak %s per device (planned in %s)",
                    p.strategy, _seconds(p.step_time), p.throughput, 100 * p.mfu, _bytes(p.peak_memory),
                    _seconds(time.perf_counter() - t0))
        return p


def megatron_plan(model_graph, cluster, t: Optional[int] = None, p: Optional[int] = None, d: Optional[int] = None,
                  schedule: str = "1F1B", *, num_microbatches: Optional[int] = None, **options) -> Plan:
    """The given Megatron layout when t, p, d are all set — tensor parallel t inside a node x pipeline
    p x data parallel d, with Megatron's column / row / vocabulary splits fixed in the tensor-parallel
    stages (:func:`megatron_specs`; a graph with none of its roles keeps a searched layout and says
    so in ``Plan.strategy``) — or, with none set, the best Megatron-style (t, p, d) layout of the
    sweep :func:`plan` compares against (each block's layout searched on its t-device mesh), under
    the same cost model as :func:`plan`.
    With t, p, d given and no ``num_blocks``, the blocks are the model's repeated layers (one each,
    ``weft.pipeline.repeated_layers``) and each stage holds layers / p of them, as Megatron-LM
    splits; a depth beyond the layers keeps the planner's automatic blocks.
    ``allow_infeasible=True`` (with t, p, d given): a layout that does not fit is returned anyway,
    ``Plan.feasible`` False, priced at each stage's unconstrained layouts (with ``zero="auto"`` at
    the ZeRO option that keeps the least; the micro-batch count with the least peak memory),
    ``Plan.infeasible_reason`` naming the worst stage with its figures; otherwise ValueError with
    that reason. ``recompute="full"`` evaluates the layout as Megatron-LM ran its large models
    (default "auto": per stage the cheapest mode that fits; see :func:`plan`). ``zero``: the ZeRO
    level across the d replicas ("auto", default: the fastest that fits; 1 is Megatron's distributed
    optimizer; ``t=1, p=1, d=N, zero=3`` is FSDP over every device)."""
    g = _training_graph(model_graph)
    cluster = _calibrated(cluster, options)
    opts, _ = _options(schedule, False, {"num_microbatches": num_microbatches, **options})
    if t is not None and p is not None and d is not None:
        return _weft.megatron_plan(g, cluster, _weft.MegatronLayout(t, p, d), **opts)
    if (t, p, d) != (None, None, None):
        raise ValueError("megatron_plan: give all of t, p, d, or none (then the best layout is returned)")
    return _weft.best_megatron_plan(g, cluster, **opts)


def megatron_specs(model_graph, t: int, *, detail: bool = False, sequence_parallel: bool = False):
    """Megatron's tensor-parallel layout of a model's parameters on ``t`` devices, as
    :func:`megatron_plan` forces it: ``{parameter: (role, spec)}``, the spec on a 1-D mesh of ``t``
    devices. Roles are recognised from the graph's structure, never from names (docs/modules/plan.md,
    "Megatron's layouts"): ``"column"`` (QKV, MLP-1, a SwiGLU gate: split along the output features;
    a fused QKV part by part, a strided spec), ``"column_bias"``, ``"row"`` (attention-out, MLP-2:
    split along the input features), ``"row_bias"`` (replicated), ``"vocab_embedding"`` (the token
    table, tied LM head included), ``"vocab_head"`` / ``"vocab_head_bias"`` (an untied LM head),
    ``"replicated"`` (norms, position embeddings, the rest). ``detail=True``: the whole answer, a
    dict with per parameter its role, split dim, stride, spec and a note (why a split stays
    replicated), ``results`` (the specs of what the split matmuls, the vocabulary-parallel embedding
    and the activations between a column and its row make, "P(sum)" for partial sums, and of the
    gradients the updates read), ``boundaries`` (the spec a planner block boundary carries where
    Megatron splits a tensor), ``fixed`` (everything the block searches are given: parameters,
    optimizer states, results), ``recognised`` (False for a graph with none of the roles, e.g. a
    conv net: :func:`megatron_plan` then searches freely and says so in ``Plan.strategy``) and a
    one-line ``summary``. ``sequence_parallel=True``: also Megatron's sequence parallelism —
    ``sequence`` (in ``detail``) names the residual-stream tensors (bias adds, dropout, residual adds,
    norms between a partial result and the next weight matmul) split along their token dim, which
    ``results``, ``boundaries`` and ``fixed`` then carry too; ``megatron_plan(...,
    sequence_parallel=True)`` runs with them (a reduce-scatter and an all-gather where the plain
    layout all-reduces)."""
    if isinstance(t, bool) or not isinstance(t, int):
        raise TypeError(f"megatron_specs: t must be an int, got {type(t).__name__}")
    if not isinstance(model_graph, _weft.Graph):
        raise TypeError(f"megatron_specs: expected a weft.Graph, got {type(model_graph).__name__}")
    if not isinstance(sequence_parallel, bool):
        raise TypeError(f"megatron_specs: sequence_parallel must be a bool, got {type(sequence_parallel).__name__}")
    out = _weft.megatron_specs(model_graph, t, sequence_parallel)
    if detail:
        return out
    return {name: (p["role"], p["spec"]) for name, p in out["params"].items()}


def data_parallel_plan(model_graph, cluster, shares, num_microbatches: int = 1, schedule: str = "1F1B",
                       **options) -> Plan:
    """Data parallelism with the given samples per micro-batch on every device (device id order;
    the shares sum to batch / num_microbatches), costed like :func:`plan`'s candidates. On mixed
    GPUs the planner's own choice is the "data parallel (uneven shares)" alternative."""
    g = _training_graph(model_graph)
    cluster = _calibrated(cluster, options)
    opts, _ = _options(schedule, False, {"num_microbatches": num_microbatches, **options})
    opts.pop("num_microbatches", None)
    return _weft.data_parallel_plan(g, cluster, [int(s) for s in shares], int(num_microbatches), **opts)


def split_plan(model_graph, cluster, fraction, num_microbatches: int = 1, schedule: str = "1F1B",
               **options) -> Plan:
    """Whale's ``split`` over mixed GPUs with given fractions: the whole graph as one SPMD stage on
    every device (id order), device i holding ``fraction[i] / sum(fraction)`` of every dimension the
    mesh axis splits, costed like :func:`plan`'s "spmd (uneven split)" candidates."""
    g = _training_graph(model_graph)
    cluster = _calibrated(cluster, options)
    opts, _ = _options(schedule, False, {"num_microbatches": num_microbatches, **options})
    opts.pop("num_microbatches", None)
    return _weft.split_plan(g, cluster, [float(f) for f in fraction], int(num_microbatches), **opts)


def layout_plan(model_graph, cluster, stages, num_microbatches: int = 1, schedule: str = "1F1B",
                **options) -> Plan:
    """A given pipeline layout: ``stages`` = [(first_block, last_block, [device ids], mesh or None)],
    blocks of the planner's layer grouping (``num_blocks``), costed like :func:`plan`'s candidates.
    ``allow_infeasible=True``: a layout that does not fit is returned with ``Plan.feasible`` False
    (step time at each stage's unconstrained layouts, its memory, ``Plan.infeasible_reason``)
    instead of ValueError. ``recompute``: "auto" (default), "none", "selective" or "full", as in
    :func:`plan`."""
    g = _training_graph(model_graph)
    cluster = _calibrated(cluster, options)
    opts, _ = _options(schedule, False, {"num_microbatches": num_microbatches, **options})
    opts.pop("num_microbatches", None)
    norm = []
    for st in stages:
        if len(st) == 4 and st[3] is not None:
            norm.append((int(st[0]), int(st[1]), [int(d) for d in st[2]], [int(x) for x in st[3]]))
        else:
            norm.append((int(st[0]), int(st[1]), [int(d) for d in st[2]]))
    return _weft.layout_plan(g, cluster, norm, int(num_microbatches), **opts)


__all__ = ["plan", "megatron_plan", "megatron_specs", "data_parallel_plan", "split_plan", "layout_plan", "load_calibration",
           "calibrated_cluster", "Plan"]


def adaptive_policy(plan: Plan, trace=None, window: float = 60.0, k_max: int = 8, duration: float = 0.0,
                    samples_per_window: int = 16, forward_overhead: float = 0.0,
                    backward_overhead: float = 0.0) -> "_weft.AdaptivePolicy":
    """Ada-Grouper's policy for a plan's pipeline under a bandwidth trace (None: a constant network):
    the (k, micro-batch size) frontier under the plan's memory limit, the point to run in each
    ``window`` seconds of the trace, and the expected step time (mean over windows of
    ``samples_per_window`` simulated iterations each) against every fixed point and 1F1B.
    The plan's stages scale with the micro-batch size (per sample). ``duration``: seconds of
    trace covered (0 = up to its last change + one window). ``forward_overhead`` /
    ``backward_overhead``: fixed seconds per micro-batch and stage (kernel launches; weft's datasheet
    costs have none), which make small micro-batches cost compute: per k the frontier takes the
    micro-batch size with the shortest step on the full-bandwidth network."""
    return _weft.adaptive_policy(plan, trace, float(window), int(k_max), float(duration), int(samples_per_window),
                                 float(forward_overhead), float(backward_overhead))
