"""Per-collective factors of a node's intra-node link (weft.NodeSpec collective_factors): the α-β
closed forms' bandwidth terms scaled per collective, worked out here by hand; JSON round trip;
refusals; and what they change in a plan (a ZeRO-1 layout's reduce-scatters, not ZeRO-0's all-reduce)."""
import json

import pytest

import weft

ALPHA, BW = 1e-5, 1e10  # s per hop, bytes/s


def _cluster(n=4, **factors):
    m8 = weft.Cluster.preset("M8").nodes[0].device
    return weft.Cluster([weft.NodeSpec("test", n, m8, BW, ALPHA, BW, ALPHA, collective_factors=factors)])


def test_each_collective_scales_its_own_bandwidth_term_by_hand():
    n, B, beta = 4, 8e6, 1 / BW
    c = _cluster(n, reduce_scatter=3.0, all_gather=0.5, all_reduce=2.0, p2p=4.0, all_to_all=1.5)
    link = weft.axis_links(c, weft.DeviceMesh([n], list(range(n))))[0]
    by_hand = {
        "all-reduce": 2 * (n - 1) / n * B * beta * 2.0 + 2 * (n - 1) * ALPHA,
        "reduce-scatter": (n - 1) / n * B * beta * 3.0 + (n - 1) * ALPHA,
        "all-gather": (n - 1) / n * B * beta * 0.5 + (n - 1) * ALPHA,
        "all-to-all": (n - 1) / n * B * beta * 1.5 + (n - 1) * ALPHA,
        "p2p": ALPHA + B * beta * 4.0,
    }
    for kind, want in by_hand.items():
        assert weft.collective_time(kind, link, B) == pytest.approx(want, rel=1e-12), kind
    plain = weft.axis_links(_cluster(n), weft.DeviceMesh([n], list(range(n))))[0]
    assert weft.collective_time("reduce-scatter", plain, B) == pytest.approx((n - 1) / n * B * beta + (n - 1) * ALPHA)


def test_factors_round_trip_through_json_and_presets_carry_none():
    c = _cluster(reduce_scatter=2.5, p2p=0.5)
    j = json.loads(c.to_json())
    assert j["nodes"][0]["collective_factors"]["reduce_scatter"] == 2.5
    back = weft.Cluster.from_json(c.to_json())
    assert back.nodes[0].collective_factors == c.nodes[0].collective_factors
    assert back.nodes[0].collective_factors["all_gather"] == 1.0
    assert "collective_factors" not in weft.Cluster.preset("H100").to_json()
    assert weft.Cluster.preset("H100").nodes[0].collective_factors == {k: 1.0 for k in (
        "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "p2p")}


@pytest.mark.parametrize("bad", [dict(reduce_scatter=0.0), dict(all_reduce=-1.0), dict(p2p=float("inf"))])
def test_bad_factors_are_refused(bad):
    with pytest.raises(ValueError, match="collective factors must be finite and > 0"):
        _cluster(**bad)


def test_an_unknown_collective_is_refused_by_name():
    with pytest.raises(ValueError, match="unknown collective 'broadcast'"):
        _cluster(broadcast=2.0)


def test_a_slow_reduce_scatter_prices_zero_1_not_zero_0():
    g = weft.models.gpt(layers=2, hidden=64, heads=2, seq=16, vocab=128, batch=8).train_step()
    opts = dict(t=1, p=1, d=4, overlap_grad_sync=False)
    z0 = [weft.megatron_plan(g, _cluster(reduce_scatter=f), zero=0, **opts).step_time for f in (1.0, 4.0)]
    z1 = [weft.megatron_plan(g, _cluster(reduce_scatter=f), zero=1, **opts).step_time for f in (1.0, 4.0)]
    assert z0[0] == z0[1]  # ZeRO-0 all-reduces: untouched
    assert z1[1] > z1[0]   # ZeRO-1 reduce-scatters its gradients: dearer
