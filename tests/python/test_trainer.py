"""weft.Trainer against plain PyTorch: a user's module (TinyLlama: tied embeddings, RMSNorm, rotary
buffers, a causal mask, SwiGLU) trained in f64 by the Trainer on local gloo processes — a different
batch every step, AdamW with no-decay groups, warmup-cosine, clipping by the global norm — equals the
same module trained in one process by torch.optim.AdamW + clip_grad_norm_ + LambdaLR from the same
weights (1e-9 relative, losses, grad norms and parameters), under Megatron t=2 x p=2, 2 stages x 2
ZeRO-3 replicas and weft.plan's own choice; SGD (momentum, nesterov, weight decay), Adam (L2 decay),
per-group learning rates and a torch LRScheduler likewise; only this rank's samples read through
sampler / local_batch; torchrun across two launchers (--nnodes 2, c10d rendezvous on localhost) the
same as 4 local processes; bad input refused with a clear error."""
import copy
import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import weft  # noqa: E402
from test_module_values import TinyLlama  # noqa: E402
from weft.runtime.launch import free_port  # noqa: E402
from weft_env import subprocess_env  # noqa: E402

RTOL = 1e-9
STEPS = 20
ADAMW = dict(lr=3e-2, betas=(0.9, 0.95), weight_decay=0.1, no_decay=("bias", "n1", "n2", "norm"))


def batches(n, seed=3, batch=8):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 48, (batch, 8), generator=g), torch.randint(0, 48, (batch, 8), generator=g))
            for _ in range(n)]


def model():
    torch.manual_seed(11)
    return TinyLlama().double()


def schedule(steps):
    return weft.optim.warmup_cosine(warmup=3, total=steps)


def make_optimizer(kind):
    if kind == "adamw":
        return weft.optim.AdamW(**ADAMW)
    if kind == "sgd":
        return weft.optim.SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)
    if kind == "sgd-damp":
        return weft.optim.SGD(lr=0.05, momentum=0.8, dampening=0.3)
    if kind == "adam-groups":  # L2 decay; the embedding learns 3x faster
        return weft.optim.Adam(lr=1e-2, weight_decay=1e-2, groups=[{"params": "emb", "lr": 3e-2}])
    raise ValueError(kind)


def torch_optimizer(kind, m):
    o = make_optimizer(kind)
    groups = o.torch_param_groups(m.named_parameters())
    if isinstance(o, weft.optim.SGD):
        return torch.optim.SGD(groups, lr=o.lr, momentum=o.momentum, dampening=o.dampening, nesterov=o.nesterov)
    cls = torch.optim.AdamW if isinstance(o, weft.optim.AdamW) else torch.optim.Adam
    return cls(groups, lr=o.lr, betas=o.betas, eps=o.eps)


def reference(kind="adamw", steps=STEPS, clip=1.0, sched="cosine"):
    """The module trained by plain torch in one process: the oracle."""
    m = model()
    opt = torch_optimizer(kind, m)
    if sched == "cosine":
        lr_sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(steps))
    else:
        lr_sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    losses, norms = [], []
    for b in batches(steps):
        opt.zero_grad()
        loss = m(*b)
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(m.parameters(), clip if clip else float("inf"))))
        opt.step()
        lr_sched.step()
        losses.append(float(loss.detach()))
    return losses, norms, {k: v.detach().numpy().copy() for k, v in m.state_dict().items()}


def _plan(kind, step_graph, cluster):
    if kind == "t2p2":  # a callable: planned on rank 0 on the Trainer's own graph, broadcast
        return lambda graph, c: weft.megatron_plan(graph, c, t=2, p=2, d=1)
    if kind == "p2-zero3":
        return weft.megatron_plan(step_graph, cluster, t=1, p=2, d=2, zero=3)
    if kind == "dp2":
        return weft.megatron_plan(step_graph, cluster, t=1, p=1, d=2)
    return None  # weft.plan's own choice, made on rank 0 and broadcast


