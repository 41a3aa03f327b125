"""DualPipeV against torch.distributed.pipelining: torch's own order (ScheduleDualPipeV's
_calculate_single_rank_operations, built without process groups) op for op, its validator, its
runtime's CSV loader and dry run; weft's simulator against an independent list scheduler; plans
under DualPipeV priced, lowered and run on the CPU executor. The torch parts skip with the reason
when torch is not installed."""
import pytest

import weft
from test_schedule_zb import HAVE_TORCH, step_of, weft_order

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed: torch's ScheduleDualPipeV and "
                                 "validator are the reference here")


def torch_dualpipev(D, M, expand=True):
    """torch's ScheduleDualPipeV order for D ranks. expand: as (kind, stage, micro) with an
    OVERLAP_F_B replaced by its sub-actions (forward, then whole backward) and a whole backward
    (FULL_BACKWARD, torch's 'B') by 'I' then 'W', weft's one-op-at-a-time form; else torch's
    _Action lists as they are."""
    from torch.distributed.pipelining import schedules as S
    from torch.distributed.pipelining.schedules import _ComputationType as T

    o = object.__new__(S.ScheduleDualPipeV)
    o.pp_group_size, o._n_microbatches, o.n_local_stages = D, M, 2
    o._num_stages = o.num_stages = 2 * D
    order = {r: o._calculate_single_rank_operations(r) for r in range(D)}
    if not expand:
        return order
    name = {T.FORWARD: ["F"], T.FULL_BACKWARD: ["I", "W"], T.BACKWARD_INPUT: ["I"], T.BACKWARD_WEIGHT: ["W"]}
    out = []
    for r in range(D):
        ops = []
        for a in order[r]:
            for x in (a.sub_actions if a.computation_type == T.OVERLAP_F_B else (a,)):
                ops += [(k, x.stage_index, x.microbatch_index) for k in name[x.computation_type]]
        out.append(ops)
    return out


@needs_torch
def test_order_equals_torchs_own():
    from torch.distributed.pipelining.schedules import _ComputationType as T

    checked = 0
    for D in range(1, 9):
        for M in range(2 * D, 2 * D + 11):  # torch needs M >= 2D
            assert weft_order(weft.schedule("dualpipev", D, M)) == torch_dualpipev(D, M), (D, M)
            checked += 1
    assert checked == 88
    # the structure the expansion hides: torch overlaps F of one chunk with the whole backward of
    # the other, except device D - 1's first pair of its main step (run apart, the same ops)
    order = torch_dualpipev(4, 8, expand=False)
    for r, acts in order.items():
        pairs = [a.sub_actions for a in acts if a.computation_type == T.OVERLAP_F_B]
        assert pairs and all(f.computation_type == T.FORWARD and b.computation_type == T.FULL_BACKWARD
                             and f.stage_index != b.stage_index for f, b in pairs)
        # steps 4 and 5: 2(M - 2D + r + 1) + (D - 1 - r) pairs, one fewer on the last rank
        assert len(pairs) == 2 * (8 - 8 + r + 1) + (4 - 1 - r) - (r == 3), r


def test_fewer_micro_batches_than_stages_keep_a_valid_order():
    # torch's ScheduleDualPipeV refuses M < 2D; weft keeps the order for 2D with the missing
    # micro-batches' ops left out, which passes the checks (and torch's validator, below)
    for D in range(1, 7):
        full = weft.schedule("dualpipev", D, 2 * D)
        for M in range(1, 2 * D):
            s = weft.schedule("dualpipev", D, M)
            assert weft.check_order(s).ok, (D, M)
            assert s.order == [[op for op in ops if op[2] < M] for ops in full.order]


@needs_torch
def test_every_order_passes_torchs_validator_and_runtime():
    import csv
    import tempfile

    from torch.distributed.pipelining.schedules import (_Action, _ComputationType as T, _PipelineScheduleRuntime,
                                                        _simulate_comms_compute, _validate_schedule)

    kinds = {"F": T.FORWARD, "B": T.BACKWARD_INPUT, "W": T.BACKWARD_WEIGHT}
    for D in range(1, 7):
        for M in range(1, 3 * D + 2):
            s = weft.schedule("dualpipev", D, M)
            actions = {r: [_Action(st, kinds[k], m) for k, st, m in ops] for r, ops in enumerate(s.order)}
            mapping = _validate_schedule(actions, D, 2 * D, M)
            assert mapping == {st: s.device_of(st) for st in range(2 * D)}
    # torch's runtime loads the CSV, lowers it with its send/recv actions, and its dry run makes
    # progress (M < 2D included: torch's own class refuses those, its runtime runs them)
    with tempfile.TemporaryDirectory() as tmp:
        for D, M in ((2, 4), (2, 3), (3, 6), (4, 8), (4, 5), (3, 10)):
            s = weft.schedule("dualpipev", D, M)
            path = f"{tmp}/d{D}m{M}.csv"
            with open(path, "w", newline="") as f:
                csv.writer(f).writerows([[str(_Action(st, kinds[k], m)) for k, st, m in ops] for ops in s.order])
            rt = object.__new__(_PipelineScheduleRuntime)
            rt.pipeline_order, rt.pp_group_size, rt._num_stages = {}, D, 2 * D
            rt._n_microbatches, rt._stages, rt._defer_pp_recv = M, [], False
            rt._load_csv(path, format="compute_only")
            assert rt.stage_index_to_group_rank == {st: s.device_of(st) for st in range(2 * D)}
            kept = {T.FORWARD, T.FULL_BACKWARD, T.BACKWARD_INPUT, T.BACKWARD_WEIGHT, T.SEND_F, T.RECV_F, T.SEND_B,
                    T.RECV_B}
            comms = {r: [a for a in acts if a is not None and a.computation_type in kept]
                     for r, acts in rt.pipeline_order_with_comms.items()}
            _simulate_comms_compute(comms, lambda st: rt.stage_index_to_group_rank[st], 2 * D)


