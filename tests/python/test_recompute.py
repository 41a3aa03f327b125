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
