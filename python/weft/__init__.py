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
from ._weft import dtype_size

__all__ = ["dtype_size"]
# schedule / sim (pipeline schedules, simulator, Ada-Grouper)
from ._weft import BandwidthTrace, Candidate, LinkSpec, Schedule, StageModel, StageSpec, check_order
from .schedules import schedule
from .simulation import SimulationResult, simulate
from . import adagrouper
__all__ += ["BandwidthTrace", "Candidate", "LinkSpec", "Schedule", "StageModel", "StageSpec", "check_order",
            "schedule", "simulate", "SimulationResult", "adagrouper"]
__version__ = "0.1.0"
