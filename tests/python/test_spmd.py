"""weft.spmd_search: data parallel on a small model, O2 == O3 on a chain, cost == independent
re-evaluation, report, progress, memory modes, errors."""
import pytest

import weft


def _mlp(batch, widths, train=True):
    g = weft.Graph("mlp")
    x = g.input("x", [batch, widths[0]])
    for i in range(len(widths) - 1):
        w = g.parameter(f"w{i}", [widths[i], widths[i + 1]])
        x = g.einsum("bi,io->bo", [x, w], f"mm{i}")
        if i + 2 < len(widths):
            x = g.unary("relu", x, f"relu{i}")
    g.set_loss(g.reduce("mean", x, [0, 1], "loss"))
    return g.train_step() if train else g


@pytest.fixture(scope="module")
def m8():
    return weft.Cluster.preset("M8")


def test_small_model_large_batch_is_data_parallel(m8):
    import weft.models as wm

    g = wm.gpt(layers=1, hidden=256, heads=4, batch=128, seq=128, vocab=512).train_step()
    mesh = weft.DeviceMesh.iota([1, 8])
    # Priced per reader (each reader pays its own resharding) the optimum is pure data parallelism.
    # With shared resharding it is 0.8 % cheaper (3.080 vs 3.106 ms): one gradient is moved to a
    # hidden-split layout by one all-to-all that its readers share; parameters stay replicated.
    shared = weft.spmd_search(g, m8, mesh)
    r = weft.spmd_search(g, m8, mesh, shared_resharding=False)
    assert shared.cost <= r.cost * (1 + 1e-9)
    assert set(shared.param_specs.values()) == {"R R"}
    assert weft.spmd.evaluate_plan(shared, m8)["cost"] == pytest.approx(shared.cost, rel=1e-9)
    # Every parameter stays replicated; every op is split 8 ways (over the batch: the only
    # factor every op has), so the only communication is the gradient reduction.
    assert r.param_specs and set(r.param_specs.values()) == {"R R"}
    assert "R" not in {s for name, s in r.op_strategies.items() if not name.startswith("d:loss")}
    ev = weft.spmd.evaluate_plan(r, m8)
    assert ev["cost"] == pytest.approx(r.cost, rel=1e-9)
    assert ev["compute_time"] == pytest.approx(r.compute_time, rel=1e-9)
    assert r.cost == pytest.approx(r.compute_time + r.comm_time, rel=1e-12)
    assert "all-to-all" not in ev["collectives"]
    # Pure data parallelism reduces only parameter gradients (batch-partial sums), never a forward
    # activation: every reduced tensor is a gradient ("d:..."), one per parameter at least.
    assert ev["partial_reductions"] and all(n.startswith("d:") for n in ev["partial_reductions"])
    assert len(ev["partial_reductions"]) >= len(r.param_specs)


def test_o2_equals_o3_on_a_chain(m8):
    g = _mlp(512, [128, 512, 512, 128, 64], train=False)
    mesh = weft.DeviceMesh.iota([2, 4])
    a = weft.spmd_search(g, m8, mesh, level="O3")
    b = weft.spmd_search(g, m8, mesh, level="O2")
    assert b.cost == pytest.approx(a.cost, rel=1e-9)
    assert b.report.to_dict()["segments"] >= 2
    # Deterministic: the same input gives the same specs.
    assert weft.spmd_search(g, m8, mesh, level="O2").specs == b.specs


def test_report_progress_and_specs(m8):
    g = _mlp(64, [64, 128, 64])
    calls = []
    r = weft.spmd_search(g, m8, weft.DeviceMesh.iota([2, 4]), level="O3",
                         progress=lambda ph, f, msg: calls.append((ph, f)))
    fr = [f for _, f in calls]
    assert len(fr) >= 3 and fr == sorted(fr) and fr[-1] == 1.0
    text = str(r.report)
    assert "parameter" in text and "w0" in text and "compute" in text
    d = r.report.to_dict()
    assert d["ilp_variables"] > 0 and d["status"] == "optimal"
    assert d["compute_time"] == pytest.approx(r.compute_time)
    assert {p["name"] for p in d["params"]} == {"w0", "w1"}
    assert r.specs["w0"] == r.spec_of("w0")
    assert "SpmdResult" in repr(r)
    # progress=True draws a tqdm bar (or a plain line) and gives the same plan.
    assert weft.spmd_search(g, m8, weft.DeviceMesh.iota([2, 4]), level="O3", progress=True).cost == pytest.approx(r.cost)


