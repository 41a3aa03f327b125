"""The torch runtime against plain PyTorch eager on the same GPT, one device.

weft's runtime runs a one-rank program of the GPT's training step (weft's own backward and Adam,
op by op, torch kernels) in this process; the baseline is the same model written as a plain
PyTorch module, trained with autograd and torch.optim.Adam (foreach). Both start from the same
parameters (weft's counter-based initial values) and see the same tokens, so the benchmark also
checks that the two train identically (largest relative parameter difference after the steps).

Figures: step time of each (median of the timed steps after a warm-up), throughput ratio
weft / PyTorch against two baselines: the module op for op as weft's graph (softmax attention,
foreach Adam) and torch's fastest eager form (scaled_dot_product_attention, fused Adam; issue 36's
goal on a GPU: >= 0.95), and the per-instruction overhead of the runtime.

    PYTHONPATH=python:build/<dir>/python python3 benchmarks/runtime/bench_runtime.py [--device cuda]
        [--preset small|medium|1.3B] [--dtype f32|bf16] [--steps 5] [--json]

Default: --preset small on the CPU (a GPT-1.3B step needs a GPU: --device cuda --preset 1.3B).
With --json, one JSON object per figure: {"bench","case","metric","value","unit","baseline"}.
"""
import argparse
import datetime
import json
import os
import statistics
import time

import torch
import torch.distributed as dist

import weft
from weft.runtime.comm import ProcessGroups
from weft.runtime.launch import free_port
from weft.runtime.rank import TORCH_DTYPES, RankRuntime
from weft.runtime.torch_models import train_plain_pytorch

PRESETS = {  # layers, hidden, heads, seq, vocab, batch
    "small": (4, 256, 8, 128, 4096, 8),
    "medium": (12, 768, 12, 512, 16384, 8),
    "1.3B": (24, 2048, 16, 1024, 51200, 8),
}


def emit(args, case, metric, value, unit, baseline=None):
    row = {"bench": "runtime", "case": case, "metric": metric, "value": value, "unit": unit, "baseline": baseline}
    if args.json:
        print(json.dumps(row), flush=True)
    else:
        base = f"  (baseline {baseline})" if baseline is not None else ""
        print(f"runtime  {case:28s} {metric:32s} {value:12.4g} {unit}{base}", flush=True)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_torch(args, step, device, dtype, layers, heads, fastest=False):
    times, losses = [], []

    def timed(s, fn):
        sync(device)
        t0 = time.perf_counter()
        loss = fn()
        sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss)

    final = train_plain_pytorch(step, layers, heads, args.steps, seed=args.seed, device=device, dtype=dtype,
                                around_step=timed, sdpa=fastest, fused=fastest)
    return times, losses, final


def run_weft(args, step, cluster, device, dtype_name):
    mesh = weft.DeviceMesh([1], [0])
    # One device: the layout is trivial; on a GPU the memory limit is that GPU's own memory (the
    # preset's 16 GB V100 refuses a GPT-1.3B step that a 80-141 GB GPU holds).
    limit = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None
    result = weft.spmd_search(step, cluster, mesh, memory_limit=limit)
    program = weft.lower_spmd(step, cluster, mesh, result)
    layout = weft._weft.ProgramLayout(program)
    rt = RankRuntime(layout, 0, device=device, dtype=dtype_name, seed=args.seed, groups=ProcessGroups([]))
    times = []
    for s in range(1, args.steps + 1):
        sync(device)
        t0 = time.perf_counter()
        rt.step(s)
        sync(device)
        times.append(time.perf_counter() - t0)
    losses = []  # the last step's loss (the runtime keeps the current step's buffers)
    piece = rt.piece(program.loss_id)
    losses.append(float(piece[1][0]) if piece else float("nan"))
    params = {n: rt.read(b).detach() for n, b in program.parameter_ids.items()}
    return times, losses, params, len(rt.instrs)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--preset", default=None, choices=sorted(PRESETS))
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16", "f64"])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    preset = args.preset or ("1.3B" if args.device == "cuda" else "small")
    layers, hidden, heads, seq, vocab, batch = PRESETS[preset]
    device = torch.device(args.device)
    dtype = TORCH_DTYPES[args.dtype]
    step = weft.models.gpt(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab, batch=batch).train_step()
    cluster = weft.Cluster.preset("p3.8xlarge")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
    case = f"GPT {preset} {args.dtype} {args.device}"
    tw, lw, pw, n_instr = run_weft(args, step, cluster, device, args.dtype)
    tt, lt, pt = run_torch(args, step, device, dtype, layers, heads)
    tf, lf, _ = run_torch(args, step, device, dtype, layers, heads, fastest=True)
    w, t, f = (statistics.median(x[1:] or x) for x in (tw, tt, tf))
    emit(args, case, "weft runtime step", w, "s")
    emit(args, case, "PyTorch eager step", t, "s")
    emit(args, case, "PyTorch eager SDPA+fused Adam step", f, "s")
    emit(args, case, "throughput weft / PyTorch", t / w, "x", 1.0)
    emit(args, case, "throughput weft / SDPA+fused", f / w, "x", 0.95)
    emit(args, case, "runtime instructions per step", n_instr, "")
    emit(args, case, "step time per instruction", 1e6 * w / n_instr, "us")
    worst = max(float((pw[n].double() - pt[n].double()).abs().max() / pt[n].double().abs().max()) for n in pt)
    emit(args, case, f"params rel. diff after {args.steps} steps", worst, "")
    emit(args, case, "last loss weft", lw[-1], "")
    emit(args, case, "last loss PyTorch", lt[-1], "")
    emit(args, case, "last loss SDPA+fused", lf[-1], "")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
