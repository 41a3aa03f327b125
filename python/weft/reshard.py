"""Cross-mesh resharding: plan the transfer of a sharded tensor from one device mesh to another
(unit tasks, send/recv, all-gather and broadcast strategies, load balancing over hosts), and run
the plan on the CPU reference executor. See docs/modules/reshard.md.

>>> import numpy as np
>>> from weft import reshard
>>> p = reshard.plan([4, 4], "f32", "S(0)", ([2, 2], [0, 1, 2, 3]), "S(0)", ([2, 2], [4, 5, 6, 7]))
>>> len(p.unit_tasks), p.completion_time == p.lower_bound
(4, True)
>>> x = np.arange(16, dtype=np.float32).reshape(4, 4)
>>> out = reshard.execute(p, x)
>>> out[5].tolist()
[[0.0, 1.0, 2.0, 3.0]]
"""
from __future__ import annotations

import json
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from ._weft import (
    CrossMeshOp,
    CrossMeshPlan,
    CrossMeshUnitTask,
    DeviceMesh,
    ShardingSpec,
    _cross_mesh_cluster_hosts,
    _cross_mesh_execute,
    _cross_mesh_plan,
    _cross_mesh_rows_hosts,
)

__all__ = ["Plan", "plan", "plan_many", "execute", "STRATEGIES", "BALANCERS", "CrossMeshOp", "CrossMeshUnitTask"]

STRATEGIES = ("send_recv", "local_allgather", "global_allgather", "broadcast")
BALANCERS = ("naive", "largest_first", "dfs", "random_greedy", "list", "best")

_NUMPY_TO_WEFT = {"float32": "f32", "float16": "f16", "float64": "f64", "int32": "i32", "int64": "i64",
                  "bool": "bool", "bfloat16": "bf16"}

MeshLike = Union[DeviceMesh, Tuple[Sequence[int], Sequence[int]], Sequence[Any]]


def _mesh(m: MeshLike) -> DeviceMesh:
    """A DeviceMesh from a DeviceMesh, a (shape, device_ids) pair or a nested list of ids."""
    if isinstance(m, DeviceMesh):
        return m
    if isinstance(m, tuple) and len(m) == 2 and not np.isscalar(m[0]):
        shape, ids = m
        return DeviceMesh([int(s) for s in shape], [int(i) for i in ids])
    a = np.asarray(m)
    if a.dtype.kind not in "iu":
        raise ValueError(f"a mesh must be a DeviceMesh, (shape, device_ids) or a nested list of ids, got {m!r}")
    return DeviceMesh(list(a.shape), [int(i) for i in a.reshape(-1)])


def _spec(s: Union[ShardingSpec, str], shape: Sequence[int], mesh: DeviceMesh) -> ShardingSpec:
    """A ShardingSpec from an object or text: weft notation ("S(0) R", uneven dims padded) or the
    Alpa/paper notation ("S0RR", "RS01R")."""
    if isinstance(s, ShardingSpec):
        return s
    try:
        return ShardingSpec.parse(s, list(shape), list(mesh.shape), True)
    except ValueError as first:
        try:
            return ShardingSpec.parse_alpa(s, list(shape), list(mesh.shape))
        except ValueError:
            raise first from None


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, str) and dtype in _NUMPY_TO_WEFT.values():
        return dtype
    name = np.dtype(dtype).name
    if name not in _NUMPY_TO_WEFT:
        raise ValueError(f"unsupported dtype {dtype!r}")
    return _NUMPY_TO_WEFT[name]


