"""Sharding specs on a device mesh, exact tile math, resharding plans.

A spec has one placement per mesh axis, written ``S(dim)``, ``S(dim,stride)``, ``R``, ``P(sum)``
or ``P(max)``; see docs/modules/sharding.md for the stride convention.

>>> import numpy as np, weft
>>> s = weft.ShardingSpec.parse("S(1)", [4, 2], [2])
>>> out, why = weft.propagate_reshape(s, [8])
>>> str(out)
'S(0,1)'
>>> x = np.arange(8.0)
>>> locs = distribute(x, out)
>>> locs[(1,)].tolist()
[1.0, 3.0, 5.0, 7.0]
"""
from __future__ import annotations

import itertools
from typing import Dict, Optional, Sequence, Tuple

import numpy as np

from ._weft import (
    Placement,
    ReshardPlan,
    ReshardPlanner,
    ReshardStep,
    ShardingSpec,
    enumerate_specs,
    propagate_reshape,
)

__all__ = [
    "Placement",
    "ReshardPlan",
    "ReshardPlanner",
    "ReshardStep",
    "ShardingSpec",
    "assemble",
    "distribute",
    "enumerate_specs",
    "mesh_coords",
    "propagate_reshape",
    "reshard_on_mesh",
]


def mesh_coords(mesh_shape: Sequence[int]):
    """All mesh coordinates in row-major order, as tuples."""
    return list(itertools.product(*[range(int(n)) for n in mesh_shape]))


def distribute(x: np.ndarray, spec: ShardingSpec, seed: int = 0) -> Dict[Tuple[int, ...], np.ndarray]:
    """Local arrays of every device under ``spec``. Partial axes get random terms that reduce
    (sum or max) to ``x``: term 0 of a max keeps the value, the others are smaller."""
    x = np.asarray(x)
    if list(x.shape) != list(spec.tensor_shape):
        raise ValueError(f"array shape {x.shape} != spec tensor shape {spec.tensor_shape}")
    rng = np.random.default_rng(seed)
    count = spec.partial_count()
    terms = None
    if count > 1 and spec.reduce == "sum":
        pieces = rng.standard_normal((count - 1,) + x.shape)
        terms = list(pieces) + [x - pieces.sum(axis=0)]
    elif count > 1:
        terms = [x] + [x - 1.0 - np.abs(rng.standard_normal(x.shape)) for _ in range(count - 1)]
    out = {}
    for c in mesh_coords(spec.mesh_shape):
        src = terms[spec.partial_index(list(c))] if terms is not None else x
        out[c] = src[np.ix_(*spec.tile(list(c)))] if spec.rank else src.copy()
    return out


def assemble(local: Dict[Tuple[int, ...], np.ndarray], spec: ShardingSpec) -> np.ndarray:
    """The global array from local arrays (reducing partial terms); raises if replicas disagree."""
    shape = tuple(spec.tensor_shape)
    red = spec.reduce
    acc: Optional[np.ndarray] = None
    seen = {}
    for c in mesh_coords(spec.mesh_shape):
        idx = spec.tile(list(c))
        pi = spec.partial_index(list(c))
        if pi not in seen:
            seen[pi] = np.full(shape, np.nan)
        part = seen[pi]
        view = part[np.ix_(*idx)]
        block = np.asarray(local[c])
        if list(block.shape) != [len(i) for i in idx]:
            raise ValueError(f"device {c}: local shape {block.shape} != {[len(i) for i in idx]}")
        if np.any(~np.isnan(view) & (view != block)):
            raise ValueError(f"device {c}: replica disagrees with another device")
        part[np.ix_(*idx)] = block
    for part in seen.values():
        if np.isnan(part).any():
            raise ValueError("some element is held by no device")
        if acc is None:
            acc = part.copy()
        elif red == "max":
            acc = np.maximum(acc, part)
        else:
            acc = acc + part
    assert acc is not None
    return acc


def reshard_on_mesh(src: ShardingSpec, dst: ShardingSpec, cluster=None, mesh=None, links=None,
                    dtype: str = "f32") -> ReshardPlan:
    """The cheapest collective sequence from ``src`` to ``dst`` on one mesh. Give either
    ``links`` (one AxisLink per mesh axis) or ``cluster`` and ``mesh`` (a DeviceMesh)."""
    if links is None:
        if cluster is None or mesh is None:
            raise ValueError("reshard_on_mesh needs links=, or cluster= and mesh=")
        links = mesh.axis_links(cluster)
    return ReshardPlanner(list(links), dtype).plan(src, dst)
