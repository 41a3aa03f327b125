"""Measure matmul efficiency against GEMM shape on one GPU (the data behind issue 17's curve).

Run on a machine with a CUDA GPU and torch:
    python3 benchmarks/cost/gpu_gemm_sweep.py --out sweep.json
Writes one row per (m, k, n, batch, dtype): seconds (median of samples, CUDA events) and
FLOP/s; plus memory-bound ops (bytes/s) and the launch overhead of a tiny op; plus one GPT
block's forward+backward time (unfused attention, as weft's IR models it) at a few sizes, so
the cost model's prediction can be set next to a measurement. Nothing here is imported by weft.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def timed(fn, min_ms=20.0, samples=7):
    fn()
    torch.cuda.synchronize()
    # inner repeats so one sample lasts >= min_ms / samples
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    torch.cuda.synchronize()
    one = max(s.elapsed_time(e), 1e-3)
    inner = max(1, int(min_ms / samples / one))
    out = []
    for _ in range(samples):
        s.record()
        for _ in range(inner):
            fn()
        e.record()
        torch.cuda.synchronize()
        out.append(s.elapsed_time(e) / 1e3 / inner)
    return statistics.median(out)


def gemm_shapes():
    sizes = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
    shapes = set()
    for s in sizes:
        shapes.add((s, s, s, 1))
    for x in [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]:
        shapes.add((x, 8192, 8192, 1))   # few rows (small micro-batch x sequence)
        shapes.add((8192, x, 8192, 1))   # short contraction
        shapes.add((8192, 8192, x, 1))   # narrow output (tensor-parallel shard)
    # transformer shapes: tokens x hidden x 4 hidden, sharded by t in {1, 2, 4, 8}
    for h in [1024, 2048, 4096, 8192, 12288]:
        for t in [1, 8]:
            for tok in [2048, 8192]:
                shapes.add((tok, h, 4 * h // t, 1))
                shapes.add((tok, 4 * h // t, h, 1))
    # attention score / context matmuls: batch = micro-batch x heads
    for bh, sq, d in [(16, 2048, 128), (96, 2048, 128), (32, 1024, 64), (128, 2048, 64)]:
        shapes.add((sq, d, sq, bh))
        shapes.add((sq, sq, d, bh))
    return sorted(shapes)


def sweep_gemm(dtypes):
    rows = []
    for dt_name in dtypes:
        dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dt_name]
        for m, k, n, b in gemm_shapes():
            if b * (m * k + k * n + m * n) * 4 > 8 << 30:
                continue
            a = torch.randn(b, m, k, device="cuda", dtype=dt) if b > 1 else torch.randn(m, k, device="cuda", dtype=dt)
            w = torch.randn(b, k, n, device="cuda", dtype=dt) if b > 1 else torch.randn(k, n, device="cuda", dtype=dt)
            o = torch.empty(*( (b, m, n) if b > 1 else (m, n)), device="cuda", dtype=dt)
            sec = timed(lambda: torch.matmul(a, w, out=o))
            fl = 2.0 * b * m * k * n
            rows.append(dict(m=m, k=k, n=n, batch=b, dtype=dt_name, seconds=sec, flops=fl, flops_per_s=fl / sec))
            del a, w, o
    return rows


def sweep_memory():
    rows = []
    for numel in [1 << 20, 1 << 24, 1 << 27]:
        x = torch.randn(numel, device="cuda")
        y = torch.randn(numel, device="cuda")
        o = torch.empty_like(x)
        for name, fn, nbytes in [
            ("add", lambda: torch.add(x, y, out=o), 3 * numel * 4),
            ("gelu", lambda: torch.ops.aten.gelu.out(x, out=o), 2 * numel * 4),
            ("copy", lambda: o.copy_(x), 2 * numel * 4),
        ]:
            sec = timed(fn)
            rows.append(dict(op=name, numel=numel, bytes=nbytes, seconds=sec, bytes_per_s=nbytes / sec))
        del x, y, o
    return rows


def launch_overhead():
    x = torch.randn(1024, device="cuda")
    o = torch.empty_like(x)
    return timed(lambda: torch.add(x, x, out=o))


def gpt_block(h, heads, s, b, dt):
    """Forward + backward of one pre-LN GPT block, attention unfused (matmul, softmax, matmul)."""
    torch.manual_seed(0)
    p = {
        "ln1": torch.nn.LayerNorm(h).to("cuda", dt),
        "qkv": torch.nn.Linear(h, 3 * h).to("cuda", dt),
        "proj": torch.nn.Linear(h, h).to("cuda", dt),
        "ln2": torch.nn.LayerNorm(h).to("cuda", dt),
        "up": torch.nn.Linear(h, 4 * h).to("cuda", dt),
        "down": torch.nn.Linear(4 * h, h).to("cuda", dt),
    }
    x = torch.randn(b, s, h, device="cuda", dtype=dt, requires_grad=True)
    d = h // heads

    def fwd():
        y = p["ln1"](x)
        q, k, v = p["qkv"](y).view(b, s, 3, heads, d).permute(2, 0, 3, 1, 4)
        a = torch.softmax((q @ k.transpose(-1, -2)) * d**-0.5, dim=-1)
        c = (a @ v).transpose(1, 2).reshape(b, s, h)
        z = x + p["proj"](c)
        return z + p["down"](torch.nn.functional.gelu(p["up"](p["ln2"](z))))

    def step():
        out = fwd()
        out.backward(torch.ones_like(out))

    fwd_s = timed(lambda: fwd(), samples=5)
    step_s = timed(step, samples=5)
    return dict(hidden=h, heads=heads, seq=s, batch=b, dtype=str(dt).replace("torch.", ""),
                forward_s=fwd_s, forward_backward_s=step_s)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtypes", default="bf16,f16,f32")
    a = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.time()
    res = dict(device=torch.cuda.get_device_name(), torch=torch.__version__)
    res["launch_overhead_s"] = launch_overhead()
    res["memory"] = sweep_memory()
    res["gemm"] = sweep_gemm(a.dtypes.split(","))
    blocks = []
    for h, heads, s, b in [(1024, 16, 1024, 8), (2048, 16, 2048, 4), (4096, 32, 2048, 1), (4096, 32, 2048, 4),
                           (12288 // 8, 96 // 8, 2048, 1)]:
        blocks.append(gpt_block(h, heads, s, b, torch.bfloat16))
        torch.cuda.empty_cache()
    res["gpt_blocks"] = blocks
    res["elapsed_s"] = time.time() - t0
    json.dump(res, open(a.out, "w"), indent=1)
    best = {}
    for r in res["gemm"]:
        best[r["dtype"]] = max(best.get(r["dtype"], 0), r["flops_per_s"])
    print(res["device"], "launch", res["launch_overhead_s"], "best", {k: v / 1e12 for k, v in best.items()},
          "elapsed", res["elapsed_s"])
    for bl in blocks:
        print(bl)


if __name__ == "__main__":
    main()
