"""Gradient buckets (issue 36): the replicas' gradient all-reduces of a stage grouped, in the order
their gradients become final, into buckets of at least ``Plan.grad_bucket_bytes`` of local tile
each, every bucket issued right after its last gradient is final (inside the last micro-batch's
backward, before any update), and run by weft.run as one collective over the tiles laid end to end.
Checked against the program itself (boundaries by hand from the tile sizes, issue points from the
instruction order) and against one device (the CPU executor and 4 gloo processes)."""
import copy
import json

import numpy as np
import pytest

import weft


def step_graph():
    return weft.models.gpt(layers=2, hidden=32, heads=2, seq=4, vocab=32, batch=8).train_step()


@pytest.fixture(scope="module")
def setup():
    step = step_graph()
    c = weft.Cluster.preset("p3.8xlarge")
    plan = weft.data_parallel_plan(step, c, [1, 1, 1, 1], num_microbatches=2)
    return step, c, plan


def lowered(setup, bucket_bytes):
    step, c, plan = setup
    p = weft.Plan.from_json(plan.to_json())
    p.grad_bucket_bytes = bucket_bytes
    return weft.lower(p, step, c)


def tile_bytes(j, b):
    """Local tile bytes of buffer b: every replica holds the whole gradient (R / P on the SPMD axes)."""
    buf = j["buffers"][b]
    return int(np.prod(buf["shape"])) * buf["element_bytes"]


def analyse(prog):
    """Per bucket (in list order): its all-reduces' input buffers and list positions, and the
    position of the last write of each one's accumulator (the scale's input)."""
    j = json.loads(prog.to_json())
    code = j["codes"][0]
    writer = {}
    buckets = {}
    for k, i in enumerate(code):
        if i["kind"] == "all-reduce" and i["bucket"] >= 0:
            buckets.setdefault(i["bucket"], []).append((k, i))
    first_update = next(k for k, i in enumerate(code) if i["kind"] == "compute"
                        and j["graph"]["ops"][i["op"]]["kind"].startswith(("adam", "sgd")))
    out = []
    for bid in sorted(buckets, key=lambda b: buckets[b][0][0]):
        members = []
        for k, i in buckets[bid]:
            scale = max(q for q in range(k) if code[q]["kind"] == "scale" and code[q]["out"] == i["in"])
            acc = code[scale]["in"][0]
            last_write = max(q for q in range(scale) if acc in code[q]["out"])
            members.append({"pos": k, "scale": scale, "ready": last_write, "bytes": tile_bytes(j, i["in"][0]),
                            "mean": i["in"][0]})
        out.append(members)
    return j, code, out, first_update


def test_no_buckets_when_zero(setup):
    j, code, buckets, _ = analyse(lowered(setup, 0))
    assert buckets == []
    assert all(i.get("bucket", -1) == -1 for i in code)


@pytest.mark.parametrize("cap", [1, 64 * 1024, 1e12])
def test_bucket_boundaries_and_issue_points(setup, cap):
    j, code, buckets, first_update = analyse(lowered(setup, cap))
    params = len(j["parameters"])
    members = [m for b in buckets for m in b]
    assert len(members) == params  # every parameter's gradient all-reduce is in a bucket
    if cap == 1:
        assert all(len(b) == 1 for b in buckets)  # a bucket per gradient
    if cap == 1e12:
        assert len(buckets) == 1  # the whole stage
    readies = [m["ready"] for m in members]
    assert readies == sorted(readies)  # in the order the gradients become final
    for n, b in enumerate(buckets):
        size = sum(m["bytes"] for m in b)
        if n + 1 < len(buckets):  # greedy: full at its last gradient, not before
            assert size >= cap and size - b[-1]["bytes"] < cap
        pos = [m["pos"] for m in b]
        assert pos == list(range(pos[0], pos[0] + len(b)))  # adjacent
        # issued right after its last gradient is final: only the bucket's scales (and frees) between
        last = max(m["ready"] for m in b)
        assert all(code[q]["kind"] in ("scale", "free") for q in range(last + 1, pos[0]))
        assert pos[-1] < first_update  # inside the backward, before any update
    # (a bucket's all-reduces read the mean the scale right before made)
    assert all(m["scale"] < m["pos"] for m in members)


