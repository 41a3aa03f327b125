"""Program verification (issue 38): a Program is the contract between planning and running. Every
mutation of a lowered program a tester tried (segfaults in weft.execute, garbage run silently, a
plan for one graph run with another) is refused with a ValueError naming the problem, never a
crash; planner-made programs verify."""
import copy
import json

import pytest

import weft


def gpt(hidden=32, layers=1):
    return weft.models.gpt(layers=layers, hidden=hidden, heads=2, seq=4, vocab=32, batch=4).train_step()


@pytest.fixture(scope="module")
def cluster():
    return weft.Cluster.preset("p3.8xlarge")


@pytest.fixture(scope="module")
def step():
    return gpt()


@pytest.fixture(scope="module")
def planned(step, cluster):
    plan = weft.plan(step, cluster, spmd_time_limit=5)
    return plan, weft.lower(plan, step, cluster)


@pytest.fixture(scope="module")
def dp(step, cluster):
    """Four replicas: gradient all-reduces (sum of P(sum)) over the replica axis."""
    plan = weft.data_parallel_plan(step, cluster, [1, 1, 1, 1], num_microbatches=1)
    return weft.lower(plan, step, cluster)


@pytest.fixture(scope="module")
def base(planned):
    return json.loads(planned[1].to_json())


def refused(j, *words):
    """The mutated JSON is refused (at load, verify or execute) with a ValueError naming `words`."""
    text = json.dumps(j)
    with pytest.raises(ValueError) as e:
        p = weft.Program.from_json(text)
        p.check()
        weft.execute(p, steps=1)
    msg = str(e.value)
    for w in words:
        assert w in msg, msg
    return msg


def instrs(j, kind=None):
    """(code index, position, instruction) of every instruction (of `kind`) of every code list."""
    return [(c, k, i) for c, code in enumerate(j["codes"]) for k, i in enumerate(code)
            if kind is None or i["kind"] == kind]


def op_id(j, kind):
    return next(o for o, op in enumerate(j["graph"]["ops"]) if op["kind"] == kind)


# ---------------------------------------------------------------------------------------- planner-made

def test_planner_programs_verify(planned, dp, step, cluster):
    plan, prog = planned
    assert plan.graph_fingerprint == step.fingerprint()
    assert prog.graph_fingerprint and prog.step_fingerprint == step.fingerprint()
    for p in (prog, dp):
        p.verify()
        p.verify(step)
        p.check()
        back = weft.Program.from_json(p.to_json())
        back.verify(step)
    res = weft.execute(prog, steps=1)
    assert res.losses[0] > 0


def test_fingerprint_is_structure_not_values(step):
    assert gpt().fingerprint() == step.fingerprint()
    assert gpt(hidden=64).fingerprint() != step.fingerprint()
    assert gpt(layers=3).fingerprint() != step.fingerprint()


# ---------------------------------------------------------------------------------- segfault reproducers

def test_codes_emptied(base):
    j = copy.deepcopy(base)
    j["codes"] = [[] for _ in j["codes"]]
    refused(j, "run by no rank")
    j["codes"] = []
    refused(j, "code")


def test_buffer_shape_2_62(base):
    j = copy.deepcopy(base)
    j["buffers"][0]["shape"][0] = 2 ** 62
    refused(j, "buffer 0", "shape")


@pytest.mark.parametrize("other", [dict(hidden=64), dict(layers=3)])
def test_graph_replaced(base, other):
    j = copy.deepcopy(base)
    g = gpt(**other)
    j["graph"] = json.loads(g.to_json())
    refused(j, "fingerprint", base["graph_fingerprint"], g.fingerprint())
    j["graph_fingerprint"] = g.fingerprint()  # the fingerprint forged too: the buffers no longer fit
    refused(j, "program")


def test_buffer_tensor_changed(base):
    j = copy.deepcopy(base)
    b = j["loss"]
    j["buffers"][b]["tensor"] = 0
    refused(j, j["buffers"][b]["name"])


def test_ce_loss_deleted(base):
    j = copy.deepcopy(base)
    ce = op_id(j, "cross_entropy")
    for code in j["codes"]:
        code[:] = [i for i in code if i["op"] != ce]
    refused(j, "program")


# ------------------------------------------------------------------------------------- garbage silently

@pytest.mark.parametrize("value", [-1, 0, 2 ** 40])
def test_microbatch_size(base, value):
    j = copy.deepcopy(base)
    j["stages"][0]["microbatch_size"] = value
    refused(j, "microbatch_size")


@pytest.mark.parametrize("value", [0, 2, 3])
def test_replicas(base, dp, value):
    for src in (base, json.loads(dp.to_json())):
        j = copy.deepcopy(src)
        if j["stages"][0]["replicas"] == value:
            continue
        j["stages"][0]["replicas"] = value
        refused(j, "replica")


