"""Prediction = measurement on the machine at hand (issue 36): calibrate this host, plan five layouts
of a GPT on the local cluster the calibration describes, run each, and compare.

1. ``weft.calibrate(device="cpu", nproc=N, threads=1)`` times matmuls, memory-bound ops, per-op
   overheads and gloo collectives between N processes here; ``report.local_cluster()`` is this host
   as a cluster of N devices priced with what was measured (one device per process).
2. On that cluster, the training graph of the GPT (bench_vs_torch.py's plain torch module, at its
   ``--config``: medium, 4 layers x 256 hidden, seq 128, vocab 4096, batch 16, on 2 processes by
   default; small, 4 x 128, seq 64, vocab 2048, batch 8, on 4) is planned five ways, each by ``weft.megatron_plan`` (a layout evaluation priced
   with the planner's cost model): data parallel (d=N), ZeRO-3 (d=N, zero=3), tensor parallel
   (t=N), 1F1B pipelines (p=N) with 2 and 4 micro-batches; and ``weft.plan`` picks its own.
   Planned with ``overlap_grad_sync=False``: on a CPU the collectives run on the cores that compute.
3. The same N processes train the module with ``weft.Trainer`` on every plan (Adam, the same batches),
   alternating plan by plan each step, a barrier before and after each step (the slowest rank's
   time); the figure is the median over the timed steps.

Printed: per layout the predicted step (``Plan.step_time``), the measured median, their ratio
(target 0.75-1.33), the predicted and measured ranks; whether the orders agree (two layouts within
5 % of each other measured count as tied); and ``weft.plan``'s pick, its measured step against the
fastest measured layout (target within 5 %; the pick is timed too when it is none of the five).

    PYTHONPATH=python:build/<dir>/python python3 benchmarks/runtime/bench_prediction.py [--config medium|small] [--nproc N]
        [--steps 10] [--warmup 3] [--full-calibration] [--save FILE] [--json]

A calibration taken while the machine is busy is warned about (RuntimeWarning) and mis-prices every
layout: run this on an idle machine.
"""
import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

import weft

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_vs_torch as bvt  # noqa: E402  (the GPT of the side-by-side and its configs)

LAYOUTS = [("data parallel", dict(t=1, p=1, d=None, zero=0)), ("ZeRO-3", dict(t=1, p=1, d=None, zero=3)),
           ("tensor parallel", dict(t=None, p=1, d=1)), ("1F1B M=2", dict(t=1, p=None, d=1, num_microbatches=2)),
           ("1F1B M=4", dict(t=1, p=None, d=1, num_microbatches=4))]


def make_model(cfg):
    torch.manual_seed(0)
    return bvt.GPT(cfg["layers"], cfg["hidden"], cfg["heads"], cfg["seq"], cfg["vocab"])


def batch_of(step, cfg):
    return bvt.batch_of(step, cfg)


def optimizer():
    return weft.optim.Adam(lr=1e-3, betas=(0.9, 0.95), eps=1e-8)


def layout_kwargs(kw, n):
    """A LAYOUTS entry with its None (the axis spanning every process) set to n."""
    return {k: (n if v is None else v) for k, v in kw.items()}


# On a CPU host the collectives run on the cores that compute: nothing hides them.
PLAN_OPTIONS = dict(overlap_grad_sync=False)


def plans_for(cluster, cfg, n):
    """(name, plan) for the five layouts and weft.plan's pick, planned in this process."""
    step = weft.Trainer.training_graph(make_model(cfg), batch_of(0, cfg), optimizer())
    out = []
    for name, kw in LAYOUTS:
        try:
            out.append((name, weft.megatron_plan(step, cluster, **layout_kwargs(kw, n), **PLAN_OPTIONS)))
        except ValueError as e:
            print(f"prediction  {name}: not planned: {e}", flush=True)
    t0 = time.perf_counter()
    pick = weft.plan(step, cluster, **PLAN_OPTIONS)
    return out, pick, time.perf_counter() - t0


def run(plan_texts, cluster_text, cfg, steps, warmup):
    """One process: every plan trained alternately; rank 0 returns {name: [step seconds]}."""
    torch.set_num_threads(1)
    rank = dist.get_rank()
    model = make_model(cfg)
    example = batch_of(0, cfg)
    cluster = weft.Cluster.from_json(cluster_text)
    trainers = {name: weft.Trainer(copy.deepcopy(model), example, plan=weft.Plan.from_json(text), cluster=cluster,
                                   optimizer=optimizer(), progress=False)
                for name, text in plan_texts.items()}
    names = list(trainers)
    times = {n: [] for n in names}
    losses = {}
    for i in range(warmup + steps):
        batch = batch_of(i, cfg)
        order = names[i % len(names):] + names[:i % len(names)]  # rotate who goes first
        for n in order:
            dist.barrier()
            t0 = time.perf_counter()
            losses[n] = trainers[n].step(batch)["loss"]
            dist.barrier()
            if i >= warmup:
                times[n].append(time.perf_counter() - t0)
    return {"times": times, "losses": losses} if rank == 0 else None


