"""weft.torch_export against torch itself: DTensor's distribute_tensor on a 4-process gloo mesh
must give every rank weft's tile, torch's schedule runtime must load the exported schedules."""
import json
import math
import socket
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import weft  # noqa: E402
from weft import torch_export  # noqa: E402

WORLD = 4
DISTRIBUTE_TIMEOUT_S = 60


@pytest.fixture(scope="module")
def cluster():
    return weft.Cluster.preset("p3.8xlarge")


@pytest.fixture(scope="module")
def tiny():
    return weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8)


@pytest.fixture(scope="module")
def plans(cluster, tiny):
    """The tiny GPT on 4 devices (the planner replicates its parameters: too small to split), and
    a GPT large enough for the planner to split weights (S(0), S(1) from the SPMD search)."""
    wide = weft.models.gpt(layers=2, hidden=512, heads=8, seq=128, vocab=512, batch=8)
    return {
        "tiny t=4": weft.megatron_plan(tiny, cluster, t=4, p=1, d=1),
        "tiny t=2 d=2": weft.megatron_plan(tiny, cluster, t=2, p=1, d=2),
        "tiny p=2 d=2": weft.megatron_plan(tiny, cluster, t=1, p=2, d=2),
        "wide t=4": weft.megatron_plan(wide, cluster, t=4, p=1, d=1),
        "wide t=2 d=2": weft.megatron_plan(wide, cluster, t=2, p=1, d=2),
        "wide t=2 p=2": weft.megatron_plan(wide, cluster, t=2, p=2, d=1),
    }


def param_spec(stage, param):
    """A plan parameter's weft spec on its stage's full mesh (independent of torch_export)."""
    try:
        return weft.ShardingSpec.parse(param.spec, list(param.shape), list(stage.mesh_shape))
    except ValueError:
        return weft.ShardingSpec.parse(param.spec, list(param.shape), list(stage.mesh_shape), True)


def strided_specs():
    """Hand-made specs the planner's tiny plans do not produce: every spec (strided and partial
    included) of small tensors on the 2x2 and the 1-D mesh of 4, and an uneven one DTensor shares."""
    cases = []
    for shape, mesh in (([8, 6], [2, 2]), ([12], [4]), ([4, 8], [4])):
        cases += [(str(s), shape, mesh, False) for s in weft.enumerate_specs(shape, mesh)]
    cases.append(("P(max) S(1,1)", [8, 6], [2, 2], False))
    cases.append(("S(0)", [6], [4], True))
    return cases


# ---- one spec <-> placements ----