@pytest.mark.parametrize("mb", [-1, 99])
def test_load_input_microbatch(base, mb):
    j = copy.deepcopy(base)
    for c, k, i in instrs(j, "load-input"):
        i["microbatch"] = mb
    refused(j, "load-input", "micro-batch")


def test_compute_op_changed(base):
    j = copy.deepcopy(base)
    c, k, i = instrs(j, "compute")[0]
    i["op"] = (i["op"] + 1) % len(j["graph"]["ops"])
    refused(j, f"#{k}", "op")


def test_compute_input_buffer_changed(base):
    j = copy.deepcopy(base)
    c, k, i = next(x for x in instrs(j, "compute") if len(x[2]["in"]) >= 2)
    i["in"][0], i["in"][1] = i["in"][1], i["in"][0]
    refused(j, f"#{k}", "operand")


def test_sum_all_reduce_turned_max(dp):
    j = json.loads(dp.to_json())
    ars = [x for x in instrs(j, "all-reduce") if not x[2]["internal"] and x[2]["reduce"] == "sum"]
    assert ars
    ars[0][2]["reduce"] = "max"
    refused(j, "all-reduce", "reduced by sum, not max")


def test_leaf_spec_r_to_s0(dp):
    j = json.loads(dp.to_json())  # replicated parameters on a mesh [4, 1]: S(0) on axis 0 splits them
    for b in j["leaf_buffers"]:
        buf = j["buffers"][b]
        t = j["graph"]["tensors"][buf["tensor"]]
        if t["role"] == "parameter" and buf["spec"].split()[0] == "R" and buf["shape"][0] % 4 == 0:
            parts = buf["spec"].split()
            parts[0] = "S(0)"
            buf["spec"] = " ".join(parts)
            break
    else:
        pytest.skip("no replicated parameter leaf")
    refused(j, "not a strategy", "wrong tiles")


def test_scale_changed(dp):
    j = json.loads(dp.to_json())
    c, k, i = instrs(j, "scale")[0]
    i["scale"] *= 2
    refused(j, f"#{k}", "is not the mean")


def test_buffer_shape_differs_from_tile(base):
    j = copy.deepcopy(base)
    b = next(b for b in j["buffers"] if b["tensor"] >= 0 and b["shape"])
    b["shape"][-1] += 1
    refused(j, b["name"], "shape")


@pytest.mark.parametrize("eb", [0, -4])
def test_element_bytes(base, eb):
    j = copy.deepcopy(base)
    j["buffers"][0]["element_bytes"] = eb
    refused(j, "element_bytes")


def test_zero_ranks_and_no_loss(base):
    j = copy.deepcopy(base)
    j["ranks"] = []
    refused(j, "program")
    j = copy.deepcopy(base)
    j["loss"] = -1
    refused(j, "loss")


def test_fingerprint_missing(base):
    j = copy.deepcopy(base)
    del j["graph_fingerprint"]
    refused(j, "graph_fingerprint")


# ------------------------------------------------------------------------------- plan for another graph

def test_plan_for_another_graph(cluster):
    big, small = gpt(hidden=64), gpt(hidden=32)
    plan = weft.plan(big, cluster, spmd_time_limit=5)
    with pytest.raises(ValueError) as e:
        weft.lower(plan, small, cluster)
    assert plan.graph_fingerprint in str(e.value) and small.fingerprint() in str(e.value)
    with pytest.raises(ValueError):
        weft.execute(plan, small, cluster, steps=1)
    # The plan survives JSON with its fingerprint.
    back = weft.Plan.from_json(plan.to_json())
    assert back.graph_fingerprint == plan.graph_fingerprint
    with pytest.raises(ValueError, match="fingerprint"):
        weft.lower(back, small, cluster)
    prog = weft.lower(plan, big, cluster)
    with pytest.raises(ValueError, match="fingerprint"):
        prog.verify(small)


def test_plan_for_another_graph_through_run_cli_and_torchrun(cluster, tmp_path, capsys):
    """weft.run, `weft run` and torchrun's `python -m weft.run` lower through weft.lower: refused there,
    before any process starts, with both fingerprints named."""
    import subprocess
    import sys

    big = weft.models.gpt(layers=1, hidden=64, heads=2, seq=4, vocab=32, batch=4)
    small = weft.models.gpt(layers=1, hidden=32, heads=2, seq=4, vocab=32, batch=4)
    plan = weft.plan(big, cluster, spmd_time_limit=5)
    with pytest.raises(ValueError, match="fingerprint"):
        weft.run(plan, small, cluster, steps=1)
    plan_path, model_path = tmp_path / "plan.json", tmp_path / "small.json"
    plan_path.write_text(plan.to_json())
    model_path.write_text(small.to_json())
    from weft.runtime import load_program

    with pytest.raises(ValueError, match=plan.graph_fingerprint):
        load_program(str(plan_path), str(model_path), "p3.8xlarge")
    from weft.cli import main
    from weft_env import subprocess_env

    assert main(["run", str(plan_path), "--model", str(model_path), "--cluster", "p3.8xlarge", "--steps", "1"]) == 2
    assert plan.graph_fingerprint in capsys.readouterr().err
    env = subprocess_env()
    env.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    tr = subprocess.run([sys.executable, "-m", "weft.run", str(plan_path), "--model", str(model_path),
                         "--cluster", "p3.8xlarge", "--steps", "1"], capture_output=True, text=True, timeout=300,
                        env=env)
    assert tr.returncode != 0 and plan.graph_fingerprint in tr.stderr, tr.stdout + tr.stderr


