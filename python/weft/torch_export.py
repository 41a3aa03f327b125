"""Export a plan to torch-native code: DTensor placements and torch.distributed.pipelining schedules.

For people who run a weft plan with PyTorch's own engine instead of weft's executor:

- :func:`stage_meshes` -- per pipeline stage, the device mesh shape and its device ids (build one
  ``torch.distributed.device_mesh.DeviceMesh`` per stage from them);
- :func:`to_dtensor` -- per parameter, the ``torch.distributed.tensor`` placements (``Shard``,
  ``Replicate``, ``Partial``, ``_StridedShard``) on its stage's mesh, exact: every rank of
  ``distribute_tensor(x, mesh, placements)`` holds what weft's tile math gives its coordinate;
- :func:`dtensor_placements` / :func:`spec_from_dtensor` -- one :class:`weft.ShardingSpec` to
  placements and back (placement objects or their text);
- :func:`to_torch_schedule` -- the plan's pipeline schedule as ``_Action`` lists per pipeline
  rank, or the CSV that ``_PipelineScheduleRuntime._load_csv`` reads.

torch is imported inside the functions: ``import weft`` works without it. ``weft.Plan`` gets
``to_dtensor`` and ``to_torch_schedule`` as methods. See docs/modules/runtime_export.md.
"""
from __future__ import annotations

import csv
import functools
import io
import re
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ._weft import Plan, ShardingSpec
from .schedules import schedule as _make_schedule
from .sharding import mesh_coords

__all__ = ["StageMesh", "dtensor_placements", "spec_from_dtensor", "stage_meshes", "to_dtensor",
           "to_torch_schedule"]


class StageMesh(NamedTuple):
    """One pipeline stage's device mesh: its shape (with data parallelism, the replica axis
    first) and its device ids, row-major over the shape (weft device id = torch rank)."""

    shape: Tuple[int, ...]
    devices: Tuple[int, ...]

    def rank_grid(self) -> list:
        """The device ids as a nested list of the mesh's shape: ``DeviceMesh(device_type,
        stage_mesh.rank_grid())``."""
        grid: list = list(self.devices)
        for n in reversed(self.shape[1:]):
            grid = [grid[i:i + n] for i in range(0, len(grid), n)]
        return grid


def stage_meshes(plan: Plan) -> List[StageMesh]:
    """Per pipeline stage (index order), its mesh shape and device ids. The shape is the stage's
    full mesh, the one weft lowers to and :func:`to_dtensor` places parameters on: with
    ``plan.data_parallel > 1`` its first axis is the replica axis."""
    return [StageMesh(tuple(int(n) for n in s.mesh_shape), tuple(int(d) for d in s.devices))
            for s in plan.stages]


# ---- one spec <-> DTensor placements ----

_WORD = re.compile(r"\s*(Replicate\(\)|Shard\((\d+)\)|_StridedShard\(dim=(\d+), split_factor=(\d+)\)"
                   r"|Partial\('(sum|max)'\))\s*(,|$)")


def _placement_objects(text: str) -> list:
    """Placement objects from ShardingSpec.to_dtensor()'s text (its fixed format)."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        raise ValueError(f"unexpected DTensor text {text!r} from ShardingSpec.to_dtensor")
    out, pos, body = [], 0, body[1:-1]
    while pos < len(body):
        m = _WORD.match(body, pos)
        if m is None:
            raise ValueError(f"unexpected DTensor text {text!r} from ShardingSpec.to_dtensor")
        word, shard_dim, strided_dim, factor, reduce = m.group(1, 2, 3, 4, 5)
        if word == "Replicate()":
            out.append(Replicate())
        elif shard_dim is not None:
            out.append(Shard(int(shard_dim)))
        elif strided_dim is not None:
            out.append(_StridedShard(int(strided_dim), split_factor=int(factor)))
        else:
            out.append(Partial(reduce))
        pos = m.end()
    return out


def _placement_word(p, rank: int) -> str:
    """One torch placement as a word ShardingSpec.parse reads with DTensor's meaning."""
    from torch.distributed.tensor import Partial, Replicate, Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    # _StridedShard first: do not rely on whether a torch version derives it from Shard.
    if isinstance(p, _StridedShard):
        dim = p.dim + rank if p.dim < 0 else p.dim
        return f"_StridedShard(dim={dim}, split_factor={int(p.split_factor)})"
    if isinstance(p, Shard):
        return f"Shard({p.dim + rank if p.dim < 0 else p.dim})"
    if isinstance(p, Replicate):
        return "Replicate()"
    if isinstance(p, Partial):
        if p.reduce_op not in ("sum", "max"):
            raise ValueError(f"Partial({p.reduce_op!r}): weft's partial specs reduce by sum or max only")
        return f"Partial({p.reduce_op})"
    raise TypeError(f"not a DTensor placement: {p!r} ({type(p).__name__})")


