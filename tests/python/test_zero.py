"""Sharded data parallelism across replicas (issue 22): ZeRO's closed forms from Python, the options'
errors, issue 22's Llama2-7B-sized case on one DGX-A100 node (the planner's plan fits with 16
bytes per parameter and is no slower than FSDP with full checkpointing or the best Megatron
layout), the issue's one-stage layout_plan call at exactly 38 GB, and the benchmark's output."""
import json
import os
import subprocess
import sys

import pytest

import weft

LIMIT = 38912 << 20


def test_closed_forms_from_python():
    psi = 1e9
    m = [weft.zero_memory(level, 2 * psi, 12 * psi, 64) for level in range(4)]
    assert [x.state for x in m] == pytest.approx([16 * psi, 4 * psi + 12 * psi / 64, 2 * psi + 14 * psi / 64,
                                                  16 * psi / 64])
    t = [weft.zero_traffic(level, 2 * psi, 8).total(1) for level in range(4)]
    assert t == pytest.approx([2 * 7 / 8 * 2 * psi] * 3 + [3 * 7 / 8 * 2 * psi])
    assert "ZeroMemory(" in repr(m[3])


def test_bad_zero_options_are_refused():
    step = weft.models.gpt(layers=2, hidden=64, heads=4, seq=32, vocab=128, batch=8).train_step(optimizer="adam")
    c = weft.Cluster.preset("M8", nodes=1)
    with pytest.raises(ValueError, match="zero must be"):
        weft.megatron_plan(step, c, t=1, p=1, d=8, zero=4)
    with pytest.raises(ValueError, match="auto, 0, 1, 2 or 3"):
        weft.megatron_plan(step, c, t=1, p=1, d=8, zero="fsdp")
    with pytest.raises(TypeError, match="zero must be"):
        weft.megatron_plan(step, c, t=1, p=1, d=8, zero=True)
    p = weft.megatron_plan(step, c, t=1, p=1, d=8, zero="2")
    assert p.zero == [2] and p.stages[0].zero_group == 8
    back = weft.Plan.from_json(p.to_json())
    assert back.zero == [2] and back.stages[0].zero_group == 8


def test_the_simulator_runs_the_plans_replica_collectives():
    # ZeRO-2's per-micro-batch reduce-scatter and the step's all-gather are in the stage's replica
    # collectives; the stage's times hold only their exposed part, and the plan's step is the
    # simulation with the collectives on the devices' streams (re-simulated from JSON).
    step = weft.models.gpt(layers=2, hidden=64, heads=4, seq=32, vocab=128, batch=32).train_step(optimizer="adam")
    c = weft.Cluster.preset("M8", nodes=1)
    p = weft.megatron_plan(step, c, t=1, p=1, d=8, zero=2, num_microbatches=4)
    st = p.stages[0]
    rc = st.replica_collectives
    assert rc.reduce_backward > 0 and rc.step_gather > 0 and rc.gather_forward == 0
    assert 0 < st.replica_exposed["backward"] <= rc.reduce_backward
    assert st.replica_exposed["optimizer"] >= rc.step_gather
    back = weft.Plan.from_json(p.to_json())
    assert back.stages[0].replica_collectives == rc
    assert back.resimulate_step_time() == pytest.approx(p.step_time)


def test_zero3_on_the_embedding_only_runs_and_equals_one_device():
    # Per-block levels from Python: a GPT whose tied embedding holds most parameters, 8 replicas,
    # a limit between ZeRO-2's and ZeRO-3's peaks: ZeRO-3 on the embedding's blocks only; lowered,
    # only those parameters are stored sharded and the step equals one device.
    step = weft.models.gpt(layers=2, hidden=32, heads=4, seq=8, vocab=1024, batch=16).train_step(optimizer="adam")
    c = weft.Cluster.preset("M8", nodes=1)
    kw = dict(t=1, p=1, d=8, num_microbatches=2, num_blocks=4, recompute="none", overlap_grad_sync=False,
              memory_fraction=1.0)
    z2, z3 = (weft.megatron_plan(step, c, zero=z, **kw) for z in (2, 3))
    assert z3.peak_memory < z2.peak_memory
    p = weft.megatron_plan(step, c, zero="auto", memory_limit=int((z2.peak_memory + z3.peak_memory) / 2), **kw)
    st = p.stages[0]
    assert st.zero in (1, 2) and st.zero_blocks, p.summary()
    assert "ZeRO-3 on blocks" in p.summary()
    assert weft.Plan.from_json(p.to_json()).stages[0].zero_blocks == st.zero_blocks
    prog = weft.lower(p, step, c)
    got, ref = weft.execute(prog, steps=2), weft.execute_reference(step, steps=2)
    assert got.losses == pytest.approx(ref.losses, rel=1e-10)
    for name, v in ref.parameters.items():
        assert got.parameters[name] == pytest.approx(v, rel=1e-9, abs=1e-12), name


