"""weft.run / python -m weft.run: plans executed as real processes on torch.distributed (gloo on CPU)
equal the one-device reference; failures stop every rank with a clear error, never a hang."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import weft  # noqa: E402
from weft.runtime.launch import free_port  # noqa: E402
from weft_env import subprocess_env  # noqa: E402


def gpt(optimizer="adam", **kw):
    g = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8)
    return g.train_step(optimizer=optimizer, **kw)


@pytest.fixture(scope="module")
def step():
    return gpt()


@pytest.fixture(scope="module")
def cluster():
    return weft.Cluster.preset("p3.8xlarge")  # 4 V100s in one node


@pytest.fixture(scope="module")
def reference(step):
    return weft.execute_reference(step, steps=3)


# Megatron's tensor-parallel layout on a 1-D mesh of 4: column-parallel qkv / fc1, row-parallel proj /
# fc2, a vocab-parallel embedding (a model this small is cheapest replicated, so the layout is fixed).
MEGATRON = {f"h{i}.{n}": s for i in range(2) for n, s in
            [("attn.qkv.w", "S(1)"), ("attn.proj.w", "S(0)"), ("mlp.fc1.w", "S(1)"), ("mlp.fc2.w", "S(0)")]}
MEGATRON["wte"] = "S(0)"


def megatron_spmd(step, cluster):
    mesh = weft.DeviceMesh([4], range(4))
    # Each reader priced alone, so the row-parallel partial sums are all-reduced as Megatron does
    # (shared resharding reduce-scatters them once for their readers here).
    result = weft.spmd_search(step, cluster, mesh, level="O2", time_limit=10, fixed_specs=MEGATRON,
                              shared_resharding=False)
    return weft.lower_spmd(step, cluster, mesh, result)


def programs(step, cluster):
    """The acceptance layouts: (a) 4-way SPMD with Megatron's layout, (b) 2 stages x 2-way tensor
    parallel with 1F1B, (c) 2 stages x 2 data-parallel replicas with kFkB k=2, (d) weft.plan's choice."""
    return {
        "a-megatron-spmd": megatron_spmd(step, cluster),
        "b-2stages-tp2-1f1b": weft.lower(weft.megatron_plan(step, cluster, t=2, p=2, d=1, num_microbatches=2),
                                         step, cluster),
        "c-2stages-dp2-kfkb2": weft.lower(weft.megatron_plan(step, cluster, t=1, p=2, d=2, schedule="kFkB",
                                                             schedule_k=2, num_microbatches=4, zero=0),
                                          step, cluster),
        "d-weft-plan": weft.lower(weft.plan(step, cluster), step, cluster),
    }


@pytest.fixture(scope="module")
def layouts(step, cluster):
    return programs(step, cluster)


def kinds(program):
    out = {}
    for r in range(program.num_ranks):
        for i in program.instructions(r):
            out[i["kind"]] = out.get(i["kind"], 0) + 1
    return out


def assert_same(got, ref, rtol, params=True):
    np.testing.assert_allclose(got.losses, ref.losses, rtol=rtol, atol=0)
    for kind in ("gradients",) + (("parameters",) if params else ()):
        mine, want = getattr(got, kind), getattr(ref, kind)
        assert set(mine) == set(want) and want
        for name, w in want.items():
            scale = float(np.max(np.abs(w)))
            np.testing.assert_allclose(mine[name], w, rtol=rtol, atol=rtol * scale, err_msg=f"{kind}[{name}]")


def test_layouts_exercise_the_runtime(layouts):
    k = {name: kinds(p) for name, p in layouts.items()}
    assert k["a-megatron-spmd"].get("all-reduce", 0) > 0  # row-parallel partial sums
    assert k["b-2stages-tp2-1f1b"].get("send", 0) > 0 and k["b-2stages-tp2-1f1b"].get("recv", 0) > 0
    assert k["c-2stages-dp2-kfkb2"].get("all-reduce", 0) > 0  # data-parallel gradients
    assert all(p.num_ranks == 4 for p in layouts.values())


_RUNS = {}


def run_f64(layouts, name):
    if name not in _RUNS:
        _RUNS[name] = weft.run(layouts[name], steps=3, dtype="f64")
    return _RUNS[name]