def torch_local(x, placements, mesh_shape, coord):
    """What DTensor leaves on mesh coordinate `coord` of a full tensor x, without processes: each
    placement's own split (Shard / _StridedShard._split_tensor), in mesh order, as distribute_tensor
    applies them."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.placement_types import _StridedShard

    for axis, p in enumerate(placements):
        if isinstance(p, (Shard, _StridedShard)):
            shards, _ = p._split_tensor(x, mesh_shape[axis], with_padding=False)
            x = shards[coord[axis]]
    return x


def assert_same_layout(spec, placements):
    shape, mesh = list(spec.tensor_shape), list(spec.mesh_shape)
    x = torch.arange(math.prod(shape)).reshape(shape)
    for c in weft.sharding.mesh_coords(mesh):
        want = x.numpy()[np.ix_(*spec.tile(list(c)))]
        assert np.array_equal(torch_local(x, placements, mesh, c).numpy(), want), (str(spec), placements, c)


def test_named_strided_specs_map_to_strided_shard():
    from torch.distributed.tensor.placement_types import _StridedShard

    # FSDP under TP: axis 1 (TP) splits dim 0 first, axis 0 (FSDP) each of its halves.
    fsdp_tp = weft.ShardingSpec.parse("S(0,2) S(0,4)", [8, 4], [2, 2])
    # Cyclic on a 1-D mesh: element e on device e mod 4.
    cyclic = weft.ShardingSpec([12], [4], [weft.Placement.shard(0, 1)])
    for spec in (fsdp_tp, cyclic):
        placements = torch_export.dtensor_placements(spec)
        assert isinstance(placements[0], _StridedShard)  # not DTensor's default (mesh-order) nesting
        assert_same_layout(spec, placements)


def test_uneven_dim_split_twice_has_no_placements():
    padded = weft.ShardingSpec.parse("S(0) S(0)", [5, 4], [2, 2], True)
    with pytest.raises(ValueError, match="'w'.*uneven"):
        torch_export.dtensor_placements(padded, name="w")
    from torch.distributed.tensor import Shard

    with pytest.raises(ValueError, match="other elements"):
        torch_export.spec_from_dtensor([Shard(0), Shard(0)], [5, 4], [2, 2], allow_padding=True)


def test_placements_read_back_in_every_notation(plans):
    specs = [(param_spec(st, p), f"{name}/{p.name}") for name, plan in plans.items()
             for st in plan.stages for p in st.params]
    specs += [(weft.ShardingSpec.parse(t, shape, mesh, pad), t) for t, shape, mesh, pad in strided_specs()]
    unique = {(str(s), tuple(s.tensor_shape), tuple(s.mesh_shape), s.allow_padding): (s, w) for s, w in specs}
    strided = 0
    for spec, what in unique.values():
        shape, mesh, pad = list(spec.tensor_shape), list(spec.mesh_shape), spec.allow_padding
        placements = torch_export.dtensor_placements(spec, what)
        assert_same_layout(spec, placements)
        strided += "_StridedShard" in spec.to_dtensor()
        texts = [spec.to_dtensor(), str(placements), repr(tuple(placements)), " ".join(str(p) for p in placements)]
        for text in texts:
            assert weft.ShardingSpec.parse(text, shape, mesh, pad) == spec, (what, text)
            assert torch_export.spec_from_dtensor(text, shape, mesh, pad) == spec, (what, text)
        assert torch_export.spec_from_dtensor(placements, shape, mesh, pad) == spec, what
        assert torch_export.spec_from_dtensor(tuple(placements), shape, mesh, pad) == spec, what
    assert strided >= 10


def test_partial_words():
    s = weft.ShardingSpec.parse("P(max) S(1)", [4, 4], [2, 2])
    for text in ("[Partial(max), Shard(1)]", "[Partial('max'), Shard(dim=1)]", "P(max) S(1)"):
        assert weft.ShardingSpec.parse(text, [4, 4], [2, 2]) == s
    from torch.distributed.tensor import Partial, Shard

    with pytest.raises(ValueError, match="sum or max"):
        torch_export.spec_from_dtensor([Partial("avg"), Shard(1)], [4, 4], [2, 2])
    with pytest.raises(TypeError):
        torch_export.spec_from_dtensor(["Shard(0)", object()], [4, 4], [2, 2])


# ---- a plan's parameters ----

def test_to_dtensor_covers_every_parameter_on_its_stage(plans, tiny):
    step = tiny.train_step(optimizer="adam")
    for name, plan in plans.items():
        for i, st in enumerate(plan.stages):
            per_stage = plan.to_dtensor(stage=i)
            assert sorted(per_stage) == sorted(p.name for p in st.params), name
            for p in st.params:
                assert len(per_stage[p.name]) == len(st.mesh_shape)
                assert per_stage[p.name] == torch_export.dtensor_placements(param_spec(st, p))
        everything = plan.to_dtensor()
        assert sorted(everything) == sorted({p.name for st in plan.stages for p in st.params})
        if name.startswith("tiny"):
            assert plan.to_dtensor(step).keys() == everything.keys()
    from torch.distributed.tensor import Replicate

    dp = plans["tiny t=2 d=2"]
    assert dp.data_parallel == 2 and list(dp.stages[0].mesh_shape) == [2, 2]
    assert all(pl[0] == Replicate() for pl in dp.to_dtensor().values())  # the replica axis
    assert any(str(pl) != "[Replicate(), Replicate()]" for pl in plans["wide t=2 d=2"].to_dtensor().values())


def test_to_dtensor_checks_graph_and_stage(plans, cluster):
    other = weft.models.gpt(layers=1, hidden=64, heads=4, seq=8, vocab=128, batch=8).train_step(optimizer="adam")
    with pytest.raises(ValueError, match="step graph"):
        plans["tiny t=4"].to_dtensor(other)
    with pytest.raises(ValueError, match="out of range"):
        plans["tiny p=2 d=2"].to_dtensor(stage=2)
    meshes = torch_export.stage_meshes(plans["tiny p=2 d=2"])
    assert [m.shape for m in meshes] == [(2, 1), (2, 1)]
    assert [m.devices for m in meshes] == [tuple(st.devices) for st in plans["tiny p=2 d=2"].stages]
    assert meshes[0].rank_grid() == [[d] for d in meshes[0].devices]


def test_to_dtensor_refuses_uneven_tensor_split(cluster, tiny):
    split = weft.split_plan(tiny, cluster, [0.5, 0.25, 0.125, 0.125])
    with pytest.raises(ValueError, match="unevenly"):
        split.to_dtensor()


# ---- distribute_tensor on 4 gloo processes ----

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _distribute_worker(rank, port, plan_jsons, spec_cases, out_dir):
    """One rank: builds every stage mesh (DeviceMesh creation is collective over all ranks), then
    distribute_tensor's local piece of each tensor vs weft's tile of its coordinate. A Partial
    axis holds terms: their reduction over the axis must give the tile."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import distribute_tensor

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    meshes = {}

    def mesh_of(shape, devices):
        key = (tuple(shape), tuple(devices))
        if key not in meshes:
            meshes[key] = DeviceMesh("cpu", torch.tensor(list(devices)).reshape(list(shape)))
        return meshes[key]

    def check(mesh, spec, placements):
        shape = list(spec.tensor_shape)
        x = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)  # exact below 2**24
        local = distribute_tensor(x, mesh, placements).to_local()
        coord = mesh.get_coordinate()
        if coord is None:
            return 0
        for axis in spec.partial_axes:
            op = dist.ReduceOp.MAX if spec.reduce == "max" else dist.ReduceOp.SUM
            dist.all_reduce(local, op=op, group=mesh.get_group(axis))
        tile = x.numpy()[np.ix_(*spec.tile(list(coord)))]
        assert list(local.shape) == list(spec.local_shape(list(coord))), (spec, coord)
        assert np.allclose(local.numpy(), tile, rtol=0, atol=1e-3), (spec, placements, coord)
        return 1

    checked = 0
    try:
        for text in plan_jsons:
            plan = weft.Plan.from_json(text)
            for i, st in enumerate(plan.stages):
                mesh = mesh_of(st.mesh_shape, st.devices)
                placements = plan.to_dtensor(stage=i, device_mesh=mesh)
                if len(plan.stages) > 1:
                    assert plan.to_dtensor(device_mesh=mesh) == placements  # the stage found by its ranks
                for p in st.params:
                    checked += check(mesh, param_spec(st, p), placements[p.name])
        for shape_mesh, devices, cases in spec_cases:
            mesh = mesh_of(shape_mesh, devices)
            for text, shape, _, pad in cases:
                spec = weft.ShardingSpec.parse(text, shape, shape_mesh, pad)
                checked += check(mesh, spec, torch_export.dtensor_placements(spec))
    finally:
        dist.destroy_process_group()
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump({"checked": checked}, f)


