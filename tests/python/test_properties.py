"""Property tests of the public API (hypothesis): on any input, weft returns a correct answer or
raises ValueError/TypeError with a message, never another exception, a crash, a hang or a silently
wrong number. The reliability review's reproducers are explicit examples (issue 20)."""
import json
import math

import pytest

hyp = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import weft  # noqa: E402

# derandomize: the same examples on every run (CI stays reproducible; hypothesis' database is not kept)
SETTINGS = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
CLEAR = (ValueError, TypeError)

floats = st.floats(allow_nan=True, allow_infinity=True)
any_json = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | floats | st.text(max_size=8),
                        lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                        max_leaves=12)


@SETTINGS
@given(st.text(alphabet="SRP(),0123456789 sumax_[]", max_size=24),
       st.lists(st.integers(1, 24), min_size=1, max_size=3), st.lists(st.integers(1, 4), min_size=1, max_size=2))
@example("S(0,18446744073709551621)", [8], [2])
@example("S(0) S(0)", [8], [2, 2])
def test_spec_parse_round_trips_or_names_the_problem(text, shape, mesh):
    try:
        s = weft.ShardingSpec.parse(text, shape, mesh)
    except CLEAR as e:
        assert str(e)
        return
    assert weft.ShardingSpec.parse(str(s), shape, mesh) == s


@SETTINGS
@given(st.lists(st.lists(st.integers(1, 2**40), min_size=1, max_size=4), min_size=1, max_size=4))
@example([[2**31, 2**31, 4]])
@example([[2**30, 2**30]] * 8)
def test_parameter_counts_are_exact_or_refused(shapes):
    g = weft.Graph("p")
    try:
        for i, s in enumerate(shapes):
            g.parameter(f"p{i}", s, "f32")
        n = g.num_params()
    except CLEAR as e:
        assert "2^6" in str(e)
        total = sum(math.prod(s) for s in shapes)
        assert total * 4 >= 2**60 or any(math.prod(s) * 4 >= 2**60 for s in shapes)
        return
    assert n == sum(math.prod(s) for s in shapes)  # exact: Python ints do not overflow


@SETTINGS
@given(st.sampled_from(["num_devices", "memory_bytes", "memory_bandwidth", "bandwidth", "latency", "count",
                        "peak_flops", "kind", "nodes"]), any_json)
@example("num_devices", 8.5)
@example("count", 2**31)
@example("memory_bytes", "32GB")
def test_cluster_json_is_read_exactly_or_refused_with_its_path(field, value):
    c = json.loads(weft.Cluster.preset("M8").to_json())
    node = c["nodes"][0]
    if field in ("memory_bytes", "memory_bandwidth", "kind", "peak_flops"):
        node["device"][field] = value
    elif field in ("bandwidth", "latency"):
        node["nic"][field] = value
    elif field == "nodes":
        c = {"nodes": value}
    else:
        node[field] = value
    try:
        got = weft.Cluster.from_json(json.dumps(c, allow_nan=True))
    except CLEAR as e:
        assert "cluster JSON" in str(e) or "node" in str(e)
        return
    # accepted: the value was an integer / a positive finite number where one is needed
    if field == "num_devices":
        assert isinstance(value, int) and not isinstance(value, bool) and got.num_devices == value
    if field == "count":
        assert got.num_nodes == value
    if field in ("memory_bytes", "memory_bandwidth", "bandwidth"):
        assert isinstance(value, (int, float)) and math.isfinite(value) and value > 0
    assert weft.Cluster.from_json(got.to_json()) == got


@SETTINGS
@given(st.integers(0, 2**31), floats)
@example(1, float("inf"))
@example(1, float("nan"))
def test_preempted_traces_are_finite_or_refused(seed, duration):
    try:
        t = weft.BandwidthTrace.preempted(seed, duration=duration)
    except CLEAR:
        assert not (math.isfinite(duration) and 0 < duration <= 1e7)
        return
    assert math.isfinite(duration) and duration > 0
    assert 0.3 - 1e-12 <= t.mean_fraction(0.0, duration) <= 1.0 + 1e-12  # full or preempted stretches


