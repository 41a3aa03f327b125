"""Cluster model: presets, heterogeneous clusters, device meshes and per-axis α-β.

>>> import weft
>>> c = weft.Cluster.preset("M8", nodes=2)
>>> mesh = weft.DeviceMesh.iota([2, 8])
>>> [round(l.beta * 1e12, 3) for l in mesh.axis_links(c)]  # ps/byte per axis
[640.0, 7.692]
"""
from __future__ import annotations

from functools import reduce

from ._weft import AxisLink, Cluster, Device, DeviceMesh, DeviceSpec, MatmulEfficiency, NodeSpec, axis_links

__all__ = ["AxisLink", "Cluster", "Device", "DeviceMesh", "DeviceSpec", "MatmulEfficiency", "NodeSpec", "axis_links", "concat"]


def concat(*clusters: Cluster) -> Cluster:
    """Joins clusters node by node, e.g. ``concat(Cluster.preset("M8", 4), Cluster.preset("P100", 2))``."""
    if not clusters:
        raise ValueError("concat needs at least one cluster")
    return reduce(Cluster.concat, clusters)