class Plan:
    """A cross-mesh resharding plan (wraps the C++ CrossMeshPlan and remembers the layouts)."""

    def __init__(self, cpp: CrossMeshPlan, tensors: List[tuple]):
        self._cpp = cpp
        self._tensors = tensors  # (shape, dtype name, src spec, src mesh, dst spec, dst mesh)

    completion_time = property(lambda self: self._cpp.completion_time, doc="simulated completion time (s)")
    lower_bound = property(lambda self: self._cpp.lower_bound, doc="lower bound on any plan's time (s)")
    lower_bound_per_host = property(lambda self: self._cpp.lower_bound_per_host,
                                    doc="max over hosts of must-send / must-receive bytes over bandwidth")
    lower_bound_parts = property(lambda self: self._cpp.lower_bound_parts,
                                 doc="the bound's parts in s: per_host, sender_sets, cliques, whole_tasks (max = bound)")
    ratio = property(lambda self: self._cpp.ratio, doc="completion_time / lower_bound")
    strategy = property(lambda self: self._cpp.strategy,
                        doc="send_recv, local_allgather, global_allgather or broadcast")
    balancer_used = property(lambda self: self._cpp.balancer_used, doc="the load balancer that produced the order")
    unit_tasks = property(lambda self: self._cpp.unit_tasks, doc="the unit tasks (regions, bytes, senders, receivers)")
    ops = property(lambda self: self._cpp.ops, doc="the transfers (start and duration in s, bytes, hosts)")
    order = property(lambda self: self._cpp.order, doc="host -> op ids in execution order")

    def nic_bytes_sent(self) -> Dict[int, int]:
        """Bytes each host's NIC sends (host -> bytes)."""
        return self._cpp.nic_bytes_sent()

    def nic_bytes_received(self) -> Dict[int, int]:
        """Bytes each host's NIC receives (host -> bytes)."""
        return self._cpp.nic_bytes_received()

    def to_json(self) -> str:
        """The plan as JSON text (ops with start / duration in s, bytes, hosts)."""
        return self._cpp.to_json()

    def to_dict(self) -> dict:
        """The plan as a dict (the parsed to_json)."""
        return json.loads(self._cpp.to_json())

    def execute(self, *arrays: np.ndarray, staged: bool = False, return_stats: bool = False):
        """Runs the plan on the CPU executor (see :func:`execute`)."""
        return execute(self, *arrays, staged=staged, return_stats=return_stats)

    def __repr__(self) -> str:
        from .display import reshard_repr

        return reshard_repr(self)

    def _repr_html_(self) -> str:
        """Notebook display: completion time and lower bound (s), strategy, bytes sent and received per host."""
        from .display import reshard_html

        return reshard_html(self)

    def show(self, path: Optional[str] = None):
        """The per-host timeline as a matplotlib ``Figure`` (no pyplot, backend untouched): one row
        per host, one bar per transfer on its sending host's row from its start for its duration
        (s), coloured by the receiving host (local copies hatched grey), the lower bound dashed.
        Saved as PNG to ``path`` when given."""
        from .plots import reshard_figure

        return reshard_figure(self, path)


