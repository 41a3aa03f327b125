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
    # three stacked bars per device (state, in-flight activations, transient) summing to its memory
    assert len(memory.patches) == 3 * len(plan.devices_used)
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


def _renderer(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # the figure's own canvas is a bare FigureCanvasBase (no pyplot)
    canvas.draw()
    return canvas.get_renderer()


def _extent(artist, renderer):
    return artist.get_window_extent(renderer)


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


def _check_plan_figure(plan, fig):
    """What issue 39 asked of plan.show: memory bars visible in an adaptive unit, the Gantt legend
    listing only the kinds drawn and lying outside the axes, stage labels without Python tuples."""
    devices, gantt, memory, spec = fig.axes[:4]
    renderer = _renderer(fig)
    # memory: the stacked bars of each device add up to its memory in the axis unit, and fill a
    # visible part of the axis (no linear GB axis under kilobytes)
    unit = memory.get_ylabel()[len("memory ("):-1]
    scale = {"B": 1.0, "kB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}[unit]
    n = len(plan.devices_used)
    bars = memory.patches
    assert len(bars) == 3 * n
    heights = [sum(bars[k * n + i].get_height() for k in range(3)) for i in range(n)]
    assert heights == [pytest.approx(m / scale) for m in plan.device_memory]
    assert min(heights) > 0.2 * memory.get_ylim()[1]
    assert all(bars[i].get_height() > 0 for i in range(n))  # the state part
    # the Gantt legend: exactly the kinds drawn, outside the axes and off every bar
    drawn = {p.get_facecolor() for p in gantt.patches if p.get_height() == pytest.approx(0.8)}
    legend = gantt.get_legend()
    assert legend is not None and len(legend.get_patches()) == len(drawn)
    assert {p.get_facecolor() for p in legend.get_patches()} == drawn
    box = _extent(legend, renderer)
    assert not _overlaps(box, _extent(gantt, renderer))
    for ax in fig.axes[:4]:
        if ax is not gantt:
            assert not _overlaps(box, _extent(ax, renderer)), ax.get_title()
    mem_legend = memory.get_legend()
    assert mem_legend is not None and not _overlaps(_extent(mem_legend, renderer), _extent(memory, renderer))
    # device labels: "dev D", "S<stage> (r,c)", never a Python tuple such as "(0,)"
    labels = [t.get_text() for t in devices.texts]
    assert len(labels) == n and not any(",)" in t or ", " in t for t in labels), labels
    return devices, memory, labels


def test_plan_figures_of_a_tiny_model_and_a_zero3_plan(tmp_path):
    step = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8).train_step()
    cluster = weft.Cluster.preset("p3.8xlarge")
    tiny = weft.megatron_plan(step, cluster, t=2, p=2, d=1, num_microbatches=4)  # kilobytes per device
    fig = tiny.show(path=str(tmp_path / "tiny.png"))
    assert (tmp_path / "tiny.png").read_bytes()[:4] == b"\x89PNG"
    devices, memory, labels = _check_plan_figure(tiny, fig)
    assert memory.get_ylabel() in ("memory (kB)", "memory (MB)") and all("ZeRO" not in t for t in labels)
    assert not any(p.get_hatch() for p in memory.patches)  # nothing sharded: nothing hatched
    assert "ZeRO-0" in devices.get_title()

    z3 = weft.megatron_plan(step, cluster, t=1, p=2, d=2, zero=3)
    assert list(z3.zero) == [3, 3]
    fig = z3.show(path=str(tmp_path / "zero3.png"))
    assert (tmp_path / "zero3.png").read_bytes()[:4] == b"\x89PNG"
    devices, memory, labels = _check_plan_figure(z3, fig)
    # the shard owners: stage s's devices (replica-major) hold shards 1/2 and 2/2 of its state
    want = {0: "S0 (0,0)\nZeRO-3\nshard 1/2", 1: "S0 (1,0)\nZeRO-3\nshard 2/2",
            2: "S1 (0,0)\nZeRO-3\nshard 1/2", 3: "S1 (1,0)\nZeRO-3\nshard 2/2"}
    assert labels == [f"dev {d}\n{want[d]}" for d in z3.devices_used]
    assert "S0 ZeRO-3, S1 ZeRO-3" in devices.get_title()
    n = len(z3.devices_used)
    assert all(p.get_hatch() == "//" for p in memory.patches[:n])  # the sharded state part
    assert not any(p.get_hatch() for p in memory.patches[n:])
    shard_texts = sorted(t.get_text() for t in memory.texts)
    assert shard_texts == sorted(["Z3\n1/2", "Z3\n2/2"] * 2)
    assert any("ZeRO shard" in t.get_text() for t in memory.get_legend().get_texts())


def test_gantt_legend_lists_only_the_kinds_drawn_outside_the_axes():
    r = weft.simulate(weft.schedule("1f1b", stages=2, micro_batches=3), weft.StageSpec(forward_time=1.0, backward_time=2.0))
    fig = r.plot_gantt()
    ax = fig.axes[0]
    renderer = _renderer(fig)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["F (forward)", "B (backward)"]
    assert not _overlaps(_extent(ax.get_legend(), renderer), _extent(ax, renderer))
    assert ax.get_xlabel() == "time (s)" and "step 12 s" in ax.get_title()  # (3 + 2 - 1) x (1 + 2) s