@pytest.mark.parametrize("name", ["a-megatron-spmd", "b-2stages-tp2-1f1b", "c-2stages-dp2-kfkb2", "d-weft-plan"])
def test_four_gloo_processes_equal_the_reference_f64(name, layouts, reference):
    got = run_f64(layouts, name)
    assert isinstance(got, weft.ExecutionResult)
    assert len(got.losses) == 3 and len(got.step_seconds) == 4 and all(len(s) == 3 for s in got.step_seconds)
    assert set(got.parameters) == set(reference.parameters)
    assert_same(got, reference, 1e-10)
    assert got.max_relative_error(reference) < 1e-10
    assert all(b > 0 for b in got.peak_bytes)


def test_zbv_v_placement_runs_on_four_gloo_processes(step, cluster, reference):
    # ZB-V: 2 devices x 2 replicas hold the V (device 0 the first and last chunks, device 1 the two
    # middle ones): the middle hand-over and the tied embedding's gradient and new value stay on one
    # device group, partly as messages a rank sends to itself (handed over in memory).
    plan = weft.megatron_plan(step, cluster, t=1, p=2, d=2, schedule="zbv", num_microbatches=4)
    prog = weft.lower(plan, step, cluster)
    to_self = [i for r in range(prog.num_ranks) for i in prog.instructions(r) if i["kind"] == "send" and r in i["group"]]
    assert to_self
    got = weft.run(prog, steps=3, dtype="f64")
    assert_same(got, reference, 1e-10)
    assert_same(weft.execute(prog, steps=3), reference, 1e-10)


@pytest.mark.parametrize("p,d,m", [(2, 2, 4), (4, 1, 8)])
def test_dualpipev_runs_on_four_gloo_processes(step, cluster, reference, p, d, m):
    # DualPipeV on the same V as ZB-V: 2 devices x 2 replicas (M = 2D) and one pipeline over 4
    # devices (M = 2D); its whole backwards (B then W at once) and overlapped pairs (F, then the
    # whole backward of the other chunk) run as the lowering's ordinary B and W instructions.
    plan = weft.megatron_plan(step, cluster, t=1, p=p, d=d, schedule="DualPipeV", num_microbatches=m)
    assert plan.schedule == "dualpipev" and plan.num_stages == p
    prog = weft.lower(plan, step, cluster)
    assert prog.num_ranks == 4
    got = weft.run(prog, steps=3, dtype="f64")
    assert_same(got, reference, 1e-10)
    assert_same(weft.execute(prog, steps=3), reference, 1e-10)


def test_full_recomputation_runs_on_four_gloo_processes(step, cluster, reference):
    # A plan with full recomputation runs as planned: each block's forward re-made before its
    # backward (more compute instructions), the same values as one device on 4 gloo processes.
    def megatron(mode):
        return weft.megatron_plan(step, cluster, t=1, p=2, d=2, num_microbatches=4, recompute=mode)

    full, none = megatron("full"), megatron("none")
    assert full.recompute == ["full", "full"] and none.recompute == ["none", "none"]
    prog_full, prog_none = weft.lower(full, step, cluster), weft.lower(none, step, cluster)

    def computes(p):
        return sum(1 for r in range(p.num_ranks) for i in p.instructions(r) if i["kind"] == "compute")

    assert computes(prog_full) > computes(prog_none)
    got = weft.run(prog_full, steps=3, dtype="f64")
    assert_same(got, reference, 1e-10)
    # Memory on the CPU executor: never more with recomputation (this model's peak is its parameters
    # and Adam states; the drop on an activation-bound model is test_pipeline_executor.cpp's).
    assert weft.execute(prog_full, steps=1).peak_bytes[0] <= weft.execute(prog_none, steps=1).peak_bytes[0]


@pytest.mark.parametrize("zero", [1, 3])
def test_zero_sharded_states_run_on_four_gloo_processes(step, cluster, reference, zero):
    # ZeRO over 4 replicas (issue 22): level 1 keeps a quarter of every Adam moment per rank,
    # gradients reduce-scattered and parameters all-gathered along the replica axis once per step;
    # level 3 also stores a quarter of each parameter, gathered before each use in the forward and
    # the backward, and reduce-scatters each micro-batch's gradients. The values equal one device.
    plan = weft.megatron_plan(step, cluster, t=1, p=1, d=4, num_microbatches=2, zero=zero)
    assert plan.zero == [zero] and plan.stages[0].zero_group == 4
    prog = weft.lower(plan, step, cluster)
    kinds = {i["kind"] for r in range(prog.num_ranks) for i in prog.instructions(r)}
    assert {"reduce-scatter", "all-gather"} <= kinds, kinds
    got = weft.run(prog, steps=3, dtype="f64")
    assert_same(got, reference, 1e-10)
    # The ranks hold less than one level below (the same layout).
    below = weft.lower(weft.megatron_plan(step, cluster, t=1, p=1, d=4, num_microbatches=2, zero=zero - 1),
                       step, cluster)
    assert weft.execute(prog, steps=2).peak_bytes[0] < weft.execute(below, steps=2).peak_bytes[0]


