import pytest

import weft


def test_roofline_and_collectives_closed_forms():
    dev = weft.Cluster.preset("H100").device(0)
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
