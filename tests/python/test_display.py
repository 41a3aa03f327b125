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
    assert f"{plan.step_time:.4g} s" in text["plan"] and "samples/s" in text["plan"]
    assert "parameters" in text["graph"] and f"{g.num_params() / 1e6:.4g} M" in text["graph"]
    assert "4× V100-SXM2-16GB" in text["cluster"]
    assert "2x2" in text["mesh"] and "[4, 4]" in text["spec"] and "Shard(0)" in text["spec"]
    assert f"{prog.num_ranks}" in text["program"] and "instructions" in text["program"]
    assert f"{res.losses[0]:.6g}" in text["result"]
