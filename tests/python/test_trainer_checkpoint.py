"""weft.Trainer checkpoints through torch.distributed.checkpoint (gloo on CPU, f64): saved under one
plan and world size, loaded under another, training resumes exactly (equal to plain torch AdamW +
clip_grad_norm_ + LambdaLR trained without a break); the checkpoint loads into plain torch with DCP
(torch's key layout); another model's checkpoint is refused naming the tensor; strided tiles are
saved as DCP chunk lists. See docs/modules/training_checkpoints.md."""
import json
import os
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import weft  # noqa: E402
from test_module_values import TinyLlama  # noqa: E402

RTOL = 1e-9
# plain torch reads the checkpoints in this process, without torch.distributed (no_dist=True)
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
OPT = dict(lr=3e-2, betas=(0.9, 0.95), weight_decay=0.1, no_decay=("bias", "n1", "n2", "norm"))


def batches(n, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 48, (8, 8), generator=g), torch.randint(0, 48, (8, 8), generator=g)) for _ in range(n)]


def cluster(n):
    """n devices of a p3.8xlarge node (the preset has 4)."""
    if n == 4:
        return weft.Cluster.preset("p3.8xlarge")
    spec = json.loads(weft.Cluster.preset("p3.8xlarge").to_json())
    spec["nodes"][0]["num_devices"] = n
    return weft.Cluster.from_json(json.dumps(spec))


def make_trainer(layout, total, model=None, optimizer=None):
    """layout: ("megatron", t, p, d) | ("zero3", n) | ("dp", n) | ("random", n, seed): a random
    valid layout on a mesh of n (weft.lower_random: every leaf a random spec, strided ones included)."""
    torch.manual_seed(11)
    model = TinyLlama().double() if model is None else model
    data = batches(1)
    kind, *arg = layout
    n = {"megatron": lambda: arg[0] * arg[1] * arg[2], "zero3": lambda: arg[0], "dp": lambda: arg[0],
         "random": lambda: arg[0]}[kind]()
    cl = cluster(n)
    opt = optimizer or weft.optim.AdamW(**OPT)
    g = weft.from_torch(model, data[0]).train_step(**opt.train_step_options())
    if kind == "megatron":
        plan = weft.megatron_plan(g, cl, t=arg[0], p=arg[1], d=arg[2])
    elif kind == "zero3":
        plan = weft.megatron_plan(g, cl, t=1, p=1, d=n, zero=3)
    elif kind == "dp":
        plan = weft.data_parallel_plan(g, cl, [8 // n] * n)
    else:
        plan = weft.lower_random(g, cl, weft.DeviceMesh([n], list(range(n))), arg[1])
    return weft.Trainer(model, data[0], plan=plan, cluster=cl, optimizer=opt,
                        lr_schedule=weft.optim.warmup_cosine(warmup=3, total=total), grad_clip=1.0, precision="f64")


def _numpy(sd):
    return {k: v.detach().numpy().copy() for k, v in sd.items()}


def run_save(path, layout, steps, total):
    """Trains `steps` steps under `layout`, saves; returns losses, the full state dict, figures."""
    tr = make_trainer(layout, total)
    losses = [tr.step(b)["loss"] for b in batches(steps)]
    torch.distributed.barrier()  # the figure: the save, not the wait for the slowest rank's set-up
    t0 = time.perf_counter()
    tr.save(path, extra={"batch": steps, "note": "data position"})
    return {"losses": losses, "state": _numpy(tr.full_state_dict()), "save_s": time.perf_counter() - t0,
            "objects": dict(tr._checkpoint_stats)}


def run_load(path, layout, start, total, save_to=None):
    """Loads under `layout`, returns the loaded state (before training), then trains to `total`
    (and saves to `save_to`)."""
    tr = make_trainer(layout, total)
    torch.distributed.barrier()
    t0 = time.perf_counter()
    extra = tr.load(path)
    load_s = time.perf_counter() - t0
    loaded = _numpy(tr.full_state_dict())
    at = (tr.steps_done, tr.engine.optimizer_steps)
    losses = [tr.step(b)["loss"] for b in batches(total)[start:]]
    if save_to:
        tr.save(save_to, extra={"batch": total})
    return {"objects": dict(getattr(tr, "_checkpoint_stats", {})), "strided": strided_tiles(tr), "extra": extra,
            "loaded": loaded, "at": at, "losses": losses, "state": _numpy(tr.full_state_dict()),
            "load_s": load_s}


def torch_reference(steps, total):
    """Plain torch: AdamW + clip_grad_norm_ + LambdaLR, `steps` steps of a `total`-step schedule."""
    torch.manual_seed(11)
    model = TinyLlama().double()
    o = weft.optim.AdamW(**OPT)
    opt = torch.optim.AdamW(o.torch_param_groups(model.named_parameters()), lr=o.lr, betas=o.betas, eps=o.eps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, weft.optim.warmup_cosine(warmup=3, total=total))
    losses = []
    for x, y in batches(steps):
        opt.zero_grad()
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss.detach()))
    return model, opt, losses


