"""weft.spmd_search's time_limit is the limit of the whole search (issue 18): O3 stops inside CBC's
root LP, O2 with memory rows stops between its ILPs, and the deadline returns the best plan that
fits so far (status "timeout"), independently re-evaluated; a generous limit changes nothing.

Timing bounds carry slack for a loaded 2-core CI machine (problem construction, which the
deadline does not cut, takes 0.6 s idle and up to 1.6 s loaded for the 4-layer GPT) but are far
below what the search took when the limit was per ILP."""
import time

import pytest

import weft
import weft.models as wm

pytestmark = pytest.mark.serial  # wall-clock bounds: run alone (scripts/test_all.sh)


@pytest.fixture(scope="module")
def m8():
    return weft.Cluster.preset("M8")


def _gpt(layers):
    # The benchmark's GPT (benchmarks/spmd/bench_spmd.py): hidden 512, 8 heads, batch 8, seq 1024.
    return wm.gpt(layers=layers, hidden=512, heads=8, batch=8, seq=1024).train_step()


def _check_plan(r, m8, limit):
    ev = weft.spmd.evaluate_plan(r, m8)
    assert ev["cost"] == pytest.approx(r.cost, rel=1e-9)
    assert ev["peak_memory"] == pytest.approx(r.peak_memory, rel=1e-9)
    assert r.peak_memory <= limit


def test_o3_with_one_second_on_a_4_layer_gpt_returns_in_time(m8):
    # Per-ILP semantics ran this 7.5 s (idle) to 13.6 s (loaded): the root LP relaxation of its
    # 110 k-column ILP never looked at CBC's limit. Measured now: 1.3-1.8 s on the loaded 2-core
    # development machine.
    g = _gpt(4)
    mesh = weft.DeviceMesh.iota([2, 4])
    t0 = time.perf_counter()
    r = weft.spmd_search(g, m8, mesh, level="O3", time_limit=1.0)
    wall = time.perf_counter() - t0
    report = r.report.to_dict()
    assert wall < 3.0, f"O3 with time_limit=1 took {wall:.2f} s"
    assert report["status"] == "timeout"
    assert 0 <= report["gap"] <= 1
    _check_plan(r, m8, report["memory_limit"])


def test_o2_with_memory_rows_on_a_24_layer_gpt_stops_at_the_limit(m8):
    # A binding memory limit with memory pricing off: every O2 segment is an ILP with memory
    # rows. With 2 s per ILP the search ran for more than 7 minutes; now 2 s are the whole
    # search (measured 2.2 s loaded), and the plan returned fits.
    g = _gpt(24)
    mesh = weft.DeviceMesh.iota([2, 4])
    limit = 2.4e9  # the unconstrained O2 plan peaks at 2.53 GB
    t0 = time.perf_counter()
    r = weft.spmd_search(g, m8, mesh, level="O2", memory_limit=limit, time_limit=2.0, memory_pricing=False)
    wall = time.perf_counter() - t0
    assert wall < 2.0 * 1.5 + 0.5 + 1.0, f"O2 with time_limit=2 took {wall:.2f} s"
    assert r.report.to_dict()["status"] == "timeout"
    _check_plan(r, m8, limit)


def test_a_generous_limit_changes_nothing(m8):
    # The same plans with 60 s and with 600 s for the whole search, proven (not cut short).
    g = wm.gpt(layers=2, hidden=256, heads=4, batch=16, seq=128, vocab=512).train_step()
    mesh = weft.DeviceMesh.iota([1, 4])
    for level in ("O2", "O3"):
        a = weft.spmd_search(g, m8, mesh, level=level, time_limit=60)
        b = weft.spmd_search(g, m8, mesh, level=level, time_limit=600)
        assert a.report.to_dict()["status"] == "optimal"
        assert a.cost == b.cost
        assert a.specs == b.specs


def test_time_limit_must_be_positive(m8):
    g = _gpt(1)
    with pytest.raises(ValueError, match="time_limit must be > 0"):
        weft.spmd_search(g, m8, weft.DeviceMesh.iota([2, 4]), time_limit=0)
