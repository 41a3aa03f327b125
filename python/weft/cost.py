"""IR-independent cost model: roofline compute time, α-β collectives, calibration.

>>> import weft
>>> dev = weft.Cluster.preset("M8").device(0)
>>> round(weft.compute_time(2 * 4096**3, 0, "f16", dev) * 1e3, 3)  # ms
1.1
"""
from __future__ import annotations

from ._weft import Calibration, collective_time, compute_time, roofline

__all__ = ["Calibration", "collective_time", "compute_time", "roofline"]
