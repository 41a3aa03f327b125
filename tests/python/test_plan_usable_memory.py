# Usable memory = (capacity − reserve) × fraction, and what a layout that does not fit reports (issue
# 37): the worst stage with its figures, and with zero="auto" the ZeRO level the planner would turn to.
import re

import pytest

import weft

GiB = 1 << 30


def _gpt(layers=4, batch=16):
    return weft.models.gpt(layers=layers, hidden=256, heads=4, seq=64, vocab=1024, batch=batch).train_step(
        optimizer="adam")


def test_usable_memory_is_capacity_less_the_reserve_times_the_fraction():
    g = _gpt()
    c = weft.Cluster.preset("DGX-A100", nodes=1)
    cap = 80 * GiB  # the preset's A100-SXM4-80GB
    # Default: 1 GiB reserve on a device's own memory, then the 0.9 fragmentation margin.
    p = weft.megatron_plan(g, c, t=1, p=1, d=8, num_microbatches=2)
    assert p.memory_limit == pytest.approx((cap - GiB) * 0.9, rel=1e-12)
    # A memory_limit is the budget as given: no reserve unless one is set.
    assert weft.megatron_plan(g, c, t=1, p=1, d=8, num_microbatches=2,
                              memory_limit=16e9).memory_limit == pytest.approx(16e9 * 0.9, rel=1e-12)
    q = weft.megatron_plan(g, c, t=1, p=1, d=8, num_microbatches=2, memory_limit=16e9, memory_reserve=2e9,
                           memory_fraction=0.8)
    assert q.memory_limit == pytest.approx((16e9 - 2e9) * 0.8, rel=1e-12)
    assert weft.megatron_plan(g, c, t=1, p=1, d=8, num_microbatches=2,
                              memory_reserve=0).memory_limit == pytest.approx(cap * 0.9, rel=1e-12)
    # Devices under 8 GiB (toy and test devices) get no default reserve.
    text = c.to_json()
    assert '"memory_bytes":85899345920.0' in text
    small = weft.Cluster.from_json(text.replace('"memory_bytes":85899345920.0', f'"memory_bytes":{4 * GiB}.0'))
    assert weft.megatron_plan(g, small, t=1, p=1, d=8, num_microbatches=2,
                              allow_infeasible=True).memory_limit == pytest.approx(4 * GiB * 0.9, rel=1e-12)
    with pytest.raises(ValueError, match="memory_reserve must be >= 0"):
        weft.plan(g, c, memory_reserve=-5)
    with pytest.raises(ValueError, match="leaves nothing"):
        weft.plan(g, c, memory_limit=1e9, memory_reserve=2e9)


def test_a_plan_that_fits_the_whole_device_is_refused_under_the_reserve_and_says_so():
    g = _gpt()
    c = weft.Cluster.preset("DGX-A100", nodes=1)
    opts = dict(t=1, p=1, d=8, num_microbatches=2, zero=0, recompute="none", memory_fraction=1.0)
    room = weft.megatron_plan(g, c, memory_limit=1e12, **opts)
    need = room.peak_memory
    # At 100 % of a capacity of 1.01 × what it needs the layout fits ...
    fits = weft.megatron_plan(g, c, memory_limit=need * 1.01, **opts)
    assert fits.feasible and fits.peak_memory == pytest.approx(need, rel=1e-9)
    # ... and under a reserve of 5 % of that capacity it does not, and the reason names the reserve.
    with pytest.raises(ValueError, match=r"does not fit.*reserve") as e:
        weft.megatron_plan(g, c, memory_limit=need * 1.01, memory_reserve=need * 0.0505, **opts)
    assert "usable" in str(e.value)
    # The planner, free to pick any layout, refuses outright when the state alone cannot fit.
    with pytest.raises(ValueError, match="reserve") as e:
        weft.plan(g, c, memory_limit=need * 1.01, memory_reserve=need * 1.0, memory_fraction=1.0)
    assert "missing" in str(e.value) or "no plan fits" in str(e.value)


def _figure(text, label):
    """The bytes a report prints after `label` ("peak 1.23 GB" -> 1.23e9)."""
    m = re.search(label + r" ([0-9.]+) ([kMG]?)B", text)
    assert m, (label, text)
    return float(m.group(1)) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}[m.group(2)]


