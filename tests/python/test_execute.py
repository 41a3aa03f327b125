"""weft.lower / weft.execute: lowered programs run on the CPU executor equal the one-device reference."""
import numpy as np
import pytest

import weft


@pytest.fixture(scope="module")
def step():
    g = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=4)
    return g.train_step(optimizer="adam")


@pytest.fixture(scope="module")
def cluster():
    return weft.Cluster.preset("p3.8xlarge")


# A model this small is cheapest replicated: fix a few specs so that the program moves data (batch split
# on x, vocab-parallel embedding / cross-entropy, tensor-parallel MLP and attention on y and x).
FIXED = {"tokens": "S(0) R", "wte": "S(0) R", "h0.mlp.fc1.w": "R S(1)", "h1.attn.qkv.w": "S(1) S(0)"}


def lower_on_2x2(step, cluster):
    mesh = weft.DeviceMesh([2, 2], range(4))
    # Each reader priced alone: the layout this module was written around (its vocab-parallel
    # loss and all-reduced partial sums; shared resharding gathers this tiny model's tensors once).
    result = weft.spmd_search(step, cluster, mesh, level="O2", time_limit=10, fixed_specs=FIXED,
                              shared_resharding=False)
    return weft.lower_spmd(step, cluster, mesh, result)


@pytest.fixture(scope="module")
def program(step, cluster):
    return lower_on_2x2(step, cluster)


@pytest.fixture(scope="module")
def reference(step):
    return weft.execute_reference(step)


def assert_same(got, ref, rtol):
    assert len(got.losses) == len(ref.losses)
    np.testing.assert_allclose(got.losses, ref.losses, rtol=rtol, atol=0)
    assert set(got.parameters) == set(ref.parameters) and ref.parameters
    for name, want in ref.parameters.items():
        assert got.parameters[name].shape == want.shape, name
        scale = float(np.max(np.abs(want)))  # relative to the tensor: Adam amplifies rounding near g = 0
        np.testing.assert_allclose(got.parameters[name], want, rtol=rtol, atol=rtol * scale, err_msg=name)
    assert set(got.gradients) == set(ref.gradients)
    for name, want in ref.gradients.items():
        scale = float(np.max(np.abs(want)))
        np.testing.assert_allclose(got.gradients[name], want, rtol=rtol, atol=rtol * scale, err_msg=name)
    assert got.max_relative_error(ref) < rtol


def test_spmd_program_matches_reference(step, program, reference):
    assert isinstance(program, weft.Program)
    assert program.num_ranks == 4
    program.check()
    got = weft.execute(program)
    assert isinstance(got, weft.ExecutionResult)
    assert len(got.losses) == 3 and reference.losses[0] > 1
    assert_same(got, reference, 1e-10)
    leaves = {t["name"] for t in step.tensors if t["role"] == "parameter" and t["producer"] is None}
    assert set(reference.parameters) == set(program.parameters) == leaves
    # per-rank statistics; the reference has none
    assert len(got.bytes_sent) == len(got.bytes_received) == len(got.peak_bytes) == 4
    assert len(got.internal_bytes_sent) == 4
    assert all(b > 0 for b in got.peak_bytes)
    assert got.total_bytes_sent > 0
    assert sum(sum(d.values()) for d in got.bytes_received) == got.total_bytes_sent
    assert got.seconds > 0
    assert reference.bytes_sent == [] and reference.peak_bytes == []


def test_program_inspection(program):
    assert "4 ranks" in repr(program)
    instrs = program.instructions(0)
    assert instrs and set(instrs[0]) >= {"kind", "op", "inputs", "outputs", "axis", "group"}
    kinds = {i["kind"] for i in instrs}
    assert "compute" in kinds
    assert any(i["op"] is not None for i in instrs if i["kind"] == "compute")
    coll = [i for r in range(4) for i in program.instructions(r) if i["group"]]
    assert coll and all(len(i["group"]) == 2 and i["axis"] in (0, 1) for i in coll)
    names = {b["name"] for b in program.buffers}
    assert all(x in names for i in instrs for x in i["inputs"] + i["outputs"])
    assert program.loss in names and set(program.parameters.values()) <= names
    assert program.dump_rank(0).strip() in program.dump()
    kinds = {i["kind"] for r in range(4) for i in program.instructions(r)}
    assert {"all-gather", "all-reduce", "ce-loss"} <= kinds
    with pytest.raises(ValueError):
        program.instructions(4)
    with pytest.raises(ValueError):
        program.dump_rank(-1)