def _dtensor_indices(words: Sequence[Tuple[int, int, int]], n: int, coord: Tuple[int, ...]) -> List[int]:
    """The indices of one dim of size n that torch gives the mesh coordinate `coord`, by torch's
    own split functions applied in mesh order. words: per mesh axis sharding this dim, in mesh
    order, (mesh axis, shards, split factor; 0 = plain Shard)."""
    import torch
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    piece = torch.arange(n)
    for axis, k, factor in words:
        p = _StridedShard(0, split_factor=factor) if factor else Shard(0)
        shards, _ = p._split_tensor(piece, k, with_padding=False, contiguous=True)
        piece = shards[coord[axis]] if coord[axis] < len(shards) else piece[:0]
    return piece.tolist()


def _shard_words(placements: Sequence, mesh: Sequence[int], rank: int) -> Tuple[Tuple[Tuple[int, int, int], ...], ...]:
    """Per tensor dim, the (mesh axis, shards, split factor or 0) of the placements splitting it."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    words: List[list] = [[] for _ in range(rank)]
    for a, p in enumerate(placements):
        if isinstance(p, _StridedShard):
            words[p.dim].append((a, int(mesh[a]), int(p.split_factor)))
        elif isinstance(p, Shard):
            words[p.dim].append((a, int(mesh[a]), 0))
    return tuple(tuple(w) for w in words)


@functools.lru_cache(maxsize=1024)
def _layout_differs(spec_text: str, shape: Tuple[int, ...], mesh: Tuple[int, ...], padding: bool,
                    words: Tuple[Tuple[Tuple[int, int, int], ...], ...]) -> Optional[str]:
    spec = ShardingSpec.parse(spec_text, list(shape), list(mesh), padding)
    for d, n in enumerate(shape):
        for c in mesh_coords(mesh):
            if spec.tile(list(c))[d].tolist() != _dtensor_indices(words[d], n, c):
                return f"dim {d} on mesh coordinate {c}"
    return None


def _mismatch(spec: ShardingSpec, placements: Sequence) -> Optional[str]:
    """Where DTensor's layout of `placements` differs from weft's tiles of `spec` (None: nowhere).
    Partial axes hold whole values in both (only the reduction differs), so only shards count."""
    shape = tuple(int(n) for n in spec.tensor_shape)
    mesh = tuple(int(n) for n in spec.mesh_shape)
    return _layout_differs(str(spec), shape, mesh, bool(spec.allow_padding),
                           _shard_words(placements, mesh, len(shape)))


def dtensor_placements(spec: ShardingSpec, name: str = "") -> list:
    """The torch placements of one spec, one per mesh axis (DTensor applies them in mesh order;
    a weft stride that is not DTensor's default nesting becomes ``_StridedShard``). Checked
    against torch's own splitting: ValueError (naming ``name`` when given) where DTensor cannot
    hold the same elements on every device, as for uneven dims split by several axes or strided."""
    what = f"parameter {name!r}: " if name else ""
    try:
        placements = _placement_objects(spec.to_dtensor())
    except ValueError as e:
        raise ValueError(f"{what}spec '{spec}' of shape {list(spec.tensor_shape)} on mesh "
                         f"{list(spec.mesh_shape)} has no DTensor placements: {e}") from None
    where = _mismatch(spec, placements)
    if where is not None:
        raise ValueError(f"{what}spec '{spec}' of shape {list(spec.tensor_shape)} on mesh {list(spec.mesh_shape)}: "
                         f"DTensor's {placements} would hold other elements ({where}); weft pads uneven dims "
                         f"before splitting, DTensor chunks them")
    return placements


def spec_from_dtensor(placements, tensor_shape: Sequence[int], mesh_shape: Sequence[int],
                      allow_padding: bool = False) -> ShardingSpec:
    """The weft spec holding the same elements as DTensor's ``placements`` on every device.

    ``placements``: torch placement objects (a DTensor's ``.placements``), or their text: the
    repr or str of such a list or tuple (``[Shard(dim=0), _StridedShard(dim=0, sf=2)]``,
    ``(S(0), R)``), or ShardingSpec.to_dtensor()'s. ValueError when weft cannot say the same,
    e.g. a _StridedShard whose shards are no single digit of the dim, or an uneven dim split by
    several axes (DTensor chunks it axis after axis, weft pads it first).
    """
    rank = len(tensor_shape)
    objects = None
    if isinstance(placements, str):
        text = placements
    else:
        objects = list(placements)
        text = "[" + ", ".join(_placement_word(p, rank) for p in objects) + "]"
    spec = ShardingSpec.parse(text, [int(n) for n in tensor_shape], [int(n) for n in mesh_shape], allow_padding)
    uneven = any(spec.padded_size(d) != n for d, n in enumerate(spec.tensor_shape))
    if uneven or objects is not None:
        # Text: ShardingSpec.parse reads plain Shard words of an uneven dim by weft's padding rule,
        # which is DTensor's only when the spec's own placements say so.
        if objects is not None:
            where = _mismatch(spec, objects)
        else:
            try:
                where = _mismatch(spec, dtensor_placements(spec))
            except ValueError:
                where = "an uneven dim split by several axes: DTensor chunks it axis after axis, weft pads it first"
        if where is not None:
            raise ValueError(f"DTensor placements {text} on shape {list(tensor_shape)}, mesh {list(mesh_shape)}: "
                             f"weft's spec '{spec}' would hold other elements ({where})")
    return spec


# ---- a plan's parameters ----

def _param_spec(plan: Plan, stage, param) -> ShardingSpec:
    mesh = [int(n) for n in stage.mesh_shape]
    shape = [int(n) for n in param.shape]
    text = param.spec.strip()
    # A spec with nothing past the replica axis is a fully replicated parameter.
    if not text or (plan.data_parallel > 1 and len(mesh) > 1 and text == "R"):
        return ShardingSpec.replicated(shape, mesh)
    try:
        return ShardingSpec.parse(text, shape, mesh)
    except ValueError:
        pass  # perhaps an uneven dim: the planner's specs may pad
    try:
        return ShardingSpec.parse(text, shape, mesh, True)
    except ValueError as e:
        raise ValueError(f"stage {stage.index}, parameter {param.name!r}: bad spec '{text}': {e}") from None


def _check_against_graph(plan: Plan, step) -> None:
    """The plan's parameters are the step graph's: same names and shapes, none missing."""
    held = {}
    for st in plan.stages:
        for p in st.params:
            t = step.find(p.name)
            if t is None:
                raise ValueError(f"stage {st.index}: the plan's parameter {p.name!r} is not in the step graph")
            shape = [int(n) for n in step.tensor(t)["shape"]]
            if shape != [int(n) for n in p.shape]:
                raise ValueError(f"stage {st.index}: parameter {p.name!r} has shape {list(p.shape)} in the plan, "
                                 f"{shape} in the step graph")
            held[p.name] = True
    missing = [t["name"] for t in step.tensors
               if t["role"] == "parameter" and t["producer"] is None and t["name"] not in held]
    if missing:
        raise ValueError(f"the step graph's parameters {missing} are on no stage of the plan: another graph's plan?")


def _mesh_ranks(device_mesh) -> Tuple[Tuple[int, ...], Tuple[int, ...]]:
    shape = tuple(int(n) for n in device_mesh.mesh.shape)
    ranks = tuple(int(r) for r in device_mesh.mesh.flatten().tolist())
    return shape, ranks


def to_dtensor(plan: Plan, step=None, device_mesh=None, *, stage: Optional[int] = None) -> Dict[str, list]:
    """Per parameter name, its torch.distributed.tensor placements on its stage's FULL mesh (with
    ``plan.data_parallel > 1`` the replica axis first, where every parameter is ``Replicate()``):
    ``distribute_tensor(w, stage_mesh, placements)`` gives each rank weft's tile of ``w``.

    ``step``: the training graph the plan was made for (optional); when given, the parameters are
    checked against it (names, shapes, none missing). ``stage``: only that pipeline stage's
    parameters. ``device_mesh``: a torch ``DeviceMesh`` for one stage: its shape must equal the
    stage's mesh shape; without ``stage``, the stage is the one whose devices are the mesh's ranks
    (weft device id = torch rank; ``stage_meshes`` lists them). Without ``stage`` and
    ``device_mesh``, every stage's parameters: in a pipeline each lives on its own stage's mesh;
    a parameter on several stages (a tied embedding) must have the same placements on each, else
    pass ``stage``. Raises ValueError when a spec has no exact DTensor equivalent (see
    :func:`dtensor_placements`) and for uneven tensor splits (``plan.split_fraction``)."""
    if list(plan.split_fraction):
        raise ValueError(f"the plan splits tensors unevenly (fractions {list(plan.split_fraction)}): DTensor's "
                         f"Shard splits evenly (torch.chunk)")
    if step is not None:
        _check_against_graph(plan, step)
    stages = list(plan.stages)
    if stage is not None:
        if not 0 <= stage < len(stages):
            raise ValueError(f"stage {stage} out of range: the plan has {len(stages)} stage(s)")
        stages = [stages[stage]]
    if device_mesh is not None:
        shape, ranks = _mesh_ranks(device_mesh)
        if stage is None and len(stages) > 1:
            match = [s for s in stages if tuple(s.devices) == ranks]
            if not match:
                raise ValueError(f"device_mesh ranks {list(ranks)} are no stage's devices "
                                 f"({[list(s.devices) for s in stages]}); pass stage=")
            stages = match
        want = tuple(int(n) for n in stages[0].mesh_shape)
        if shape != want:
            raise ValueError(f"device_mesh has shape {list(shape)}, stage {stages[0].index}'s mesh is {list(want)}"
                             + (" (replica axis first)" if plan.data_parallel > 1 else ""))
    out: Dict[str, list] = {}
    first_stage: Dict[str, int] = {}
    for st in stages:
        for p in st.params:
            placements = dtensor_placements(_param_spec(plan, st, p), name=p.name)
            if p.name in out and out[p.name] != placements:
                raise ValueError(f"parameter {p.name!r} is on stages {first_stage[p.name]} and {st.index} with "
                                 f"placements {out[p.name]} and {placements}; pass stage=")
            out.setdefault(p.name, placements)
            first_stage.setdefault(p.name, st.index)
    return out


# ---- the pipeline schedule ----

def _schedule_of(plan: Plan):
    """The plan's schedule (as C++ plan::schedule_of): plan stages = pipeline ranks; the
    interleaved schedules have plan.schedule_v virtual stages per rank, ZB-V and DualPipeV two in
    the V shape."""
    if plan.num_stages < 1 or plan.num_microbatches < 1:
        raise ValueError("the plan needs at least one stage and one micro-batch")
    return _make_schedule(plan.schedule, plan.num_stages, plan.num_microbatches, k=plan.schedule_k,
                          v=2 if plan.schedule in ("zbv", "dualpipev") else plan.schedule_v)


def _actions(plan: Plan) -> Dict[int, list]:
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    sched = _schedule_of(plan)
    # weft's B is the whole backward, or only the input gradient when W is split off (ZB-H1).
    kinds = {"F": _ComputationType.FORWARD, "W": _ComputationType.BACKWARD_WEIGHT,
             "B": _ComputationType.BACKWARD_INPUT if sched.split_backward else _ComputationType.FULL_BACKWARD}
    return {rank: [_Action(stage, kinds[kind], micro) for kind, stage, micro in ops]
            for rank, ops in enumerate(sched.order)}


def _csv_text(actions: Dict[int, list]) -> str:
    # What PipelineScheduleMulti._dump_csv writes for pipeline_order: one row per rank.
    buf = io.StringIO(newline="")
    writer = csv.writer(buf)
    for rank in sorted(actions):
        writer.writerow([str(a) for a in actions[rank]])
    return buf.getvalue()


def to_torch_schedule(plan: Plan, format: str = "actions", path=None):
    """The plan's pipeline schedule for torch.distributed.pipelining.

    ``format="actions"``: ``{pipeline rank: [_Action, ...]}`` in weft's order, the shape of a
    torch schedule's ``pipeline_order``. Pipeline rank r runs plan stage r (with data parallelism
    every replica runs the same schedule in its own pipeline group). Actions are ``F``, ``B``
    (full backward) or, when the schedule splits the backward (ZB-H1, zb_interleaved, ZB-V,
    DualPipeV), ``I`` (input gradient) and ``W`` (weight gradient); ``stage_index`` is the logical
    stage, which for the interleaved schedules is virtual stage c*ranks + r on rank r (torch's
    loop-style placement) and for ZB-V and DualPipeV stages r and 2*ranks-1-r on rank r (torch's
    "v" style; torch's loader infers the stage-to-rank mapping from the actions). DualPipeV comes
    out one action at a time: torch's OVERLAP_F_B pairs as their F then their backward, its whole
    backwards as I then W (the same computation; see docs/modules/runtime_export.md).
    ``format="csv"``: the CSV text ``_PipelineScheduleRuntime._load_csv(f, format="compute_only")``
    reads. ``path``: also write that CSV to the file."""
    if format not in ("actions", "csv"):
        raise ValueError(f"format must be 'actions' or 'csv' (got {format!r})")
    actions = _actions(plan)
    text = _csv_text(actions)
    if path is not None:
        with open(path, "w", newline="") as f:
            f.write(text)
    return actions if format == "actions" else text


Plan.to_dtensor = to_dtensor
Plan.to_torch_schedule = to_torch_schedule
