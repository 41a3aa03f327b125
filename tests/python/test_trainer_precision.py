"""weft.Trainer's precisions against torch (gloo on CPU, 4 processes).

- "f64": the Trainer equals torch AdamW + clip_grad_norm_ + LambdaLR to 1e-15 (the proof precision).
- "bf16-mixed": bf16 parameters and activations, f32 master weights, Adam moments, parameters'
  gradients (their collectives and micro-batch accumulations) and loss; trained 50 steps on a
  tensor-parallel and a data-parallel (ZeRO) plan, its loss curve stays within BF16_RTOL of torch's
  own mixed precision (the f32 module under torch.autocast("cpu", bfloat16), torch.optim.AdamW on
  the f32 parameters). Why 1e-2: bf16 keeps 8 significant bits, a unit roundoff of 2^-8 ≈ 3.9e-3
  per rounding; the two runs round at different places (weft stores every activation in bf16,
  CPU autocast keeps the residual stream in f32), so their losses differ by about one bf16
  rounding: measured max relative difference per step 1.9e-3 (tensor parallel) and 1.7e-3 (data
  parallel), while torch autocast vs torch f32 is 1.6e-3 and weft f32 vs torch f32 is 1.9e-7.
  1e-2 leaves a factor 5 and is still 5e4 times the f32 agreement. The storage dtypes (f32
  gradients, masters, moments, loss) are checked directly, not inferred from the tolerance.
- grad_reduce_dtype="bf16": the gradients' all-reduces send half the bytes; the loss stays within
  BF16_RTOL of the f32 reductions.
- "f16-mixed": dynamic loss scaling as torch.amp.GradScaler (an overflow skips the step on every
  rank: parameters, masters and moments bit-identical, no optimizer step counted; the scale halves,
  grows by 2 after growth_interval finite steps), and a 20-step run within F16_RTOL of f32 (f16
  keeps 11 significant bits, unit roundoff 2^-11 ≈ 4.9e-4; measured 1.8e-4; 2e-3 is 4 roundoffs).
"""
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import weft  # noqa: E402
from test_module_values import TinyLlama  # noqa: E402

BF16_RTOL = 1e-2  # see the module docstring
F16_RTOL = 2e-3   # f16 keeps 11 significant bits (unit roundoff 4.9e-4); measured 1.8e-4 (TinyLlama, 20 steps)
OPT = dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
CLUSTER = "p3.8xlarge"  # 4 devices: 4 processes


def batches(n, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 48, (8, 8), generator=g), torch.randint(0, 48, (8, 8), generator=g)) for _ in range(n)]


def torch_reference(steps, autocast=False, dtype=torch.float32, lr=OPT["lr"]):
    """The same module trained by torch: f32 (or f64) parameters, AdamW, clip 1.0, warmup-cosine;
    ``autocast``: its forward under torch.autocast("cpu", bfloat16), the f32 parameters as masters."""
    torch.manual_seed(11)
    model = TinyLlama().to(dtype)
    opt = torch.optim.AdamW(model.parameters(), **{**OPT, "lr": lr})
    sched = torch.optim.lr_scheduler.LambdaLR(opt, weft.optim.warmup_cosine(warmup=3, total=steps))
    out = []
    for x, y in batches(steps):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        out.append(float(loss.detach()))
    return out


def make_trainer(steps, precision, plan_kw=None, lr=OPT["lr"], module_dtype=torch.float32, **kw):
    torch.manual_seed(11)
    model = TinyLlama().to(module_dtype)
    data = batches(steps)
    cluster = weft.Cluster.preset(CLUSTER)
    opt = weft.optim.AdamW(**{**OPT, "lr": lr})
    plan = None
    if plan_kw is not None:  # a given Megatron layout, planned on the graph the Trainer builds
        half = {"bf16-mixed": "bf16", "f16-mixed": "f16"}.get(precision)
        step = weft.from_torch(model, data[0], dtype=half).train_step(**opt.train_step_options(),
                                                                       master_weights=True if half else None)
        plan = weft.megatron_plan(step, cluster, **plan_kw)
    tr = weft.Trainer(model, data[0], cluster=cluster, plan=plan, optimizer=opt, precision=precision,
                      lr_schedule=weft.optim.warmup_cosine(warmup=3, total=steps), grad_clip=1.0, **kw)
    return tr, data


