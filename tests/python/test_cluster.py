import json

import pytest

import weft


def test_presets_json_concat():
    c = weft.Cluster.preset("M8", nodes=2)
    assert c.num_devices == 16 and c.num_nodes == 2 and c.node_of(9) == 1
    assert c.device(0).spec.peak("f16") == pytest.approx(125e12)
    for name in weft.Cluster.preset_names():
        k = weft.Cluster.preset(name, 2)
        assert weft.Cluster.from_json(k.to_json()) == k
    h = weft.cluster.concat(weft.Cluster.preset("M8", 4), weft.Cluster.preset("P100", 2))
    assert h.num_devices == 48 and not h.homogeneous
    assert h.device(47).kind == "P100-PCIE-16GB"
    assert repr(h) == "Cluster(4x M8[8x V100-SXM2-32GB] + 2x P100[8x P100-PCIE-16GB])"
    assert weft.Cluster.from_json(json.dumps({"nodes": [{"preset": "DGX-A100", "count": 2}]})) == weft.Cluster.preset(
        "DGX-A100", 2)
    with pytest.raises(ValueError, match="unknown cluster preset"):
        weft.Cluster.preset("TPU")
    with pytest.raises(ValueError):
        weft.Cluster.from_json("{}")
    dev = weft.DeviceSpec("X", {"f32": 1e12}, 16e9, 500e9)
    custom = weft.Cluster([weft.NodeSpec("n", 2, dev, 50e9, 1e-6, 10e9, 5e-6)])
    assert custom.nodes[0].nic_bandwidth == 10e9


def test_device_mesh_and_axis_links():
    m = weft.DeviceMesh.iota([2, 8])
    assert m.device_at([1, 3]) == 11 and m.coord_of(11) == [1, 3]
    assert repr(m.reshape([4, 4])) == "Mesh[x=4,y=4](0..15)"
    t = weft.DeviceMesh([2, 2], [0, 2, 1, 3])
    assert t.is_iota and hash(t) == hash(weft.DeviceMesh([2, 2], [0, 2, 1, 3]))
    with pytest.raises(ValueError, match="appears twice"):
        weft.DeviceMesh([2], [1, 1])
    links = m.axis_links(weft.Cluster.preset("M8", 2))
    assert links[0].crosses_nodes and links[0].inter_beta == pytest.approx(8 / 12.5e9)
    assert not links[1].crosses_nodes and links[1].beta == pytest.approx(1 / 130e9)