@pytest.mark.parametrize("cap", [0, 1, 64 * 1024, 1e12])
def test_executor_equals_one_device(setup, cap):
    step, _, _ = setup
    ref = weft.execute_reference(step, steps=2)
    res = weft.execute(lowered(setup, cap), steps=2)
    assert res.max_relative_error(ref, atol=1e-12) < 1e-10
    # the same sums in another order: bit-identical to no buckets
    base = weft.execute(lowered(setup, 0), steps=2)
    assert res.losses == base.losses
    for n in base.parameters:
        np.testing.assert_array_equal(res.parameters[n], base.parameters[n])


def test_verifier_refuses_bad_buckets(setup):
    src = json.loads(lowered(setup, 64 * 1024).to_json())
    code = src["codes"][0]
    ks = [k for k, i in enumerate(code) if i["bucket"] == 0]
    assert len(ks) >= 2

    def refused(j, words):
        with pytest.raises(ValueError, match=words):
            weft.Program.from_json(json.dumps(j)).check()

    j = copy.deepcopy(src)  # a bucket split by another instruction
    c = j["codes"][0]
    c.insert(ks[1], c.pop(next(k for k, i in enumerate(c) if i["kind"] == "scale" and k > ks[-1])))
    refused(j, "bucket 0 is split|reads|written")
    j = copy.deepcopy(src)  # a bucket on a non-all-reduce
    s = next(k for k, i in enumerate(j["codes"][0]) if i["kind"] == "scale")
    j["codes"][0][s]["bucket"] = 7
    refused(j, "only resharding all-reduces are bucketed")
    j = copy.deepcopy(src)  # another reduce op in the bucket
    j["codes"][0][ks[1]]["reduce"] = "max"
    refused(j, "program")
    j = copy.deepcopy(src)  # the id reused by a later bucket
    later = [k for k, i in enumerate(j["codes"][0]) if i["bucket"] == 1]
    if later:
        j["codes"][0][later[0]]["bucket"] = 0
        j["codes"][0][later[0]]["reduce"] = "sum"
        refused(j, "bucket 0 is split")


def test_runtime_one_collective_per_bucket(setup):
    """4 gloo processes: equal to one device, and the gradient all-reduces launched per step are the
    buckets (1 with the whole stage, one per parameter with 1 B), not the parameters."""
    step, c, plan = setup
    ref = weft.execute_reference(step, steps=2)
    counts = {}
    for cap in (1, 1e12):
        prog = lowered(setup, cap)
        j, code, buckets, _ = analyse(prog)
        others = sum(1 for i in code if i["kind"] == "all-reduce" and i["bucket"] < 0)
        res = weft.run(prog, nproc=4, steps=2, dtype="f64")
        assert res.max_relative_error(ref, atol=1e-12) < 1e-10
        calls = {r.get("all-reduce", 0) for r in res.collective_calls}
        assert calls == {2 * (len(buckets) + others)}, (calls, len(buckets), others)
        counts[cap] = len(buckets)
    assert counts[1e12] == 1 and counts[1] == len(json.loads(prog.to_json())["parameters"])


def test_plan_records_the_buckets_it_priced(setup):
    """The plan carries the bucket size its collectives were priced with — with or without overlap
    (``overlap_grad_sync=False`` prices them exposed; the buckets are the same) — through its JSON,
    and lowering follows it; a plan whose size is 0 has no bucket."""
    step, c, _ = setup
    for kw, want in [({}, 25e6), ({"overlap_grad_sync": False}, 25e6), ({"grad_bucket_bytes": 1e5}, 1e5),
                     ({"overlap_grad_sync": False, "grad_bucket_bytes": 1e5}, 1e5)]:
        for p in (weft.data_parallel_plan(step, c, [1, 1, 1, 1], num_microbatches=2, **kw), weft.plan(step, c, **kw)):
            assert p.grad_bucket_bytes == want
            assert weft.Plan.from_json(p.to_json()).grad_bucket_bytes == want
    p = weft.data_parallel_plan(step, c, [1, 1, 1, 1], num_microbatches=2, overlap_grad_sync=False)
    assert analyse(weft.lower(p, step, c))[2] != []
    p.grad_bucket_bytes = 0
    assert analyse(weft.lower(p, step, c))[2] == []
    assert '"grad_bucket_bytes": 0.0' in p.to_json()
    with pytest.raises(ValueError, match="grad_bucket_bytes"):
        weft.Plan.from_json(p.to_json().replace('"grad_bucket_bytes": 0.0', '"grad_bucket_bytes": -1.0'))
