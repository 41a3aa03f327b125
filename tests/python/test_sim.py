import json

import pytest

import weft


def test_no_comm_step_closed_form():
    S, M = 4, 8
    for kind in ("gpipe", "1f1b", "kfkb", "eager_1f1b"):
        r = weft.simulate(weft.schedule(kind, S, M, k=3), weft.StageSpec(forward_time=1.0, backward_time=2.0))
        assert r.step_time == pytest.approx((M + S - 1) * 3.0)
        assert r.bubble_fraction == pytest.approx((S - 1) / (M + S - 1))
    r = weft.simulate(weft.schedule("interleaved", S, M, v=2), weft.StageSpec(forward_time=1.0, backward_time=2.0))
    assert r.step_time == pytest.approx((M * 2 + S - 1) * 3.0)
    r = weft.simulate(weft.schedule("zb_h1", S, M), weft.StageSpec(forward_time=1, backward_time=1, weight_time=1))
    assert r.step_time == pytest.approx(3 * M + (S - 1))


def test_hand_computed_2f2b_beats_1f1b():
    st = weft.StageSpec(forward_time=1.0, backward_time=2.0, activation_bytes=1.0)
    link = weft.PipelineLink(bandwidth=2.0)  # 0.5 time units per transfer
    assert weft.simulate(weft.schedule("1f1b", 2, 4), st, link).step_time == pytest.approx(17.0)
    assert weft.simulate(weft.schedule("kfkb", 2, 4, k=2), st, link).step_time == pytest.approx(16.0)


def test_memory_and_peaks():
    st = weft.StageSpec(activation_memory=10.0, static_memory=100.0)
    r = weft.simulate(weft.schedule("kfkb", 4, 8, k=2), st)
    assert r.peak_in_flight == [8, 6, 4, 2]
    assert r.peak_memory == [180.0, 160.0, 140.0, 120.0]


def test_deadlock_is_reported_not_hung():
    order = weft.schedule("1f1b", 3, 4).order
    order[2][0], order[2][1] = order[2][1], order[2][0]
    r = weft.simulate(weft.Schedule("broken", 3, 3, 4, False, order))
    assert r.deadlock and "device 2 blocked at B(s2,m0)" in r.deadlock_report


def test_chrome_trace_and_gantt(tmp_path):
    r = weft.simulate(weft.schedule("1f1b", 3, 4), weft.StageSpec(activation_bytes=1.0), weft.PipelineLink(bandwidth=4.0))
    doc = r.to_chrome_trace(str(tmp_path / "t.json"))
    assert sum(e["ph"] == "X" for e in doc["traceEvents"]) == r.num_tasks
    assert json.load(open(tmp_path / "t.json")) == doc
    r.plot_gantt(str(tmp_path / "g.png"))
    assert (tmp_path / "g.png").stat().st_size > 1000


def test_bandwidth_trace():
    t = weft.BandwidthTrace([0, 2, 6], [1.0, 0.5, 0.25])
    assert t.fraction_at(3) == 0.5
    assert t.finish_time(1, 35, 10) == pytest.approx(8.0)
    assert t.mean_fraction(0, 6) == pytest.approx(4 / 6)
    assert weft.BandwidthTrace.from_json(t.to_json()) == t
    a, b = weft.BandwidthTrace.preempted(3), weft.BandwidthTrace.preempted(3)
    assert a == b and all(f == 1.0 or 0.3 <= f <= 0.6 for f in a.fractions)
    with pytest.raises(ValueError, match="start at 0"):
        weft.BandwidthTrace([1.0], [1.0])
    # a trace slows a transfer: 1 byte at 1 B/s with fraction 0.5 -> 2 s each way
    st = weft.StageSpec(forward_time=1, backward_time=2, activation_bytes=1)
    r = weft.simulate(weft.schedule("1f1b", 2, 1), st, weft.PipelineLink(bandwidth=1.0, trace=weft.BandwidthTrace.constant(0.5)))
    assert r.step_time == pytest.approx(1 + 2 + 1 + 2 + 2 + 2)


def test_adagrouper_frontier_tune_drive():
    m = weft.StageModel(forward_per_sample=1, forward_overhead=0.1, backward_per_sample=2, backward_overhead=0.2,
                        activation_bytes_per_sample=1, activation_memory_per_sample=1)
    cands = weft.adagrouper.frontier([m] * 4, 24, 12.0, k_max=6)
    assert [(c.k, c.micro_batch_size) for c in cands] == [(1, 3), (2, 1), (3, 1)]
    links = [weft.PipelineLink(bandwidth=1.0, trace=weft.BandwidthTrace([0, 1000, 2000], [1.0, 0.3, 1.0]))]
    t = weft.adagrouper.tune(cands, [m] * 4, links, t0=1500)
    assert t.step_times[t.best] == min(t.step_times)
    ad = weft.adagrouper.drive(cands, [m] * 4, links, until=3000)
    fixed = [weft.adagrouper.drive(cands, [m] * 4, links, until=3000, fixed=i) for i in range(len(cands))]
    assert ad.mean_step() <= min(f.mean_step() for f in fixed) + 1e-9
    assert ad.switches >= 1
    with pytest.raises(ValueError, match="estimate"):
        weft.adagrouper.drive(cands, [m] * 4, links, estimate="oracle")


def test_links_from_cluster():
    c = weft.Cluster.preset("M8", 2)
    links = weft.links_from_cluster(c, [0, 8])
    assert len(links) == 1
    assert links[0].bandwidth == pytest.approx(c.nodes[0].nic_bandwidth)
    inside = weft.links_from_cluster(c, [0, 1, 2])
    assert inside[0].bandwidth == pytest.approx(c.nodes[0].intra_bandwidth)
    r = weft.simulate(weft.schedule("1f1b", 2, 4), weft.StageSpec(activation_bytes=1e6), links)
    assert not r.deadlock


def test_replica_collectives_on_the_device_stream_by_hand():
    # docs/modules/sim.md "Replica collectives": one stage, 1F1B over 2 micro-batches, ZeRO-3's
    # gathers and reduce-scatters with quarter units; by hand the step ends at 27 (the optimizer
    # waits for the last reduce-scatter), and half the bandwidth equals doubled collective times.
    rc = weft.ReplicaCollectives(gather_forward=2, gather_backward=2, reduce_backward=2, gather_unit=0.25,
                                 reduce_unit=0.25)
    st = weft.StageSpec(forward_time=4, backward_time=8, optimizer_time=1, replica=rc)
    r = weft.simulate(weft.schedule("1f1b", 1, 2), st)
    assert r.step_time == pytest.approx(27.0)
    assert r.collective_time == [pytest.approx(12.0)]
    kinds = [e[0] for e in r.raw.timeline]
    assert kinds.count("gather") == 8 and kinds.count("reduce") == 2
    assert "replica collectives" in json.dumps(r.to_chrome_trace())
    slow = weft.simulate(weft.schedule("1f1b", 1, 2), st, replica_trace=weft.BandwidthTrace.constant(0.5))
    doubled = weft.ReplicaCollectives(gather_forward=4, gather_backward=4, reduce_backward=4, gather_unit=0.25,
                                      reduce_unit=0.25)
    assert slow.step_time == pytest.approx(weft.simulate(
        weft.schedule("1f1b", 1, 2), weft.StageSpec(forward_time=4, backward_time=8, optimizer_time=1,
                                                    replica=doubled)).step_time)
    with pytest.raises(ValueError, match="overlap units"):
        weft.simulate(weft.schedule("1f1b", 1, 2), weft.StageSpec(replica=weft.ReplicaCollectives(
            gather_forward=1, gather_unit=0)))