def test_run_refuses_before_starting_processes(planned):
    """weft.run checks (verifies) the program before any process starts: a program is either lowered
    (verified by construction and again here) or loaded (verified by from_json)."""
    _, prog = planned
    prog.check()
    j = json.loads(prog.to_json())
    j["codes"] = [[] for _ in j["codes"]]
    with pytest.raises(ValueError, match="run by no rank"):
        weft.run(weft.Program.from_json(json.dumps(j)), steps=1)


def test_a_non_compute_names_no_op_and_only_transfers_run_on_one_rank(base):
    j = copy.deepcopy(base)
    c, k, i = instrs(j, "free")[0]
    i["op"] = 0
    refused(j, f"#{k}", "runs no op")
    j = copy.deepcopy(base)
    c, k, i = instrs(j, "compute")[0]
    i["on_rank"] = 0
    refused(j, f"#{k}", "on_rank")


def _leaf_paths(j, path=()):
    if isinstance(j, dict):
        for k, v in j.items():
            if k != "graph":
                yield from _leaf_paths(v, path + (k,))
    elif isinstance(j, list):
        for n, v in enumerate(j):
            yield from _leaf_paths(v, path + (n,))
    else:
        yield path


def test_random_single_field_mutations_are_refused_or_change_nothing(planned, dp):
    """Every field of the JSON (but the graph's) changed at random: the program is refused (ValueError),
    or it verifies and runs to exactly the numbers of the original (2 steps: losses and parameters).
    A verified program never runs garbage and never crashes."""
    import random

    import numpy as np

    rng = random.Random(38)
    counts = {"refused": 0, "ran": 0}
    for prog in (planned[1], dp):
        good = weft.execute(prog, steps=2)
        src = json.loads(prog.to_json())
        paths = list(_leaf_paths(src))
        for _ in range(120):
            j = copy.deepcopy(src)
            q = rng.choice(paths)
            d = j
            for k in q[:-1]:
                d = d[k]
            v = d[q[-1]]
            if isinstance(v, bool):
                d[q[-1]] = not v
            elif isinstance(v, int):
                d[q[-1]] = rng.choice([v + 1, v - 1, -1, 0, 2, 99])
            elif isinstance(v, float):
                d[q[-1]] = v * 2
            elif isinstance(v, str):
                d[q[-1]] = rng.choice(["R", "S(0)", "max", "sum", "copy", "R R", "S(0) R", "P(sum) R"])
            try:
                p = weft.Program.from_json(json.dumps(j))
            except ValueError:
                counts["refused"] += 1
                continue
            try:
                r = weft.execute(p, steps=2)  # a verified program runs (no ValueError either)
            except ValueError as e:
                raise AssertionError((q, v, d[q[-1]], str(e)))
            counts["ran"] += 1
            assert r.losses == good.losses, (q, v, d[q[-1]])
            for name, want in good.parameters.items():
                assert np.array_equal(r.parameters[name], want), (q, v, d[q[-1]], name)
    assert counts["refused"] > 50 and counts["ran"] > 50, counts


def test_duplicated_or_missing_instructions(base, dp):
    """A write while the buffer still holds a value (a duplicated instruction), an addend accumulated
    twice, an Input read before its load-input: refused."""
    j = copy.deepcopy(base)
    code = j["codes"][0]
    k = next(n for n, i in enumerate(code) if i["kind"] == "compute")
    code.insert(k + 1, copy.deepcopy(code[k]))
    refused(j, "already holds a value")
    j = copy.deepcopy(base)
    for code in j["codes"]:
        code[:] = [i for i in code if i["kind"] != "load-input"]
    refused(j, "before a load-input fills it")


