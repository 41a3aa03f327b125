"""The training loop's one small all-reduce per step (weft.Trainer's gradient norm and loss) is priced
by the planner (PlanOptions step_allreduce_bytes): a plan's step time grows by the ring all-reduce of
those bytes over every device of the plan, worked out here by hand from the link's α and β."""
import pytest

import weft


def _graph():
    return weft.models.gpt(layers=2, hidden=64, heads=2, seq=16, vocab=128, batch=8).train_step()


def _by_hand(cluster, devices, nbytes):
    link = weft.axis_links(cluster, weft.DeviceMesh([len(devices)], devices))[0]
    n = len(devices)
    return 2 * (n - 1) * link.alpha + 2 * (n - 1) / n * nbytes * link.beta  # ring all-reduce


@pytest.mark.parametrize("layout", [dict(t=1, p=1, d=4), dict(t=1, p=2, d=2, num_microbatches=2),
                                    dict(t=2, p=1, d=2)])
def test_the_step_allreduce_adds_one_ring_all_reduce_over_the_plans_devices(layout):
    c = weft.Cluster.preset("p3.8xlarge")
    g = _graph()
    bare = weft.megatron_plan(g, c, step_allreduce_bytes=0, **layout)
    priced = weft.megatron_plan(g, c, **layout)  # default: 16 bytes
    big = weft.megatron_plan(g, c, step_allreduce_bytes=1e6, **layout)
    devices = sorted(set(priced.devices_used))
    assert len(devices) == 4
    for plan, nbytes in ((priced, 16), (big, 1e6)):
        want = _by_hand(c, devices, nbytes)
        assert plan.step_time - bare.step_time == pytest.approx(want, rel=1e-6, abs=1e-12)
    assert all(a.optimizer_time < b.optimizer_time for a, b in zip(bare.stages, priced.stages))


def test_one_device_has_no_step_allreduce_and_bad_values_are_refused():
    c = weft.Cluster.preset("p3.8xlarge")
    one = weft.Cluster.from_json(c.to_json().replace('"num_devices":4', '"num_devices":1'))
    g = _graph()
    assert weft.megatron_plan(g, one, t=1, p=1, d=1).step_time == \
        weft.megatron_plan(g, one, t=1, p=1, d=1, step_allreduce_bytes=0).step_time
    with pytest.raises(ValueError, match="step_allreduce_bytes"):
        weft.megatron_plan(g, c, t=1, p=1, d=4, step_allreduce_bytes=-1)