def test_memory_tight_shards_only_the_largest(m8):
    g = _mlp(32768, [256, 2048, 512, 256])
    mesh = weft.DeviceMesh.iota([1, 8])
    free = weft.spmd_search(g, m8, mesh, memory_limit=-1)
    assert free.param_specs["w1"] == "R R"
    limit = free.peak_memory - 0.5 * 2048 * 512 * 4
    r = weft.spmd_search(g, m8, mesh, memory_limit=limit, memory_mode="shard_largest")
    assert r.report.to_dict()["forced_sharded_params"] == 1
    assert r.param_specs["w1"] != "R R" and r.param_specs["w2"] == "R R"
    assert r.peak_memory <= limit


def test_errors(m8):
    g = _mlp(4, [4, 4, 4], train=False)
    with pytest.raises(ValueError, match="no op of graph"):
        weft.spmd_search(g, weft.Cluster.preset("M8", nodes=2), weft.DeviceMesh.iota([1, 16]))
    gt = _mlp(64, [64, 64])
    with pytest.raises(ValueError, match="cannot be met.*largest tensors"):
        weft.spmd_search(gt, m8, weft.DeviceMesh.iota([1, 8]), memory_limit=1000)
    with pytest.raises(ValueError, match="level"):
        weft.spmd_search(gt, m8, weft.DeviceMesh.iota([1, 8]), level="O1")
    with pytest.raises(ValueError, match="nope"):
        weft.spmd_search(gt, m8, weft.DeviceMesh.iota([1, 8]), fixed_specs={"nope": "R R"})
    with pytest.raises(ValueError):
        weft.spmd_search(gt, m8, weft.DeviceMesh.iota([1, 8]), progress=3)


def test_o2_memory_pricing_fits_and_is_reported(m8):
    import weft.models as wm

    # On the datasheet model: under the efficiency model O2's unpriced segment-by-segment search
    # lands above its priced one here (2.354 vs 2.266 ms; O2 is a heuristic, issue 17's note).
    m8 = m8.datasheet()
    g = wm.gpt(layers=2, hidden=256, heads=4, batch=16, seq=128, vocab=512).train_step()
    mesh = weft.DeviceMesh.iota([1, 4])
    free = weft.spmd_search(g, m8, mesh, level="O2", memory_limit=-1)
    limit = 0.75 * free.peak_memory
    priced = weft.spmd_search(g, m8, mesh, level="O2", memory_limit=limit)
    d = priced.report.to_dict()
    assert d["memory_price_probes"] > 0 and d["memory_price"] > 0
    assert priced.peak_memory <= limit
    assert weft.spmd.evaluate_plan(priced, m8)["peak_memory"] <= limit
    assert priced.cost >= free.cost * (1 - 1e-9)
    assert "memory pricing" in str(priced.report)
    rows = weft.spmd_search(g, m8, mesh, level="O2", memory_limit=limit, memory_pricing=False)
    assert rows.report.to_dict()["memory_price_probes"] == 0
    assert rows.peak_memory <= limit


def test_output_specs_charge_the_layout_readers_need(m8):
    # A forward MLP whose output must leave replicated: the search pays the gather (as comm). On the
    # datasheet model; under the efficiency model the constrained plan computes replicated instead
    # (no comm), so only its cost is compared there.
    assert weft.spmd_search(_mlp(64, [1024, 4096], train=False), m8, weft.DeviceMesh.iota([4]), level="O3",
                            strided_candidates=False, output_specs={"mm0": "R"}).cost >= \
        weft.spmd_search(_mlp(64, [1024, 4096], train=False), m8, weft.DeviceMesh.iota([4]), level="O3",
                         strided_candidates=False).cost * (1 - 1e-12)
    m8 = m8.datasheet()
    g = _mlp(64, [1024, 4096], train=False)
    mesh = weft.DeviceMesh.iota([4])
    free = weft.spmd_search(g, m8, mesh, level="O3", strided_candidates=False)
    need = weft.spmd_search(g, m8, mesh, level="O3", strided_candidates=False, output_specs={"mm0": "R"})
    assert need.cost >= free.cost
    assert need.comm_time >= free.comm_time
    with pytest.raises(ValueError, match="unknown tensor"):
        weft.spmd_search(g, m8, mesh, output_specs={"nope": "R"})
