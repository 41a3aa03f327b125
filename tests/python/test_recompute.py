"""Activation recomputation from Python (issue 17): the option on plan / megatron_plan / layout_plan,
Plan.recompute per stage, bad values, and Megatron's GPT-3 175B layout evaluated as Megatron ran it."""
import pytest

import weft


def _small():
    return weft.models.gpt(layers=4, hidden=64, heads=4, seq=32, vocab=128, batch=4).train_step()


def test_layout_plan_full_adds_one_forward_and_keeps_less():
    g = _small()
    c = weft.Cluster.preset("M8", nodes=1)
    plans = {r: weft.layout_plan(g, c, [(0, 3, [0])], num_blocks=4, recompute=r) for r in ("none", "selective", "full")}
    none, sel, full = plans["none"].stages[0], plans["selective"].stages[0], plans["full"].stages[0]
    assert [plans[r].recompute for r in ("none", "selective", "full")] == [["none"], ["selective"], ["full"]]
    assert full.backward_time - none.backward_time == pytest.approx(none.forward_time, rel=1e-9)
    assert full.activation_memory < sel.activation_memory < none.activation_memory
    assert none.backward_time < sel.backward_time < full.backward_time
    # The choice survives the JSON round trip and shows in the summary.
    assert weft.Plan.from_json(plans["full"].to_json()).recompute == ["full"]
    assert "recompute     [0] full" in plans["full"].summary()
    assert "recompute     none" in plans["none"].summary()


def test_plan_picks_recompute_only_when_memory_forces_it():
    g = weft.models.gpt(layers=4, hidden=64, heads=4, seq=64, vocab=128, batch=8).train_step()
    c = weft.Cluster.preset("M8", nodes=1)
    ample = weft.plan(g, c, memory_fraction=1.0)
    assert set(ample.recompute) == {"none"}
    with pytest.raises(ValueError, match="no plan fits"):
        weft.plan(g, c, memory_fraction=1.0, memory_limit=1.4e6, recompute="none")
    tight = weft.plan(g, c, memory_fraction=1.0, memory_limit=1.4e6)
    assert set(tight.recompute) - {"none"}
    assert tight.peak_memory <= 1.4e6


def test_bad_recompute_values():
    g = _small()
    c = weft.Cluster.preset("M8", nodes=1)
    with pytest.raises(ValueError, match="auto, none, selective or full"):
        weft.plan(g, c, recompute="sometimes")
    with pytest.raises(TypeError, match="recompute must be a string"):
        weft.plan(g, c, recompute=True)


def test_megatron_gpt3_175b_with_full_recompute_is_evaluable():
    # Issue 17: GPT-3 175B (seq 2048, batch 1536) on 128 DGX-A100 nodes as Megatron-LM ran it:
    # t=8, p=16, d=8, full recomputation, micro-batch 1 (192 micro-batches per replica).
    g = weft.models.build("GPT-175B", batch=1536, dtype="f16").train_step(optimizer="adam")
    c = weft.Cluster.preset("DGX-A100", nodes=128)
    p = weft.megatron_plan(g, c, t=8, p=16, d=8, recompute="full", num_microbatches=192)
    assert p.feasible and p.num_stages == 16 and p.data_parallel == 8 and p.microbatch_size == 1
    assert p.recompute == ["full"] * 16
    assert p.peak_memory <= 80e9 * 0.9
    # Recomputation is priced: the same layout without it is faster per step (and holds more).
    q = weft.megatron_plan(g, c, t=8, p=16, d=8, recompute="none", num_microbatches=192)
    assert q.step_time < p.step_time and q.peak_memory > p.peak_memory
    # Each micro-batch's F + B (B about 2F) becomes 2F + B: 4/3 on the pipelined part; the
    # optimizer step and the exposed gradient sync do not grow, so the step grows by a bit less.
    assert 1.15 < p.step_time / q.step_time < 4 / 3 + 0.01


