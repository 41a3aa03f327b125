"""ZeRO's collectives in buckets (issue 36): ZeRO-2/3's per-micro-batch gradient reduce-scatters
grouped by ``Plan.grad_bucket_bytes`` in the order the gradients are made, each bucket issued right
after its last gradient; ZeRO-3's parameter gathers grouped per FSDP unit (the plan's layer-grouping
blocks), the next unit's issued before the current unit computes (prefetch); ZeRO-1's once-per-step
reduce-scatters and ZeRO-1/2's end-of-step gathers of the new parameters bucketed too. Checked
against the program (boundaries by hand from the tile sizes and the blocks, issue points from the
instruction order) and against one device (the CPU executor and 4 gloo processes, where each
bucket is one launch)."""
import json
import re

import numpy as np
import pytest

import weft


def step_graph():
    return weft.models.gpt(layers=2, hidden=32, heads=2, seq=4, vocab=32, batch=8).train_step(optimizer="adam")


@pytest.fixture(scope="module")
def setup():
    return step_graph(), weft.Cluster.preset("p3.8xlarge")


@pytest.fixture(scope="module")
def reference(setup):
    return weft.execute_reference(setup[0], steps=2)


_plans = {}


def cluster_of(setup, devices):
    return setup[1] if devices == 4 else weft.Cluster.preset("S1", nodes=devices)


def plan_of(setup, zero, d=4, p=1):
    key = (zero, d, p)
    if key not in _plans:
        step, c = setup[0], cluster_of(setup, d * p)
        _plans[key] = weft.megatron_plan(step, c, t=1, p=p, d=d, num_microbatches=2, zero=zero, num_blocks=4,
                                         recompute="none", memory_fraction=1.0)
    return _plans[key]


def lowered(setup, zero, cap, d=4, p=1):
    step, c = setup[0], cluster_of(setup, d * p)
    plan = weft.Plan.from_json(plan_of(setup, zero, d, p).to_json())
    plan.grad_bucket_bytes = cap
    return weft.lower(plan, step, c)


def tile_bytes(j, b, replicas):
    """Local tile bytes of buffer b (t=1: only the replica axis 0 may shard it)."""
    buf = j["buffers"][b]
    n = int(np.prod(buf["shape"])) * buf["element_bytes"]
    return n // replicas if buf["spec"].startswith("[S") else n


def microbatch_of(j, b):
    m = re.search(r"/m(\d+)$", j["buffers"][b]["name"])
    return int(m.group(1)) if m else 0


def bucket_runs(code, kind):
    """bucket id -> its positions, for the collectives of `kind` in buckets."""
    out = {}
    for k, i in enumerate(code):
        if i["kind"] == kind and i["bucket"] >= 0:
            out.setdefault(i["bucket"], []).append(k)
    return out


def greedy(sizes, cap):
    """The buckets of a list of sizes by the rule: close a bucket once it holds >= cap bytes."""
    out, cur, size = [], [], 0
    for n, s in enumerate(sizes):
        cur.append(n)
        size += s
        if size >= cap:
            out.append(cur)
            cur, size = [], 0
    if cur:
        out.append(cur)
    return out


def reduce_scatter_chains(j, code):
    """Per ZeRO-2/3 gradient reduce-scatter of the backward: (position, gradient buffer, position
    where that gradient is made, its micro-batch, bytes, bucket)."""
    out = []
    for k, i in enumerate(code):
        if i["kind"] != "reduce-scatter" or i["axis"] != 0:
            continue
        sc = max(q for q in range(k) if i["in"][0] in code[q]["out"])
        into_acc = any(code[q]["kind"] in ("copy", "accumulate") and i["out"][0] in code[q]["in"]
                       for q in range(k, len(code)))
        if code[sc]["kind"] != "scale" or not into_acc:
            continue  # ZeRO-1's once-per-step reduce-scatter of the mean
        g = code[sc]["in"][0]
        made = max(q for q in range(sc) if g in code[q]["out"])
        out.append(dict(pos=k, grad=g, made=made, mb=microbatch_of(j, g), bytes=tile_bytes(j, i["in"][0], 1),
                        bucket=i["bucket"]))
    return out