@pytest.mark.parametrize("name", ["a-megatron-spmd", "c-2stages-dp2-kfkb2"])
def test_four_gloo_processes_equal_plain_pytorch(name, layouts, step):
    # An oracle independent of weft's autodiff, optimizer and kernels: the same GPT as a torch module,
    # trained 3 steps by torch autograd + torch.optim.Adam in one process from the same initial values
    # and tokens.
    from weft.runtime.torch_models import train_plain_pytorch

    want = train_plain_pytorch(step, layers=2, heads=4, steps=3, dtype=torch.float64)
    got = run_f64(layouts, name)
    assert set(want) == set(got.parameters)
    for n, w in want.items():
        w = w.numpy()
        np.testing.assert_allclose(got.parameters[n], w, rtol=1e-10, atol=1e-10 * np.max(np.abs(w)), err_msg=n)


@pytest.mark.parametrize("model,shape,seed", [("gpt", [4], 0), ("gpt", [2, 2], 1), ("moe", [4], 0),
                                              ("moe", [2, 2], 1)])
def test_random_layouts_use_every_collective_and_equal_the_reference(model, shape, seed, cluster):
    # Layouts no search would choose: every op a random strategy, every leaf a random spec. They move
    # data with all-gather, reduce-scatter, all-to-all (MoE dispatch included) and all-reduce.
    if model == "gpt":
        s = weft.models.gpt(layers=1, hidden=32, heads=2, seq=4, vocab=32, batch=4).train_step()
    else:
        s = weft.models.moe(layers=1, hidden=16, heads=2, experts=4, seq=4, vocab=32, batch=4, ffn=32,
                            moe_every=1).train_step()
    prog = weft.lower_random(s, cluster, weft.DeviceMesh(shape, range(4)), seed)
    k = kinds(prog)
    assert all(k.get(c, 0) > 0 for c in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all")), k
    got = weft.run(prog, steps=2, dtype="f64")
    ref = weft.execute_reference(s, steps=2)
    assert_same(got, ref, 1e-10)
    assert got.bytes_sent[0].get("all-to-all", 0) > 0 and got.bytes_sent[0].get("reduce-scatter", 0) > 0


def test_uneven_shares_and_the_uneven_split_equal_the_reference():
    # Uneven data-parallel shares: each replica runs the graph at its own batch (here 1 sample: torch's
    # einsum returns a transposed view for it, which the runtime stores row-major before the
    # all-reduce), a device with no samples left out; Whale's uneven tensor split over mixed GPUs.
    step16 = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=16).train_step()
    c4 = weft.Cluster.preset("p3.8xlarge")
    shares = weft.data_parallel_plan(step16, c4, [5, 2, 1, 0], num_microbatches=2)
    got = weft.run(shares, step16, c4, steps=2, dtype="f64")
    assert len(got.step_seconds) == 3
    assert_same(got, weft.execute_reference(step16, steps=2), 1e-10)
    mixed = weft.Cluster.concat(weft.Cluster.preset("p3.8xlarge"), weft.Cluster.preset("P100"))
    step12 = weft.models.gpt(layers=1, hidden=48, heads=4, seq=12, vocab=96, batch=12).train_step()
    split = weft.split_plan(step12, mixed, [2] * 4 + [1] * 8)
    assert_same(weft.run(split, step12, mixed, steps=2, dtype="f64"), weft.execute_reference(step12, steps=2), 1e-10)