def _two_stage_plans():
    # The executor test's 2-stage 1F1B GPT (one block per layer, 2 micro-batches: stage 0 holds
    # both micro-batches' activations between their forwards and backwards).
    g = weft.models.gpt(layers=4, hidden=32, heads=4, seq=64, vocab=32, batch=8).train_step()
    c = weft.Cluster.preset("p3.8xlarge", nodes=1)

    def layout(recompute, limit=0.0):
        return weft.layout_plan(g, c, [(0, 1, [0]), (2, 3, [1])], num_microbatches=2, num_blocks=4,
                                recompute=recompute, memory_fraction=1.0, memory_limit=limit)

    return g, c, layout


def test_selective_on_some_blocks_runs_as_planned():
    # Issue 37: under a limit halfway between stage 0's peaks with none and with selective on both
    # of its blocks, the planner makes one block's attention cores selective; lowered and run on
    # the CPU executor it equals one device, and its executed peak lies between none's and
    # selective's (and within 15 % of the plan: the executor stores f64, the plan counts f32).
    g, c, layout = _two_stage_plans()
    none, sel = layout("none"), layout("selective")
    n0, s0 = none.stages[0].peak_memory, sel.stages[0].peak_memory
    mixed = layout("auto", n0 - (n0 - s0) / 2)
    st = mixed.stages[0]
    assert (st.recompute, st.recompute_blocks, st.selective_blocks) == ("selective", [], [0])
    assert mixed.stages[1].recompute == "none"
    assert s0 < st.peak_memory <= n0 - (n0 - s0) / 2
    assert none.stages[0].backward_time < st.backward_time < sel.stages[0].backward_time
    assert "recompute     [0] selective on 1 of 2 blocks [1] none" in mixed.summary()
    ref = weft.execute_reference(g, steps=2)
    peaks = {}
    for name, p in (("none", none), ("selective", sel), ("mixed", mixed)):
        got = weft.execute(p, g, c, steps=2)
        assert got.max_relative_error(ref) < 1e-10, name
        peaks[name] = got.peak_bytes[0]
    assert peaks["selective"] < peaks["mixed"] < peaks["none"]  # measured: 6.20 < 6.66 < 7.71 MB
    assert peaks["mixed"] / 2 == pytest.approx(st.peak_memory, rel=0.15)
    # Full on one block beside selective on the other: the limits from stage 0's selective peak
    # down to full's, the first where the planner takes both; the full block is re-made whole, the
    # other's cores only: the same values, the executed peak between full's and the one above.
    full = layout("full")
    f0 = full.stages[0].peak_memory
    both = None
    for i in range(1, 40):
        q = layout("auto", s0 - (s0 - f0) * i / 40)
        if q.stages[0].recompute_blocks and q.stages[0].selective_blocks:
            both = q
            break
    assert both is not None
    st = both.stages[0]
    assert st.recompute == "full" and sorted(st.recompute_blocks + st.selective_blocks) == [0, 1]
    for name, p in (("full", full), ("both", both)):
        got = weft.execute(p, g, c, steps=2)
        assert got.max_relative_error(ref) < 1e-10, name
        peaks[name] = got.peak_bytes[0]
    assert peaks["full"] < peaks["both"] < peaks["mixed"]  # measured: 3.01 < 4.01 < 6.66 MB
    assert peaks["both"] / 2 == pytest.approx(st.peak_memory, rel=0.15)


def test_selective_on_some_blocks_runs_on_the_torch_runtime():
    # The same per-block plan on two gloo processes (weft.run): the values of one device.
    pytest.importorskip("torch")
    g, c, layout = _two_stage_plans()
    n0, s0 = layout("none").stages[0].peak_memory, layout("selective").stages[0].peak_memory
    p = layout("auto", n0 - (n0 - s0) / 2)
    assert p.stages[0].selective_blocks == [0]
    got = weft.run(weft.lower(p, g, c), steps=2, dtype="f64")
    assert got.max_relative_error(weft.execute_reference(g, steps=2)) < 1e-10


