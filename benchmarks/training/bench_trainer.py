"""weft.Trainer against torch DDP on the char-level GPT of examples/train_char_lm.py.

In the same launched processes (4 gloo processes on the CPU by default), the same module (same
initial weights) is trained four ways, alternating step by step so that each sees the same load
on the machine:

* torch DDP: ``DistributedDataParallel`` over the processes, each process a quarter of the global
  batch, ``torch.optim.AdamW`` with the same parameter groups, clipping at the same global norm;
* weft.Trainer on the data-parallel plan (``weft.data_parallel_plan``, a quarter of the batch per
  process, one micro-batch; its gradient all-reduces in 25 MB buckets, issued in the backward), and
  the same plan without buckets (``grad_bucket_bytes = 0``: one all-reduce per gradient, each where
  the update needs it);
* weft.Trainer on the tensor x pipeline plan (``weft.megatron_plan`` t=2, p=2, d=1).

Every step gets the same global batch. Figures: the median step time of the timed steps after the
warm-up, tokens/s (global tokens per step / median step), the ratio weft / DDP (throughput) in the
same run, the loss of the last step of each, and the largest difference of a parameter tensor
from DDP's after the last step (relative to the tensor's largest entry): all three train the same
model on the same data with the same optimizer, so they agree up to rounding: in f32, about 1e-4
of a tensor's largest entry after the first step, a few 1e-3 after 40 (Adam's normalised update
does not damp the f32 differences of the summation orders; the losses agree to 4 digits);
``--precision f64`` shows the three agreeing to about 1e-13 after 5 steps.

    PYTHONPATH=python:build/<dir>/python python3 benchmarks/training/bench_trainer.py [--steps 20]
        [--warmup 3] [--nproc 4] [--batch 64] [--seq 64] [--save benchmarks/data/bench_trainer.txt] [--json]

With --json, one JSON object per figure: {"bench","case","metric","value","unit","baseline"}.
"""
import argparse
import copy
import datetime
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import weft

ROOT = Path(__file__).resolve().parents[2]


