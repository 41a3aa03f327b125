"""SPMD (intra-operator) strategy search: the sharding of every op and tensor on one device mesh.

    >>> g = weft.models.gpt(layers=2, hidden=512, heads=8, batch=8, seq=128).train_step()
    >>> c = weft.Cluster.preset("M8")
    >>> r = weft.spmd_search(g, c, weft.DeviceMesh.iota([2, 4]), level="O2", progress=True)
    >>> print(r.report)            # phases, ILP size, status, cost split, memory, parameter specs
    >>> r.specs["wte"], r.cost, r.compute_time, r.comm_time

The search, its cost model and its levels are described in docs/modules/spmd.md.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Union

from . import _weft

_s = _weft.spmd

__all__ = ["SpmdResult", "spmd_search", "evaluate_plan"]


class SpmdResult:
    """The outcome of :func:`spmd_search`.

    ``specs``: spec text of every tensor by name; ``op_strategies``: the factor-to-mesh-axis
    assignment of every op ("b:x f:y", "R" = replicated); ``cost`` = ``compute_time`` +
    ``comm_time`` (predicted seconds per step); ``peak_memory`` (bytes per device); ``report``:
    the search report (``str(report)`` is a readable table, ``report.to_dict()`` the numbers).
    """

    def __init__(self, plan, graph, mesh):
        self.plan = plan
        self.graph = graph
        self.mesh = mesh
        self.report = plan.report
        self._specs: Optional[Dict[str, str]] = None
        self._op_strategies: Optional[Dict[str, str]] = None
        self.cost: float = plan.cost
        self.compute_time: float = plan.compute_time
        self.comm_time: float = plan.comm_time
        self.peak_memory: float = plan.peak_memory

    # Built on first use: on a deep training graph the text of every tensor's spec and every
    # op's strategy costs a noticeable share of a fast search (0.25 s at 96 GPT layers).
    @property
    def specs(self) -> Dict[str, str]:
        """Spec text of every tensor by name."""
        if self._specs is None:
            self._specs = dict(self.plan.tensor_specs(self.graph))
        return self._specs

    @property
    def shared_specs(self) -> Dict[str, str]:
        """Tensor name -> the layout it is resharded to once for every reader that needs exactly it."""
        return dict(self.plan.shared_specs(self.graph))

    @property
    def op_strategies(self) -> Dict[str, str]:
        """Factor-to-mesh-axis assignment of every op by name."""
        if self._op_strategies is None:
            self._op_strategies = dict(self.plan.op_strategies(self.graph, self.mesh))
        return self._op_strategies

    @property
    def param_specs(self) -> Dict[str, str]:
        """Spec of every parameter (the report's table) by name."""
        return {r["name"]: r["spec"] for r in self.report.to_dict()["params"]}

    def spec_of(self, tensor: str) -> str:
        """Spec text of one tensor (by name)."""
        return self.plan.spec_of(self.graph, tensor)

    def __str__(self) -> str:
        return str(self.report)

    def _repr_html_(self) -> str:
        """Notebook display: cost split (s), peak memory (bytes), ILP size, parameter specs."""
        from .display import spmd_html

        return spmd_html(self)

    def __repr__(self) -> str:
        from .display import _bytes, _seconds

        return (f"SpmdResult(cost={_seconds(self.cost)}, compute={_seconds(self.compute_time)}, "
                f"comm={_seconds(self.comm_time)}, peak={_bytes(self.peak_memory)})")


def _progress_fn(progress: Union[None, bool, Callable[..., Any]]):
    """True -> a tqdm bar (INFO records of the ``weft`` logger when tqdm is missing); a callable gets
    (phase, fraction, message)."""
    if progress is None or progress is False:
        return None, None
    if callable(progress):
        return progress, None
    if progress is not True:
        raise ValueError(f"spmd_search: progress must be None, a bool or a callable, got {progress!r}")
    try:
        from tqdm import tqdm  # type: ignore
    except ImportError:  # pragma: no cover - depends on the environment
        from .log import logger

        def plain(phase: str, fraction: float, message: str) -> None:
            logger.info("spmd %s: %5.1f%% %s", phase, 100 * fraction, message)

        return plain, None
    bar = tqdm(total=1000, desc="spmd", leave=False)

    def update(phase: str, fraction: float, message: str) -> None:
        bar.set_description(f"spmd {phase}")
        bar.n = int(round(1000 * min(max(fraction, 0.0), 1.0)))
        bar.refresh()

    return update, bar


def spmd_search(graph, cluster, mesh, level: str = "O2", memory_limit: Optional[float] = None,
                time_limit: float = 60.0, *, memory_mode: str = "ilp", relative_gap: float = 0.0,
                reuse_repeated_layers: bool = True, strided_candidates: bool = True,
                memory_pricing: bool = True,
                fixed_specs: Optional[Mapping[str, str]] = None,
                output_specs: Optional[Mapping[str, str]] = None,
                progress: Union[None, bool, Callable[[str, float, str], Any]] = None,
                shared_resharding: bool = True, shared_layouts_per_tensor: int = 2) -> SpmdResult:
    """Searches the SPMD strategy of ``graph`` (forward or training step) on ``mesh`` of ``cluster``.

    level: "O3" = one ILP over the whole graph, "O2" = segments between critical nodes stitched by
    DP (repeated layers solved once). memory_limit: bytes per device; None = the device's memory,
    a negative number = no limit. memory_mode: "ilp" (memory rows in the ILP) or "shard_largest"
    (Rhino §4.4: force the k largest parameters sharded, smallest feasible k). time_limit: seconds
    for the whole search (every ILP, the O2 DP and refinement, memory pricing, the memory loop; CBC
    is stopped even inside its root LP); on the deadline the best plan that fits so far is returned
    with ``report.status == "timeout"`` (at worst a greedy plan), and ValueError ("no solution
    within the time limit") only when even that plan exceeds the memory limit. memory_pricing (O2): when the plan found without memory rows does not fit, price
    memory per byte (the smallest price that fits, by bisection) before building memory rows.
    fixed_specs: tensor name -> spec text forced. output_specs: tensor name -> the spec its readers
    outside the graph need (the producer pays the resharding to it, as communication). progress: a
    callable (phase, fraction,
    message) or True for a tqdm bar. shared_resharding: a tensor several readers need in one layout
    is resharded to it once (``result.shared_specs``; at most ``shared_layouts_per_tensor`` candidate
    layouts per tensor, those most readers can use); False charges every reader its own resharding. Raises ValueError on bad input (a mesh larger than any op can
    be split, an impossible memory limit naming the tensors that make it impossible, ...).
    """
    fn, bar = _progress_fn(progress)
    try:
        plan = _s.search(graph, cluster, mesh, level=level,
                         memory_limit=0.0 if memory_limit is None else float(memory_limit),
                         memory_mode=memory_mode, time_limit=float(time_limit), relative_gap=float(relative_gap),
                         reuse_repeated_layers=reuse_repeated_layers, strided_candidates=strided_candidates,
                         memory_pricing=memory_pricing,
                         fixed_specs=dict(fixed_specs or {}), output_specs=dict(output_specs or {}),
                         progress=fn, shared_resharding=bool(shared_resharding),
                         shared_layouts_per_tensor=int(shared_layouts_per_tensor))
    finally:
        if bar is not None:
            bar.close()
    return SpmdResult(plan, graph, mesh)


def evaluate_plan(result: SpmdResult, cluster) -> Dict[str, Any]:
    """Independent re-evaluation of a result's strategies: cost, compute/comm split, peak memory,
    collective counts, every non-free edge, and ``partial_reductions`` (the tensors whose partial
    sums an edge reduces: Megatron's layout reduces two forward activations per block)."""
    return dict(_s.evaluate_plan(result.graph, cluster, result.mesh, result.plan))
