"""Notebook displays: every _repr_html_ renders, parses as HTML and shows the key figures."""
from html.parser import HTMLParser

import weft


class _Check(HTMLParser):
    def __init__(self):
        super().__init__()
        self.stack, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, (self.stack, tag)
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)


def parse(html: str) -> str:
    p = _Check()
    p.feed(html)
    p.close()
    assert not p.stack, p.stack  # every tag closed
    return " ".join(p.text)


def test_every_rich_display_parses_and_shows_the_figures():
    g = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8)
    step = g.train_step()
    c = weft.Cluster.preset("p3.8xlarge")
    plan = weft.plan(step, c)
    prog = weft.lower(plan, step, c)
    res = weft.execute(prog, steps=1)
    spec = weft.ShardingSpec.parse("S(0) R", [8, 4], [2, 2])
    mesh = weft.DeviceMesh([2, 2], range(4))
    text = {name: parse(obj._repr_html_()) for name, obj in
            [("plan", plan), ("graph", g), ("cluster", c), ("mesh", mesh), ("spec", spec), ("program", prog),
             ("result", res)]}
    from weft.display import _seconds

    # times in a readable unit (issue 39): "484.2 µs", not "0.0004842 s"
    assert f"step time {_seconds(plan.step_time)}" in text["plan"] and "samples/s" in text["plan"]
    assert plan.step_time < 1e-3 and "µs" in _seconds(plan.step_time)
    assert "parameters" in text["graph"] and f"{g.num_params() / 1e6:.4g} M" in text["graph"]
    assert "4× V100-SXM2-16GB" in text["cluster"]
    assert "2x2" in text["mesh"] and "[4, 4]" in text["spec"] and "Shard(0)" in text["spec"]
    assert f"{prog.num_ranks}" in text["program"] and "instructions" in text["program"]
    assert f"{res.losses[0]:.6g}" in text["result"]


def test_schedule_simulation_reshard_and_spmd_displays():
    # 1F1B, 4 stages, 8 micro-batches, F = 1 s, B = 2 s: step (m + p - 1)(F + B) = 33 s,
    # bubble (p - 1) / (m + p - 1) = 27.3 %, every device busy m (F + B) = 24 s.
    s = weft.schedule("1f1b", stages=4, micro_batches=8)
    text = parse(s._repr_html_())
    assert "1f1b" in text and "micro-batches 8" in text and "ops 64" in text, text
    assert repr(s) == "Schedule(1f1b, 4 stages on 4 devices, 8 micro-batches)"
    r = weft.simulate(s, weft.StageSpec(forward_time=1.0, backward_time=2.0))
    text = parse(r._repr_html_())
    assert "step time 33 s" in text and "bubble 27.3 %" in text and text.count("24 s") == 4, text
    assert repr(r).startswith("SimulationResult(1f1b: step 33 s, bubble 27.3 %")
    # S(0) R on a 2x2 mesh of hosts {0,1}, {2,3} (two devices each) -> S(1) R on devices 4..7: each
    # destination host needs one half of the columns of the 8x4 f32 tensor (64 B), nothing more.
    p = weft.reshard.plan([8, 4], "f32", "S(0) R", ([2, 2], [0, 1, 2, 3]), "S(1) R", ([2, 2], [4, 5, 6, 7]),
                          devices_per_host=2, bandwidth=1e9)
    assert p.nic_bytes_received() == {2: 64, 3: 64}
    text = parse(p._repr_html_())
    assert "completion time" in text and "lower bound" in text and "1 GB/s" in text and text.count("64 B") >= 2
    assert f"{len(p.ops)} transfers" in repr(p) and "s," in repr(p)
    g = weft.models.gpt(layers=1, hidden=64, heads=4, seq=8, vocab=128, batch=8).train_step()
    res = weft.spmd_search(g, weft.Cluster.preset("p3.8xlarge"), weft.DeviceMesh([2], [0, 1]), level="O3")
    text = parse(res._repr_html_())
    assert "cost per step" in text and "wte" in text and "peak memory" in text and "per device" in text, text
    names = list(res.param_specs)
    assert all(name in text for name in names[:12]) and f"... {len(names) - 12} more" in text


def test_time_units_are_readable():
    from weft.display import _seconds

    assert [_seconds(x) for x in (33.0, 0.0125, 6.4e-8, 0.0)] == ["33 s", "12.5 ms", "64 ns", "0 s"]
    # issue 39: a step of 1.59 s is "1.59 s", never "1.59e+03 ms"; minutes past 60 s
    assert [_seconds(x) for x in (1.59, 5.3e-6, 90.0)] == ["1.59 s", "5.3 µs", "1.5 min"]


def test_sizes_are_readable():
    from weft.display import _bytes

    assert [_bytes(x) for x in (512, 826e3, 1.3e6, 15.5e9, 2e12)] == ["512 B", "826 kB", "1.3 MB", "15.5 GB", "2 TB"]


def test_a_training_graph_displays():
    # issue 39: the training step's _repr_html_ raised (training_flops() of a training graph)
    step = weft.models.gpt(layers=1, hidden=64, heads=4, seq=8, vocab=128, batch=8).train_step()
    text = parse(step._repr_html_())
    assert "training step" in text and "FLOPs per step" in text and f"{step.forward_flops():.4g}" in text


def test_run_describe_prints_adaptive_step_times():
    from types import SimpleNamespace

    from weft.runtime import describe

    text = describe(SimpleNamespace(losses=[1.0, 0.5], step_seconds=[[1.59, 0.0021]]))
    assert text.splitlines()[1] == "rank 0: 1.59 s, 2.1 ms per step" and "e+" not in text


def test_plan_and_stage_reprs_use_readable_units():
    step = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8).train_step()
    p = weft.megatron_plan(step, weft.Cluster.preset("p3.8xlarge"), t=1, p=2, d=2, zero=3)
    text = repr(p)
    assert text.startswith("Plan(gpt.train on Cluster(1x p3.8xlarge[4x V100-SXM2-16GB]): megatron t=1 p=2 d=2, 2 stage(s)")
    assert " µs, " in text and " kB/device)" in text and "e-0" not in text, text
    st = repr(p.stages[0])
    assert st.startswith("PlanStage(0: blocks 0-0 on 2 devices, mesh (2x1), F ") and "ZeRO-3 over 2" in st, st
    assert "e-0" not in st and " kB" in st, st
