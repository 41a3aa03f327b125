"""weft.Trainer checkpoints through torch.distributed.checkpoint (DCP), in torch's key layout.

    trainer.save("ckpt/step-1000", extra={"data_position": 1000})   # every rank: a collective
    extra = trainer.load("ckpt/step-1000")                           # any plan, any world size

Keys (one flat DCP state dict; DCP's own flattening of ``{"model": ..., "optim": ...}`` gives
the same names, so plain torch reads it with ``dcp.load({"model": model.state_dict()}, ...)``):

- ``model.<key>``: every key of ``model.state_dict()`` -- the trained parameters (tied aliases
  included, each under every name the module gives it) and the module's persistent buffers;
- ``optim.state.<fqn>.<name>``: the optimizer state of parameter ``fqn`` (the module's first
  name of it, as ``torch.distributed.checkpoint.state_dict.get_optimizer_state_dict`` keys it),
  with torch's names: Adam / AdamW ``exp_avg``, ``exp_avg_sq``, ``step`` (a float32 scalar, the
  bias-correction count); SGD ``momentum_buffer``; mixed precision's float32 master copy
  ``master`` (weft's own: torch keeps none);
- ``weft.steps_done``, ``weft.optimizer_steps`` (int64 scalars), ``weft.extra`` (the user's dict,
  pickled, a bytes entry of DCP).

Each parameter / state is saved from the rank's tile of its buffer (the one of
``program.parameter_ids``, on its pipeline stage): as a DTensor on a DeviceMesh of the rank's
stage with weft's placements (:func:`weft.torch_export.dtensor_placements`) where DTensor's chunk
for the rank's mesh coordinate is exactly the rank's tile, otherwise (strided tiles, uneven
splits DTensor chunks otherwise) as :class:`TileChunks`, an object of DCP's chunk-list protocol
(``__create_write_items__`` / ``__create_chunk_list__`` / ``__get_tensor_shard__``): one chunk per
box of contiguous index runs. Replicas write the same chunks; DCP's planner keeps one writer.
Loading builds the same objects for the loading trainer's tiles (its plan, its world size) and
DCP's load planner reads the overlaps of saved and wanted chunks into them.
"""
from __future__ import annotations

import itertools
import os
import pickle
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, MetadataIndex,
                                                   TensorProperties, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

__all__ = ["TileChunks", "save", "load", "state_keys"]

# weft's optimizer-state tensor names (prefix:<param>) -> torch's state names.
STATE_NAMES = {"adam_m": "exp_avg", "adam_v": "exp_avg_sq", "sgd_momentum": "momentum_buffer", "master": "master"}
_ROLES = ("parameter", "optimizer_state")


# ---- a tile as DCP chunks

def _runs(idx: np.ndarray) -> List[Tuple[int, int, int]]:
    """(local start, global start, length) of each maximal run of consecutive global indices."""
    idx = np.asarray(idx, dtype=np.int64).reshape(-1)
    if idx.size == 0:
        return []
    cuts = np.flatnonzero(np.diff(idx) != 1) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [idx.size]])
    return [(int(s), int(idx[s]), int(e - s)) for s, e in zip(starts, ends)]


