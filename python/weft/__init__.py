"""weft: plans distributed training for a single-device model and executes its communication.

The C++ core lives in ``weft._weft``; this package adds the Pythonic layer around it.
"""
from __future__ import annotations

import sys as _sys

try:
    from . import _weft
except ImportError:  # a development build: _weft on sys.path (PYTHONPATH=python:build/<dir>/python)
    import _weft  # type: ignore[no-redef]

    _sys.modules[__name__ + "._weft"] = _weft
from ._weft import dtype_size, format_bytes, format_flops, format_seconds

__all__ = ["dtype_size", "format_bytes", "format_flops", "format_seconds"]
# schedule / sim (pipeline schedules, simulator, Ada-Grouper)
from ._weft import (BandwidthTrace, Candidate, PipelineLink, ReplicaCollectives, Schedule, StageModel, StageSpec,
                    check_order, links_from_cluster)
from .schedules import schedule
from .simulation import SimulationResult, simulate
from . import adagrouper
__all__ += ["BandwidthTrace", "Candidate", "PipelineLink", "ReplicaCollectives", "Schedule", "StageModel", "StageSpec",
            "check_order",
            "links_from_cluster", "schedule", "simulate", "SimulationResult", "adagrouper"]
# cluster / sharding / cost (cluster model, sharding specs and tile math, IR-free cost model)
from .cluster import AxisLink, Cluster, Device, DeviceMesh, DeviceSpec, MatmulEfficiency, NodeSpec, axis_links
from .sharding import (Placement, ReshardPlan, ReshardPlanner, ReshardStep, ShardingSpec, assemble, distribute,
                       enumerate_specs, propagate_reshape, reshard_on_mesh)
from .cost import Calibration, collective_time, compute_time, roofline
__all__ += ["AxisLink", "Cluster", "Device", "DeviceMesh", "DeviceSpec", "MatmulEfficiency", "NodeSpec", "axis_links", "Placement",
            "ReshardPlan", "ReshardPlanner", "ReshardStep", "ShardingSpec", "assemble", "distribute",
            "enumerate_specs", "propagate_reshape", "reshard_on_mesh", "Calibration", "collective_time",
            "compute_time", "roofline"]
# ir (graph builder, autodiff, JSON, reference interpreter); builder calls return Tensor handles
from ._weft import Graph, interpret
from .tensor import Tensor
from . import tensor as _tensor
_tensor.install()
__all__ += ["Graph", "interpret", "Tensor"]
# models (the model zoo: GPT, GShard MoE, Wide-ResNet, U-Net, VGG19, BERT)
from . import models
__all__ += ["models"]
# pipeline (layer grouping, submeshes, Alpa's stage DP, Rhino's stage ILP)
from . import pipeline
__all__ += ["pipeline"]
# hetero (heterogeneous load balancing: Whale's Algorithm 1, uneven DP/tensor/pipeline splits)
from . import hetero
__all__ += ["hetero"]
# spmd (SPMD / intra-operator strategy search: ILP on CBC, O2 segments, O3 whole graph)
from . import spmd
from .spmd import SpmdResult, spmd_search
__all__ += ["spmd", "SpmdResult", "spmd_search"]
# plan (the planner: weft.plan(model, cluster) -> Plan; Megatron-style baseline)
from .planning import (Plan, adaptive_policy, calibrated_cluster, data_parallel_plan, layout_plan,
                       load_calibration, megatron_plan, megatron_specs, plan, split_plan)
from ._weft import AdaptivePolicy, AdaptiveWindow  # noqa: E402 (Plan.adaptive: Ada-Grouper under a trace)
from ._weft import ZeroMemory, ZeroTraffic, zero_memory, zero_traffic  # noqa: E402 (ZeRO's closed forms)
__all__ += ["Plan", "plan", "megatron_plan", "megatron_specs", "data_parallel_plan", "split_plan", "layout_plan", "calibrated_cluster",
            "load_calibration", "adaptive_policy", "AdaptivePolicy", "AdaptiveWindow", "ZeroMemory", "ZeroTraffic",
            "zero_memory", "zero_traffic"]
# reshard / exec (cross-mesh resharding planner and the CPU reference executor)
from . import reshard
__all__ += ["reshard"]
# lower / execute (per-rank programs of a plan, run on the CPU executor against the one-device reference)
from .execution import (ExecutionResult, Program, execute, execute_reference, lower, lower_adaptive, lower_random,
                        lower_spmd)
__all__ += ["ExecutionResult", "Program", "execute", "execute_reference", "lower", "lower_adaptive", "lower_random",
            "lower_spmd"]
__version__ = "0.1.0"
from .calibration import CalibrationReport, calibrate  # noqa: E402 (measurements -> Calibration JSON; torch imported lazily)
__all__ += ["CalibrationReport", "calibrate"]
from . import torch_export  # noqa: E402 (DTensor placements / torch pipelining schedules of a plan: Plan.to_dtensor, Plan.to_torch_schedule; torch imported lazily)
__all__ += ["torch_export"]
# runtime (plans on torch.distributed: one process per device; torch imported when a run starts)
from .runtime import run
__all__ += ["run"]
from .frontend import feeds_from_torch, from_torch  # noqa: E402 (PyTorch nn.Module -> weft.Graph via torch.export; torch imported lazily)
__all__ += ["from_torch", "feeds_from_torch"]
# the values a model carries (parameters, buffers, constants): weft.load_values, Graph.save / Graph.load
from .values import load_values  # noqa: E402
from . import values as _values
_values.install()
__all__ += ["load_values"]
# training the user's module in the user's loop (weft.Trainer; torch imported when one is made)
from . import training  # noqa: E402
from .training import distributed, launch, optim  # noqa: E402
__all__ += ["Trainer", "training", "distributed", "launch", "optim"]


def __getattr__(name):
    if name == "Trainer":
        from .training.trainer import Trainer

        return Trainer
    raise AttributeError(f"module 'weft' has no attribute {name!r}")


# notebook displays (_repr_html_ of Plan, Graph, Cluster, DeviceMesh, ShardingSpec, Program, ExecutionResult)
from . import display as _display
_display.install()
# figures (Plan.show, ShardingSpec.show, SimulationResult.plot_gantt: Figure objects, backend untouched)
from . import plots as _plots
_plots.install()
# docstrings with units on the C++ classes' properties (weft._docs); the `weft` logger (weft.log)
from . import _docs
_docs.install()
from . import log
__all__ += ["log"]
