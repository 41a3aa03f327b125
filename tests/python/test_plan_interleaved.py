"""The interleaved schedule with automatic micro-batch counts (issue 37): it needs at least as many
micro-batches as pipeline stages, so a batch with an odd factor (12 samples on 8 stages) must be
offered a count that is not a power of two; plans that use it equal one device."""

import pytest

import weft
import weft.models as wm


def step(batch, layers=8, dtype="f16"):
    return wm.gpt(layers=layers, hidden=64, heads=4, seq=16, vocab=128, batch=batch, dtype=dtype).train_step(
        optimizer="adam")


def test_auto_counts_reach_the_pipeline_depth_on_an_odd_batch():
    cl = weft.Cluster.preset("DGX-A100", nodes=2)
    # 12 samples, 8 stages: the powers of two dividing 12 are 1, 2, 4 (all < 8); 8 is stood in for by
    # the next divisor of 12 above it, 12 (one sample per micro-batch).
    p = weft.megatron_plan(step(12), cl, t=2, p=8, d=1, schedule="interleaved", schedule_v=2)
    assert p.feasible and p.schedule == "interleaved" and p.num_microbatches == 12
    # weft.plan's own search offers the same counts and says so
    own = weft.plan(step(12), weft.Cluster.preset("DGX-A100", nodes=1), schedule="interleaved", schedule_v=2)
    assert "1,2,4,12 (auto: powers of two dividing the batch (or the next divisor above a power of two))" \
        in own.search_space
    assert "1,2,4 (auto: powers of two dividing the batch)" in weft.plan(step(12), cl).search_space
    # a batch smaller than the pipeline still cannot be interleaved: said, not a silent other plan
    with pytest.raises(ValueError, match="interleaved needs at least as many micro-batches"):
        weft.megatron_plan(step(6), cl, t=2, p=8, d=1, schedule="interleaved", schedule_v=2)


def test_an_auto_interleaved_plan_runs_equal_to_one_device():
    s = step(6, layers=4, dtype="f64")
    c4 = weft.Cluster.preset("p3.8xlarge")
    # 6 samples on 4 stages: 1, 2 divide, 4 does not -> 6 micro-batches of one sample.
    plan = weft.megatron_plan(s, c4, t=1, p=4, d=1, schedule="interleaved", schedule_v=2)
    assert plan.num_microbatches == 6 and plan.schedule == "interleaved"
    got = weft.execute(plan, s, c4, steps=2)
    assert got.max_relative_error(weft.execute_reference(s, steps=2)) < 1e-10