def test_distribute_tensor_gives_every_rank_weft_tile(plans, tmp_path):
    import torch.multiprocessing as mp

    by_mesh = {}
    for case in strided_specs():
        by_mesh.setdefault(tuple(case[2]), []).append(case)
    spec_cases = [(list(mesh), list(range(WORLD)), cases) for mesh, cases in by_mesh.items()]
    plan_jsons = [p.to_json() for p in plans.values()]
    ctx = mp.start_processes(_distribute_worker, args=(_free_port(), plan_jsons, spec_cases, str(tmp_path)),
                             nprocs=WORLD, join=False, start_method="spawn")
    deadline = time.monotonic() + DISTRIBUTE_TIMEOUT_S
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"the {WORLD} gloo processes did not finish in {DISTRIBUTE_TIMEOUT_S} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    checked = [json.loads((tmp_path / f"rank{r}.json").read_text())["checked"] for r in range(WORLD)]
    n_params = sum(len(st.params) * len(st.devices) for p in plans.values() for st in p.stages)
    n_specs = sum(len(cases) for _, _, cases in spec_cases) * WORLD
    assert sum(checked) == n_params + n_specs


# ---- the pipeline schedule ----

@pytest.fixture(scope="module")
def pipelines(cluster, tiny):
    """2-stage plans under weft's schedules, torch's own ones and two torch does not have."""
    return {kind: weft.megatron_plan(tiny, cluster, t=1, p=2, d=2, schedule=kind, num_microbatches=4, schedule_k=2)
            for kind in ("1F1B", "GPipe", "ZB-H1", "kFkB", "eager-1F1B")}