@SETTINGS
@given(floats)
@example(float("nan"))
def test_simulation_with_any_trace_offset_is_bounded_or_refused(offset):
    s = weft.schedule("1f1b", stages=2, micro_batches=3)
    trace = weft.BandwidthTrace([0.0, 10.0], [1.0, 0.5])
    link = weft.PipelineLink(bandwidth=1.0, trace=trace)
    stage = weft.StageSpec(forward_time=1.0, backward_time=2.0, activation_bytes=1.0)
    try:
        r = weft.simulate(s, stage, links=link, trace_offset=offset)
    except CLEAR:
        assert not math.isfinite(offset)
        return
    # (S + M - 1)(f + b) = 12 s without communication; links only add time
    assert math.isfinite(r.step_time) and r.step_time >= 12.0 - 1e-9


@SETTINGS
@given(st.sampled_from(["microbatch_size", "data_parallel", "num_microbatches", "schedule_k", "num_blocks",
                        "step_time", "memory_limit"]), any_json)
@example("microbatch_size", -1)
@example("data_parallel", 0)
def test_plan_json_is_read_exactly_or_refused(plan_json, field, value):
    p = dict(plan_json)
    p[field] = value
    try:
        got = weft.Plan.from_json(json.dumps(p, allow_nan=True))
    except CLEAR as e:
        assert "Plan JSON" in str(e)
        return
    assert isinstance(value, (int, float)) and not isinstance(value, bool)
    assert value >= (0 if field in ("step_time", "memory_limit") else 1)
    assert json.loads(got.to_json())[field] == value


@pytest.fixture(scope="module")
def plan_json():
    step = weft.models.gpt(layers=1, hidden=16, heads=2, seq=4, vocab=16, batch=4).train_step()
    return json.loads(weft.plan(step, weft.Cluster.preset("p3.8xlarge"), spmd_time_limit=5).to_json())


@SETTINGS
@given(st.sampled_from([2**k for k in range(4, 64, 6)]), st.integers(1, 4))
@example(2**62, 2)
def test_gpt_flops_are_exact_or_refused(seq, layers):
    try:
        g = weft.models.gpt(layers=layers, hidden=64, heads=4, seq=seq, vocab=100, batch=1)
    except CLEAR as e:
        assert "2^6" in str(e)
        return
    f = g.flops()
    # at least the attention scores' and context's matmuls: 2 · 2 · s² · h per layer
    assert math.isfinite(f) and f >= layers * 4 * seq * seq * 64


@SETTINGS
@given(floats, floats, st.one_of(st.floats(-2, 2), st.just(float("nan"))))
@example(float("nan"), 10.0, 0.0)
@example(0.0, 10.0, -0.5)
@example(2.225073858507e-311, 1.0, 0.0)  # was "Ilp: constraint '' has a non-finite right-hand side"
def test_spmd_search_options_are_used_or_refused(memory_limit, time_limit, gap):
    step = weft.models.gpt(layers=1, hidden=16, heads=2, seq=4, vocab=16, batch=4).train_step()
    mesh = weft.DeviceMesh([2], [0, 1])
    if math.isfinite(time_limit) and time_limit > 0:
        time_limit = min(time_limit, 5.0)
    try:
        r = weft.spmd_search(step, weft.Cluster.preset("p3.8xlarge"), mesh, memory_limit=memory_limit,
                             time_limit=time_limit, relative_gap=gap)
    except CLEAR as e:
        bad = (math.isnan(memory_limit) or memory_limit == math.inf or not (time_limit > 0)
               or not (0 <= gap < 1) or "memory" in str(e))
        assert bad, str(e)
        return
    assert 0 <= gap < 1 and time_limit > 0 and not math.isnan(memory_limit)
    assert math.isfinite(r.cost)


@SETTINGS
@given(st.integers(0, 60), any_json)
def test_graph_json_mutations_never_crash(index, value):
    g = weft.models.gpt(layers=1, hidden=8, heads=2, seq=4, vocab=16, batch=2)
    j = json.loads(g.to_json())
    t = j["tensors"][index % len(j["tensors"])]
    key = ["shape", "dtype", "role", "producer", "name"][index % 5]
    t[key] = value
    try:
        h = weft.Graph.from_json(json.dumps(j, allow_nan=True))
    except CLEAR as e:
        assert "graph JSON" in str(e) or "tensor" in str(e) or "op" in str(e)
        return
    assert weft.Graph.from_json(h.to_json()).to_json() == h.to_json()  # what was accepted reads back
