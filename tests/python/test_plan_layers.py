# Blocks follow the model (issue 37): a layout evaluation that asks for a pipeline depth cuts the
# model at its repeated layers, one block each, so every depth that divides the layer count splits
# the layers equally; errors speak of layers.
import re

import pytest

import weft


def _gpt(layers, batch=96):
    return weft.models.gpt(layers=layers, hidden=64, heads=4, seq=32, vocab=512, batch=batch).train_step(
        optimizer="adam")


def _layers_of_stage(stage):
    """The zoo's layer indices whose forward ops ("h<i>.<...>") a stage holds."""
    return sorted({int(m.group(1)) for n in stage.ops if (m := re.match(r"h(\d+)\.", n))})


@pytest.mark.parametrize("layers,t,p,d,nodes", [(96, 8, 12, 1, 12), (96, 1, 32, 3, 12), (96, 2, 48, 1, 12),
                                                (96, 1, 96, 1, 12), (105, 8, 35, 1, 35)])
def test_megatron_depth_splits_the_layers_equally(layers, t, p, d, nodes):
    g = _gpt(layers)
    c = weft.Cluster.preset("DGX-A100", nodes=nodes)
    plan = weft.megatron_plan(g, c, t=t, p=p, d=d, num_microbatches=96 // d)
    assert plan.num_blocks == layers  # one block per layer
    per = layers // p
    # Each stage holds layers s·per .. s·per + per − 1 (Megatron's split): the embedding rides with
    # the first stage, the final norm, LM head and loss with the last.
    assert [_layers_of_stage(s) for s in plan.stages] == [list(range(k * per, k * per + per)) for k in range(p)]
    # Equal FLOPs per stage, by hand: a layer's contractions are 24·T·h² (QKV 6, projection 2, MLP 8 + 8)
    # + 4·b·s²·h (scores and context), T = b·s tokens of the graph's global batch.
    b, s, h = 96, 32, 64
    layer = 24 * b * s * h * h + 4 * b * s * s * h
    flops = {o["name"]: o["flops"] for o in g.ops if o["kind"] == "einsum"}
    for st in plan.stages:
        mine = sum(flops.get(n, 0.0) for n in st.ops if re.match(r"h\d+\.", n))
        assert mine == pytest.approx(per * layer, rel=1e-12)
    # Identical middle stages are priced identically.
    mid = plan.stages[1:-1]
    assert all(x.forward_time == pytest.approx(mid[0].forward_time, rel=1e-9) for x in mid)
    assert all(x.backward_time == pytest.approx(mid[0].backward_time, rel=1e-9) for x in mid)


def test_the_old_sixteen_blocks_refused_35_stages_and_a_depth_beyond_the_layers_names_them():
    g = _gpt(105, batch=35)
    c = weft.Cluster.preset("DGX-A100", nodes=35)
    # With 16 blocks (the old default) the layout cannot be expressed at all.
    with pytest.raises(ValueError, match=r"35 stages but only 16 blocks \(num_blocks\)"):
        weft.megatron_plan(g, c, t=8, p=35, d=1, num_microbatches=35, num_blocks=16)
    # Deeper than the layers: the blocks as before (up to 16, cut anywhere), and a refusal beyond
    # them names the layers.
    small = _gpt(4, batch=32)
    with pytest.raises(ValueError, match=r"32 stages but only 16 blocks \(the model repeats 4 layers of 25 forward"):
        weft.megatron_plan(small, weft.Cluster.preset("DGX-A100", nodes=4), t=1, p=32, d=1, num_microbatches=32)
    deeper = weft.megatron_plan(small, weft.Cluster.preset("DGX-A100", nodes=1), t=1, p=8, d=1, num_microbatches=8)
    assert deeper.num_blocks == 16 and len(deeper.stages) == 8


def test_twelve_stages_of_96_layers_were_priced_unevenly_with_16_blocks():
    # The 1.35x of issue 37: 16 blocks over 12 stages put 2 blocks (12 layers) on some stages and 1
    # (6 layers) on others; with a block per layer every stage holds 8 and the step is shorter.
    g = _gpt(96)
    c = weft.Cluster.preset("DGX-A100", nodes=12)
    even = weft.megatron_plan(g, c, t=8, p=12, d=1, num_microbatches=96)
    old = weft.megatron_plan(g, c, t=8, p=12, d=1, num_microbatches=96, num_blocks=16)
    assert sorted({len(_layers_of_stage(s)) for s in old.stages}) != [8]
    assert max(len(_layers_of_stage(s)) for s in old.stages) >= 12
    assert even.step_time < old.step_time / 1.2


def test_repeated_layers_of_the_zoo():
    for name, count in [("GPT-175B", 96), ("GPT-39B", 48)]:
        g = weft.models.build(name, batch=8, dtype="f16").train_step(optimizer="adam")
        rl = weft.pipeline.repeated_layers(g)
        # 25 forward ops per block, + 3 dropout sites (probabilities, both branches) of the papers' 0.1
        assert rl.count == count and rl.period == 25 + 3 and len(rl.starts) == count
        assert all(b - a == rl.period for a, b in zip(rl.starts, rl.starts[1:]))
        lg = weft.pipeline.group_by_layers(g, rl)
        assert len(lg) == count
        # Identical layers, identical blocks (the first holds the embedding, the last the head too).
        inner = [blk.compute_flops for blk in lg.blocks[1:-1]]
        assert max(inner) == pytest.approx(min(inner), rel=1e-12)


def _forward_runs(prog, rank):
    """A rank's forward computes in runs: a run ends at a backward or update op, or where an op
    repeats (a full recomputation re-makes one unit right before the backward that reads it, so a
    run that is not a whole stage's forward is such a unit)."""
    runs, cur = [], None
    for i in prog.instructions(rank):
        if i["kind"] != "compute":
            continue
        op = i["op"]
        if op.startswith("d:") or op.startswith("adam"):
            cur = None
            continue
        if cur is None or op in cur:
            cur = []
            runs.append(cur)
        cur.append(op)
    return runs


def test_the_lowering_regroups_at_the_plans_layer_cuts():
    # A GPT whose LM head outweighs a layer: the FLOP-balanced grouping into 4 blocks cuts inside
    # layers, the plan's layer blocks do not; the lowering must re-make what the plan priced (one
    # layer at a time under full recomputation), so it regroups at Plan.block_cuts.
    from test_execute import assert_same

    step = weft.models.gpt(layers=4, hidden=32, heads=4, seq=8, vocab=512, batch=8).train_step(optimizer="adam")
    rl = weft.pipeline.repeated_layers(step)
    anywhere = weft.pipeline.group_layers(step, 4)
    by_layer = weft.pipeline.group_by_layers(step, rl)
    assert [b.forward_ops for b in anywhere.blocks] != [b.forward_ops for b in by_layer.blocks]
    c = weft.Cluster.preset("p3.8xlarge")
    plan = weft.megatron_plan(step, c, t=1, p=2, d=2, num_microbatches=2, recompute="full")
    assert list(plan.block_cuts) == list(rl.starts[1:])
    assert list(weft.Plan.from_json(plan.to_json()).block_cuts) == list(plan.block_cuts)
    prog = weft.lower(plan, step, c)
    for rank, stage_layers in [(0, {0, 1}), (2, {2, 3})]:  # rank 2: stage 1's first device
        runs = _forward_runs(prog, rank)
        whole = [r for r in runs if {int(m.group(1)) for n in r if (m := re.match(r"h(\d+)\.", n))} == stage_layers]
        units = [r for r in runs if r not in whole]
        assert len(whole) == 2 and len(units) == 2 * 2  # per micro-batch: its forward, then two units
        for run in units:  # each re-made unit is one whole layer (its 25 ops), as the plan priced
            got = {int(m.group(1)) for n in run if (m := re.match(r"h(\d+)\.", n))}
            assert len(got) == 1 and got <= stage_layers, run
            assert sum(1 for n in run if n.startswith("h")) == 25, run
    assert_same(weft.execute(plan, step, c), weft.execute_reference(step), 1e-10)