def test_an_imported_torch_module_trained_on_4_processes_equals_plain_pytorch(cluster):
    # A torch nn.Module GPT (weft.runtime.torch_models.TorchGPT) imported with weft.from_torch, planned
    # (2 stages x 2-way tensor parallel, 1F1B) and trained 3 Adam steps by the runtime on 4 gloo
    # processes; the same module trained 3 steps by torch autograd + torch.optim.Adam in one process from
    # the same initial values and tokens.
    from weft.runtime.torch_models import TorchGPT, train_module

    zoo = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8)
    gen = torch.Generator().manual_seed(3)
    params = {t["name"]: 0.1 * torch.randn(t["shape"], dtype=torch.float64, generator=gen) for t in zoo.tensors
              if t["role"] == "parameter" and t["producer"] is None}
    module = TorchGPT(params, layers=2, heads=4)  # its own weights: the run starts from them
    tokens, labels = torch.randint(0, 128, (8, 8)), torch.randint(0, 128, (8, 8))
    g = weft.from_torch(module, (tokens, labels))
    assert g.num_params() == zoo.num_params()
    step = g.train_step(optimizer="adam")
    plan = weft.megatron_plan(step, cluster, t=2, p=2, d=1, num_microbatches=2)
    got = weft.run(plan, step, cluster, steps=3, dtype="f64")
    want = train_module(module, step, 3)  # from the module's own weights, as the run
    assert set(want) == set(got.parameters)
    for n, w in want.items():
        w = w.numpy()
        np.testing.assert_allclose(got.parameters[n], w, rtol=1e-10, atol=1e-10 * np.max(np.abs(w)), err_msg=n)


@pytest.mark.parametrize("name", ["a-megatron-spmd", "b-2stages-tp2-1f1b", "c-2stages-dp2-kfkb2", "d-weft-plan"])
def test_f32_runs_close_to_the_reference(name, step, layouts):
    # f32 losses and gradients within 1e-5 of both references. Parameters after Adam: where a gradient is
    # at the rounding level (the key bias's is exactly 0 in exact arithmetic: softmax ignores it), Adam
    # moves the weight by about lr * sign(noise) in any f32 run (the f32 reference itself is 3e-4 off the
    # f64 one there), so Adam's parameters are compared in f64 above; SGD is well conditioned and its
    # f32 parameters are held to 1e-5 everywhere (next test).
    got = weft.run(layouts[name], steps=3, dtype="f32")
    for ref in (weft.execute_reference(step, steps=3), weft.execute_reference(step, steps=3, dtype="f32")):
        assert_same(got, ref, 1e-5, params=False)


def test_f32_sgd_parameters_within_1e5(cluster):
    sgd = gpt("sgd", lr=0.1)
    got = weft.run(megatron_spmd(sgd, cluster), steps=3, dtype="f32")
    assert_same(got, weft.execute_reference(sgd, steps=3), 1e-5)
    assert_same(got, weft.execute_reference(sgd, steps=3, dtype="f32"), 1e-5)


def test_bf16_runs_and_learns(layouts, reference):
    got = weft.run(layouts["a-megatron-spmd"], steps=3, dtype="bf16")
    np.testing.assert_allclose(got.losses, reference.losses, rtol=3e-2)


@pytest.mark.parametrize("kw", [{}, {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9}])
def test_f16_with_master_weights_equals_the_reference_and_plain_pytorch(kw, cluster):
    # f16 parameters with f32 master copies and f32 states (Adam; SGD with momentum), 2 stages x
    # 2 data-parallel replicas (the states carried per stage, the gradients all-reduced): in f64
    # storage the reference exactly, and torch.optim on the same GPT in one process (the master copy
    # starts as the parameter, so its update is the plain f64 one).
    from weft.runtime.torch_models import train_plain_pytorch

    step = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8,
                           dtype="f16").train_step(**kw)
    plan = weft.megatron_plan(step, cluster, t=1, p=2, d=2, num_microbatches=2)
    got = weft.run(plan, step, cluster, steps=3, dtype="f64")
    assert_same(got, weft.execute_reference(step, steps=3), 1e-10)
    want = train_plain_pytorch(step, layers=2, heads=4, steps=3, dtype=torch.float64)
    for n, w in want.items():
        w = w.numpy()
        np.testing.assert_allclose(got.parameters[n], w, rtol=1e-10, atol=1e-10 * np.max(np.abs(w)), err_msg=n)
    # The graph's own dtypes (None): f16 parameters, f32 master copies and moments; the losses close
    # to the f64 reference.
    mixed = weft.run(plan, step, cluster, steps=3, dtype=None)
    np.testing.assert_allclose(mixed.losses, got.losses, rtol=3e-2)