def test_plan_one_spmd_stage_matches_reference(step, cluster, reference):
    plan = weft.plan(step, cluster, pipeline=False, max_data_parallel=1, num_microbatches=1, uneven_split=False,
                     compare_megatron=False, spmd_time_limit=10)
    assert plan.num_stages == 1 and plan.data_parallel == 1 and plan.num_microbatches == 1
    prog = weft.lower(plan, step, cluster)
    assert prog.num_ranks == len(plan.stages[0].devices) == 4
    prog.check()
    got = weft.execute(plan, step, cluster)
    assert_same(got, reference, 1e-10)
    assert got.losses == weft.execute(prog).losses


def test_json_round_trip(program):
    text = program.to_json()
    again = weft.Program.from_json(text)
    assert again.dump() == program.dump()
    assert again == program
    with pytest.raises(ValueError):
        weft.Program.from_json(text[: len(text) // 2])
    with pytest.raises(ValueError):
        weft.Program.from_json(text.replace('"ranks"', '"rankz"', 1))


def test_f32_close_to_reference(step, cluster, program, reference):
    got = weft.execute(program, dtype="f32")
    for ref in (reference, weft.execute_reference(step, dtype="f32")):
        np.testing.assert_allclose(got.losses, ref.losses, rtol=1e-5, atol=0)
        for name, want in ref.gradients.items():
            scale = float(np.max(np.abs(want)))
            np.testing.assert_allclose(got.gradients[name], want, rtol=1e-5, atol=1e-5 * scale, err_msg=name)
    # Adam's first steps move a weight by about lr * sign(g): where g is at the rounding level, f32 and
    # f64 disagree on the sign (the f32 reference itself is 7e-4 off the f64 one). SGD is well
    # conditioned: everything within 1e-5.
    sgd = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=4).train_step(optimizer="sgd",
                                                                                                 lr=0.1)
    got = weft.execute(lower_on_2x2(sgd, cluster), dtype="f32")
    assert_same(got, weft.execute_reference(sgd), 1e-5)
    assert_same(got, weft.execute_reference(sgd, dtype="f32"), 1e-5)


def test_inputs_and_seed(step, program, reference):
    other = weft.execute_reference(step, seed=1)
    assert other.losses != reference.losses
    inputs = {t["name"]: t for t in step.tensors if t["role"] == "input"}
    assert inputs
    rng = np.random.default_rng(0)
    feeds = {}
    for name, t in inputs.items():
        hi = 128 if t["dtype"] in ("i32", "i64") else None
        feeds[name] = (rng.integers(0, hi, size=t["shape"]) if hi else rng.standard_normal(t["shape"]))
    got = weft.execute(program, inputs=feeds, steps=1)
    ref = weft.execute_reference(step, inputs=feeds, steps=1)
    assert_same(got, ref, 1e-10)
    assert ref.losses[0] != reference.losses[0]


def test_bad_input(step, cluster, program):
    with pytest.raises(ValueError, match="dtype"):
        weft.execute(program, dtype="f16")
    with pytest.raises(ValueError, match="dtype"):
        weft.execute_reference(step, dtype="f16")
    plan = weft.plan(step, cluster, pipeline=False, max_data_parallel=1, num_microbatches=1, uneven_split=False,
                     compare_megatron=False, spmd_time_limit=10)
    with pytest.raises(ValueError, match="step"):
        weft.execute(plan)
    with pytest.raises(ValueError, match="global batch"):  # a plan for another batch
        weft.lower(plan, weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8).train_step(
            optimizer="adam"), cluster)
    with pytest.raises(ValueError):
        weft.execute("not a program")
    with pytest.raises(ValueError):
        weft.execute(program, inputs={"no_such_input": np.zeros(3)})


