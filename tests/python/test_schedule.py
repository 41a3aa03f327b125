import pytest

import weft


def test_kfkb_limits_equal_1f1b_and_gpipe():
    for S in range(1, 5):
        for M in range(1, 9):
            assert weft.schedule("kfkb", S, M, k=1).order == weft.schedule("1f1b", S, M).order
            assert weft.schedule("kfkb", S, M, k=M).order == weft.schedule("gpipe", S, M).order


def test_hand_written_1f1b_order():
    s = weft.schedule("1f1b", 3, 4)
    assert [f"{k}{m}" for k, _, m in s.order[0]] == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]


def test_peak_in_flight_closed_forms():
    S, M = 5, 12
    for k in range(1, 7):
        assert weft.schedule("kfkb", S, M, k=k).peak_in_flight() == [min(M, k * (S - s)) for s in range(S)]
    assert weft.schedule("eager_1f1b", S, M).peak_in_flight() == [min(M, 2 * (S - s) - 1) for s in range(S)]


def test_all_kinds_pass_checks_and_round_trip():
    for kind in weft.schedules.KINDS:
        s = weft.schedule(kind, 4, 8, k=3, v=2, check=True)
        assert weft.check_order(s).ok
        assert weft.Schedule.from_json(s.to_json()) == s
        assert hash(weft.Schedule.from_json(s.to_json())) == hash(s)
    assert weft.schedule("interleaved", 4, 8, v=2).num_stages == 8
    assert weft.schedule("zb_h1", 4, 8).split_backward


def test_broken_order_reports_deadlock():
    s = weft.schedule("1f1b", 3, 4)
    order = s.order
    order[2][0], order[2][1] = order[2][1], order[2][0]
    bad = weft.Schedule("broken", 3, 3, 4, False, order)
    c = weft.check_order(bad)
    assert not c.ok and "deadlock" in c.problems[0]


def test_bad_input_is_value_error():
    with pytest.raises(ValueError, match="unknown schedule kind"):
        weft.schedule("pipedream", 2, 2)
    with pytest.raises(ValueError, match="at least the devices"):
        weft.schedule("interleaved", 3, 2, v=2)
    with pytest.raises(ValueError, match="missing"):
        weft.Schedule("x", 2, 2, 1, False, [[("F", 0, 0), ("B", 0, 0)], [("F", 1, 0)]])
    with pytest.raises(ValueError, match="unknown op kind"):
        weft.Schedule("x", 1, 1, 1, False, [[("X", 0, 0)]])


def test_interleaved_any_m_reaches_the_formula_with_torchs_memory():
    # Interleaved 1F1B for M not a multiple of the devices (torch's rounds: M // D of them when that
    # divides M; M = 9 on 4 devices, which torch refuses, in fewer, larger rounds): no
    # communication, a device's F = 1, B = 2 split over v chunks -> (M + (D - 1) / v) * (F + B).
    cases = [(4, 6), (4, 10), (8, 12), (8, 20), (4, 9), (3, 7)]
    cases += [(D, M) for D in (2, 3, 4) for M in range(D, 3 * D + 2)]
    for D, M in cases:
        for v in (2, 3):
            s = weft.schedule("interleaved", D, M, v=v, check=True)
            r = weft.simulate(s, weft.StageSpec(forward_time=1.0 / v, backward_time=2.0 / v))
            assert not r.deadlock
            assert r.step_time == pytest.approx((M + (D - 1) / v) * 3, rel=1e-12), (D, M, v)
    # Activations in flight: torch's warm-up (v - 1) * R + 2 * (D - 1 - d) forwards, then one more,
    # also at M = D (was all v * M forwards first, like GPipe).
    for D, M, v in [(4, 4, 2), (4, 6, 2), (8, 12, 3)]:
        rounds = max(1, M // D)
        while M % rounds:
            rounds -= 1
        R = M // rounds
        want = [min(v * M, (v - 1) * R + 2 * (D - 1 - d) + 1) for d in range(D)]
        st = weft.StageSpec(forward_time=1.0 / v, backward_time=2.0 / v, activation_memory=1.0)
        r = weft.simulate(weft.schedule("interleaved", D, M, v=v), st)
        assert list(r.peak_memory) == pytest.approx(want), (D, M, v)