def test_actions_follow_weft_order(pipelines):
    from torch.distributed.pipelining.schedules import _Action, _ComputationType as T

    for kind, plan in pipelines.items():
        sched = weft.schedule(plan.schedule, plan.num_stages, plan.num_microbatches, k=plan.schedule_k)
        actions = plan.to_torch_schedule()
        assert sorted(actions) == list(range(plan.num_stages))
        split = sched.split_backward
        assert split == (kind == "ZB-H1")
        for rank, ops in enumerate(sched.order):
            got = actions[rank]
            assert all(isinstance(a, _Action) for a in got)
            assert [(a.stage_index, a.microbatch_index) for a in got] == [(s, m) for _, s, m in ops]
            want_kind = {"F": T.FORWARD, "B": T.BACKWARD_INPUT if split else T.FULL_BACKWARD, "W": T.BACKWARD_WEIGHT}
            assert [a.computation_type for a in got] == [want_kind[k] for k, _, _ in ops]
            # each micro-batch's F and B (or I and W) exactly once on this rank's stage
            kinds = (T.FORWARD, T.BACKWARD_INPUT, T.BACKWARD_WEIGHT) if split else (T.FORWARD, T.FULL_BACKWARD)
            for t in kinds:
                assert sorted(a.microbatch_index for a in got if a.computation_type == t) == list(
                    range(plan.num_microbatches)), (kind, rank, t)
            assert {a.stage_index for a in got} == {rank}


def _runtime(num_ranks, num_stages, num_microbatches):
    """A _PipelineScheduleRuntime with no stages attached: enough for _load_csv's validation and
    its lowering to send/recv actions (which needs no process group)."""
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime

    rt = object.__new__(_PipelineScheduleRuntime)
    rt.pipeline_order = {}
    rt.pp_group_size = num_ranks
    rt._num_stages = num_stages
    rt._n_microbatches = num_microbatches
    rt._stages = []
    rt._defer_pp_recv = False
    return rt


def test_csv_loads_in_torch_runtime_and_round_trips(pipelines, tmp_path):
    import csv

    from torch.distributed.pipelining.schedules import _Action

    for kind, plan in pipelines.items():
        path = tmp_path / f"{plan.schedule}.csv"
        text = plan.to_torch_schedule(format="csv", path=str(path))
        assert path.read_bytes().decode() == text
        actions = plan.to_torch_schedule()
        rt = _runtime(plan.num_stages, plan.num_stages, plan.num_microbatches)
        rt._load_csv(str(path), format="compute_only")
        assert rt.pipeline_order == actions, kind
        assert rt.stage_index_to_group_rank == {s: s for s in range(plan.num_stages)}
        assert set(rt.pipeline_order_with_comms) == set(actions)  # lowered with send/recv
        rows = list(csv.reader(text.splitlines()))
        assert {r: [_Action.from_str(s) for s in row] for r, row in enumerate(rows)} == actions
        # torch's own dump of the loaded order is the same file
        dumped = tmp_path / f"{plan.schedule}.dump.csv"
        rt._dump_csv(str(dumped), format="compute_only")
        assert dumped.read_bytes() == path.read_bytes()