def train(plan_kinds, opt_kind="adamw", steps=STEPS, clip=1.0, sched="cosine", local=False):
    """In each launched process: the Trainer under each plan; returns what rank 0 needs to compare."""
    out = []
    for kind in plan_kinds:
        m = model()
        data = batches(steps)
        world = torch.distributed.get_world_size()
        cluster = weft.Cluster.preset("p3.8xlarge") if world == 4 else _two_devices()
        graph = weft.Trainer.training_graph(m, data[0], make_optimizer(opt_kind))
        lr_schedule = schedule(steps)
        if sched == "steplr":  # a torch LRScheduler, bound to any optimizer
            dummy = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=make_optimizer(opt_kind).lr)
            lr_schedule = torch.optim.lr_scheduler.StepLR(dummy, step_size=2, gamma=0.5)
        seen = []
        tr = weft.Trainer(m, data[0], plan=_plan(kind, graph, cluster), cluster=cluster,
                          optimizer=make_optimizer(opt_kind), lr_schedule=lr_schedule, grad_clip=clip, precision="f64",
                          callbacks=[seen.append])
        metrics = []
        if local:  # read only this rank's samples: a DataLoader over the batches' samples
            flat = [(b[0][i], b[1][i]) for b in data for i in range(b[0].shape[0])]
            sampler = tr.sampler(flat, shuffle=False)
            loader = torch.utils.data.DataLoader(flat, batch_sampler=sampler)
            for rows in loader:
                metrics.append(tr.step(tr.local_batch(rows)))
            read = len(tr.local_indices())
        else:
            metrics = [tr.step(b) for b in data]
            read = None
        sd = tr.full_state_dict()
        strict = model().load_state_dict(sd, strict=True)  # the module's own keys, tied names included
        out.append(dict(plan=tr.plan.strategy if tr.plan is not None else "", losses=[x["loss"] for x in metrics],
                        norms=[x["grad_norm"] for x in metrics], lrs=[x["lr"] for x in metrics],
                        state={k: v.numpy() for k, v in sd.items()}, strict=str(strict), read=read,
                        stages=tr.plan.num_stages if tr.plan is not None else 0,
                        callback_keys=sorted(seen[-1]) if seen else [], calls=len(seen)))
    return out


def _two_devices():
    """p3.8xlarge's node with 2 of its 4 GPUs."""
    return weft.Cluster.from_json(weft.Cluster.preset("p3.8xlarge").to_json().replace('"num_devices":4',
                                                                                       '"num_devices":2'))


def assert_equal(got, want, rtol=RTOL):
    losses, norms, state = want
    np.testing.assert_allclose(got["losses"], losses, rtol=rtol, atol=0)
    np.testing.assert_allclose(got["norms"], norms, rtol=rtol, atol=0)
    assert set(got["state"]) == set(state)
    for k, v in state.items():
        if v.dtype.kind == "f":
            np.testing.assert_allclose(got["state"][k], v, rtol=rtol, atol=rtol * np.max(np.abs(v)), err_msg=k)


@pytest.fixture(scope="module")
def adamw_reference():
    return reference("adamw")


def test_trains_like_torch_under_three_plans(adamw_reference):
    results = weft.launch(train, ["t2p2", "p2-zero3", None], nproc=4)
    got = results[0]
    assert "t=2" in got[0]["plan"] or "megatron" in got[0]["plan"].lower()
    for g in got:
        assert_equal(g, adamw_reference)
        assert g["strict"] == "<All keys matched successfully>"
    # every rank reports the same global metrics
    for r in results[1:]:
        for a, b in zip(r, got):
            assert a["losses"] == b["losses"] and a["norms"] == b["norms"]
    # the schedule: warmup then cosine, as LambdaLR
    f = schedule(STEPS)
    np.testing.assert_allclose(got[0]["lrs"], [ADAMW["lr"] * f(i) for i in range(STEPS)], rtol=1e-15)
    assert max(adamw_reference[1]) > 1.0  # clipping was active (the norm exceeded the max norm)
    assert got[0]["losses"][-1] < 0.6 * got[0]["losses"][0]