def test_bad_input(layouts, step, cluster):
    prog = layouts["a-megatron-spmd"]
    with pytest.raises(ValueError, match="nproc=3"):
        weft.run(prog, nproc=3)
    with pytest.raises(ValueError, match="backend"):
        weft.run(prog, backend="mpi")
    with pytest.raises(ValueError, match="dtype"):
        weft.run(prog, dtype="f8")
    with pytest.raises(ValueError, match="steps"):
        weft.run(prog, steps=0)
    with pytest.raises(ValueError, match="step="):
        weft.run(weft.plan(step, cluster))
    with pytest.raises(TypeError):
        weft.run("plan.json")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            weft.run(prog, backend="nccl")


def broken(program) -> str:
    """The program's JSON with its first send deleted: the matching recv would wait forever."""
    j = json.loads(program.to_json())
    for code in j["codes"]:
        for k, ins in enumerate(code):
            if ins.get("kind") == "send":
                del code[k]
                return json.dumps(j)
    raise AssertionError("no send")


def test_a_wrong_program_fails_before_any_process_starts(layouts):
    # The static check runs when a program is read (and again on every rank before anything runs).
    with pytest.raises(ValueError, match=r"deadlock: rank \d #\d+ recv .* never comes"):
        weft.Program.from_json(broken(layouts["b-2stages-tp2-1f1b"]))


def test_a_failing_rank_stops_the_others(layouts, step):
    # Token id 200 is outside the vocabulary (128): the ranks that look it up fail; the others, blocked
    # at a collective with them, are stopped; the error names the rank, the instruction and the id.
    ids = np.random.default_rng(0).integers(0, 128, size=(8, 8)).astype(np.float64)
    ids[5, 3] = 200
    t0 = time.time()
    with pytest.raises(RuntimeError, match=r"rank \d failed: rank \d #\d+ compute .*200") as e:
        weft.run(layouts["c-2stages-dp2-kfkb2"], inputs={"tokens": ids}, timeout_s=30)
    assert time.time() - t0 < 30, e.value


def _parent_of(pid: str) -> int:
    stat = open(f"/proc/{pid}/stat").read()
    return int(stat[stat.rindex(")") + 2:].split()[1])  # the field after the state, past "(comm)"


def _worker_pids(rank: int):
    """This process's own rank workers (named weft-rank-<r>, forked by the forkserver that weft.run
    started from this process), never another test's that runs beside this one (pytest-xdist)."""
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if open(f"/proc/{d}/comm").read().strip() != f"weft-rank-{rank}":
                    continue
                if _parent_of(str(_parent_of(d))) != os.getpid():
                    continue
            except (OSError, ValueError, IndexError):
                continue
            pids.append(int(d))
    return pids


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the rank processes in /proc")
def test_a_killed_rank_is_reported_and_the_others_stop(layouts):
    def kill_rank_1():
        deadline = time.time() + 30
        while time.time() < deadline:
            pids = _worker_pids(1)
            if pids:
                time.sleep(3)  # inside the run
                for p in pids:
                    os.kill(p, signal.SIGKILL)
                return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_rank_1)
    killer.start()
    t0 = time.time()
    with pytest.raises(RuntimeError, match=r"rank 1 failed: the process died \(signal SIGKILL\)"):
        weft.run(layouts["b-2stages-tp2-1f1b"], steps=100000, timeout_s=30)
    killer.join()
    assert time.time() - t0 < 30
    time.sleep(0.5)
    assert not any(_worker_pids(r) for r in range(4))  # nothing left running


def _torchrun():
    exe = shutil.which("torchrun")
    return [exe] if exe else [sys.executable, "-m", "torch.distributed.run"]


def torchrun(tmp_path, nproc, *args, timeout=240):
    cmd = _torchrun() + ["--nproc-per-node", str(nproc), "--master-port", str(free_port()), "-m", "weft.run"]
    return subprocess.run(cmd + [str(a) for a in args], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True,
                          timeout=timeout)