def test_accumulation_mutations():
    """Two micro-batches per replica: a gradient accumulated twice, or read before its accumulation."""
    step = gpt()
    c = weft.Cluster.preset("p3.8xlarge")
    prog = weft.lower(weft.data_parallel_plan(step, c, [1, 1, 0, 0], num_microbatches=2), step, c)
    prog.verify()
    src = json.loads(prog.to_json())
    j = copy.deepcopy(src)
    code = j["codes"][0]
    k = next(n for n, i in enumerate(code) if i["kind"] == "accumulate")
    code.insert(k + 1, copy.deepcopy(code[k]))
    refused(j, "a second time")
    j = copy.deepcopy(src)
    code = j["codes"][0]
    k = next(n for n, i in enumerate(code) if i["kind"] == "accumulate")
    acc = code[k]["out"][0]
    r = next(n for n, i in enumerate(code) if n > k and acc in i["in"] and i["kind"] != "free")
    code.insert(k, code.pop(r))  # the reader before the accumulation
    refused(j, "program")


def _two_microbatch_programs():
    """Two micro-batches: 2 replicas (the accumulation before the replica all-reduce) and a 2-stage
    1F1B pipeline (values crossing stages by send / recv)."""
    step = gpt(layers=2)
    c = weft.Cluster.preset("p3.8xlarge")
    dp2 = weft.lower(weft.data_parallel_plan(step, c, [1, 1, 0, 0], num_microbatches=2), step, c)
    pp = weft.lower(weft.megatron_plan(step, c, 1, 2, 2, num_microbatches=2), step, c)
    assert len(json.loads(pp.to_json())["stages"]) == 2
    return [json.loads(dp2.to_json()), json.loads(pp.to_json())]


def test_accumulation_deleted_or_fed_twice():
    """The hole the per-instruction checks left: with two micro-batches an accumulator has one
    accumulate; deleted (from the code every rank of the stage shares), the accumulator is a plain
    copy of micro-batch 0's gradient and the update would use half the batch. Following which
    micro-batches each value holds refuses it, by name; so does a micro-batch loaded twice (fed to
    the accumulation twice) and an accumulation deleted on one replica only."""
    for src in _two_microbatch_programs():
        weft.Program.from_json(json.dumps(src)).check()
        accs = [x for x in instrs(src, "accumulate")]
        assert accs
        for c, k, _ in accs[:3] + accs[-2:]:  # the first (loss / last layer) and the last (first layer)
            j = copy.deepcopy(src)
            del j["codes"][c][k]
            refused(j, "from micro-batches {0} of the stage's 2", "an accumulation is missing")
        j = copy.deepcopy(src)
        for c, code in enumerate(j["codes"]):  # micro-batch 1's input loads micro-batch 0 again
            for i in code:
                if i["kind"] == "load-input" and i["microbatch"] == 1:
                    i["microbatch"] = 0
        refused(j, "a micro-batch counted twice")
    # one replica's own code without the accumulation: its all-reduce meets the other replica's
    src = _two_microbatch_programs()[0]
    j = copy.deepcopy(src)
    ranks = j["ranks"]
    c0 = ranks[0]["code"]
    j["codes"].append(copy.deepcopy(j["codes"][c0]))
    ranks[0]["code"] = len(j["codes"]) - 1
    k = next(n for n, i in enumerate(j["codes"][-1]) if i["kind"] == "accumulate")
    del j["codes"][-1][k]
    msg = refused(j, "program")
    assert "micro-batches" in msg or "accumulat" in msg, msg


def test_program_checked_against_its_plan():
    """Counts consistent with the plan: a program verified against another plan of the same step
    (other micro-batches, stages, micro-batch size) or a plan of another step is refused by name."""
    step = gpt(layers=2)
    c = weft.Cluster.preset("p3.8xlarge")
    a = weft.megatron_plan(step, c, 1, 2, 2, num_microbatches=2)
    prog = weft.lower(a, step, c)
    prog.verify(step, a)
    for other, words in [(weft.megatron_plan(step, c, 1, 2, 2, num_microbatches=1), "runs 2 micro-batches, the plan 1"),
                         (weft.megatron_plan(step, c, 1, 1, 4, num_microbatches=1), "2 stages, the plan has 1"),
                         (weft.megatron_plan(step, c, 2, 2, 1, num_microbatches=2), "micro-batches of 1 samples, the plan 2"),
                         (weft.megatron_plan(gpt(hidden=64, layers=2), c, 1, 2, 2, num_microbatches=2),
                          "the plan was made for")]:
        with pytest.raises(ValueError, match=words):
            prog.verify(step, other)
    with pytest.raises(ValueError, match="plan= needs graph="):
        prog.verify(plan=a)


def test_collective_moved_to_an_axis_of_size_one(dp):
    """dp's mesh is [4, 1]: the gradient all-reduce moved to axis 1 would move nothing."""
    j = json.loads(dp.to_json())
    c, k, i = next(x for x in instrs(j, "all-reduce") if not x[2]["internal"])
    i["axis"] = 1
    refused(j, f"#{k}", "moves nothing")