class TileChunks:
    """A rank's tile of a tensor as DCP chunks: one per box of contiguous index runs (a block
    tile is one box; a strided tile one box per run of each dim). ``local`` is the tile (local
    shape, row-major over its global index lists ``glob``); the chunks are views of it, so a load
    writes into it. Implements DCP's chunk-list protocol; :class:`SavePlanner` / :class:`LoadPlanner`
    look its chunks up (DCP's defaults look up torch.Tensor objects only)."""

    def __init__(self, local: torch.Tensor, glob, shape):
        self.local = local
        self.shape = torch.Size(int(n) for n in shape)
        per_dim = [_runs(g) for g in glob]
        self.boxes: Dict[Tuple[int, ...], Tuple[Tuple[int, ...], Tuple[int, ...]]] = {}
        for combo in itertools.product(*per_dim):
            offsets = tuple(r[1] for r in combo)
            self.boxes[offsets] = (tuple(r[0] for r in combo), tuple(r[2] for r in combo))

    def size(self) -> torch.Size:
        """The global shape (DCP's load planner checks it against the checkpoint's)."""
        return self.shape

    def _view(self, offsets) -> torch.Tensor:
        starts, lengths = self.boxes[tuple(offsets)]
        v = self.local
        for d, (s, n) in enumerate(zip(starts, lengths)):
            v = v.narrow(d, s, n)
        return v

    def __create_chunk_list__(self) -> List[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(self.boxes[o][1])) for o in self.boxes]

    def __create_write_items__(self, fqn: str, obj: Any) -> List[WriteItem]:
        props = TensorProperties.create_from_tensor(self.local)
        return [WriteItem(index=MetadataIndex(fqn, torch.Size(o)), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(offsets=torch.Size(o),
                                                                                 sizes=torch.Size(self.boxes[o][1])),
                                                      properties=props, size=self.shape))
                for o in self.boxes]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        off = tuple(index.offset) if index.offset is not None else (0,) * len(self.shape)
        if off not in self.boxes:
            raise ValueError(f"{index.fqn}: this rank holds no chunk at offset {list(off)}")
        return self._view(off)


class SavePlanner(DefaultSavePlanner):
    """DCP's default planner, with :class:`TileChunks` values (their chunks written contiguous)."""

    def lookup_object(self, index: MetadataIndex) -> Any:
        """The data of one write item: a TileChunks chunk (contiguous), else DCP's lookup."""
        obj = self.state_dict.get(index.fqn)
        if isinstance(obj, TileChunks):
            return obj.__get_tensor_shard__(index).contiguous()
        return super().lookup_object(index)


class LoadPlanner(DefaultLoadPlanner):
    """DCP's default planner, reading into :class:`TileChunks` values (views of the tiles).
    (DCP's set-up maps values it does not know to None: they are set aside meanwhile; the
    values are top-level keys of a flat dict, the same keys after DCP's flattening.)"""

    def set_up_planner(self, state_dict, metadata=None, is_coordinator: bool = False) -> None:
        """DCP's set-up, TileChunks values kept."""
        held = {k: v for k, v in state_dict.items() if isinstance(v, TileChunks)}
        for k, v in held.items():
            state_dict[k] = v.local
        super().set_up_planner(state_dict, metadata, is_coordinator)
        for k, v in held.items():
            state_dict[k] = v
            self.state_dict[k] = v

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        """Where one read item goes: a view of a TileChunks tile, else DCP's lookup."""
        obj = self.state_dict.get(index.fqn)
        if isinstance(obj, TileChunks):
            return obj.__get_tensor_shard__(index)
        return super().lookup_tensor(index)


# ---- the trainer's state as keys