def test_torchrun_runs_a_saved_plan(tmp_path, step, cluster, reference):
    plan = weft.megatron_plan(step, cluster, t=2, p=2, d=1, num_microbatches=2)
    (tmp_path / "plan.json").write_text(plan.to_json())
    (tmp_path / "step.json").write_text(step.to_json())
    (tmp_path / "cluster.json").write_text(cluster.to_json())
    out = torchrun(tmp_path, 4, "plan.json", "--model", "step.json", "--cluster", "cluster.json", "--steps", 3,
                   "--dtype", "f64", "--out", "result.npz")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "losses" in out.stdout and "rank 3:" in out.stdout
    r = np.load(tmp_path / "result.npz")
    np.testing.assert_allclose(r["losses"], reference.losses, rtol=1e-10)
    for name, want in reference.parameters.items():
        np.testing.assert_allclose(r[f"param/{name}"], want, rtol=1e-10, atol=1e-10 * np.max(np.abs(want)))
    for name, want in reference.gradients.items():
        np.testing.assert_allclose(r[f"grad/{name}"], want, rtol=1e-10, atol=1e-10 * np.max(np.abs(want)))


def test_torchrun_a_wrong_plan_fails_on_every_rank(tmp_path, layouts):
    (tmp_path / "bad.json").write_text(broken(layouts["b-2stages-tp2-1f1b"]))
    t0 = time.time()
    out = torchrun(tmp_path, 4, "bad.json", timeout=120)
    assert out.returncode != 0
    # Every rank says why it ends: the check's error, or (torchrun stops the others at the first
    # failure) that it was stopped because another rank failed.
    for r in range(4):
        assert f"weft.run: rank {r}: " in out.stderr, out.stderr[-3000:]
    assert "ValueError: program: deadlock" in out.stderr and "never comes" in out.stderr
    # A world that does not match the program: every rank says so.
    (tmp_path / "good.json").write_text(layouts["a-megatron-spmd"].to_json())
    out = torchrun(tmp_path, 2, "good.json", timeout=120)
    assert out.returncode != 0
    assert all(f"weft.run: rank {r}: " in out.stderr for r in range(2)), out.stderr[-3000:]
    assert "nproc=2, but the program has 4 ranks" in out.stderr
    assert time.time() - t0 < 120


def test_torchrun_a_killed_rank_stops_every_rank(tmp_path, layouts):
    # Ranks started by hand as torchrun would (env://), rank 1 killed mid-run: every other rank reports
    # the failure and exits within seconds (gloo sees the closed connection; the timeout bounds the rest).
    (tmp_path / "p.json").write_text(layouts["b-2stages-tp2-1f1b"].to_json())
    port = free_port()
    procs = []
    for r in range(4):
        env = subprocess_env()
        env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, "-m", "weft.run", "p.json", "--steps", "100000",
                                       "--timeout", "20"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    time.sleep(8)  # started and running steps
    assert all(p.poll() is None for p in procs)
    procs[1].kill()
    t0 = time.time()
    for r, p in enumerate(procs):
        if r == 1:
            continue
        _, err = p.communicate(timeout=60)
        assert p.returncode == 1
        assert f"weft.run: rank {r}:" in err, err[-2000:]
    assert time.time() - t0 < 30
    procs[1].wait()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (NCCL)")
def test_nccl_on_one_gpu_equals_the_reference(cluster):
    s = gpt()
    mesh = weft.DeviceMesh([1], [0])
    prog = weft.lower_spmd(s, cluster, mesh, weft.spmd_search(s, cluster, mesh))
    got = weft.run(prog, steps=3, dtype="f64", backend="nccl")
    assert_same(got, weft.execute_reference(s, steps=3), 1e-10)


def test_exact_gelu_runs_on_the_runtime(cluster):
    # nn.GELU()'s erf form (weft's gelu_erf) through the importer, a random layout on 2 processes.
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act, self.fc2 = torch.nn.Linear(4, 6), torch.nn.GELU(), torch.nn.Linear(6, 3)

        def forward(self, x, y):
            return ((self.fc2(self.act(self.fc(x))) - y) ** 2).mean()

    g = weft.from_torch(M().double(), (torch.randn(8, 4, dtype=torch.float64), torch.randn(8, 3, dtype=torch.float64)))
    step = g.train_step(optimizer="adam")
    prog = weft.lower_random(step, cluster, weft.DeviceMesh([2], [0, 1]), 3)
    assert_same(weft.run(prog, steps=2, dtype="f64"), weft.execute_reference(step, steps=2), 1e-10)
