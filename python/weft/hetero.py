"""Heterogeneous load balancing (Whale's hardware-aware Algorithm 1, corrected).

Load is shared in proportion to each device's effective FLOP/s, then shifted off devices that run
out of memory, with memory modelled as ``static + units * bytes_per_unit`` (parameters, gradients
and optimizer state do not scale with a batch share). The result minimises the slowest device's
time over all integer shares that fit (tested against brute force).

>>> import weft
>>> from weft import hetero
>>> devs = [hetero.DeviceCapacity(15.7e12, 32 * 2**30, "V100"), hetero.DeviceCapacity(9.3e12, 16 * 2**30, "P100")]
>>> hetero.balance_load(devs, hetero.LoadModel(1e12), 25).units
[16, 9]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Union

from ._weft import Cluster, Graph
from ._weft import hetero as _h

DeviceCapacity = _h.DeviceCapacity
LoadModel = _h.LoadModel
HeteroShares = _h.HeteroShares
ModelProfile = _h.ModelProfile
DataParallelOptions = _h.DataParallelOptions
DpEvaluation = _h.DpEvaluation
PipelineOptions = _h.PipelineOptions
PipelineEvaluation = _h.PipelineEvaluation
capacities = _h.capacities
even_layers = _h.even_layers
even_units = _h.even_units
evaluate_load = _h.evaluate_load
evaluate_pipeline = _h.evaluate_pipeline
evaluate_data_parallel = _h.evaluate_data_parallel
memory_descending_order = _h.memory_descending_order
split_dimension = _h.split_dimension
try_balance_load = _h.try_balance_load
_balance_load = _h.balance_load
_balance_pipeline = _h.balance_pipeline
_balance_data_parallel = _h.balance_data_parallel

__all__ = ["DeviceCapacity", "LoadModel", "HeteroShares", "ModelProfile", "DataParallelOptions", "DpEvaluation",
           "PipelineOptions", "PipelineEvaluation", "BatchBalance", "PipelineBalance", "balance_load",
           "try_balance_load", "evaluate_load", "even_units", "split_dimension", "memory_descending_order",
           "capacities", "profile", "balance_batch", "balance_pipeline", "evaluate_data_parallel",
           "evaluate_pipeline", "even_layers"]

ModelLike = Union[str, Callable[[int], Graph], ModelProfile]


def balance_load(devices: Sequence[DeviceCapacity], loads: Union[LoadModel, Sequence[LoadModel]],
                 total_units: int) -> HeteroShares:
    """Algorithm 1: integer shares summing to ``total_units``; ValueError says how much memory is missing."""
    if isinstance(loads, LoadModel):
        loads = [loads]
    return _balance_load(list(devices), list(loads), int(total_units))


def profile(model: ModelLike, optimizer: str = "adam") -> ModelProfile:
    """A ModelProfile from a zoo preset name ("BERT-large"), a ``batch -> forward Graph`` callable, or a profile."""
    if isinstance(model, ModelProfile):
        return model
    if isinstance(model, str):
        return ModelProfile.from_preset(model)
    if callable(model):
        return ModelProfile.from_builder(model, optimizer)
    raise ValueError(f"expected a preset name, a batch -> Graph callable or a ModelProfile, got {type(model).__name__}")


def _devices(cluster: Cluster, devices: Optional[Sequence[int]]) -> list:
    return list(range(cluster.num_devices)) if devices is None else [int(d) for d in devices]


@dataclass(frozen=True)
class BatchBalance:
    """Data-parallel batch shares: ``batch`` per device, and the even and balanced evaluations."""
    batch: list
    shares: HeteroShares
    balanced: object  # DpEvaluation, or HeteroShares for a numbers-only load
    even: object
    speedup: float  # balanced throughput / even throughput

    def __str__(self) -> str:
        return f"BatchBalance(batch={self.batch}, speedup={self.speedup:.3f})"


def balance_batch(cluster: Cluster, model_or_numbers: Union[ModelLike, LoadModel, dict], global_batch: int,
                  devices: Optional[Sequence[int]] = None, calibration=None, overlap_grad_sync: bool = True,
                  dtype: str = "f32") -> BatchBalance:
    """Uneven data-parallel batch shares over a (heterogeneous) cluster.

    ``model_or_numbers``: a zoo preset name, a ``batch -> Graph`` callable or a ModelProfile (scored
    with the roofline + α-β all-reduce evaluator), or plain numbers: a LoadModel or a dict with
    ``flops_per_sample``, ``static_bytes``, ``bytes_per_sample`` (scored by compute time only,
    devices at their peak FLOP/s of ``dtype``).
    """
    ids = _devices(cluster, devices)
    if isinstance(model_or_numbers, dict):
        d = dict(model_or_numbers)
        model_or_numbers = LoadModel(d.pop("flops_per_sample"), d.pop("static_bytes", 0.0),
                                     d.pop("bytes_per_sample", 0.0), d.pop("fixed_flops", 0.0))
        if d:
            raise ValueError(f"unknown load fields: {sorted(d)}")
    if isinstance(model_or_numbers, LoadModel):
        from ._weft import Calibration
        caps = capacities(cluster, ids, dtype, calibration if calibration is not None else Calibration())
        shares = balance_load(caps, model_or_numbers, global_batch)
        even = evaluate_load(caps, [model_or_numbers], even_units(global_batch, len(ids)))
        return BatchBalance(list(shares.units), shares, shares, even, even.max_time / shares.max_time)
    prof = profile(model_or_numbers)
    opt = DataParallelOptions()
    if calibration is not None:
        opt.calibration = calibration
    opt.overlap_grad_sync = overlap_grad_sync
    shares = _balance_data_parallel(prof, cluster, ids, int(global_batch), opt)
    bal = evaluate_data_parallel(prof, cluster, ids, shares.units, opt)
    even = evaluate_data_parallel(prof, cluster, ids, even_units(int(global_batch), len(ids)), opt)
    return BatchBalance(list(shares.units), shares, bal, even, bal.throughput / even.throughput)


@dataclass(frozen=True)
class PipelineBalance:
    """Pipeline stages on mixed GPUs: memory-descending device order, balanced layer counts."""
    device_order: list
    layers: list
    balanced: PipelineEvaluation
    even: PipelineEvaluation  # even layer counts on the same device order
    speedup: float

    def __str__(self) -> str:
        return f"PipelineBalance(devices={self.device_order}, layers={self.layers}, speedup={self.speedup:.3f})"


def balance_pipeline(cluster: Cluster, model: ModelLike, devices: Optional[Sequence[int]] = None,
                     micro_batch: int = 1, num_micro: int = 8, calibration=None, replicas: int = 1) -> PipelineBalance:
    """Pipeline stages on mixed GPUs: devices memory-descending, ``replicas`` consecutive devices per stage
    (nested data parallelism), layer counts by Algorithm 1, scored by the 1F1B simulator."""
    prof = profile(model)
    opt = PipelineOptions()
    opt.micro_batch = int(micro_batch)
    opt.num_micro = int(num_micro)
    opt.replicas = int(replicas)
    if calibration is not None:
        opt.calibration = calibration
    bal = _balance_pipeline(prof, cluster, _devices(cluster, devices), opt)
    stages = len(bal.device_order) // opt.replicas
    even = evaluate_pipeline(prof, cluster, bal.device_order, even_layers(prof.num_layers, stages), opt)
    return PipelineBalance(list(bal.device_order), list(bal.layers), bal, even, bal.throughput / even.throughput)
