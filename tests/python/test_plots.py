"""Figures: Plan.show, ShardingSpec.show, SimulationResult.plot_gantt return Figures with the expected
artists and never change matplotlib's backend (a notebook's inline plots keep working)."""
import pytest

matplotlib = pytest.importorskip("matplotlib")

import weft  # noqa: E402


@pytest.fixture(scope="module")
def plan():
    step = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8).train_step()
    return weft.megatron_plan(step, weft.Cluster.preset("p3.8xlarge"), t=2, p=2, d=1, num_microbatches=4)


def test_plan_show(plan, tmp_path):
    backend = matplotlib.get_backend()
    fig = plan.show(path=str(tmp_path / "plan.png"))
    assert isinstance(fig, matplotlib.figure.Figure) and (tmp_path / "plan.png").stat().st_size > 0
    devices, gantt, memory, spec = fig.axes[:4]
    assert len(devices.patches) == len(plan.devices_used)  # one square per device
    # one bar per (stage, micro-batch, phase): F and B for each of 4 micro-batches on 2 stages, + updates
    bars = [p for p in gantt.patches if p.get_height() == pytest.approx(0.8)]
    assert len(bars) >= 2 * 4 * 2
    assert len(memory.patches) == len(plan.devices_used)
    assert [t.get_text() for t in memory.get_xticklabels()] == [str(d) for d in plan.devices_used]
    assert len(spec.images) == 1
    assert matplotlib.get_backend() == backend


def test_spec_show_marks_the_holder_of_every_element():
    spec = weft.ShardingSpec.parse("S(0,2) S(1)", [8, 4], [2, 2])  # strided rows: 0,1 | 2,3 | 0,1 ...
    fig = spec.show()
    img = fig.axes[0].images[0].get_array()
    for i in range(8):
        for j in range(4):
            coord = [(i // 2) % 2, j // 2]
            assert img[i, j] == coord[0] * 2 + coord[1]
    with pytest.raises(ValueError, match="1-D and 2-D"):
        weft.ShardingSpec.parse("S(0) R", [4, 4, 4], [2, 2]).show()


def test_gantt_is_a_figure_without_pyplot_state():
    backend = matplotlib.get_backend()
    r = weft.simulate(weft.schedule("1f1b", stages=2, micro_batches=3), weft.StageSpec(forward_time=1.0, backward_time=2.0))
    fig = r.plot_gantt()
    assert isinstance(fig, matplotlib.figure.Figure)
    assert matplotlib.get_backend() == backend
    import matplotlib.pyplot as plt

    assert all(plt.figure(n) is not fig for n in plt.get_fignums())  # not registered with pyplot


def test_reshard_show_one_bar_per_transfer_on_its_host_row():
    backend = matplotlib.get_backend()
    p = weft.reshard.plan([8, 4], "f32", "S(0) R", ([2, 2], [0, 1, 2, 3]), "S(1) R", ([2, 2], [4, 5, 6, 7]),
                          devices_per_host=2, bandwidth=1e9)
    fig = p.show()
    assert isinstance(fig, matplotlib.figure.Figure)
    ax = fig.axes[0]
    bars = sorted(((b.get_x(), b.get_width(), b.get_y() + b.get_height() / 2) for b in ax.patches))
    want = sorted((op.start, op.duration, float(op.send_host)) for op in p.ops)  # hosts 0..3 are rows 0..3
    assert len(bars) == len(p.ops) == 4
    assert bars == [pytest.approx(w) for w in want]
    # 4 transfers of 32 B at 1 GB/s, two per sending host: each host is busy 64 ns, the lower bound.
    assert all(w == pytest.approx(32e-9) for _, w, _ in bars) and p.completion_time == pytest.approx(64e-9)
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"host {h} (dev {2 * h},{2 * h + 1})" for h in range(4)]
    assert matplotlib.get_backend() == backend