WORST = {"err": 0.0}  # the largest error relative to each tensor's largest value, for the figures


def assert_close(got, want, what):
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    assert got.shape == want.shape, what
    err = float(np.max(np.abs(got - want) / (np.abs(want) + 1e-12))) if got.size else 0.0
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    if want.size:
        WORST["err"] = max(WORST["err"], float(np.max(np.abs(got - want))) / max(scale, 1e-300))
    assert np.allclose(got, want, rtol=RTOL, atol=RTOL * max(scale, 1e-12)), f"{what}: max rel err {err:.3g}"


def assert_state(got, model, what):
    want = model.state_dict()
    assert set(got) == set(want), what
    for k in want:
        assert_close(got[k], want[k].detach().numpy(), f"{what}: {k}")


@pytest.fixture(scope="module")
def ckpt_t2p2(tmp_path_factory):
    """Step 10 of 20, tensor 2 x pipeline 2 on 4 processes."""
    path = str(tmp_path_factory.mktemp("ckpt") / "step-10")
    res = weft.launch(run_save, path, ("megatron", 2, 2, 1), 10, 20, nproc=4)
    return path, res


def test_save_tp2_pp2_load_dp2_resumes_exactly(ckpt_t2p2):
    path, saved = ckpt_t2p2
    t0 = time.perf_counter()
    res = weft.launch(run_load, path, ("dp", 2), 10, 20, nproc=2)
    wall = time.perf_counter() - t0
    ref10, _, ref_losses10 = torch_reference(10, 20)
    ref20, _, ref_losses = torch_reference(20, 20)
    assert_close(saved[0]["losses"], ref_losses[:10], "losses 1-10 under t2 x p2")
    for r in res:
        assert r["extra"] == {"batch": 10, "note": "data position"}
        assert r["at"] == (10, 10)
        # full_state_dict after loading: the module's keys, strict, the step-10 weights
        m = TinyLlama().double()
        m.load_state_dict({k: torch.from_numpy(v) for k, v in r["loaded"].items()}, strict=True)
        assert_state(r["loaded"], ref10, "loaded state")
        assert_close(r["losses"], ref_losses[10:], "losses 11-20 under dp2 after loading")
        assert_state(r["state"], ref20, "weights after 20 steps")
    worst, WORST["err"] = WORST["err"], 0.0
    files = sorted(os.listdir(path))
    print(f"\nt2xp2 save {max(s['save_s'] for s in saved):.3f} s, objects per rank "
          f"{[s['objects'] for s in saved]}, files {files}; dp2 load {max(r['load_s'] for r in res):.3f} s, "
          f"launch+load+10 steps {wall:.1f} s; worst error vs torch {worst:.2g} of the tensor's largest value")


def test_plain_torch_loads_the_checkpoint(ckpt_t2p2):
    """Single process, no weft: dcp.load into the module's own state_dict and torch's optimizer
    state names."""
    import torch.distributed.checkpoint as dcp

    path, _ = ckpt_t2p2
    ref10, opt10, _ = torch_reference(10, 20)
    model = TinyLlama().double()
    sd = model.state_dict()
    dcp.load({"model": sd}, checkpoint_id=path, no_dist=True)
    model.load_state_dict(sd, strict=True)
    assert_state({k: v.numpy() for k, v in model.state_dict().items()}, ref10, "plain torch load")
    # the optimizer state, keyed by parameter FQN with torch's names
    names = {p: n for n, p in ref10.named_parameters()}
    state = {}
    for p, st in opt10.state.items():
        state[names[p]] = {"exp_avg": torch.zeros_like(st["exp_avg"]), "exp_avg_sq": torch.zeros_like(st["exp_avg_sq"]),
                           "step": torch.zeros((), dtype=torch.float32)}
    dcp.load({"optim": {"state": state}}, checkpoint_id=path, no_dist=True)
    for p, st in opt10.state.items():
        n = names[p]
        assert_close(state[n]["exp_avg"].numpy(), st["exp_avg"].numpy(), f"exp_avg of {n}")
        assert_close(state[n]["exp_avg_sq"].numpy(), st["exp_avg_sq"].numpy(), f"exp_avg_sq of {n}")
        assert float(state[n]["step"]) == float(st["step"]) == 10.0


