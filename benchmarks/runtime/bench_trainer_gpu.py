"""weft.Trainer against eager PyTorch on one GPU (or the CPU), on the user's path: a GPT written as a
plain torch module, trained in mixed precision by both, in the same process, alternating.

The model is bench_vs_torch's GPT (separate Q, K, V; causal softmax attention written out; GELU
MLP; untied head) at GPT-3 XL's size (``--config 1.3B``: 24 layers x 2048 hidden, 16 heads, seq
1024, vocab 50304, batch 8) or smaller. Three runs from the same initial weights see the same
batches, one optimizer step per batch, alternating step by step (the order rotated each step):

* ``weft``: ``weft.Trainer(model, precision="bf16-mixed", optimizer=weft.optim.AdamW)`` on the
  one-device plan (``megatron_plan(t=1, p=1, d=1)``): the graph in bf16, f32 master weights and
  moments;
* ``torch``: the same module under ``torch.autocast(bfloat16)`` with f32 parameters and
  ``torch.optim.AdamW(fused=True)``, the attention written out as in the module (the same math as
  weft's graph);
* ``torch-sdpa``: as ``torch`` with the attention through ``scaled_dot_product_attention(is_causal=True)``
  (torch's flash kernel): the fastest eager form a torch user writes, issue 36's baseline (goal:
  weft's throughput >= 0.95x of it).

Figures: median step seconds and tokens/s of each, the ratios weft / torch and weft / torch-sdpa,
weft's instructions per step and the step time per instruction, the losses of the last step, and
the peak memory of each (torch.cuda.max_memory_allocated, reset between runs). ``--profile N``:
cProfile of N more weft steps, the top functions by own time (where the per-instruction Python goes).

    PYTHONPATH=python:build/<dir>/python python3 benchmarks/runtime/bench_trainer_gpu.py
        [--config 1.3B|350M|small] [--device cuda|cpu] [--steps 6] [--warmup 2] [--profile 2]
"""
import argparse
import copy
import cProfile
import datetime
import io
import os
import pstats
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_vs_torch as bvt  # noqa: E402  (the GPT module and the batches)

import weft  # noqa: E402
from weft.runtime.launch import free_port  # noqa: E402

CONFIGS = {  # layers, hidden, heads, seq, vocab, batch
    "1.3B": dict(layers=24, hidden=2048, heads=16, seq=1024, vocab=50304, batch=8),
    "350M": dict(layers=24, hidden=1024, heads=16, seq=1024, vocab=50304, batch=8),
    "small": dict(layers=2, hidden=128, heads=4, seq=64, vocab=512, batch=4),
}


def sdpa_forward(self, x):
    """bench_vs_torch.Attention.forward with torch's fused causal attention."""
    b, s, _ = x.shape
    q, k, v = (f(x).view(b, s, -1, self.hd).transpose(1, 2) for f in (self.q, self.k, self.v))
    return self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, -1))


def one_device_cluster():
    """The H200 preset's node with one device (the plan's shape; the run is this process)."""
    text = weft.Cluster.preset("H200").to_json()
    n = weft.Cluster.preset("H200").num_devices
    return weft.Cluster.from_json(text.replace(f'"num_devices":{n}', '"num_devices":1'))


def torch_step(model, lr, dev):
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01,
                            fused=True)

    def step(batch):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(*batch)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="1.3B")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--profile", type=int, default=0, help="cProfile this many more weft steps")
    args = ap.parse_args()
    cfg = CONFIGS[args.config]
    dev = torch.device(args.device)
    if dev.type == "cuda":
        dev = torch.device("cuda", torch.cuda.current_device() if dev.index is None else dev.index)
        torch.cuda.set_device(dev)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=600))

    t0 = time.perf_counter()
    torch.manual_seed(0)
    model = bvt.GPT(cfg["layers"], cfg["hidden"], cfg["heads"], cfg["seq"], cfg["vocab"])
    n_params = sum(p.numel() for p in model.parameters())
    example = bvt.batch_of(0, cfg)
    opt = weft.optim.AdamW(lr=args.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01)
    graph = weft.Trainer.training_graph(model, example, opt, "bf16-mixed")
    cluster = one_device_cluster()
    plan = weft.megatron_plan(graph, cluster, t=1, p=1, d=1, allow_infeasible=True)
    tr = weft.Trainer(copy.deepcopy(model), example, plan=plan, cluster=cluster, optimizer=opt,
                      precision="bf16-mixed", progress=False, check_batch=False, device=dev)
    setup = time.perf_counter() - t0
    plain = copy.deepcopy(model).to(dev)
    fused = copy.deepcopy(model).to(dev)
    for blk in fused.blocks:
        blk.attn.forward = sdpa_forward.__get__(blk.attn)
    del model
    runs = {"weft": lambda b: tr.step(b)["loss"], "torch": torch_step(plain, args.lr, dev),
            "torch-sdpa": torch_step(fused, args.lr, dev)}
    names = list(runs)
    times = {k: [] for k in names}
    losses = {k: None for k in names}
    peaks = {k: 0 for k in names}
    for i in range(args.warmup + args.steps):
        x, y = bvt.batch_of(i, cfg)
        batch = (x.to(dev), y.to(dev))
        for key in names[i % len(names):] + names[:i % len(names)]:
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            sync(dev)
            t = time.perf_counter()
            loss = runs[key](batch if key != "weft" else (x, y))
            sync(dev)
            if i >= args.warmup:
                times[key].append(time.perf_counter() - t)
            losses[key] = float(loss)
            if dev.type == "cuda":
                peaks[key] = max(peaks[key], torch.cuda.max_memory_allocated(dev))
    med = {k: statistics.median(v) for k, v in times.items()}
    tokens = cfg["batch"] * cfg["seq"]
    case = f"GPT {args.config} ({n_params / 1e9:.2f} B params) bf16 {args.device}"
    if dev.type == "cuda":
        case += f" {torch.cuda.get_device_name(dev)}"
    print(f"# {case}; {args.warmup} warm-up + {args.steps} timed steps each, alternating; medians; "
          f"weft set-up (import, plan, values) {setup:.1f} s; torch {torch.__version__}")
    fmt = "trainer-gpu  {:12s} {:34s} {:12.4g} {}"
    for k in names:
        print(fmt.format(k, "step (median)", med[k], "s"))
        print(fmt.format(k, "tokens/s", tokens / med[k], "tokens/s"))
        print(fmt.format(k, "loss at the last step", losses[k], ""))
        if dev.type == "cuda":
            print(fmt.format(k, "peak memory", peaks[k] / 2**30, "GiB"))
    n_instr = len(tr.engine.instrs)
    print(fmt.format("weft", "throughput / torch (same math)", med["torch"] / med["weft"], "x  (baseline 1.0)"))
    print(fmt.format("weft", "throughput / torch-sdpa", med["torch-sdpa"] / med["weft"], "x  (baseline 0.95)"))
    print(fmt.format("weft", "instructions per step", n_instr, ""))
    print(fmt.format("weft", "step time per instruction", 1e6 * med["weft"] / n_instr, "us"))
    if args.profile:
        prof = cProfile.Profile()
        for i in range(args.profile):
            prof.enable()
            tr.step(bvt.batch_of(10_000 + i, cfg))
            sync(dev)
            prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(22)
        print(f"# cProfile of {args.profile} weft steps, by own time")
        print("\n".join(line for line in out.getvalue().splitlines() if line.strip())[:6000])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