def test_selective_blocks_json_round_trip_and_bad_input():
    import json

    g, c, layout = _two_stage_plans()
    n0, s0 = layout("none").stages[0].peak_memory, layout("selective").stages[0].peak_memory
    p = layout("auto", n0 - (n0 - s0) / 2)
    back = weft.Plan.from_json(p.to_json())
    assert back.stages[0].selective_blocks == [0] and back.to_json() == p.to_json()

    def bad(edit, match):
        j = json.loads(p.to_json())
        edit(j["stages"][0])
        with pytest.raises(ValueError, match=match):
            weft.Plan.from_json(json.dumps(j))

    bad(lambda s: s.update(selective_blocks=[7]), r"selective_blocks names block 7, the plan has 4 blocks")
    bad(lambda s: s.update(selective_blocks=[-1]), r"selective_blocks names block -1")
    bad(lambda s: s.update(selective_blocks=[0, 0]), r"selective_blocks names block 0 twice")
    bad(lambda s: s.update(recompute="none"), r"selective_blocks lists blocks but recompute is 'none'")
    bad(lambda s: s.update(recompute="full"), r"recompute is 'full' on every block")
    bad(lambda s: s.update(recompute="full", recompute_blocks=[0]),
        r"names block 0 in both recompute_blocks and selective_blocks")
    # Full on one block beside selective on the other is a valid per-block assignment.
    j = json.loads(p.to_json())
    j["stages"][0].update(recompute="full", recompute_blocks=[1])
    q = weft.Plan.from_json(json.dumps(j))
    assert (q.stages[0].recompute_blocks, q.stages[0].selective_blocks) == ([1], [0])
    assert "recompute     [0] full on 1, selective on 1 of 2 blocks" in q.summary()
    # Plans written before per-block selective (no field) read as before.
    j = json.loads(p.to_json())
    del j["stages"][0]["selective_blocks"]
    j["stages"][0]["recompute"] = "selective"
    assert weft.Plan.from_json(json.dumps(j)).stages[0].selective_blocks == []


def test_cli_summary_shows_per_block_modes(tmp_path, capsys):
    # make_plan at 1.3 MB per device (no layout keeps every activation, test_recompute.cpp's
    # "tight" plan): the planner recomputes per block, and `weft plan` prints each stage's
    # modes as the plan it writes holds them.
    from weft.cli import main

    g = weft.models.gpt(layers=4, hidden=64, heads=4, seq=64, vocab=128, batch=4)
    (tmp_path / "g.json").write_text(g.to_json())
    (tmp_path / "c.json").write_text(weft.Cluster.preset("M8", nodes=1).to_json())
    assert main(["plan", "--model", str(tmp_path / "g.json"), "--cluster", str(tmp_path / "c.json"),
                 "--memory-limit", "1.3e6", "--memory-fraction", "1", "--threads", "2",
                 "--json", str(tmp_path / "p.json")]) == 0
    out = capsys.readouterr().out
    p = weft.Plan.from_json((tmp_path / "p.json").read_text())
    assert p.peak_memory <= 1.3e6
    assert any(st.selective_blocks for st in p.stages)  # weft.plan here: 1.203 ms, 1.216 ms with full on blocks alone
    words = []
    for st in p.stages:
        some = ([f"full on {len(st.recompute_blocks)}"] if st.recompute_blocks else []) + \
               ([f"selective on {len(st.selective_blocks)}"] if st.selective_blocks else [])
        n = st.last_block - st.first_block + 1
        words.append(f"[{st.index}] {', '.join(some)} of {n} blocks" if some else f"[{st.index}] {st.recompute}")
    assert "recompute     " + " ".join(words) in out
    for st in p.stages:
        if st.selective_blocks:
            assert f"recompute selective on blocks {','.join(map(str, st.selective_blocks))}: " in out