def example_module():
    spec = importlib.util.spec_from_file_location("train_char_lm", ROOT / "examples" / "train_char_lm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run(args):
    """One process. Rank 0 returns {"times": {case: [step seconds]}, "losses": {case: last loss}, ...}: a
    step is timed from a barrier before it to a barrier after it, so it is the slowest rank's."""
    ex = example_module()
    rank, world = dist.get_rank(), dist.get_world_size()
    data = ex.Chars()
    margs = argparse.Namespace(seed=0, hidden=args.hidden, heads=args.heads, layers=args.layers, seq=args.seq)
    model = ex.make_model(margs, data.vocab)
    if args.precision == "f64":
        model = model.double()
    example = data.batch(0, args.batch, args.seq)
    cluster = weft.Cluster.preset("p3.8xlarge")
    opt = weft.optim.AdamW(lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, no_decay=("bias", "ln", "norm"))
    step_graph = weft.Trainer.training_graph(model, example, opt, args.precision)  # the graph the Trainer runs
    dp = weft.data_parallel_plan(step_graph, cluster, [args.batch // world] * world)
    unbucketed = weft.Plan.from_json(dp.to_json())
    unbucketed.grad_bucket_bytes = 0  # one all-reduce per gradient, in the update phase (before buckets)
    plans = {
        "weft data parallel": dp,
        "weft dp, no buckets": unbucketed,
        "weft tp2 x pp2": weft.megatron_plan(step_graph, cluster, t=2, p=2, d=1),
    }
    trainers = {case: weft.Trainer(copy.deepcopy(model), example, plan=plan, cluster=cluster, optimizer=opt,
                                   grad_clip=1.0, precision=args.precision, progress=False)
                for case, plan in plans.items()}

    ddp_model = torch.nn.parallel.DistributedDataParallel(copy.deepcopy(model))
    ddp_opt = torch.optim.AdamW(opt.torch_param_groups(ddp_model.module.named_parameters()), lr=args.lr,
                                betas=(0.9, 0.95), eps=1e-8)
    share = args.batch // world

    def ddp_step(batch):
        x, y = (t[rank * share:(rank + 1) * share] for t in batch)
        ddp_opt.zero_grad(set_to_none=True)
        loss = ddp_model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp_model.parameters(), 1.0)
        ddp_opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)  # the global batch's loss, as weft reports it
        return float(mean) / world

    cases = ["torch DDP"] + list(trainers)
    times = {c: [] for c in cases}
    losses = {c: float("nan") for c in cases}
    for i in range(args.warmup + args.steps):
        batch = data.batch(i, args.batch, args.seq)
        order = cases[i % len(cases):] + cases[:i % len(cases)]  # rotate who goes first
        for c in order:
            dist.barrier()
            t0 = time.perf_counter()
            losses[c] = ddp_step(batch) if c == "torch DDP" else trainers[c].step(batch)["loss"]
            dist.barrier()
            if i >= args.warmup:
                times[c].append(time.perf_counter() - t0)
    instrs = {c: len(t.engine.instrs) for c, t in trainers.items()}
    ref = ddp_model.module.state_dict()
    diff = {}
    for c, t in trainers.items():  # full_state_dict is a collective: every rank calls it
        full = t.full_state_dict()
        diff[c] = max((float((full[k].double() - v.double()).abs().max() / v.double().abs().max().clamp_min(1e-30)), k)
                      for k, v in ref.items() if v.is_floating_point())
    return {"times": times, "losses": losses, "instrs": instrs, "diff": diff,
            "params": sum(p.numel() for p in model.parameters())} if rank == 0 else None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20, help="timed steps of each")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--precision", choices=["f32", "f64"], default="f32",
                    help="f64: the module in float64 (a check that the three train alike to f64 rounding)")
    ap.add_argument("--save", default=None, help="also write the figures (with a header) to this file")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.batch % args.nproc:
        ap.error("--batch must be a multiple of --nproc")
    t0 = time.perf_counter()
    load = os.getloadavg()[0]
    res = weft.launch(run, args, nproc=args.nproc)[0]
    wall = time.perf_counter() - t0
    tokens = args.batch * args.seq
    model = f"char GPT {res['params'] / 1e3:.0f}k, batch {args.batch}x{args.seq}, {args.nproc} gloo procs, {args.precision}"
    lines = []

    def emit(case, metric, value, unit, baseline=None):
        row = {"bench": "trainer", "case": case, "metric": metric, "value": value, "unit": unit, "baseline": baseline}
        if args.json:
            line = json.dumps(row)
        else:
            base = f"  (baseline {baseline})" if baseline is not None else ""
            line = f"trainer  {case:22s} {metric:36s} {value:12.4g} {unit}{base}"
        print(line, flush=True)
        lines.append(line)

    med = {c: statistics.median(ts) for c, ts in res["times"].items()}
    ddp = med["torch DDP"]
    for c in med:
        emit(c, "step (median)", med[c], "s")
        emit(c, "tokens/s", tokens / med[c], "tokens/s")
        if c != "torch DDP":
            emit(c, "throughput / torch DDP", ddp / med[c], "x", 1.0)
            emit(c, "runtime instructions per step", res["instrs"][c], "")
        emit(c, f"loss after {args.warmup + args.steps} steps", res["losses"][c], "")
        if c != "torch DDP":
            emit(c, "params rel. diff vs torch DDP", res["diff"][c][0], f"({res['diff'][c][1]})")
    if args.save:
        head = [f"# benchmarks/training/bench_trainer.py, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
                f"# {model}; {args.warmup} warm-up + {args.steps} timed steps of each, alternating; medians",
                f"# machine: {platform.machine()}, {os.cpu_count()} CPU cores (shared), torch {torch.__version__}, "
                f"1 thread per process; load average {load:.1f} before the run; {wall:.0f} s in all"]
        Path(args.save).write_text("\n".join(head + lines) + "\n")
        print(f"saved to {args.save}")


if __name__ == "__main__":
    sys.exit(main())
