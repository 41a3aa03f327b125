"""weft.plan: the planner from Python (small models; the acceptance runs are in the C++ tests)."""
import json

import pytest

import weft


def small_gpt(batch=8, layers=2, hidden=64):
    return weft.models.gpt(layers=layers, hidden=hidden, heads=4, seq=32, vocab=256, batch=batch)


def one_node(gpus):
    c = weft.Cluster.preset("M8", nodes=1)
    d = json.loads(c.to_json())
    d["nodes"][0]["num_devices"] = gpus
    return weft.Cluster.from_json(json.dumps(d))


def test_plan_one_gpu_is_one_stage_and_adds_up():
    g = small_gpt()
    p = weft.plan(g, one_node(1), num_microbatches=4, compare_megatron=False)
    assert isinstance(p, weft.Plan)
    assert p.num_stages == 1 and p.stages[0].devices == [0]
    st = p.stages[0]
    assert p.step_time == pytest.approx(4 * (st.forward_time + st.backward_time) + st.optimizer_time, rel=1e-12)
    assert p.num_microbatches * p.microbatch_size * p.data_parallel == 8
    assert p.throughput == pytest.approx(8 / p.step_time)
    assert 0 < p.mfu < 1
    assert "Plan for" in p.summary() and "step time" in p.summary()


def test_plan_json_round_trip_and_resimulation(tmp_path):
    g = small_gpt(batch=16, layers=4)
    p = weft.plan(g, one_node(4), schedule="1F1B", num_microbatches=4, num_blocks=4, compare_megatron=False)
    text = p.to_json()
    q = weft.Plan.from_json(text)
    assert q == p and q.to_json() == text
    assert q.resimulate_step_time() == pytest.approx(p.step_time, rel=1e-12)
    with pytest.raises(ValueError, match="not valid JSON"):
        weft.Plan.from_json("{")
    d = json.loads(text)
    del d["stages"]
    with pytest.raises(ValueError, match="stages"):
        weft.Plan.from_json(json.dumps(d))


def test_plan_infeasible_says_how_much_memory_is_missing():
    g = small_gpt()
    with pytest.raises(ValueError, match=r"GB missing"):
        weft.plan(g, one_node(1), memory_limit=1e3)
    with pytest.raises(ValueError, match="unknown schedule"):
        weft.plan(g, one_node(1), schedule="3F3B")
    with pytest.raises(ValueError, match="unknown option"):
        weft.plan(g, one_node(1), no_such_option=1)


def test_plan_progress_callback_and_bar(capsys):
    g = small_gpt()
    seen = []
    weft.plan(g, one_node(2), num_microbatches=2, compare_megatron=False,
              progress=lambda phase, f, msg: seen.append((phase, f)))
    assert seen and seen[-1][0] == "done" and seen[-1][1] == 1.0
    assert all(0.0 <= f <= 1.0 for _, f in seen)
    weft.plan(g, one_node(2), num_microbatches=2, compare_megatron=False, progress=True)  # tqdm bar


def test_plan_no_worse_than_megatron_layouts_on_a_small_model():
    g = small_gpt(batch=16, layers=4, hidden=128)
    c = one_node(4)
    p = weft.plan(g, c, num_microbatches=4, num_blocks=4)
    m = weft.megatron_plan(g, c, num_microbatches=4, num_blocks=4)
    assert p.step_time <= m.step_time * (1 + 1e-9)
    one = weft.megatron_plan(g, c, t=2, p=2, d=1, num_microbatches=4, num_blocks=4)
    assert one.strategy == "megatron t=2 p=2 d=1" and one.num_stages == 2
    assert p.step_time <= one.step_time * (1 + 1e-9)


def test_plan_forward_graph_is_turned_into_a_training_step():
    fwd = weft.models.gpt(layers=1, hidden=32, heads=4, seq=16, vocab=64, batch=4)
    p = weft.plan(fwd, one_node(1), num_microbatches=1, compare_megatron=False)
    assert p.model.endswith("train") or p.num_stages == 1


def test_cli_plan_and_version(tmp_path, capsys):
    from weft.cli import main

    assert main(["version"]) == 0
    out = tmp_path / "plan.json"
    assert main(["plan", "--model", "GPT-Medium", "--batch", "4", "--cluster", "M8", "--nodes", "1",
                 "--num-microbatches", "2", "--num-blocks", "4", "--no-megatron", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "Plan for" in text
    q = weft.Plan.from_json(out.read_text())
    assert q.num_microbatches == 2


def test_rebatch_and_batch_size():
    big = weft.models.gpt(layers=1, hidden=32, heads=4, seq=16, vocab=64, batch=8).train_step(optimizer="adam")
    small = weft.models.gpt(layers=1, hidden=32, heads=4, seq=16, vocab=64, batch=2).train_step(optimizer="adam")
    assert weft._weft.batch_size(big) == 8
    assert weft._weft.rebatch(big, 2) == small
    with pytest.raises(ValueError):
        weft._weft.rebatch(big, 0)
    assert weft._weft.model_state_bytes(big) == pytest.approx(4 * big.param_bytes())