@pytest.mark.parametrize("zero", [2, 3])
@pytest.mark.parametrize("cap", [1, 64 * 1024, 1e12])
def test_reduce_scatter_buckets_by_size_issued_after_their_last_gradient(setup, zero, cap):
    prog = lowered(setup, zero, cap)
    j = json.loads(prog.to_json())
    code = j["codes"][0]
    chains = reduce_scatter_chains(j, code)
    base = reduce_scatter_chains(*(lambda q: (q, q["codes"][0]))(json.loads(lowered(setup, zero, 0).to_json())))
    assert len(chains) == len(base) == 2 * len(j["parameters"])  # every gradient, each micro-batch
    assert all(c["bucket"] == -1 for c in base)
    runs = bucket_runs(code, "reduce-scatter")
    for mb in (0, 1):
        mine = [c for c in chains if c["mb"] == mb]
        mine.sort(key=lambda c: c["made"])  # the order the backward makes the gradients
        want = greedy([c["bytes"] for c in mine], cap)  # by hand: the greedy rule on the tile sizes
        got = []
        for c in mine:
            if not got or got[-1][0] != c["bucket"]:
                got.append((c["bucket"], []))
            got[-1][1].append(mine.index(c))
        assert [g for _, g in got] == want, (mb, cap)
        for bid, members in got:
            pos = runs[bid]
            assert pos == list(range(pos[0], pos[0] + len(pos)))  # adjacent
            assert len(pos) == len(members)
            last = max(mine[n]["made"] for n in members)
            # issued right after its last gradient is made: only scales, frees and the buckets
            # issued at the same point before it (an op making two gradients) in between
            between = [code[q] for q in range(last + 1, pos[0])]
            assert all(i["kind"] in ("scale", "free", "copy", "accumulate") or
                       (i["kind"] == "reduce-scatter" and i["bucket"] >= 0) for i in between)
            assert len([i for i in between if i["kind"] == "scale"]) >= len(members)
    if cap == 1:
        assert len(runs) == len(chains)
    if cap == 1e12:
        assert len(runs) == 2  # one bucket per micro-batch: the whole stage's gradients


def gather_buckets(j, code):
    """ZeRO-3's forward / backward gathers of sharded parameter leaves, per bucket in list order:
    (bucket, positions, parameter names, positions of the computes reading the gathered copies, of
    the first compute reading each)."""
    leaves = {b for b in j["leaf_buffers"]}
    out = []
    for k, i in enumerate(code):
        if i["kind"] != "all-gather" or i["in"][0] not in leaves:
            continue
        readers = [q for q in range(k + 1, len(code)) if code[q]["kind"] == "compute" and i["out"][0] in code[q]["in"]]
        name = j["graph"]["tensors"][j["buffers"][i["in"][0]]["tensor"]]["name"]
        if out and out[-1]["bucket"] == i["bucket"] and i["bucket"] >= 0:
            out[-1]["pos"].append(k)
            out[-1]["params"].append(name)
            out[-1]["readers"] += readers
            out[-1]["first"].append(readers[0])
        else:
            out.append(dict(bucket=i["bucket"], pos=[k], params=[name], readers=readers, first=[readers[0]]))
    return out


def test_zero3_gathers_per_unit_with_prefetch(setup):
    step, _ = setup
    prog = lowered(setup, 3, 64 * 1024)
    j = json.loads(prog.to_json())
    code = j["codes"][0]
    plan = plan_of(setup, 3)
    graph = weft.Graph.from_json(json.dumps(j["graph"])) if hasattr(weft.Graph, "from_json") else None
    blocks = weft.pipeline.group_layers(graph if graph is not None else step, plan.num_blocks).block_of_op
    unit = [b if b >= 0 else plan.num_blocks - 1 for b in blocks]
    buckets = gather_buckets(j, code)
    flat = gather_buckets(*(lambda q: (q, q["codes"][0]))(json.loads(lowered(setup, 3, 0).to_json())))
    assert all(b["bucket"] == -1 for b in flat)
    # The same gathers (parameter by parameter, phase by phase), grouped.
    assert sorted(p for b in buckets for p in b["params"]) == sorted(p for b in flat for p in b["params"])
    assert len(buckets) < len(flat)
    for b in buckets:
        assert b["bucket"] >= 0 and b["pos"] == list(range(b["pos"][0], b["pos"][0] + len(b["pos"])))
        # one unit: the op each gathered copy is first read by is of one block (a tied embedding's
        # copy is then held to its last use, the head, in another block)
        assert len({unit[code[q]["op"]] for q in b["first"]}) == 1, b
    # Prefetch: inside a phase, unit j+1's bucket is issued before unit j's compute ends (before
    # the last op reading unit j's copies), and after unit j-1's gathers.
    prefetched = 0
    for a, b in zip(buckets, buckets[1:]):
        if unit[code[a["first"][0]]["op"]] == unit[code[b["first"][0]]["op"]]:
            continue  # the next phase's (or micro-batch's) first unit
        if b["pos"][0] < max(a["readers"]):
            prefetched += 1
            assert b["pos"][0] > a["pos"][-1]
    assert prefetched >= 2 * 2  # forward and backward of each micro-batch prefetch at least once
    # The gathers per step equal the buckets: one per unit and phase run, not one per parameter.
    n_units = len(set(unit))
    assert len(buckets) <= 2 * 2 * n_units + 2 * 2


