"""Reproducers of the reliability review (issue 20): each bad input gets a clear ValueError."""
import json
import math

import pytest

import weft


def test_an_infinite_trace_is_refused_not_a_hang():
    with pytest.raises(ValueError, match="duration must be finite"):
        weft.BandwidthTrace.preempted(1, duration=float("inf"))


def test_a_spec_number_out_of_range_is_named():
    with pytest.raises(ValueError, match="'18446744073709551621' out of range in sharding spec"):
        weft.ShardingSpec.parse("S(0,18446744073709551621)", [8], [2])


def test_sizes_never_overflow_silently():
    g = weft.Graph("x")
    with pytest.raises(ValueError, match="more than 2\\^63 elements"):  # refused when built
        g.parameter("a", [2**31, 2**31, 4])
    for i in range(8):  # each fits; their sum does not
        g.parameter(f"p{i}", [2**30, 2**30], "f32")
    with pytest.raises(ValueError, match="more than 2\\^63 parameters"):
        g.num_params()
    with pytest.raises(ValueError, match="2\\^63"):
        g.param_bytes()


def test_gpt_flops_never_overflow():
    # seq = 2^62: the attention scores would have 2^124 elements; was 6400.0 FLOPs.
    with pytest.raises(ValueError, match="more elements than weft can size|2\\^63"):
        weft.models.gpt(layers=2, hidden=64, heads=4, seq=2**62, vocab=100)
    # the largest sizes that fit give exact, positive FLOPs
    g = weft.models.gpt(layers=1, hidden=64, heads=4, seq=2**20, vocab=100, batch=1)
    assert g.flops() > 4 * 2**40 * 64  # scores and context: 2·2·s²·h at least
    assert math.isfinite(g.flops())


def test_a_nan_trace_offset_is_refused():
    with pytest.raises(ValueError, match="trace_offset must be finite"):
        weft.simulate(weft.schedule("1f1b", stages=2, micro_batches=3), weft.StageSpec(), trace_offset=float("nan"))


def test_json_readers_name_the_bad_field():
    c = json.loads(weft.Cluster.preset("M8").to_json())
    bad = json.loads(json.dumps(c))
    bad["nodes"][0]["device"]["memory_bytes"] = "32GB"
    with pytest.raises(ValueError, match=r"cluster JSON: \$\.nodes\[0\]\.device\.memory_bytes: expected a number"):
        weft.Cluster.from_json(json.dumps(bad))
    bad = json.loads(json.dumps(c))
    bad["nodes"][0]["num_devices"] = 8.5  # was truncated to 8
    with pytest.raises(ValueError, match=r"\$\.nodes\[0\]\.num_devices: expected an integer, got 8\.5"):
        weft.Cluster.from_json(json.dumps(bad))
    bad = json.loads(json.dumps(c))
    bad["nodes"][0]["nic"]["latency"] = -1
    with pytest.raises(ValueError, match=r"\$\.nodes\[0\]\.nic\.latency: must be >= 0"):
        weft.Cluster.from_json(json.dumps(bad))
    with pytest.raises(ValueError, match="not valid JSON"):
        weft.Cluster.from_json('{"nodes": [{"preset": "M8", "count": 1e400}]}')
    with pytest.raises(ValueError, match="graph JSON: not valid JSON.*overflow"):
        weft.Graph.from_json('{"format":"weft.ir.graph","version":1e400}')
    with pytest.raises(ValueError, match=r"Schedule JSON: \$\.order\[0\]\[0\]\[1\]: expected an integer"):
        weft.Schedule.from_json('{"name":"x","num_stages":1,"num_devices":1,"num_micro":1,'
                                '"split_backward":false,"order":[[["F",0.5,0],["B",0,0]]]}')
    with pytest.raises(ValueError, match=r"BandwidthTrace JSON: \$\.times\[1\]: expected a number"):
        weft.BandwidthTrace.from_json('{"times":[0,"1"],"fractions":[1,0.5]}')


def test_too_many_devices_is_an_error_not_an_allocation_failure():
    with pytest.raises(ValueError, match="more than weft models"):
        weft.Cluster.preset("M8", nodes=2**31 - 1)
    with pytest.raises(ValueError, match="more than weft models"):
        weft.Cluster.from_json('{"nodes": [{"preset": "M8", "count": 2000000}]}')


def test_plan_json_invariants():
    step = weft.models.gpt(layers=1, hidden=32, heads=2, seq=4, vocab=32, batch=4).train_step()
    p = json.loads(weft.plan(step, weft.Cluster.preset("p3.8xlarge"), spmd_time_limit=5).to_json())
    assert json.loads(weft.Plan.from_json(json.dumps(p)).to_json()) == p  # the unmodified plan reads back
    for field, value, msg in [("microbatch_size", -1, "microbatch_size: must be >= 1"),
                              ("data_parallel", 0, "data_parallel: must be >= 1"),
                              ("num_microbatches", 2.5, "num_microbatches: expected an integer"),
                              ("step_time", -3.0, "step_time: must be >= 0")]:
        bad = dict(p, **{field: value})
        with pytest.raises(ValueError, match=msg):
            weft.Plan.from_json(json.dumps(bad))


def test_graph_json_and_builder_refuse_silent_nonsense():
    g = weft.Graph("x")
    t, ids = g.parameter("t", [4, 2]), g.input("i", [3], "i64")
    g.set_loss(g.reduce("sum", g.embedding(t, ids), [0, 1]))
    j = json.loads(g.to_json())
    j["tensors"][1]["dtype"] = "f32"
    with pytest.raises(ValueError, match="embedding ids must be i32 or i64"):
        weft.Graph.from_json(json.dumps(j))
    j = json.loads(g.to_json())
    j["tensors"][0]["grad_of"] = 0
    with pytest.raises(ValueError, match="its own gradient"):
        weft.Graph.from_json(json.dumps(j))
    with pytest.raises(ValueError, match="already a training graph"):
        g.train_step().train_step()
    x = g.input("x", [2, 3])
    with pytest.raises(ValueError, match="must be finite"):
        g.scale(x, float("nan"))
    with pytest.raises(ValueError, match="eps must be >= 0"):
        g.layer_norm(x, g.parameter("ga", [3]), g.parameter("be", [3]), -1.0)


def test_spmd_search_options_are_checked():
    step = weft.models.gpt(layers=1, hidden=32, heads=2, seq=4, vocab=32, batch=4).train_step()
    c, mesh = weft.Cluster.preset("p3.8xlarge"), weft.DeviceMesh([2], [0, 1])
    with pytest.raises(ValueError, match="memory_limit must be a finite"):
        weft.spmd_search(step, c, mesh, memory_limit=float("nan"))
    with pytest.raises(ValueError, match="relative_gap must be in"):
        weft.spmd_search(step, c, mesh, relative_gap=-0.5)
    with pytest.raises(ValueError, match="time_limit must be > 0"):
        weft.spmd_search(step, c, mesh, time_limit=float("nan"))


def test_a_huge_stride_is_named_not_overflowed():
    # Found by fuzz_spec (UBSan: stride x shards overflowed int64); the seed corpus keeps it.
    with pytest.raises(ValueError, match="exceeds the dim size"):
        weft.ShardingSpec.parse("S(000000000,5642843432170974687) S(1)", [8, 4, 22], [2, 3])