def _canonical_names(model) -> Tuple[Dict[str, str], List[str]]:
    """(state_dict key -> the module's first name of that parameter, the module's buffer keys)."""
    first: Dict[int, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        first.setdefault(id(p), n)
    keys, buffers = {}, []
    for k, v in model.state_dict(keep_vars=True).items():
        if id(v) in first:
            keys[k] = first[id(v)]
        else:
            buffers.append(k)
    return keys, buffers


def _state_key(tensor_name: str) -> Optional[str]:
    """The DCP key of a weft parameter / optimizer-state tensor name (None: not a known state)."""
    prefix, sep, param = tensor_name.partition(":")
    if not sep:
        return f"model.{tensor_name}"
    name = STATE_NAMES.get(prefix)
    return None if name is None else f"optim.state.{param}.{name}"


def state_keys(trainer) -> Dict[str, dict]:
    """Every key this trainer saves and loads: key -> {"shape", "kind": "param" | "state" | "step" |
    "buffer" | "scalar" | "extra", "name": weft tensor name (param / state)}."""
    prog = trainer.program
    aliases, buffers = _canonical_names(trainer.model)
    own = trainer.model.state_dict()
    out: Dict[str, dict] = {}
    names = {}
    for b in prog.leaf_buffer_ids:
        buf = trainer.engine.buffers[b]
        t = trainer.engine.tensors[buf["tensor_id"]]
        if t["role"] in _ROLES:
            names.setdefault(t["name"], list(buf["shape"]))
    by_param: Dict[str, List[str]] = {}
    for k, canon in aliases.items():
        by_param.setdefault(canon, []).append(k)
    for n, shape in names.items():
        key = _state_key(n)
        if key is None:
            key = f"weft.state.{n}"
        if key.startswith("model."):
            for k in by_param.get(n, [n]):
                out[f"model.{k}"] = {"shape": shape, "kind": "param", "name": n}
        else:
            out[key] = {"shape": shape, "kind": "state", "name": n}
            if n.startswith("adam_m:"):
                out[f"optim.state.{n.partition(':')[2]}.step"] = {"shape": [], "kind": "step", "name": None}
    for k in buffers:
        out[f"model.{k}"] = {"shape": list(own[k].shape), "kind": "buffer", "name": None}
    out["weft.steps_done"] = {"shape": [], "kind": "scalar", "name": None}
    out["weft.optimizer_steps"] = {"shape": [], "kind": "scalar", "name": None}
    out["weft.extra"] = {"shape": None, "kind": "extra", "name": None}
    return out


class _Meshes:
    """One DeviceMesh per pipeline stage of the program (ranks laid out by their coordinates),
    without process groups: DCP needs a mesh's coordinates only, its collectives use the default
    group (building groups would be a collective over the world at every save)."""

    def __init__(self, program):
        from torch.distributed.device_mesh import DeviceMesh

        self.shapes: Dict[int, Tuple[int, ...]] = {}
        self.meshes: Dict[int, Any] = {}
        by_stage: Dict[int, List[Tuple[Tuple[int, ...], int]]] = {}
        for r, info in enumerate(program.ranks):
            by_stage.setdefault(int(info["stage"]), []).append((tuple(int(c) for c in info["coord"]), r))
        for s, members in by_stage.items():
            shape = tuple(max(c[a] for c, _ in members) + 1 for a in range(len(members[0][0])))
            grid = torch.full(shape, -1, dtype=torch.int)
            for c, r in members:
                grid[c] = r
            self.shapes[s] = shape
            if shape and int((grid >= 0).sum()) == len(members) == grid.numel():
                try:
                    self.meshes[s] = DeviceMesh("cpu", grid, _init_backend=False)
                except Exception:  # noqa: BLE001 - no mesh: the stage's tiles are written as TileChunks
                    pass


def _placements(spec_text: str, shape, mesh_shape):
    """DTensor placements of a weft spec on its stage mesh, or None where DTensor has none."""
    from .._weft import ShardingSpec
    from ..torch_export import dtensor_placements

    for padding in (False, True):
        try:
            spec = ShardingSpec.parse(spec_text, [int(n) for n in shape], [int(n) for n in mesh_shape], padding)
            return dtensor_placements(spec)
        except Exception:  # noqa: BLE001 - no placements: the chunk-list form holds it
            continue
    return None


def _tile_object(trainer, meshes: _Meshes, b: int, local: torch.Tensor, stats: Optional[dict] = None):
    """The rank's tile of buffer b as a DTensor (where DTensor's chunk is the tile) or TileChunks."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    buf = trainer.engine.buffers[b]
    shape = [int(n) for n in buf["shape"]]
    glob = [np.asarray(g, dtype=np.int64) for g in trainer.layout.tile(b, trainer.rank)["global"]]
    stage = int(buf["stage"])
    mesh = meshes.meshes.get(stage)
    if mesh is not None and shape:
        placements = _placements(buf["spec"], shape, meshes.shapes[stage])
        runs = [_runs(g) for g in glob]
        if placements is not None and all(len(r) == 1 for r in runs):
            sizes, offsets = compute_local_shape_and_global_offset(torch.Size(shape), mesh, placements)
            if (list(sizes) == [r[0][2] for r in runs] and list(offsets) == [r[0][1] for r in runs]):
                if stats is not None:
                    stats["dtensor"] = stats.get("dtensor", 0) + 1
                stride = torch.empty(shape, device="meta").stride()
                return DTensor.from_local(local, mesh, placements, run_check=False, shape=torch.Size(shape),
                                          stride=stride)
    if stats is not None:
        stats["chunks"] = stats.get("chunks", 0) + 1
    return TileChunks(local, glob, shape)


def _my_buffers(trainer) -> Dict[str, List[int]]:
    """weft tensor name -> this rank's leaf buffers of it (parameters and optimizer states)."""
    prog = trainer.program
    stage = trainer.engine.info["stage"]
    out: Dict[str, List[int]] = {}
    for b in prog.leaf_buffer_ids:
        buf = trainer.engine.buffers[b]
        if buf["stage"] != stage:
            continue
        t = trainer.engine.tensors[buf["tensor_id"]]
        if t["role"] in _ROLES:
            out.setdefault(t["name"], []).append(b)
    return out


def _primary(trainer) -> Dict[str, int]:
    """weft tensor name -> the buffer whose tiles are saved (parameter_ids' for a parameter held
    on several stages, as a tied weight is; else the leaf buffer of lowest id)."""
    prog = trainer.program
    out: Dict[str, int] = {}
    for b in sorted(prog.leaf_buffer_ids):
        buf = trainer.engine.buffers[b]
        t = trainer.engine.tensors[buf["tensor_id"]]
        if t["role"] in _ROLES:
            out.setdefault(t["name"], b)
    out.update(prog.parameter_ids)
    return out


def _state_dict(trainer, for_load: bool, stats: Optional[dict] = None) -> Dict[str, Any]:
    eng = trainer.engine
    keys = state_keys(trainer)
    meshes = getattr(trainer, "_checkpoint_mesh_cache", None)
    if meshes is None:
        meshes = trainer._checkpoint_mesh_cache = _Meshes(trainer.program)
    mine = _my_buffers(trainer)
    primary = _primary(trainer)
    sd: Dict[str, Any] = {}
    tiles: Dict[str, torch.Tensor] = {}
    keys_of: Dict[str, List[str]] = {}
    for k, info in keys.items():
        if info["name"] is not None:
            keys_of.setdefault(info["name"], []).append(k)
    for n, bs in mine.items():
        b = primary[n] if primary.get(n) in bs else bs[0]
        if not for_load and primary.get(n) not in bs:
            continue  # a copy on another stage (a tied weight's): its primary's stage writes it
        if for_load:
            local = torch.empty(tuple(eng.local_shape(b)), dtype=eng.dtype_of(b), device="cpu")
        else:
            local = eng.read(b).detach().to("cpu")
        tiles[n] = local
        obj = _tile_object(trainer, meshes, b, local, stats)
        for k in keys_of.get(n, ()):
            sd[k] = obj
    steps = eng.optimizer_steps
    own = trainer.model.state_dict() if not for_load else {}
    for k, info in keys.items():
        if info["kind"] == "step" and (not for_load):
            param = k[len("optim.state."):-len(".step")]
            if f"adam_m:{param}" in tiles:
                sd[k] = torch.tensor(float(steps), dtype=torch.float32)
        elif info["kind"] == "buffer" and not for_load:
            sd[k] = own[k[len("model."):]].detach().to("cpu")
    sd["weft.steps_done"] = torch.tensor(trainer.steps_done if not for_load else 0, dtype=torch.int64)
    sd["weft.optimizer_steps"] = torch.tensor(steps if not for_load else 0, dtype=torch.int64)
    sd["_tiles"] = tiles
    return sd


def save(trainer, path: str, extra: Optional[dict] = None) -> None:
    """Writes the trainer's state to directory ``path`` (a collective: every rank calls it)."""
    if extra is not None and not isinstance(extra, dict):
        raise TypeError(f"save: extra must be a dict or None, got {type(extra).__name__}")
    eng = trainer.engine
    if not eng.states_filled:  # before the first step: its leaves as that step fills them (the module's values)
        eng.begin_step(trainer.steps_done + 1, fill_states=True)
        eng.states_filled = True
    stats: dict = {}
    sd = _state_dict(trainer, for_load=False, stats=stats)
    sd.pop("_tiles")
    # bytes (a leaf of DCP's flattening; a dict is not): the user's dict and the f16 loss scaler's state
    scaler = trainer.scaler.state_dict() if getattr(trainer, "scaler", None) is not None else None
    sd["weft.extra"] = pickle.dumps({"extra": dict(extra or {}), "loss_scaler": scaler})
    os.makedirs(path, exist_ok=True)
    dcp.save(sd, checkpoint_id=path, planner=SavePlanner())
    trainer._checkpoint_stats = stats


def _check(trainer, path: str) -> Dict[str, Any]:
    """The checkpoint's metadata, checked against this trainer's keys: ValueError naming the
    first missing, unexpected or differently shaped tensor."""
    if not os.path.isdir(path) or not os.path.exists(os.path.join(path, ".metadata")):
        raise ValueError(f"load: {path!r} is no DCP checkpoint (no .metadata file)")
    md = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    keys = state_keys(trainer)
    missing = [k for k, i in keys.items() if k not in md and i["kind"] not in ("buffer",)]
    if missing:
        raise ValueError(f"load: the checkpoint {path!r} lacks {missing[0]!r}"
                         + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
                         + ": saved from another model or optimizer")
    extra = [k for k in md if k not in keys and not k.startswith("optim.param_groups")]
    if extra:
        raise ValueError(f"load: the checkpoint {path!r} has {extra[0]!r}"
                         + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else "")
                         + ", which this model / optimizer does not: saved from another model")
    for k, info in keys.items():
        m = md.get(k)
        if m is None or info["shape"] is None:
            continue
        if not isinstance(m, TensorStorageMetadata):
            raise ValueError(f"load: {k!r} is no tensor in the checkpoint {path!r}")
        if list(m.size) != list(info["shape"]):
            raise ValueError(f"load: {k!r} has shape {list(m.size)} in the checkpoint {path!r}, "
                             f"{list(info['shape'])} in this model")
    if not isinstance(md.get("weft.extra"), BytesStorageMetadata):
        raise ValueError(f"load: 'weft.extra' is no bytes entry in the checkpoint {path!r}")
    return md


def load(trainer, path: str) -> dict:
    """Reads ``path`` into the trainer's tiles (any plan, any world size; a collective). Returns
    the ``extra`` dict given to save."""
    _check(trainer, path)
    stats: dict = {}
    sd = _state_dict(trainer, for_load=True, stats=stats)
    tiles = sd.pop("_tiles")
    # Buffers of the module are constants of the graph: not read back.
    sd["weft.extra"] = b""
    dcp.load(sd, checkpoint_id=path, planner=LoadPlanner())
    eng = trainer.engine
    mine = _my_buffers(trainer)
    for n, bs in mine.items():
        v = tiles[n].to(trainer.device)
        for b in bs:
            eng.write(b, v.clone() if len(bs) > 1 else v)
    eng.states_filled = True
    trainer._checkpoint_stats = stats
    eng.optimizer_steps = int(sd["weft.optimizer_steps"])
    trainer.steps_done = int(sd["weft.steps_done"])
    saved = pickle.loads(sd["weft.extra"])
    if getattr(trainer, "scaler", None) is not None and saved.get("loss_scaler"):
        trainer.scaler.load_state_dict(saved["loss_scaler"])  # the scale and its growth count resume
    return saved["extra"]
