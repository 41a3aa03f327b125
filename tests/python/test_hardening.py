"""Reproducers of the reliability review (issue 20): each bad input gets a clear ValueError."""
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
    g.parameter("a", [2**31, 2**31, 4])
    with pytest.raises(ValueError, match="more than 2\\^63 elements"):
        g.num_params()
    with pytest.raises(ValueError, match="more than 2\\^63 elements"):
        g.param_bytes()


def test_a_nan_trace_offset_is_refused():
    with pytest.raises(ValueError, match="trace_offset must be finite"):
        weft.simulate(weft.schedule("1f1b", stages=2, micro_batches=3), weft.StageSpec(), trace_offset=float("nan"))