def _hosts(meshes: List[DeviceMesh], hosts: Optional[Mapping[int, int]], devices_per_host: Optional[int],
           cluster: Any, bandwidth: Union[float, Mapping[int, float]]) -> Tuple[Dict[int, int], Dict[int, float], float]:
    bw_map: Dict[int, float] = {}
    default = 1.0
    if isinstance(bandwidth, Mapping):
        bw_map = {int(h): float(b) for h, b in bandwidth.items()}
    else:
        default = float(bandwidth)
    given = sum(x is not None for x in (hosts, devices_per_host, cluster))
    if given > 1:
        raise ValueError("give at most one of hosts, devices_per_host and cluster")
    if hosts is not None:
        dh = {int(d): int(h) for d, h in hosts.items()}
    elif devices_per_host is not None:
        if int(devices_per_host) < 1:
            raise ValueError(f"devices_per_host must be >= 1, got {devices_per_host}")
        ids = sorted({d for m in meshes for d in m.device_ids})
        dh = {d: d // int(devices_per_host) for d in ids}
    elif cluster is not None:
        dh, cbw = _cross_mesh_cluster_hosts(cluster)
        bw_map = {**cbw, **bw_map}
    else:
        dh = _cross_mesh_rows_hosts(meshes)
    return dh, bw_map, default


def plan_many(tensors: Sequence[Sequence[Any]], strategy: str = "broadcast", balancer: str = "best", seed: int = 0,
              hosts: Optional[Mapping[int, int]] = None, devices_per_host: Optional[int] = None, cluster: Any = None,
              bandwidth: Union[float, Mapping[int, float]] = 1.0, broadcast_chunks: int = 0,
              dfs_node_limit: int = 200000, time_limit_s: float = 2.0, greedy_restarts: int = 16) -> Plan:
    """Plans several tensors crossing the same stage boundary jointly. Each entry is
    (shape, dtype, src_spec, src_mesh, dst_spec, dst_mesh). Hosts: an explicit device -> host
    dict, or devices_per_host (host = id // n), or a Cluster (nodes and NIC bandwidths), or by
    default each mesh row (all axes but the last) is a host, numbered over the meshes in order
    (source meshes first). bandwidth: bytes/s per host and direction (a number or host -> number)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; one of {STRATEGIES}")
    if balancer not in BALANCERS:
        raise ValueError(f"unknown balancer {balancer!r}; one of {BALANCERS}")
    norm = []
    for t in tensors:
        if len(t) != 6:
            raise ValueError("each tensor is (shape, dtype, src_spec, src_mesh, dst_spec, dst_mesh)")
        shape, dtype, ss, sm, ds, dm = t
        shape = [int(s) for s in shape]
        sm, dm = _mesh(sm), _mesh(dm)
        norm.append((shape, _dtype_name(dtype), _spec(ss, shape, sm), sm, _spec(ds, shape, dm), dm))
    meshes: List[DeviceMesh] = []
    for m in [n[3] for n in norm] + [n[5] for n in norm]:  # source meshes first
        if m not in meshes:
            meshes.append(m)
    dh, bw, default = _hosts(meshes, hosts, devices_per_host, cluster, bandwidth)
    cpp = _cross_mesh_plan(norm, dh, bw, default, strategy, balancer, int(seed), int(dfs_node_limit),
                           float(time_limit_s), int(greedy_restarts), int(broadcast_chunks))
    return Plan(cpp, norm)


def plan(shape: Sequence[int], dtype: Any, src_spec: Union[ShardingSpec, str], src_mesh: MeshLike,
         dst_spec: Union[ShardingSpec, str], dst_mesh: MeshLike, strategy: str = "broadcast",
         balancer: str = "best", seed: int = 0, **kwargs: Any) -> Plan:
    """Plans one tensor's cross-mesh resharding; keyword arguments as plan_many.

    strategy: send_recv | local_allgather | global_allgather | broadcast;
    balancer: naive | largest_first | dfs | random_greedy | list (earliest-start list schedule) | best
    (all of them, the fastest simulated plan; deterministic for a seed)."""
    return plan_many([(shape, dtype, src_spec, src_mesh, dst_spec, dst_mesh)], strategy=strategy,
                     balancer=balancer, seed=seed, **kwargs)


def execute(p: Plan, *arrays: np.ndarray, staged: bool = False, return_stats: bool = False):
    """Runs the plan on the CPU reference executor with the given global arrays (one per tensor
    of the plan) laid out by the source specs; returns, per tensor, device -> local array of the
    destination layout (a single dict when the plan has one tensor). With return_stats, returns
    (result, stats) where stats has bytes_sent / bytes_received per host (NIC), bytes_local,
    bytes_written and seconds."""
    if len(arrays) != len(p._tensors):
        raise ValueError(f"the plan moves {len(p._tensors)} tensors, got {len(arrays)} arrays")
    args = []
    for a, (shape, dtype, ss, sm, ds, dm) in zip(arrays, p._tensors):
        a = np.asarray(a)
        if list(a.shape) != list(shape):
            raise ValueError(f"array shape {list(a.shape)} != planned tensor shape {shape}")
        if _NUMPY_TO_WEFT.get(a.dtype.name) != dtype:
            raise ValueError(f"array dtype {a.dtype.name} does not match the plan's dtype {dtype}")
        args.append((np.ascontiguousarray(a).tobytes(), shape, dtype, ss, sm, ds, dm))
    outs, stats = _cross_mesh_execute(p._cpp, args, bool(staged))
    result = []
    for a, devs in zip(arrays, outs):
        dt = np.asarray(a).dtype
        result.append({d: np.frombuffer(b, dtype=dt).reshape(shape).copy() for d, (b, shape) in devs.items()})
    out = result[0] if len(result) == 1 else result
    return (out, stats) if return_stats else out