def ranks(values):
    order = sorted(values, key=values.get)
    return {k: order.index(k) + 1 for k in values}


def orders_agree(pred, meas, tie=0.05):
    """The predicted order equals the measured one, where two layouts measured within ``tie`` of each
    other may come in either order."""
    names = list(pred)
    for a in names:
        for b in names:
            if pred[a] < pred[b] and meas[a] > meas[b] * (1 + tie):
                return False
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=sorted(bvt.CONFIGS), default="medium")
    ap.add_argument("--nproc", type=int, default=None,
                    help="processes (default: the config's, 2 for medium -- one per core of a 2-core host; more "
                         "processes than cores time the operating system's scheduler as much as weft)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps of each layout")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--full-calibration", action="store_true", help="the full calibration (default: quick)")
    ap.add_argument("--save", default=None, help="also write the figures (with a header) to this file")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    cfg = {k: v for k, v in bvt.CONFIGS[args.config].items() if k != "nproc"}
    n = args.nproc or bvt.CONFIGS[args.config]["nproc"]
    if cfg["batch"] % n:
        ap.error(f"--nproc must divide the batch {cfg['batch']}")
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        report = weft.calibrate(device="cpu", nproc=n, threads=1, quick=not args.full_calibration)
    busy = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    cluster = report.local_cluster()
    calib_s = time.perf_counter() - t0
    plans, pick, pick_s = plans_for(cluster, cfg, n)
    texts = {name: p.to_json() for name, p in plans}
    pick_name = next((name for name, p in plans if p.to_json() == pick.to_json()), None)
    if pick_name is None:
        zero = max((st.zero for st in pick.stages), default=0)
        pick_name = (f"weft.plan ({pick.strategy}, {len(pick.stages)} stage(s), M={pick.num_microbatches}, "
                     f"dp={pick.data_parallel}, ZeRO-{zero})")
        texts[pick_name] = pick.to_json()
    predicted = {name: p.step_time for name, p in plans}
    if pick_name not in predicted:
        predicted[pick_name] = pick.step_time
    res = weft.launch(run, texts, cluster.to_json(), cfg, args.steps, args.warmup, nproc=n)[0]
    measured = {name: statistics.median(ts) for name, ts in res["times"].items()}
    wall = time.perf_counter() - t0

    lines = []

    def emit(case, metric, value, unit, baseline=None):
        row = {"bench": "prediction", "case": case, "metric": metric, "value": value, "unit": unit,
               "baseline": baseline}
        line = json.dumps(row) if args.json else (
            f"prediction  {case:24s} {metric:34s} {value:12.4g} {unit}"
            + (f"  (target {baseline})" if baseline is not None else ""))
        print(line, flush=True)
        lines.append(line)

    five = [name for name, _ in plans]
    pr, mr = ranks({k: predicted[k] for k in five}), ranks({k: measured[k] for k in five})
    for name in predicted:
        emit(name, "predicted step", predicted[name], "s")
        emit(name, "measured step (median)", measured[name], "s")
        emit(name, "predicted / measured", predicted[name] / measured[name], "x", "0.75-1.33")
        if name in five:
            emit(name, "rank predicted / measured", pr[name] * 10 + mr[name], "(tens: predicted)")
        emit(name, "last loss", res["losses"][name], "")
    within = sum(0.75 <= predicted[k] / measured[k] <= 1.33 for k in five)
    emit("all", "layouts with ratio in 0.75-1.33", within, f"of {len(five)}", len(five))
    emit("all", "predicted order = measured (5 % ties)", int(orders_agree({k: predicted[k] for k in five},
                                                                        {k: measured[k] for k in five})),
         "(1 = yes)", 1)
    fastest = min(measured[k] for k in five)
    emit(pick_name, "weft.plan's pick / fastest measured", measured[pick_name] / fastest, "x", "<= 1.05")
    emit("all", "weft.plan seconds", pick_s, "s")
    if args.save:
        head = [f"# benchmarks/runtime/bench_prediction.py, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
                f"# bench_vs_torch's GPT, {args.config} {cfg}; {n} gloo processes, 1 thread each; {args.warmup} warm-up + {args.steps} timed "
                f"steps of each layout, alternating; medians",
                f"# calibration: {'full' if args.full_calibration else 'quick'}, {calib_s:.0f} s; "
                f"link α {report.link_fit.alpha:.3g} s, β {report.link_fit.beta:.3g} s/B; a small all-reduce between "
                f"compute {report.collective_latency_s:.3g} s; runtime per op {report.runtime_overhead_s:.3g} s; "
                f"kernel overhead {report.kernel_overhead_s:.3g} s",
                f"# machine: {platform.machine()}, {os.cpu_count()} CPU cores, torch {torch.__version__}; load average "
                f"{load:.1f} before the run; {wall:.0f} s in all" + (f"; WARNING: {busy[0]}" if busy else "")]
        Path(args.save).write_text("\n".join(head + lines) + "\n")
        print(f"saved to {args.save}")


if __name__ == "__main__":
    sys.exit(main())
