"""weft.reshard: cross-mesh resharding plans and the CPU executor, from Python."""
import json

import numpy as np
import pytest

from weft import reshard
from weft._weft import DeviceMesh, ShardingSpec

GIB = 1024.0 ** 3


def test_figure2_task1_four_unit_tasks_and_bound():
    p = reshard.plan([4, 4], "f32", "S01R", ([2, 2], [0, 1, 2, 3]), "S0R", ([2, 2], [4, 5, 6, 7]))
    assert len(p.unit_tasks) == 4
    t0 = p.unit_tasks[0]
    assert t0.region == [[(0, 1)], [(0, 4)]] and t0.senders == [0] and t0.receivers == [4, 5]
    # Each receiver host needs its 2x4 half (32 bytes) at bandwidth 1: the bound is 32 s.
    assert p.lower_bound == pytest.approx(32.0)
    assert p.completion_time == pytest.approx(32.0)
    assert p.ratio == pytest.approx(1.0)


def test_table2_case4_64_tasks_at_bound_every_seed():
    shape = [1024, 1024, 512]
    for seed in range(3):
        p = reshard.plan(shape, "f32", "RS01R", ([2, 4], range(8)), "S01RR", ([2, 4], range(8, 16)),
                         seed=seed, bandwidth=GIB)
        assert len(p.unit_tasks) == 64
        assert p.completion_time == pytest.approx(1.0) and p.lower_bound == pytest.approx(1.0)


@pytest.mark.parametrize("A,B", [(1, 1), (1, 3), (2, 2), (4, 2)])
def test_one_to_many_strategies_closed_forms(A, B):
    shape = [256, 1024, 1024]  # 1 GiB f32
    args = (shape, "f32", "R R", ([1, 1], [0]), " ".join(["R"] * 2), ([A, B], list(range(1, A * B + 1))))
    t = {s: reshard.plan(*args, strategy=s, bandwidth=GIB).completion_time for s in reshard.STRATEGIES}
    assert t["send_recv"] == pytest.approx(A * B)
    assert t["local_allgather"] == pytest.approx(A)
    assert t["broadcast"] == pytest.approx(1.0)


def test_execute_matches_slicing_strided_and_uneven():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 10)).astype(np.float32)
    sm, dm = DeviceMesh([2, 2], [0, 1, 2, 3]), DeviceMesh([3], [4, 5, 6])
    src = ShardingSpec.parse("S(1,1) S(0)", [6, 10], [2, 2])  # cyclic (strided) columns
    for strategy in reshard.STRATEGIES:
        p = reshard.plan([6, 10], np.float32, src, sm, "S(1)", dm, strategy=strategy, devices_per_host=2)
        out, stats = reshard.execute(p, x, return_stats=True)
        # Uneven: 10 columns over 3 devices -> 4, 4, 2 (padding at the end).
        np.testing.assert_array_equal(out[4], x[:, 0:4])
        np.testing.assert_array_equal(out[5], x[:, 4:8])
        np.testing.assert_array_equal(out[6], x[:, 8:10])
        assert stats["bytes_received"] == p.nic_bytes_received()
    staged = reshard.execute(p, x, staged=True)
    np.testing.assert_array_equal(staged[6], x[:, 8:10])


def test_joint_plan_two_tensors_and_json():
    a = np.arange(32, dtype=np.int64).reshape(4, 8)
    b = np.arange(16, dtype=np.float64).reshape(16)
    sm, dm = ([2], [0, 1]), ([2], [2, 3])
    p = reshard.plan_many([([4, 8], "i64", "S(0)", sm, "S(1)", dm), ([16], "f64", "R", sm, "S(0)", dm)],
                          devices_per_host=1, seed=3)
    out_a, out_b = p.execute(a, b)
    np.testing.assert_array_equal(out_a[3], a[:, 4:])
    np.testing.assert_array_equal(out_b[2], b[:8])
    d = json.loads(p.to_json())
    assert d["strategy"] == "broadcast" and len(d["unit_tasks"]) == len(p.unit_tasks) == 6
    assert set(d["hosts"]) == {"0", "1", "2", "3"}
    assert p.to_json() == reshard.plan_many([([4, 8], "i64", "S(0)", sm, "S(1)", dm),
                                             ([16], "f64", "R", sm, "S(0)", dm)],
                                            devices_per_host=1, seed=3).to_json()


def test_balancers_never_beat_the_bound_and_best_is_best():
    args = ([1024, 1024, 512], "f32", "S0RR", ([2, 4], range(8)), "S(0) R", ([3, 4], range(8, 20)))
    times = {b: reshard.plan(*args, balancer=b, bandwidth=GIB).completion_time for b in reshard.BALANCERS}
    lb = reshard.plan(*args, bandwidth=GIB).lower_bound
    assert all(t >= lb * (1 - 1e-12) for t in times.values())
    assert times["best"] == pytest.approx(lb) == pytest.approx(min(times.values()))
    assert times["largest_first"] > lb * 1.3  # Table 2 case 6: LPT collides on the middle host


def test_bad_input_errors():
    sm, dm = ([2], [0, 1]), ([2], [2, 3])
    with pytest.raises(ValueError, match="shape"):
        reshard.plan([4, 4], "f32", ShardingSpec.parse("S(0)", [4, 8], [2]), sm, "S(0)", dm)
    with pytest.raises(ValueError):
        reshard.plan([4, 4], "f32", "S(0)", ([2], [0, 0]), "S(0)", dm)  # duplicate devices
    p = reshard.plan([4, 4], "f32", "S(0)", sm, "S(1)", dm)
    with pytest.raises(ValueError, match="dtype"):
        reshard.execute(p, np.zeros((4, 4), dtype=np.float64))
    with pytest.raises(ValueError, match="shape"):
        reshard.execute(p, np.zeros((4, 5), dtype=np.float32))
    with pytest.raises(ValueError, match="strategy"):
        reshard.plan([4, 4], "f32", "S(0)", sm, "S(1)", dm, strategy="teleport")
    with pytest.raises(ValueError, match="host"):
        reshard.plan([4, 4], "f32", "S(0)", sm, "S(1)", dm, hosts={0: 0, 1: 0})