def test_data_parallel_and_microbatch_plans_match_reference(step, cluster, reference):
    # Even data-parallel shares over 4 GPUs, 2 micro-batches each: gradients accumulated, then
    # all-reduced across the replicas.
    dp = weft.data_parallel_plan(step, cluster, [1, 1, 1, 1], num_microbatches=1)
    assert dp.data_parallel == 4
    assert_same(weft.execute(dp, step, cluster), reference, 1e-10)
    got = weft.execute(dp, step, cluster)
    assert_same(got, reference, 1e-10)
    # The planner's own choice on the 4-GPU cluster when it is one stage (SPMD, replicas, micro-batches).
    own = weft.plan(step, cluster, pipeline=False, compare_megatron=False, spmd_time_limit=10)
    assert own.num_stages == 1
    assert_same(weft.execute(own, step, cluster), reference, 1e-10)


def test_pipeline_plans_match_reference(cluster):
    # Megatron t=1 p=2 d=2 on 4 GPUs with 2 micro-batches under GPipe and ZB-H1, and t=2 p=2 under
    # kFkB: stages exchange activations and gradients by send / recv, the tied embedding's gradient
    # contribution crosses once per step and its new value goes back to the last stage.
    step = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8).train_step(optimizer="adam")
    ref = weft.execute_reference(step)
    for (t, p, d), schedule in [((1, 2, 2), "gpipe"), ((1, 2, 2), "zb_h1"), ((2, 2, 1), "kfkb")]:
        plan = weft.megatron_plan(step, cluster, t=t, p=p, d=d, num_microbatches=2, schedule=schedule, schedule_k=2)
        assert plan.num_stages == 2
        prog = weft.lower(plan, step, cluster)
        assert len({r["stage"] for r in prog.ranks}) == 2
        sends = [i for r in range(prog.num_ranks) for i in prog.instructions(r) if i["kind"] == "send"]
        recvs = [i for r in range(prog.num_ranks) for i in prog.instructions(r) if i["kind"] == "recv"]
        assert sends and recvs and {i["tag"] for i in sends} == {i["tag"] for i in recvs}
        assert all(len(i["region"]) >= 1 for i in sends)
        got = weft.execute(prog)
        assert_same(got, ref, 1e-10)
        assert sum(r.get("send", 0) for r in got.bytes_sent) > 0
        assert weft.Program.from_json(prog.to_json()) == prog
    # The planner's own choice on 8 GPUs (a pipeline for this model), run as planned.
    eight = weft.Cluster.preset("M8")
    own = weft.plan(step, eight)
    got = weft.execute(own, step, eight)
    assert_same(got, ref, 1e-10)


def test_uneven_shares_and_mixed_cluster_plans_match_reference():
    # Mixed GPUs: uneven data-parallel shares (each replica runs its own batch, the gradients are
    # weighted by samples) and the planner's heterogeneous pipeline, both equal to one device.
    step = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=16).train_step(optimizer="adam")
    ref = weft.execute_reference(step)
    mixed = weft.Cluster.concat(weft.Cluster.preset("p3.8xlarge"), weft.Cluster.preset("P100"))
    dp = weft.plan(step, mixed, pipeline=False, uneven_split=False)
    assert dp.replica_microbatch and len(set(dp.replica_microbatch)) > 1
    assert_same(weft.execute(dp, step, mixed), ref, 1e-10)
    piped = weft.plan(step, mixed, uneven_split=False)
    assert_same(weft.execute(piped, step, mixed), ref, 1e-10)
    # Whale's uneven tensor split over the same GPUs (V100s hold twice a P100's piece of every split dim).
    step12 = weft.models.gpt(layers=1, hidden=48, heads=4, seq=12, vocab=96, batch=12).train_step(optimizer="adam")
    split = weft.split_plan(step12, mixed, [2] * 4 + [1] * 8)
    assert split.split_fraction
    assert_same(weft.execute(split, step12, mixed), weft.execute_reference(step12), 1e-10)
    shares = weft.data_parallel_plan(step, weft.Cluster.preset("p3.8xlarge"), [5, 2, 1, 0], num_microbatches=2)
    prog = weft.lower(shares, step, weft.Cluster.preset("p3.8xlarge"))
    assert prog.num_ranks == 3  # the device without samples is left out
    assert_same(weft.execute(prog), ref, 1e-10)