def test_zero3_save_load_under_tp2_pp2(tmp_path):
    """Sharded optimizer states (ZeRO-3 on 2 processes, Shard(0) DTensors) -> tensor 2 x pipeline 2
    on 4 processes, resumed at step 5 of 10."""
    path = str(tmp_path / "step-5")
    saved = weft.launch(run_save, path, ("zero3", 2), 5, 10, nproc=2)
    res = weft.launch(run_load, path, ("megatron", 2, 2, 1), 5, 10, nproc=4)
    ref10, _, ref_losses = torch_reference(10, 10)
    ref5, _, _ = torch_reference(5, 10)
    assert all(s["objects"].get("dtensor", 0) > 0 for s in saved), saved[0]["objects"]
    import torch.distributed.checkpoint as dcp

    md = dcp.FileSystemReader(path).read_metadata()
    chunks = md.state_dict_metadata["optim.state.emb.weight.exp_avg"].chunks
    assert sorted((tuple(c.offsets), tuple(c.sizes)) for c in chunks) == [((0, 0), (24, 16)), ((24, 0), (24, 16))]
    files = {md.storage_data[i].relative_path for i in md.storage_data if i.fqn == "optim.state.emb.weight.exp_avg"}
    assert len(files) == 2  # each rank wrote its own shard
    for r in res:
        assert r["at"] == (5, 5)
        assert_state(r["loaded"], ref5, "loaded ZeRO-3 state")
        assert_close(r["losses"], ref_losses[5:], "losses 6-10")
        assert_state(r["state"], ref10, "weights after 10 steps")
    worst, WORST["err"] = WORST["err"], 0.0
    print(f"\nworst error vs torch {worst:.2g}; zero3 objects {[s['objects'] for s in saved]}, "
          f"save {max(s['save_s'] for s in saved):.3f} s, "
          f"load {max(r['load_s'] for r in res):.3f} s")


def run_bad_loads(path, step0):
    """Each wrong model / optimizer: the ValueError's text. And a save before the first step (the
    module's values), loaded into a trainer of another initialisation: its first loss."""
    out = {}
    make_trainer(("dp", 1), 20).save(step0, extra={"batch": 0})
    torch.manual_seed(5)
    tr = make_trainer(("dp", 1), 20, model=TinyLlama().double())
    out["step0 extra"] = tr.load(step0)
    out["step0 state"] = _numpy(tr.full_state_dict())
    out["step0 loss"] = tr.step(batches(1)[0])["loss"]
    for label, kw in (("vocab", dict(vocab=40)), ("fewer layers", dict(layers=1)), ("more layers", dict(layers=3))):
        torch.manual_seed(0)
        tr = make_trainer(("dp", 1), 20, model=TinyLlama(**kw).double())
        try:
            tr.load(path)
            out[label] = None
        except ValueError as e:
            out[label] = str(e)
    tr = make_trainer(("dp", 1), 20, optimizer=weft.optim.SGD(lr=0.1, momentum=0.9))
    try:
        tr.load(path)
        out["sgd"] = None
    except ValueError as e:
        out["sgd"] = str(e)
    return out


def test_another_models_checkpoint_is_refused(ckpt_t2p2, tmp_path):
    path, _ = ckpt_t2p2
    (out,) = weft.launch(run_bad_loads, path, str(tmp_path / "step-0"), nproc=1)
    ref0, _, _ = torch_reference(0, 20)
    _, _, ref_losses = torch_reference(1, 20)
    assert out["step0 extra"] == {"batch": 0}
    assert_state(out["step0 state"], ref0, "saved before the first step")
    assert_close([out["step0 loss"]], ref_losses, "first loss after loading the step-0 checkpoint")
    assert "'model.emb.weight' has shape [48, 16]" in out["vocab"] and "[40, 16]" in out["vocab"], out["vocab"]
    assert "has 'model.blocks.1." in out["fewer layers"], out["fewer layers"]
    assert "lacks 'model.blocks.2." in out["more layers"], out["more layers"]
    assert "momentum_buffer" in out["sgd"], out["sgd"]