def test_infeasible_layout_reports_its_worst_stage_with_its_parts():
    # A 4-stage pipeline whose last stage holds the LM head over a large vocabulary: every stage
    # over the limit, the last the worst (not the first failing one).
    g = weft.models.gpt(layers=4, hidden=128, heads=4, seq=256, vocab=32768, batch=32).train_step(optimizer="adam")
    c = weft.Cluster.preset("DGX-A100", nodes=1)
    opts = dict(t=2, p=4, d=1, num_microbatches=1, zero=0, recompute="none", memory_fraction=1.0)
    room = weft.megatron_plan(g, c, memory_limit=1e12, **opts)
    peaks = [s.peak_memory for s in room.stages]
    worst = max(range(4), key=lambda s: peaks[s])
    assert worst != 0, peaks  # the case tells the worst stage from the first
    limit = min(peaks) * 0.9  # every stage over
    with pytest.raises(ValueError) as e:
        weft.megatron_plan(g, c, memory_limit=limit, **opts)
    msg = str(e.value)
    assert f"stage {worst} (the worst of 4 over)" in msg
    st = room.stages[worst]
    # Its figures, as the report prints them (3 significant digits): peak, static, activations, transient.
    assert _figure(msg, "peak") == pytest.approx(st.peak_memory, rel=5e-3)
    assert _figure(msg, "static") == pytest.approx(st.static_memory, rel=5e-3)
    assert _figure(msg, "activations") == pytest.approx(st.activation_memory, rel=5e-3)
    assert _figure(msg, "transient") == pytest.approx(st.transient_memory, rel=5e-3)
    assert f"{st.peak_memory / limit:.2f}x" in msg
    # allow_infeasible returns the same layout marked infeasible, with the same reason.
    tight = weft.megatron_plan(g, c, memory_limit=limit, allow_infeasible=True, **opts)
    assert not tight.feasible and f"stage {worst} (the worst of 4 over)" in tight.infeasible_reason
    assert [s.peak_memory for s in tight.stages] == pytest.approx(peaks, rel=1e-9)


def test_allow_infeasible_prices_the_zero_level_the_planner_would_turn_to():
    # Issue 37: with zero="auto" a layout that fits nowhere was priced at ZeRO-0 (replicated states).
    # Now at the least-memory option the planner searches: ZeRO-3 over all 8 replicas here, whose
    # state is (2P + O) / 8 of ZeRO-0's (ZeRO's closed form, zero.hpp).
    g = _gpt()
    c = weft.Cluster.preset("M8", nodes=1)
    opts = dict(t=1, p=1, d=8, num_microbatches=2, recompute="none", memory_fraction=1.0)
    z0 = weft.megatron_plan(g, c, zero=0, memory_limit=1e12, **opts)
    z3 = weft.megatron_plan(g, c, zero=3, memory_limit=1e12, **opts)
    assert z3.stages[0].static_memory == pytest.approx(z0.stages[0].static_memory / 8, rel=1e-9)
    limit = z3.peak_memory * 0.5  # below even ZeRO-3's need
    tight = weft.megatron_plan(g, c, memory_limit=limit, allow_infeasible=True, **opts)
    assert not tight.feasible
    assert tight.stages[0].zero == 3 and tight.stages[0].zero_group == 8
    assert tight.stages[0].static_memory == pytest.approx(z3.stages[0].static_memory, rel=1e-9)
    assert tight.peak_memory == pytest.approx(z3.peak_memory, rel=1e-9)
    assert "ZeRO-3" in tight.infeasible_reason
    # An explicit level is kept.
    forced = weft.megatron_plan(g, c, zero=0, memory_limit=limit, allow_infeasible=True, **opts)
    assert forced.stages[0].zero == 0 and forced.peak_memory == pytest.approx(z0.peak_memory, rel=1e-9)


def test_layout_plan_reports_its_worst_stage_too():
    # Two stages of a head-heavy GPT, both over the limit: the reason names the last (the worst),
    # not stage 0 (the first refused), before and with allow_infeasible.
    g = weft.models.gpt(layers=4, hidden=128, heads=4, seq=256, vocab=32768, batch=32).train_step(optimizer="adam")
    c = weft.Cluster.preset("DGX-A100", nodes=1)
    stages = [(0, 1, [0, 1, 2, 3], None), (2, 3, [4, 5, 6, 7], None)]
    opts = dict(num_microbatches=1, num_blocks=4, recompute="none", memory_fraction=1.0)
    room = weft.layout_plan(g, c, stages, memory_limit=1e12, **opts)
    peaks = [s.peak_memory for s in room.stages]
    assert peaks[1] / peaks[0] > 1.5, peaks
    limit = peaks[0] * 0.9
    with pytest.raises(ValueError, match=r"does not fit: stage 1 \(the worst of 2 over\)") as e:
        weft.layout_plan(g, c, stages, memory_limit=limit, **opts)
    assert _figure(str(e.value), "peak") == pytest.approx(peaks[1], rel=5e-3)
    lp = weft.layout_plan(g, c, stages, memory_limit=limit, allow_infeasible=True, **opts)
    assert not lp.feasible and lp.infeasible_reason.startswith("stage 1 (the worst of 2 over)")
