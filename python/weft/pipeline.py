"""Pipeline stage partition: layer grouping, submeshes, Alpa's stage DP and Rhino's stage ILP.

    >>> g = weft.models.gpt("GPT-1.3B", batch=1).train_step()
    >>> lg = weft.pipeline.group_layers(g, 8)            # 8 balanced blocks (fwd + bwd + update)
    >>> stage = weft.pipeline.extract_stage(g, lg.ops_of_range(0, 3))   # a standalone Graph
    >>> c = weft.Cluster.preset("M8", 2)
    >>> shapes = weft.pipeline.submesh_shapes(c)         # 1x1, 1x2, 1x4, 1x8, 2x8
    >>> p = weft.pipeline.partition_dp(8, c, cost=lambda i, j, m: ..., num_microbatches=16)
    >>> r = weft.pipeline.partition_ilp(weft.models.unet("U-Net").train_step(), num_stages=4, epsilon=0.1)

Math, conventions and measured figures: docs/modules/pipeline.md.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union

from . import _weft

_p = _weft.pipeline

SubmeshShape = _p.SubmeshShape
SubmeshPlacement = _p.SubmeshPlacement
ReplicatedPipeline = _p.ReplicatedPipeline
OpPhase = _p.OpPhase
Block = _p.Block
LayerGrouping = _p.LayerGrouping
StageCost = _p.StageCost
DpStage = _p.DpStage
DpPartition = _p.DpPartition
PartitionDag = _p.PartitionDag
StageBounds = _p.StageBounds
IlpPartition = _p.IlpPartition

classify_ops = _p.classify_ops
owner_forward_op = _p.owner_forward_op
group_layers = _p.group_layers
RepeatedLayers = _p.RepeatedLayers
repeated_layers = _p.repeated_layers
group_by_layers = _p.group_by_layers
extract_stage = _p.extract_stage
extract_stage_mapped = _p.extract_stage_mapped
structurally_equal = _p.structurally_equal
structural_hash = _p.structural_hash
submesh_shapes = _p.submesh_shapes
logical_mesh_shapes = _p.logical_mesh_shapes
assign_submeshes = _p.assign_submeshes
replicate_pipeline = _p.replicate_pipeline
partition_dp_exhaustive = _p.partition_dp_exhaustive
dag_from_graph = _p.dag_from_graph
cut_bytes = _p.cut_bytes
stage_compute = _p.stage_compute
feasible_partition = _p.feasible_partition
stage_bounds = _p.stage_bounds
partition_ilp = _p.partition_ilp
partition_dag_ilp = _p.partition_dag_ilp
partition_dag_exhaustive = _p.partition_dag_exhaustive

CostResult = Union[None, float, int, StageCost, tuple]

__all__ = [
    "SubmeshShape", "SubmeshPlacement", "ReplicatedPipeline", "OpPhase", "Block", "LayerGrouping", "StageCost",
    "DpStage", "DpPartition", "PartitionDag", "StageBounds", "IlpPartition", "classify_ops", "owner_forward_op",
    "group_layers", "RepeatedLayers", "repeated_layers", "group_by_layers", "extract_stage", "extract_stage_mapped", "structurally_equal", "structural_hash",
    "submesh_shapes", "logical_mesh_shapes", "assign_submeshes", "replicate_pipeline", "partition_dp",
    "partition_dp_exhaustive", "dag_from_graph", "cut_bytes", "stage_compute", "feasible_partition",
    "stage_bounds", "partition_ilp", "partition_dag_ilp", "partition_dag_exhaustive",
]


def partition_dp(num_blocks: int, cluster_or_submeshes, cost: Callable[[int, int, int], CostResult],
                 num_microbatches: int = 1, total_devices: Optional[int] = None,
                 t_max_relative_step: float = 0.0, time_limit_s: float = 60.0,
                 branch_and_bound: bool = True) -> DpPartition:
    """Alpa's stage construction DP over a chain of ``num_blocks`` blocks.

    ``cluster_or_submeshes`` is a :class:`weft.Cluster` (then the submeshes are
    ``submesh_shapes(cluster)`` and ``total_devices`` the cluster's devices) or a list of
    :class:`SubmeshShape` (then ``total_devices`` is required). ``cost(first, last, submesh_index)``
    returns None (infeasible), seconds per micro-batch (forward + backward), a :class:`StageCost`
    or a tuple ``(time_s, memory_bytes, fits_memory)``; it is called once per (first, last,
    submesh). Minimises Σ t + (B − 1)·max t with the stages' devices adding up to total_devices.
    ``branch_and_bound=False`` scans every t_max candidate as Alpa does (same answer, slower).
    """
    if isinstance(cluster_or_submeshes, _weft.Cluster):
        subs: Sequence[SubmeshShape] = _p.submesh_shapes(cluster_or_submeshes)
        if total_devices is None:
            total_devices = cluster_or_submeshes.num_devices
    else:
        subs = list(cluster_or_submeshes)
        if total_devices is None:
            raise ValueError("partition_dp: total_devices is required with a list of submesh shapes")
    return _p.partition_dp(num_blocks, list(subs), int(total_devices), cost, num_microbatches,
                           t_max_relative_step, time_limit_s, branch_and_bound)


def dag(compute: Sequence[float], values: Sequence[tuple]) -> PartitionDag:
    """A plain DAG for the stage ILP: per-node compute and (producer, [consumers], bytes) values."""
    return PartitionDag(list(compute), [tuple(v) for v in values])


__all__ += ["dag"]
