import pytest

import weft


def test_roofline_and_collectives_closed_forms():
    dev = weft.Cluster.preset("H100").datasheet().device(0)  # the datasheet roofline
    f, b = 2 * 8192**3, 3 * 8192**2 * 2
    r = weft.roofline(f, b, "bf16", dev)
    assert r["compute"] == pytest.approx(f / 989e12, rel=1e-9) and r["compute_bound"]
    assert weft.compute_time(1e6, 1e9, "f32", dev) == pytest.approx(1e9 / 3350e9, rel=1e-9)
    link = weft.AxisLink(8, 3e-6, 1 / 450e9)
    B = 1 << 28
    assert weft.collective_time("all-reduce", link, B) == pytest.approx(2 * 7 / 8 * B / 450e9 + 14 * 3e-6, rel=1e-9)
    assert weft.collective_time("all-gather", link, B) == pytest.approx(7 / 8 * B / 450e9 + 7 * 3e-6, rel=1e-9)
    assert weft.collective_time("reduce_scatter", link, B) == pytest.approx(7 / 8 * B / 450e9 + 7 * 3e-6, rel=1e-9)
    assert weft.collective_time("all-to-all", link, B) == pytest.approx(7 / 8 * B / 450e9 + 7 * 3e-6, rel=1e-9)
    with pytest.raises(ValueError):
        weft.collective_time("gossip", link, B)


def test_calibration():
    cal = weft.Calibration.from_json('{"compute_efficiency": {"default": 0.5}, "kernel_overhead_s": 1e-5}')
    dev = weft.Cluster.preset("M8").device(0)
    assert weft.compute_time(125e12, 0, "f16", dev, cal) == pytest.approx(2 + 1e-5, rel=1e-9)
    assert weft.Calibration.from_json(cal.to_json()) == cal
    with pytest.raises(ValueError, match="unknown key"):
        weft.Calibration.from_json('{"nope": 1}')


def test_matmul_efficiency_is_monotone_capped_and_follows_a_calibration_file():
    # Issue 17: efficiency against GEMM shape, monotone in every dimension, never above the ceiling;
    # a hand-written calibration's curve is used exactly.
    spec = weft.Cluster.preset("H100").nodes[0].device
    e = spec.matmul("bf16")
    sizes = [16, 64, 256, 1024, 4096, 16384]
    for a in sizes:
        for b in sizes:
            row = [e.at(m, a, b) for m in sizes]
            col = [e.at(a, k, b) for k in sizes]
            assert row == sorted(row) and col == sorted(col)
            assert max(row + col) <= e.ceiling
    assert e.at(8192, 8192, 8192) == pytest.approx(e.ceiling * 8192 / (8192 + e.half_k))
    assert spec.datasheet().matmul("bf16").at(64, 64, 64) == 1.0
    cal = {"matmul_efficiency": {"H100-SXM5-80GB": {"bf16": {"ceiling": 0.5, "fill_elements": 1e6, "half_k": 100}}},
           "memory_efficiency": {"default": 0.7}, "kernel_overhead_s": 3e-6}
    c = weft.calibrated_cluster(weft.Cluster.preset("H100"), cal)
    got = c.nodes[0].device.matmul("bf16")
    assert (got.ceiling, got.fill_elements, got.half_k) == (0.5, 1e6, 100)
    assert got.at(256, 512, 1024) == pytest.approx(0.5 * (256 * 1024 / 1e6) * 512 / 612)
    assert c.nodes[0].device.memory_bandwidth == pytest.approx(3350e9 * 0.7)
    assert c.nodes[0].device.kernel_overhead == pytest.approx(3e-6)
    # A matmul op's cost follows the curve by hand (one H100, bf16, 256 x 512 @ 512 x 1024).
    g = weft.Graph("mm")
    x, w = g.input("x", [256, 512], "bf16"), g.parameter("w", [512, 1024], "bf16")
    g.set_loss(g.reduce("sum", g.matmul(x, w, "mm"), [0, 1], "loss"))
    res = weft.spmd_search(g, c, weft.DeviceMesh([1], [0]), level="O3")
    mm = 2 * 256 * 512 * 1024 / (989e12 * got.at(256, 512, 1024))
    red = (256 * 1024 * 2 + 2) / (3350e9 * 0.7)
    assert res.cost == pytest.approx(mm + red + 2 * 3e-6, rel=1e-9)
    with pytest.raises(ValueError, match="give one"):
        weft.Calibration.from_json('{"compute_efficiency": {"X": {"f16": 0.5}}, '
                                   '"matmul_efficiency": {"X": {"f16": {"ceiling": 0.5}}}}')
