"""Tile index math of the torch runtime, on numpy: where each element of a rank's tile sits in the
global tensor (from exec::ProgramLayout's per-dim global indices), and the gather / scatter maps
a collective or a transfer needs, computed once per instruction and cached across steps."""
from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import numpy as np


def row_major_strides(shape: Sequence[int]) -> np.ndarray:
    st = np.ones(len(shape), dtype=np.int64)
    for i in range(len(shape) - 2, -1, -1):
        st[i] = st[i + 1] * int(shape[i + 1])
    return st


def flat_global(tile: dict, shape: Sequence[int], offset0: int = 0) -> np.ndarray:
    """Row-major global index of every local element of ``tile`` (local row-major order); dim 0
    shifted by ``offset0`` rows (a micro-batch's samples in the global batch)."""
    glob = tile["global"]
    if not glob:
        return np.zeros(1, dtype=np.int64)
    st = row_major_strides(shape)
    out = np.zeros([len(g) for g in glob], dtype=np.int64)
    for d, g in enumerate(glob):
        idx = (np.asarray(g, dtype=np.int64) + (offset0 if d == 0 else 0)) * st[d]
        out += idx.reshape([-1 if k == d else 1 for k in range(len(glob))])
    return out.reshape(-1)


def local_offsets(tile: dict, region: Sequence[Sequence[int]]) -> np.ndarray:
    """Offsets in the tile (local row-major) of a transfer's region, the region's elements in
    row-major order. The region: per dim, flattened sorted [begin, end) intervals of global indices."""
    glob = tile["global"]
    if len(region) != len(glob):
        raise ValueError(f"a region of {len(region)} dims on a tile of {len(glob)}")
    per_dim: List[np.ndarray] = []
    for d, (g, iv) in enumerate(zip(glob, region)):
        g = np.asarray(g, dtype=np.int64)
        want = np.concatenate([np.arange(iv[k], iv[k + 1], dtype=np.int64) for k in range(0, len(iv), 2)]) \
            if len(iv) else np.zeros(0, dtype=np.int64)
        order = np.argsort(g)
        pos = np.searchsorted(g, want, sorter=order)
        ok = (pos < len(g)) & (g[order[np.minimum(pos, len(g) - 1)]] == want) if len(g) else np.zeros(len(want), bool)
        if not np.all(ok):
            raise ValueError(f"element {int(want[~ok][0])} of dim {d} of the region is not in this rank's tile")
        per_dim.append(order[pos])
    if not per_dim:
        return np.zeros(1, dtype=np.int64)
    st = row_major_strides([len(g) for g in glob])
    out = np.zeros([len(p) for p in per_dim], dtype=np.int64)
    for d, p in enumerate(per_dim):
        out += (p * st[d]).reshape([-1 if k == d else 1 for k in range(len(per_dim))])
    return out.reshape(-1)


def holder_map(flats: Sequence[np.ndarray], numel: int) -> Tuple[np.ndarray, np.ndarray]:
    """For each global element: the first member (in the given order) whose tile holds it and the
    element's offset in that tile; -1 where no member holds it."""
    who = np.full(numel, -1, dtype=np.int64)
    where = np.full(numel, -1, dtype=np.int64)
    for m in range(len(flats) - 1, -1, -1):  # the first member wins: written last
        who[flats[m]] = m
        where[flats[m]] = np.arange(len(flats[m]), dtype=np.int64)
    return who, where


def positions_in(flat: np.ndarray, numel: int) -> np.ndarray:
    """Global element -> its offset in a tile with these global indices (-1 where not held)."""
    pos = np.full(numel, -1, dtype=np.int64)
    pos[flat] = np.arange(len(flat), dtype=np.int64)
    return pos


def assemble(shape: Sequence[int], pieces: Sequence[Tuple[np.ndarray, np.ndarray, int]], reduce: str = "sum"
             ) -> np.ndarray:
    """The global value from tiles: pieces = (global flat indices, values, partial term index); each
    element from the first piece of a term that holds it, summed (or maxed) over the terms."""
    numel = int(np.prod(shape)) if len(shape) else 1
    terms: Dict[int, Tuple[np.ndarray, np.ndarray]] = {}
    for flat, vals, part in pieces:
        acc, seen = terms.setdefault(part, (np.zeros(numel), np.zeros(numel, dtype=bool)))
        new = ~seen[flat]
        acc[flat[new]] = np.asarray(vals, dtype=np.float64).reshape(-1)[new]
        seen[flat] = True
    if not terms:
        return np.zeros(shape)
    parts = [terms[k][0] for k in sorted(terms)]
    out = np.maximum.reduce(parts) if reduce == "max" else np.sum(parts, axis=0)
    return out.reshape(shape)