@pytest.mark.parametrize("opt_kind,sched", [("sgd", "cosine"), ("sgd-damp", "cosine"), ("adam-groups", "steplr")])
def test_optimizers_and_schedules_like_torch(opt_kind, sched):
    got = weft.launch(train, ["dp2"], opt_kind, 8, 0.5, sched, nproc=2)[0][0]
    assert_equal(got, reference(opt_kind, steps=8, clip=0.5, sched=sched))
    assert got["calls"] == 8  # the metrics callback, once per step
    assert {"step", "loss", "grad_norm", "lr", "tokens_per_s", "mfu", "predicted_step_seconds"} <= set(got["callback_keys"])


def test_only_the_ranks_samples_are_read(adamw_reference):
    got = weft.launch(train, ["p2-zero3"], "adamw", STEPS, 1.0, "cosine", True, nproc=4)
    for r in got:  # each replica of the first stage reads its half of the batch; the last stage reads labels
        assert r[0]["read"] <= 8
    assert sorted(r[0]["read"] for r in got) == [4, 4, 4, 4]
    assert_equal(got[0][0], adamw_reference)


def test_torchrun_two_launchers_like_four_local_processes(tmp_path, adamw_reference):
    port = free_port()
    script = os.path.join(os.path.dirname(__file__), "trainer_script.py")
    cmds = [[sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
             "--node-rank", str(n), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
             "--rdzv-id", "weft-test", script, str(tmp_path / "out.npz")] for n in range(2)]
    procs = [subprocess.Popen(c, cwd=tmp_path, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for c in cmds]
    outs = [p.communicate(timeout=300)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(outs)
    r = np.load(tmp_path / "out.npz")
    losses, norms, state = adamw_reference
    np.testing.assert_allclose(r["losses"], losses, rtol=RTOL)
    np.testing.assert_allclose(r["norms"], norms, rtol=RTOL)
    for k, v in state.items():
        if v.dtype.kind == "f":
            np.testing.assert_allclose(r[f"param/{k}"], v, rtol=RTOL, atol=RTOL * np.max(np.abs(v)), err_msg=k)


def bad_inputs():
    m = model()
    data = batches(1)
    cluster = weft.Cluster.preset("p3.8xlarge")
    msgs = {}

    def catch(key, fn):
        try:
            fn()
            msgs[key] = None
        except (ValueError, TypeError) as e:
            msgs[key] = f"{type(e).__name__}: {e}"

    catch("torch optimizer", lambda: weft.Trainer(m, data[0], cluster=cluster,
                                                  optimizer=torch.optim.AdamW(m.parameters())))
    catch("precision", lambda: weft.Trainer(m, data[0], cluster=cluster, precision="fp8"))
    catch("clip", lambda: weft.Trainer(m, data[0], cluster=cluster, grad_clip=-1))
    catch("no cluster", lambda: weft.Trainer(m, data[0]))
    catch("small cluster", lambda: weft.Trainer(m, data[0], cluster=_two_devices()))
    catch("cluster type", lambda: weft.Trainer(m, data[0], cluster=4))
    tr = weft.Trainer(m, data[0], cluster=cluster, plan=None)
    catch("batch shape", lambda: tr.step((data[0][0][:4], data[0][1][:4])))
    catch("batch count", lambda: tr.step((data[0][0],)))
    catch("batch dtype", lambda: tr.step((data[0][0].double(), data[0][1])))
    catch("schedule", lambda: weft.Trainer(m, data[0], cluster=cluster, lr_schedule=3))
    # each rank drew its own random batch: caught on every rank (one small all-reduce), before any step
    catch("different batches", lambda: tr.step(batches(1, seed=100 + torch.distributed.get_rank())[0]))
    catch("same batch", lambda: tr.step(data[0]))
    return msgs


def test_bad_input_is_a_clear_error():
    msgs = weft.launch(bad_inputs, nproc=4)[0]
    assert "weft.optim optimizer" in msgs["torch optimizer"] and msgs["torch optimizer"].startswith("TypeError")
    assert "precision must be one of" in msgs["precision"]
    assert "grad_clip must be a positive number" in msgs["clip"]
    assert "give cluster=" in msgs["no cluster"]
    assert "the cluster has 2 devices, this job 4 processes" in msgs["small cluster"]
    assert msgs["cluster type"].startswith("TypeError")
    assert "'tokens' has shape (4, 8), the plan is for (8, 8)" in msgs["batch shape"]
    assert "drop_last=True" in msgs["batch shape"]
    assert "the batch has 1 tensors, the example had 2" in msgs["batch count"]
    assert "'tokens' is torch.float64" in msgs["batch dtype"]
    assert msgs["schedule"].startswith("TypeError") and "lr_schedule" in msgs["schedule"]
    assert "step 1: the ranks were given different batches" in msgs["different batches"]
    assert msgs["same batch"] is None
    with pytest.raises(ValueError, match="torch.distributed initialised"):
        weft.Trainer(model(), batches(1)[0], cluster=weft.Cluster.preset("p3.8xlarge"))


def failing_rank():
    m = model()
    data = batches(2)
    tr = weft.Trainer(m, data[0], cluster=weft.Cluster.preset("p3.8xlarge"),
                      plan=None, precision="f64")
    tr.step(data[0])
    bad = data[1][0].clone()
    bad[0, 0] = 99  # outside the vocabulary of 48
    tr.step((bad, data[1][1]))


def test_a_failing_rank_names_itself_and_the_instruction():
    with pytest.raises(RuntimeError, match=r"weft.launch: rank \d failed: .*(embedding|id 99).*the other ranks were stopped"):
        weft.launch(failing_rank, nproc=4, timeout_s=60)


def _one_device():
    return weft.Cluster.from_json(weft.Cluster.preset("p3.8xlarge").to_json().replace('"num_devices":4',
                                                                                       '"num_devices":1'))


def train_on_gpu(steps):
    m = model()
    data = batches(steps)
    tr = weft.Trainer(m, data[0], cluster=_one_device(), optimizer=make_optimizer("adamw"),
                      lr_schedule=schedule(steps), grad_clip=1.0, precision="f64")
    assert tr.device.type == "cuda"
    metrics = [tr.step(b) for b in data]
    return dict(losses=[x["loss"] for x in metrics], norms=[x["grad_norm"] for x in metrics],
                state={k: v.numpy() for k, v in tr.full_state_dict().items()})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (NCCL)")
def test_trainer_on_nccl_trains_like_torch(adamw_reference):
    # One GPU: the Trainer's program runs on CUDA tensors under NCCL; equal to torch on the CPU in f64.
    got = weft.launch(train_on_gpu, STEPS, nproc=1, backend="nccl")[0]
    assert_equal(got, adamw_reference)


def stream_to_file(path, steps=3):
    m = model()
    data = batches(steps)
    cluster = weft.Cluster.preset("p3.8xlarge")
    tr = weft.Trainer(m, data[0], cluster=cluster, plan=lambda g, c: weft.megatron_plan(g, c, t=1, p=2, d=2, zero=3),
                      optimizer=make_optimizer("adamw"), precision="f64")
    for b in data:
        tr.step(b)
    tr.save_full_state_dict(path)
    return {k: v.numpy() for k, v in tr.full_state_dict().items()}


def test_the_trained_module_streams_to_a_safetensors_file(tmp_path):
    st = pytest.importorskip("safetensors.torch")
    path = str(tmp_path / "model.safetensors")
    want = weft.launch(stream_to_file, path, nproc=4)[0]  # ZeRO-3: every parameter in shards on 2 ranks
    got = st.load_file(path)
    assert set(got) == set(want)  # every key of the module's state_dict, tied names and buffers included
    for k, v in want.items():
        np.testing.assert_array_equal(got[k].numpy(), v, err_msg=k)
    m = model()
    m.load_state_dict(got, strict=True)
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]  # written atomically