@pytest.fixture(scope="module")
def llama7b():
    fwd = weft.models.gpt(layers=32, hidden=4096, heads=32, seq=2048, vocab=32000, batch=64, dtype="f16")
    return fwd, fwd.train_step(optimizer="adam"), weft.Cluster.preset("DGX-A100", nodes=1)


def test_llama7b_on_one_node_needs_sharded_states_and_fsdp_fits(llama7b):
    fwd, g, c = llama7b
    kw = dict(memory_limit=LIMIT, memory_fraction=1.0)
    # 18 bytes per parameter (f16 2, its gradient held in f32 4, master 4, moments 8): replicated over
    # 8 GPUs the state alone (118 GB) exceeds 38 GB, so any data-parallel plan must shard it.
    state = 18 * fwd.num_params()
    assert state > LIMIT
    with pytest.raises(ValueError, match="does not fit"):
        weft.megatron_plan(g, c, t=1, p=1, d=8, zero=0, **kw)
    fsdp = weft.megatron_plan(g, c, t=1, p=1, d=8, zero=3, recompute="full", **kw)
    assert fsdp.zero == [3] and fsdp.recompute == ["full"] and fsdp.peak_memory <= LIMIT
    # ZeRO-3 keeps 1/8 of the 18 bytes per parameter on each device (the LM head's and embedding's
    # tied parameter counted once per block that reads it).
    assert fsdp.stages[0].static_memory == pytest.approx(state / 8, rel=0.02)
    # weft.plan against FSDP and the best Megatron layout: the benchmark's goal, asserted by
    # test_benchmark_prints_the_three_and_the_plan_time (the same three plans).


def test_issue_layout_plan_call_fits_at_38_gb(llama7b):
    # The issue's call, at exactly 38 GB (16 bytes per parameter counted): one SPMD stage over the 8
    # GPUs, which shards the states inside its mesh and recomputes where it must.
    _, g, c = llama7b
    p = weft.layout_plan(g, c, [(0, 31, list(range(8)), [8])], num_microbatches=8, num_blocks=32,
                         memory_limit=LIMIT, memory_fraction=1.0)
    assert p.feasible and p.peak_memory <= LIMIT * (1 + 1e-9)


def test_hybrid_sharding_is_chosen_over_full_zero3_on_a_slow_nic(tmp_path):
    # Issue 22: GPT-13B-sized (40 layers, hidden 5120) on 4 DGX-A100 nodes whose NICs give 10 Gb/s
    # (a cluster JSON): ZeRO-3 over the 32 replicas shards inside each node and replicates across
    # nodes, faster than sharding over all 32 (every micro-batch's gathers would cross the NICs).
    fwd = weft.models.gpt(layers=40, hidden=5120, heads=40, seq=2048, vocab=32000, batch=128, dtype="f16")
    g = fwd.train_step(optimizer="adam")
    spec = json.loads(weft.Cluster.preset("DGX-A100", nodes=1).to_json())
    spec["nodes"][0]["nic"]["bandwidth"] = 1.25e9
    spec["nodes"] = spec["nodes"] * 4
    path = tmp_path / "slow_nic.json"
    path.write_text(json.dumps(spec))
    c = weft.Cluster.from_json(path.read_text())
    assert c.num_devices == 32
    hybrid = weft.megatron_plan(g, c, t=1, p=1, d=32, zero=3)
    full = weft.megatron_plan(g, c, t=1, p=1, d=32, zero=3, hybrid_sharding=False)
    assert hybrid.stages[0].zero_group == 8 and full.stages[0].zero_group == 32
    assert hybrid.step_time < full.step_time
    assert "hybrid: 4 groups of 8" in hybrid.summary()
    # On the nominal network (8 x 200 Gb/s per node) the choice flips: sharding over all 32 keeps
    # 4x less state per GPU, which pays once the gathers across nodes are cheap.
    fast = weft.Cluster.preset("DGX-A100", nodes=4)
    assert weft.megatron_plan(g, fast, t=1, p=1, d=32, zero=3).stages[0].zero_group == 32


def test_benchmark_prints_the_three_and_the_plan_time():
    root = os.path.join(os.path.dirname(__file__), "..", "..")
    script = os.path.join(root, "benchmarks", "plan", "bench_zero.py")
    out = subprocess.run([sys.executable, script, "--json"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    steps = {r["case"]: r["value"] for r in rows if r["metric"] == "step_time"}
    assert set(steps) == {"FSDP (ZeRO-3 + full checkpointing, d=8)", "best Megatron layout", "weft.plan"}
    assert any(r["metric"] == "plan_seconds" for r in rows)
    assert "goal (fits, no slower than both): met" in out.stdout
    own = {r["metric"]: r["value"] for r in rows if r["case"] == "weft.plan"}
    assert own["ratio_to_fsdp"] <= 1 + 1e-9 and own["ratio_to_megatron"] <= 1 + 1e-9
    assert own["peak_memory"] <= LIMIT * (1 + 1e-9)