def test_tile_chunks_strided_and_uneven(tmp_path):
    """TileChunks alone: a strided tile is one DCP chunk per run; saved by 2 ranks, read back into
    block tiles and into a plain tensor. An uneven split DTensor cannot express (5 + 7 rows) saved,
    read back into strided tiles."""
    path = str(tmp_path / "strided")
    res = weft.launch(run_strided, path, nproc=2)
    full = torch.arange(12 * 5, dtype=torch.float64).reshape(12, 5)
    for r, got in enumerate(res):
        assert_close(got["block"], full[6 * r:6 * r + 6].numpy(), "block tile read from strided chunks")
        assert_close(got["strided"], full[torch.from_numpy(got["rows"])].numpy(), "strided tile from uneven blocks")
        assert got["chunks"] == 3
    import torch.distributed.checkpoint as dcp

    plain = {"w": torch.zeros(12, 5, dtype=torch.float64), "u": torch.zeros(12, 5, dtype=torch.float64)}
    dcp.load(plain, checkpoint_id=path, no_dist=True)
    assert_close(plain["w"].numpy(), full.numpy(), "plain load of strided chunks")
    assert_close(plain["u"].numpy(), full.numpy(), "plain load of uneven chunks")


def run_strided(path):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from weft.training.checkpoint import LoadPlanner, SavePlanner, TileChunks

    r = dist.get_rank()
    full = torch.arange(12 * 5, dtype=torch.float64).reshape(12, 5)
    cols = np.arange(5)
    rows = np.array([i for i in range(12) if (i // 2) % 2 == r])  # runs [0,1],[4,5],[8,9] / [2,3],[6,7],[10,11]
    uneven = np.arange(0, 5) if r == 0 else np.arange(5, 12)
    w = TileChunks(full[torch.from_numpy(rows)].clone(), [rows, cols], (12, 5))
    u = TileChunks(full[torch.from_numpy(uneven)].clone(), [uneven, cols], (12, 5))
    dcp.save({"w": w, "u": u}, checkpoint_id=path, planner=SavePlanner())
    block = torch.zeros(6, 5, dtype=torch.float64)
    strided = torch.zeros(6, 5, dtype=torch.float64)
    dest = {"w": TileChunks(block, [np.arange(6 * r, 6 * r + 6), cols], (12, 5)),
            "u": TileChunks(strided, [rows, cols], (12, 5))}
    dcp.load(dest, checkpoint_id=path, planner=LoadPlanner())
    return {"block": block.numpy(), "strided": strided.numpy(), "rows": rows,
            "chunks": len(w.__create_chunk_list__())}


def strided_tiles(tr):
    """How many of this rank's parameter / state tiles are strided (no single box)."""
    n = 0
    for b in tr.program.leaf_buffer_ids:
        buf = tr.program.buffers[b]
        if (buf["stage"] == tr.program.ranks[tr.rank]["stage"]
                and tr.program.graph.tensors[buf["tensor_id"]]["role"] in ("parameter", "optimizer_state")):
            n += any(len(x) and x[-1] - x[0] + 1 != len(x) for x in tr.layout.tile(b, tr.rank)["global"])
    return n


def test_strided_layout_loads_resumes_and_saves(ckpt_t2p2, tmp_path):
    """A random layout on 2 processes (strided specs S(0,1), S(1,2) ... for most parameters and
    states): the t2 x p2 checkpoint read into its strided tiles (DCP chunk lists), trained to step
    20 equal to torch, saved from those tiles and read back by plain torch."""
    import torch.distributed.checkpoint as dcp

    path, _ = ckpt_t2p2
    out = str(tmp_path / "step-20")
    res = weft.launch(run_load, path, ("random", 2, 0), 10, 20, out, nproc=2)
    ref10, _, _ = torch_reference(10, 20)
    ref20, _, ref_losses = torch_reference(20, 20)
    for r in res:
        assert r["strided"] >= 20 and r["objects"].get("chunks", 0) >= r["strided"], (r["strided"], r["objects"])
        assert_state(r["loaded"], ref10, "loaded into strided tiles")
        assert_close(r["losses"], ref_losses[10:], "losses 11-20 under the random layout")
        assert_state(r["state"], ref20, "weights after 20 steps")
    model = TinyLlama().double()
    sd = model.state_dict()
    dcp.load({"model": sd}, checkpoint_id=out, no_dist=True)
    assert_state({k: v.numpy() for k, v in sd.items()}, ref20, "plain torch load of strided chunks")
    worst, WORST["err"] = WORST["err"], 0.0
    print(f"\nworst error vs torch {worst:.2g}; random layout: strided tiles {[r['strided'] for r in res]}, "
          f"objects per rank "
          f"{[r['objects'] for r in res]}, load {max(r['load_s'] for r in res):.3f} s")


def _mixed_trainer(total):
    torch.manual_seed(11)
    model = TinyLlama().float()
    return weft.Trainer(model, batches(1)[0], cluster=cluster(1), optimizer=weft.optim.AdamW(**OPT),
                        lr_schedule=weft.optim.warmup_cosine(warmup=3, total=total), grad_clip=1.0,
                        precision="bf16-mixed")


def run_mixed(path):
    import torch.distributed.checkpoint as dcp

    a = _mixed_trainer(6)
    losses = [a.step(b)["loss"] for b in batches(6)]
    b = _mixed_trainer(6)
    for x in batches(3):
        b.step(x)
    b.save(path)
    md = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    c = _mixed_trainer(6)
    c.load(path)
    resumed = [c.step(x)["loss"] for x in batches(6)[3:]]
    sa, sc = a.full_state_dict(), c.full_state_dict()
    diff = max(float((sa[k].double() - sc[k].double()).abs().max()) for k in sa)
    return {"losses": losses[3:], "resumed": resumed, "diff": diff,
            "dtypes": {k: str(m.properties.dtype) for k, m in md.items() if "blocks.0.qkv" in k}}


def test_mixed_precision_resume_is_bitwise(tmp_path):
    """bf16-mixed: bf16 parameters (model.*), float32 master copies and Adam states; saved at step 3,
    resumed to 6 bitwise equal to 6 steps without a break."""
    (r,) = weft.launch(run_mixed, str(tmp_path / "mixed"), nproc=1)
    assert r["resumed"] == r["losses"] and r["diff"] == 0.0, r
    q = "optim.state.blocks.0.qkv.weight."
    assert r["dtypes"] == {"model.blocks.0.qkv.weight": "torch.bfloat16", q + "exp_avg": "torch.float32",
                           q + "exp_avg_sq": "torch.float32", q + "master": "torch.float32",
                           q + "step": "torch.float32"}, r["dtypes"]


def _f16_trainer(total):
    torch.manual_seed(11)
    return weft.Trainer(TinyLlama().float(), batches(1)[0], cluster=cluster(1), optimizer=weft.optim.AdamW(**OPT),
                        lr_schedule=weft.optim.warmup_cosine(warmup=3, total=total), grad_clip=1.0,
                        precision="f16-mixed", loss_scaler=weft.optim.LossScaler(init_scale=2.0 ** 16,
                                                                                growth_interval=2))


def run_f16(path):
    a = _f16_trainer(8)
    ma = [a.step(b) for b in batches(8)]
    b = _f16_trainer(8)
    for x in batches(4):
        b.step(x)
    b.save(path)
    c = _f16_trainer(8)
    c.load(path)
    at_load = c.scaler.scale
    mc = [c.step(x) for x in batches(8)[4:]]
    return {"scales": [m["loss_scale"] for m in ma], "resumed_scales": [m["loss_scale"] for m in mc],
            "losses": [m["loss"] for m in ma[4:]], "resumed": [m["loss"] for m in mc],
            "skipped": [m["skipped"] for m in ma], "at_load": at_load, "saved": b.scaler.scale}


def test_f16_loss_scale_resumes(tmp_path):
    """f16-mixed: the dynamic loss scale and its growth count are part of the checkpoint: a resumed run
    takes the same scales, skips the same steps and gives the same losses as one without a break."""
    (r,) = weft.launch(run_f16, str(tmp_path / "f16"), nproc=1)
    assert any(r["skipped"]) and len(set(r["scales"])) > 1, r  # the scale moved (overflow backoff / growth)
    assert r["at_load"] == r["saved"] and r["at_load"] != 2.0 ** 16
    assert r["resumed_scales"] == r["scales"][4:]
    assert r["resumed"] == r["losses"]