def test_zero1_and_zero2_step_gathers_and_zero1_reduce_scatters_bucketed(setup):
    for zero in (1, 2):
        prog = lowered(setup, zero, 1e12)
        j = json.loads(prog.to_json())
        code = j["codes"][0]
        leaves = set(j["leaf_buffers"])
        ag = [k for k, i in enumerate(code) if i["kind"] == "all-gather" and i["out"][0] in leaves]
        assert ag and all(code[k]["bucket"] >= 0 for k in ag)
        assert len({code[k]["bucket"] for k in ag}) == 1  # the whole stage: one bucket
        assert ag == list(range(ag[0], ag[0] + len(ag)))
        # right after the last update that makes one of them
        last_update = max(max(q for q in range(k) if code[k]["in"][0] in code[q]["out"]) for k in ag)
        assert all(code[q]["kind"] == "free" for q in range(last_update + 1, ag[0]))
        if zero == 1:  # the once-per-step reduce-scatters of the means: one bucket in the last backward
            rs = [k for k, i in enumerate(code) if i["kind"] == "reduce-scatter"]
            assert rs and len({code[k]["bucket"] for k in rs}) == 1 and code[rs[0]]["bucket"] >= 0


CASES = [(z, d, 1) for z in (1, 2, 3) for d in (2, 4)] + [(3, 2, 2), (2, 2, 2)]


@pytest.mark.parametrize("zero,d,p", CASES)
def test_executor_equals_one_device_and_the_unbucketed_program(setup, reference, zero, d, p):
    base = weft.execute(lowered(setup, zero, 0, d, p), steps=2)
    assert base.max_relative_error(reference, atol=1e-12) < 1e-10
    for cap in (1, 64 * 1024, 1e12):
        prog = lowered(setup, zero, cap, d, p)
        kinds = {i["kind"] for r in range(prog.num_ranks) for i in prog.instructions(r) if i["bucket"] >= 0}
        assert kinds, (zero, d, p, cap)
        res = weft.execute(prog, steps=2)
        assert res.max_relative_error(reference, atol=1e-12) < 1e-10
        # the same arithmetic in another order: bit-identical to no buckets
        assert res.losses == base.losses
        for n in base.parameters:
            np.testing.assert_array_equal(res.parameters[n], base.parameters[n])


def test_verifier_refuses_mixed_zero_buckets(setup):
    src = json.loads(lowered(setup, 3, 1e12).to_json())
    code = src["codes"][0]
    ag = next(b for b in bucket_runs(code, "all-gather").values() if len(b) >= 2)
    rs = next(iter(bucket_runs(code, "reduce-scatter").values()))

    def refused(j, words):
        with pytest.raises(ValueError, match=words):
            weft.Program.from_json(json.dumps(j)).check()

    j = json.loads(json.dumps(src))  # a reduce-scatter joins a bucket of all-gathers
    c = j["codes"][0]
    r = c[rs[0]]
    r["bucket"] = c[ag[0]]["bucket"]
    del c[rs[0]]
    c.insert(ag[-1] + (1 if rs[0] > ag[-1] else 0), r)
    refused(j, "another kind, axis, group or reduce op than the rest of bucket")
    j = json.loads(json.dumps(src))  # a gather of a bucket moved away from it
    c = j["codes"][0]
    c.insert(ag[-1] + 2, c.pop(ag[0]))
    refused(j, "split|reads|written|holds")


@pytest.mark.parametrize("zero,cap", [(1, 1e12), (2, 1e12), (3, 1e12), (3, 1)])
def test_runtime_one_launch_per_bucket(setup, reference, zero, cap):
    """4 gloo processes: equal to one device, and the all-gathers / reduce-scatters launched per step
    are the buckets (the whole stage per micro-batch; ZeRO-3's gathers per unit; per gradient with
    1 B), not the parameters."""
    prog = lowered(setup, zero, cap)
    code = json.loads(prog.to_json())["codes"][0]
    want, instrs = {}, {}
    for kind in ("all-gather", "reduce-scatter"):
        runs = bucket_runs(code, kind)
        alone = sum(1 for i in code if i["kind"] == kind and i["bucket"] < 0)
        want[kind] = len(runs) + alone
        instrs[kind] = sum(1 for i in code if i["kind"] == kind)
    n_params = len(prog.parameters)
    if cap == 1e12:  # far fewer launches than tensors
        assert want["reduce-scatter"] == (1 if zero == 1 else 2) and want["all-gather"] < n_params
    else:  # 1 B: a reduce-scatter per gradient and micro-batch; the gathers still per unit
        assert want["reduce-scatter"] == instrs["reduce-scatter"] == 2 * n_params
    if zero == 3:
        assert want["all-gather"] < instrs["all-gather"]
    res = weft.run(prog, nproc=4, steps=2, dtype="f64")
    assert res.max_relative_error(reference, atol=1e-12) < 1e-10
    for kind in ("all-gather", "reduce-scatter"):
        assert {r.get(kind, 0) for r in res.collective_calls} == {2 * want[kind]}, (zero, kind)