def test_weft_simulator_agrees_with_an_independent_list_scheduler():
    for times in ({"F": 1, "B": 1, "W": 1}, {"F": 1, "B": 2, "W": 1}, {"F": 2, "B": 1, "W": 0.5}):
        for D in range(1, 5):
            for M in range(1, 3 * D + 2):
                s = weft.schedule("dualpipev", D, M)
                t = {k: x / 2 for k, x in times.items()}
                r = weft.simulate(s, weft.StageSpec(forward_time=t["F"], backward_time=t["B"], weight_time=t["W"]))
                assert r.step_time == pytest.approx(step_of(weft_order(s), 2 * D, t), rel=1e-12), (D, M, times)


@needs_torch
def test_torchs_order_reaches_the_same_steps():
    # torch's own order through the list scheduler: at F = I = W = 1 (torch's units) the step of
    # ZB-V, 3M + (D - 1)/2 (25.5 at pp 4, M 8); for B = 2F what weft's simulator gives.
    one = {"F": 0.5, "B": 0.5, "W": 0.5}
    assert step_of(torch_dualpipev(4, 8), 8, one) == pytest.approx(25.5)
    for D in range(1, 6):
        for M in range(2 * D, 3 * D + 2):
            assert step_of(torch_dualpipev(D, M), 2 * D, one) == pytest.approx(3 * M + (D - 1) / 2), (D, M)
            r = weft.simulate(weft.schedule("dualpipev", D, M),
                              weft.StageSpec(forward_time=0.5, backward_time=1.0, weight_time=0.5))
            assert r.step_time == pytest.approx(step_of(torch_dualpipev(D, M), 2 * D, {"F": 0.5, "B": 1, "W": 0.5}))


# ---- plans: the planner prices DualPipeV, the lowering runs it ----

@pytest.fixture(scope="module")
def gpt4():
    g = weft.models.gpt(layers=4, hidden=64, heads=4, seq=8, vocab=128, batch=8).train_step()
    return g, weft.Cluster.preset("p3.8xlarge")


def test_kind_names_and_placement():
    s = weft.schedule("dualpipev", 4, 8, check=True)
    assert s.name == "dualpipev" and s.num_stages == 8 and s.virtual_stages == 2 and s.split_backward
    assert list(s.placement) == [0, 1, 2, 3, 3, 2, 1, 0]
    assert s == weft._weft.dualpipev(4, 8) and s == weft.schedule("dualpipev", 4, 8, v=2)
    assert "dualpipev" in weft.schedules.KINDS
    with pytest.raises(ValueError, match="v = 2"):
        weft.schedule("dualpipev", 4, 8, v=3)
    assert list(s.peak_in_flight_device()) == [9] * 4  # 2D + 1 chunks: one more than ZB-V's 2D


def test_plans_under_dualpipev_resimulate_and_hold_one_more_chunk(gpt4):
    g, c = gpt4
    zbv = weft.megatron_plan(g, c, t=1, p=4, d=1, schedule="ZB-V", num_microbatches=8)
    for name in ("DualPipeV", "dualpipev", "dualpipe-v"):
        plan = weft.megatron_plan(g, c, t=1, p=4, d=1, schedule=name, num_microbatches=8)
        assert plan.schedule == "dualpipev" and plan.num_stages == 4
    assert plan.resimulate_step_time() == pytest.approx(plan.step_time, rel=1e-12)
    sched, stages, links = plan._pipeline()
    assert list(sched.placement) == [0, 1, 2, 3, 3, 2, 1, 0] and len(stages) == 8
    assert len(links) == 3  # neighbours only, as ZB-V
    assert weft.Plan.from_json(plan.to_json()) == plan
    for a, b in zip(zbv.stages, plan.stages):
        # 2D + 1 chunk activations against ZB-V's 2D: half a stage's activations more
        assert (a.in_flight, b.in_flight) == (8, 9)
        assert b.peak_memory > a.peak_memory
    # the planner's search takes the kind too
    p = weft.plan(g, c, schedule="DualPipeV", num_microbatches=4, compare_megatron=False)
    assert p.schedule == "dualpipev"
    assert p.resimulate_step_time() == pytest.approx(p.step_time, rel=1e-12)


def test_lowered_dualpipev_equals_one_device_on_the_cpu_executor(gpt4):
    g, c = gpt4
    ref = weft.execute_reference(g, steps=2)
    for p, m in ((4, 8), (2, 4), (4, 2)):  # M = 2 < 2D: the order for 8 without micro-batches 2..7
        plan = weft.megatron_plan(g, c, t=1, p=p, d=4 // p, schedule="DualPipeV", num_microbatches=m)
        assert plan.schedule == "dualpipev" and plan.num_microbatches == m
        got = weft.execute(plan, g, c, steps=2)
        assert got.max_relative_error(ref) < 1e-10, (p, m)
    # device d runs model chunks d and 2D - 1 - d (the V), the tip on device D - 1
    plan = weft.megatron_plan(g, c, t=1, p=4, d=1, schedule="DualPipeV", num_microbatches=8)
    prog = weft.lower(plan, g, c)
    ops_of = {r: {i["op"] for i in prog.instructions(r) if i["kind"] == "compute"} for r in range(4)}
    stage_ops = [set(s.ops) for s in plan.stages]
    assert ops_of[0] & stage_ops[0] and ops_of[0] & stage_ops[3]
    assert ops_of[3] & stage_ops[1] and ops_of[3] & stage_ops[2]
    assert not ops_of[0] & stage_ops[1] and not ops_of[3] & stage_ops[0]