def test_interleaved_uses_virtual_stages_loop_style(cluster, tiny, tmp_path):
    plan = weft.megatron_plan(tiny, cluster, t=1, p=2, d=2, schedule="interleaved", schedule_v=2, num_microbatches=4)
    ranks, v = plan.num_stages, plan.schedule_v
    actions = plan.to_torch_schedule()
    for rank, acts in actions.items():
        assert {a.stage_index for a in acts} == {rank + c * ranks for c in range(v)}
    rt = _runtime(ranks, ranks * v, plan.num_microbatches)
    plan.to_torch_schedule(path=str(tmp_path / "interleaved.csv"))
    rt._load_csv(str(tmp_path / "interleaved.csv"))
    assert rt.pipeline_order == actions
    assert rt.stage_index_to_group_rank == {s: s % ranks for s in range(ranks * v)}


def test_bad_format(pipelines):
    with pytest.raises(ValueError, match="format"):
        pipelines["1F1B"].to_torch_schedule(format="json")


def test_interleaved_with_m_not_a_multiple_of_the_devices_passes_torchs_validation(cluster, tmp_path):
    # 4 pipeline devices, 6 micro-batches (torch's rounds: one round of 6), v = 2: the order weft
    # writes loads in torch's runtime (which validates it) and is what torch reads back.
    g = weft.models.gpt(layers=4, hidden=64, heads=4, seq=8, vocab=128, batch=6).train_step()
    c4 = weft.Cluster.preset("p3.8xlarge")
    plan = weft.megatron_plan(g, c4, t=1, p=4, d=1, schedule="interleaved", schedule_v=2, num_microbatches=6)
    assert plan.num_stages == 4 and plan.num_microbatches == 6
    path = tmp_path / "interleaved6.csv"
    plan.to_torch_schedule(path=str(path))
    rt = _runtime(4, 8, 6)
    rt._load_csv(str(path))
    assert rt.pipeline_order == plan.to_torch_schedule()
    # and it runs: the CPU executor's 4 ranks equal one device
    got, ref = weft.execute(plan, g, c4, steps=2), weft.execute_reference(g, steps=2)
    assert got.max_relative_error(ref) < 1e-10


def _torch_dualpipev_expanded(ranks, num_microbatches):
    """torch's ScheduleDualPipeV pipeline_order (its per-rank generator, no process group) in the
    one-action-at-a-time form weft exports: an OVERLAP_F_B as its forward then its backward, a
    whole backward (FULL_BACKWARD) as BACKWARD_INPUT then BACKWARD_WEIGHT."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType as T, ScheduleDualPipeV

    o = object.__new__(ScheduleDualPipeV)
    o.pp_group_size, o._n_microbatches, o.n_local_stages = ranks, num_microbatches, 2
    o._num_stages = o.num_stages = 2 * ranks
    out = {}
    for r in range(ranks):
        acts = []
        for a in o._calculate_single_rank_operations(r):
            for x in (a.sub_actions if a.computation_type == T.OVERLAP_F_B else (a,)):
                if x.computation_type == T.FULL_BACKWARD:
                    acts += [_Action(x.stage_index, T.BACKWARD_INPUT, x.microbatch_index),
                             _Action(x.stage_index, T.BACKWARD_WEIGHT, x.microbatch_index)]
                else:
                    acts.append(x)
        out[r] = acts
    return out


@pytest.mark.parametrize("p,d,m", [(2, 2, 4), (4, 1, 8)])
def test_dualpipev_exports_torchs_own_order_and_loads(cluster, tiny, tmp_path, p, d, m):
    # weft's DualPipeV exported for torch is torch's ScheduleDualPipeV order (expanded as above),
    # on torch's "v" stage placement, and torch's runtime loads it.
    plan = weft.megatron_plan(tiny, cluster, t=1, p=p, d=d, schedule="DualPipeV", num_microbatches=m)
    assert plan.schedule == "dualpipev" and plan.num_stages == p
    actions = plan.to_torch_schedule()
    assert actions == _torch_dualpipev_expanded(p, m)
    path = tmp_path / "dualpipev.csv"
    plan.to_torch_schedule(path=str(path))
    rt = _runtime(p, 2 * p, m)
    rt._load_csv(str(path), format="compute_only")
    assert rt.pipeline_order == actions
    assert rt.stage_index_to_group_rank == {s: s if s < p else 2 * p - 1 - s for s in range(2 * p)}