def _per_sample_constant_step(batch=24):
    """A graph whose batch cannot be re-batched: x scaled by a batch-sized Constant with a row per
    sample (a cumsum of a per-sample ramp; OPT's cumsum of ones(B, 8) has the same row for every
    sample and re-batches), an MLP and a cross entropy."""
    torch = pytest.importorskip("torch")

    class PerSample(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 4)

        def forward(self, x, y):
            pos = (torch.arange(x.shape[0] * x.shape[1], dtype=x.dtype) % 5 + 1).reshape(x.shape).cumsum(1)
            return torch.nn.functional.cross_entropy(self.out(torch.tanh(self.fc(x * pos))), y)

    torch.manual_seed(0)
    x = torch.randn(batch, 8, dtype=torch.float64)
    y = torch.randint(0, 4, (batch,))
    return weft.from_torch(PerSample().double(), (x, y)).train_step(optimizer="adam")


def test_a_graph_that_cannot_be_rebatched_on_mixed_gpus_falls_back_and_matches_reference():
    """Uneven shares, the hetero planner and Whale's split on a graph with a batch-sized Constant
    (no share or micro-batch can be cut from it): the planner keeps the plans that hold the batch
    whole (one micro-batch, no data-parallel share) and says why; explicit requests it cannot meet
    are ValueErrors naming the constant. Every plan runs equal to one device."""
    step = _per_sample_constant_step()
    assert any(t["role"] == "constant" and t["shape"][0] == 24 for t in step.tensors)
    ref = weft.execute_reference(step)
    mixed = weft.Cluster.concat(weft.Cluster.preset("p3.8xlarge"), weft.Cluster.preset("P100"))  # 4 V100 + 8 P100
    for opts in ({}, {"pipeline": False}):
        plan = weft.plan(step, mixed, **opts)
        assert plan.num_microbatches == 1 and not plan.replica_microbatch, plan.strategy
        assert "Constant leaf 'const.cumsum'" in plan.search_space and "batch-sized Constant" in plan.search_space
        assert not any(a.strategy.startswith("data parallel") and a.feasible for a in plan.alternatives)
        assert_same(weft.execute(plan, step, mixed), ref, 1e-10)
    # Whale's split keeps the batch whole in one micro-batch: its pieces are the tensors', not graphs'
    split = weft.split_plan(step, mixed, [2] * 4 + [1] * 8)
    assert split.split_fraction
    assert_same(weft.execute(split, step, mixed), ref, 1e-10)
    with pytest.raises(ValueError, match=r"cannot be split into 2 micro-batches: .*Constant leaf 'const.cumsum'"):
        weft.split_plan(step, mixed, [2] * 4 + [1] * 8, num_microbatches=2)
    with pytest.raises(ValueError, match=r"cannot run 4 samples per micro-batch .*Constant leaf 'const.cumsum'"):
        weft.data_parallel_plan(step, mixed, [4] * 4 + [1] * 8)
    with pytest.raises(ValueError, match=r"(?s)and the graph's batch .*Constant leaf 'const.cumsum'"):
        weft.plan(step, mixed, pipeline=False, uneven_split=False)  # data parallelism only: nothing holds it
    with pytest.raises(ValueError, match=r"cannot be split into 2 micro-batches: .*Constant leaf 'const.cumsum'"):
        weft.plan(step, mixed, num_microbatches=2)