def max_rel(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


# ---- f64: exact


def run_f64(steps):
    tr, data = make_trainer(steps, "f64", lr=3e-2, module_dtype=torch.float64)
    return [tr.step(b)["loss"] for b in data]


def test_f64_equals_torch():
    got = weft.launch(run_f64, 6, nproc=4)
    want = torch_reference(6, dtype=torch.float64, lr=3e-2)
    for r in got:
        assert max_rel(r, want) < 1e-15, (r, want)


# ---- bf16-mixed


def dtypes_of(tr):
    """The storage dtypes the rank uses, per tensor role (sets of dtype names)."""
    e = tr.engine
    out = {k: set() for k in ("param", "grad", "master", "moment", "grad_buffers", "loss", "activation", "lse")}
    gops = e.program.graph.ops
    lse = {o["outputs"][1] for o in gops if o["kind"] == "attention"}  # the fused attention's log-sum-exp
    for ins in e.updates:
        i = ins["inputs"]
        out["param"].add(str(e.dtype_of(i[0])))
        out["grad"].add(str(e.dtype_of(i[1])))
        out["master"].add(str(e.dtype_of(i[2])))
        for b in i[3:]:
            out["moment"].add(str(e.dtype_of(b)))
        assert e.tensor_name(i[2]).startswith("master:")
    for b, buf in enumerate(e.buffers):
        t = buf["tensor_id"]
        if t is None or t < 0 or buf["stage"] != e.info["stage"]:
            continue
        if e.is_gradient_buffer(b):
            out["grad_buffers"].add(str(e.dtype_of(b)))
        elif t == e.loss_tensor:
            out["loss"].add(str(e.dtype_of(b)))
        elif t in lse:
            out["lse"].add(str(e.dtype_of(b)))
        elif e.tensors[t]["role"] == "activation":
            out["activation"].add(str(e.dtype_of(b)))
    # the values really held (after a step): the parameters bf16, the masters f32
    held = {e.tensor_name(b).split(":")[0] if ":" in e.tensor_name(b) else "param": str(v.dtype)
            for b, v in e.values.items() if e.tensors[e.buffers[b]["tensor_id"]]["role"] in ("parameter",
                                                                                            "optimizer_state")}
    out["held"] = held
    return out


def run_bf16(steps, plan_kw, grad_reduce_dtype=None):
    tr, data = make_trainer(steps, "bf16-mixed", plan_kw, grad_reduce_dtype=grad_reduce_dtype)
    losses = [tr.step(b)["loss"] for b in data]
    kinds = [ins["kind"] for ins in tr.engine.instrs]
    return {"losses": losses, "dtypes": dtypes_of(tr), "bytes": dict(tr.engine.comm.bytes_sent),
            "kinds": {k: kinds.count(k) for k in set(kinds)}, "strategy": tr.plan.strategy}


def check_bf16_dtypes(d):
    bf, f32 = "torch.bfloat16", "torch.float32"
    assert d["param"] == {bf} and d["activation"] == {bf}
    assert d["lse"] <= {f32}  # the fused attention keeps its log-sum-exp in f32 (as flash attention)
    assert d["grad"] == {f32} and d["grad_buffers"] == {f32}  # reduced and accumulated in f32
    assert d["master"] == {f32} and d["moment"] == {f32} and d["loss"] == {f32}
    assert d["held"] == {"param": bf, "master": f32, "adam_m": f32, "adam_v": f32}


@pytest.fixture(scope="module")
def bf16_reference():
    return torch_reference(50, autocast=True), torch_reference(50)


@pytest.mark.parametrize("plan_kw", [dict(t=2, p=1, d=2), dict(t=1, p=1, d=4)], ids=["tensor-parallel", "data-parallel"])
def test_bf16_mixed_follows_torch_autocast(plan_kw, bf16_reference):
    autocast, f32 = bf16_reference
    got = weft.launch(run_bf16, 50, plan_kw, nproc=4)
    losses = got[0]["losses"]
    for r in got:
        assert r["losses"] == losses  # the reported loss is global: equal on every rank
        check_bf16_dtypes(r["dtypes"])
    rel = max_rel(losses, autocast)
    print(f"{got[0]['strategy']}: bf16-mixed vs torch autocast {rel:.2e}, vs torch f32 {max_rel(losses, f32):.2e}, "
          f"torch autocast vs f32 {max_rel(autocast, f32):.2e}; loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    assert rel < BF16_RTOL
    assert max_rel(losses, f32) > 1e-5  # it really computed in bf16 (f32 agrees to ~2e-7)
    assert losses[-1] < 0.4 * losses[0] and sum(losses[-5:]) < sum(losses[:5]) / 2  # it learns
    if plan_kw["t"] == 1:  # ZeRO over d = 4: the gradients are reduce-scattered (in f32)
        assert got[0]["kinds"].get("reduce-scatter", 0) > 0


def test_bf16_gradient_reductions_in_bf16():
    # Two micro-batches (f32 accumulations) and all-reduces of the gradients over d = 2 (no ZeRO), on
    # 2 pipeline stages: every all-reduce is a gradient's (Megatron's tensor parallelism would add
    # its activations' all-reduces, which stay f32).
    kw = dict(t=1, p=2, d=2, num_microbatches=2, zero=0)
    f32 = weft.launch(run_bf16, 10, kw, nproc=4)[-1]  # the last stage's rank: it holds the loss too
    half = weft.launch(run_bf16, 10, kw, "bf16", nproc=4)[-1]
    assert f32["kinds"].get("accumulate", 0) > 0 and f32["kinds"].get("all-reduce", 0) > 0
    check_bf16_dtypes(half["dtypes"])  # the buffers stay f32: only the collectives' payload is bf16
    assert half["bytes"]["all-reduce"] < 0.6 * f32["bytes"]["all-reduce"]  # half the bytes (measured exactly half)
    rel = max_rel(half["losses"], f32["losses"])
    print(f"bf16 vs f32 gradient reductions: {rel:.2e}; all-reduce bytes {half['bytes']['all-reduce']} vs "
          f"{f32['bytes']['all-reduce']}")
    assert 0 < rel < BF16_RTOL


# ---- f16-mixed


def state_of(tr):
    """Every parameter / optimizer-state value this rank holds (copies)."""
    e = tr.engine
    return {e.buffers[b]["name"]: v.clone() for b, v in e.values.items()
            if e.tensors[e.buffers[b]["tensor_id"]]["role"] in ("parameter", "optimizer_state")}


def run_f16_overflow(steps, force_at, forced_scale):
    scaler = weft.optim.LossScaler(init_scale=2.0 ** 12, growth_interval=3)
    tr, data = make_trainer(steps, "f16-mixed", None, loss_scaler=scaler)
    rows = []
    for i, b in enumerate(data):
        if i == force_at:
            scaler.scale = forced_scale  # an overflow forced: a scale far beyond f16's range
        before = state_of(tr) if i > 0 else None
        opt_steps = tr.engine.optimizer_steps
        m = tr.step(b)
        after = state_of(tr)
        unchanged = before is not None and all(torch.equal(before[k], after[k]) for k in after)
        rows.append(dict(loss=m["loss"], skipped=m["skipped"], scale=m["loss_scale"], norm=m["grad_norm"],
                         unchanged=unchanged, counted=tr.engine.optimizer_steps - opt_steps))
    return rows, scaler.scale


def test_f16_overflow_skips_on_every_rank_and_backs_off():
    force_at, forced = 7, 2.0 ** 18  # beyond 65504 · tokens: the seed's gradients overflow f16
    got = weft.launch(run_f16_overflow, 20, force_at, forced, nproc=4)
    rows, final = got[0]
    for r in got:  # every rank skips the same steps
        assert [x["skipped"] for x in r[0]] == [x["skipped"] for x in rows]
        for x in r[0]:
            if x["skipped"]:  # parameters, masters and moments bit-identical; no optimizer step
                assert x["unchanged"] and x["counted"] == 0 and x["norm"] == math.inf
            else:
                assert x["counted"] == 1 and (x is r[0][0] or not x["unchanged"])
    assert rows[force_at]["skipped"] and rows[force_at]["scale"] == forced
    # GradScaler's rule, replayed: back off by 2 on a skip, grow by 2 after 3 finite steps.
    scale, tracker = 2.0 ** 12, 0
    for x in rows:
        if x is rows[force_at]:
            scale, tracker = forced, tracker
        assert x["scale"] == scale
        if x["skipped"]:
            scale, tracker = scale * 0.5, 0
        else:
            tracker += 1
            if tracker == 3:
                scale, tracker = scale * 2, 0
    assert final == scale
    skipped = [i for i, x in enumerate(rows) if x["skipped"]]
    print(f"f16 skipped steps {skipped}, scales {[x['scale'] for x in rows]}")
    assert not rows[-1]["skipped"] and not rows[-2]["skipped"]  # training proceeds
    assert all(math.isfinite(x["loss"]) for x in rows)
    assert rows[-1]["loss"] < 0.75 * rows[0]["loss"]


def run_f16_vs_f32(steps):
    out = {}
    # init 2**10: no overflow in these 20 steps (the default 2**16 overflows the RMSNorm backward's
    # per-row sums in f16 at step 1: that run is checked for its first scale only)
    for name, prec, kw in (("f16", "f16-mixed", dict(loss_scaler=weft.optim.LossScaler(init_scale=2.0 ** 10))),
                           ("f32", "f32", {}), ("default", "f16-mixed", {})):
        tr, data = make_trainer(steps, prec, **kw)
        ms = [tr.step(b) for b in (data if name != "default" else data[:1])]
        out[name] = [m["loss"] for m in ms]
        out[name + "_meta"] = [(m["skipped"], m.get("loss_scale")) for m in ms]
        if name == "f16":
            out["dtypes"] = dtypes_of(tr)
    return out


def test_f16_mixed_tracks_f32():
    got = weft.launch(run_f16_vs_f32, 20, nproc=4)[0]
    assert not any(s for s, _ in got["f16_meta"])
    assert {sc for _, sc in got["f16_meta"]} == {2.0 ** 10}
    assert got["default_meta"][0][1] == 2.0 ** 16  # GradScaler's initial scale
    d = got["dtypes"]
    assert d["param"] == {"torch.float16"} and d["grad_buffers"] == {"torch.float32"}
    assert d["master"] == d["moment"] == {"torch.float32"}
    rel = max_rel(got["f16"], got["f32"])
    print(f"f16-mixed vs f32: {rel:.2e}; loss {got['f16'][0]:.4f} -> {got['f16'][-1]:.4f}")
    assert 1e-6 < rel < F16_RTOL
    assert got["f16"][-1] < 0.6 * got["f16"][0]


def test_options_checked():
    with pytest.raises(ValueError, match="init_scale"):
        weft.optim.LossScaler(init_scale=0)
    with pytest.raises(ValueError, match="backoff_factor"):
        weft.optim.LossScaler(backoff_factor=1.5)
    s = weft.optim.LossScaler(init_scale=8.0, growth_interval=2)
    s.update(False)
    s.update(False)
    assert s.scale == 16.0
    s.update(True)
    assert s.scale == 8.0 and s.growth_tracker == 0


def make_bad(kw):
    torch.manual_seed(11)
    model = TinyLlama().float()
    weft.Trainer(model, batches(1)[0], cluster=CLUSTER, **kw)


@pytest.mark.parametrize("kw,match", [(dict(precision="f32", grad_reduce_dtype="bf16"), "grad_reduce_dtype"),
                                      (dict(precision="bf16-mixed", grad_reduce_dtype="f16"), "grad_reduce_dtype"),
                                      (dict(precision="f16-mixed", loss_scaler=2.0), "LossScaler")])
def test_trainer_options_checked(kw, match):
    with pytest.raises(RuntimeError, match=match):
        weft.launch(make_bad, kw, nproc=1)
