"""Planner benchmark: plan time, predicted step time and MFU for the Rhino tables (GPT, MoE,
Wide-ResNet on V100 M8 nodes), side by side with the best Megatron-style layout under the same
cost model, and GPT-3 175B on 128 DGX-A100 nodes (whole plan time; goal < 60 s on 2 cores).

    PYTHONPATH=python:build/<dir>/python python3 benchmarks/plan/bench_plan.py [--json] [--quick]
        [--only gpt|moe|wr|gpt3]

With --json, one JSON object per figure: {"bench","case","metric","value","unit","baseline"}.
"""
import argparse
import json
import sys
import time

import weft

# (preset, GPUs) — the GPU counts of the Rhino / Alpa weak-scaling tables.
GPT = [("GPT-Medium", 1), ("GPT-Large", 2), ("GPT-XL", 4), ("GPT-2.7B", 8), ("GPT-6.7B", 16)]
MOE = [("MoE-8E-380M", 1), ("MoE-8E-760M", 2), ("MoE-16E-1.3B", 4), ("MoE-16E-2.4B", 8), ("MoE-32E-10B", 16)]
WR = [("WR-1.3B", 2), ("WR-2.6B", 4), ("WR-6B", 8), ("WR-12B", 16)]


def m8_cluster(gpus):
    if gpus >= 8:
        return weft.Cluster.preset("M8", nodes=gpus // 8)
    c = json.loads(weft.Cluster.preset("M8", nodes=1).to_json())
    c["nodes"][0]["num_devices"] = gpus
    return weft.Cluster.from_json(json.dumps(c))


def emit(args, rows, bench, case, metric, value, unit, baseline=None):
    rows.append({"bench": bench, "case": case, "metric": metric, "value": value, "unit": unit, "baseline": baseline})
    if args.json:
        print(json.dumps(rows[-1]), flush=True)


def run_case(args, rows, name, gpus, batch, dtype):
    cluster = m8_cluster(gpus)
    graph = weft.models.build(name, batch=batch, dtype=dtype).train_step(optimizer="adam")
    opts = dict(num_blocks=args.blocks, num_microbatches=args.microbatches, max_alternatives=0,
                time_limit=args.time_limit)
    t0 = time.perf_counter()
    try:
        p = weft.plan(graph, cluster, **opts)
    except ValueError as e:
        print(f"{name:14s} {gpus:3d} GPUs  FAILED: {str(e).splitlines()[0][:100]}", flush=True)
        return
    dt = time.perf_counter() - t0
    own = [a for a in p.alternatives if a.feasible and "(baseline)" not in a.strategy]
    base = [a for a in p.alternatives if a.feasible and "(baseline)" in a.strategy]
    own_t = min((a.step_time for a in own), default=float("nan"))
    base_t = min((a.step_time for a in base), default=float("nan"))
    base_s = min(base, key=lambda a: a.step_time).strategy if base else "-"
    if not args.json:
        print(f"{name:14s} {gpus:3d} GPUs  plan {dt:6.1f} s  chosen {p.strategy[:26]:26s} step {p.step_time:8.4f} s  "
              f"MFU {100 * p.mfu:5.1f}%  own-search best {own_t:8.4f} s  Megatron best {base_t:8.4f} s "
              f"({base_s.replace(' (baseline)', '')})  own/Megatron {own_t / base_t:5.3f}", flush=True)
    emit(args, rows, "plan", name, "plan_time", dt, "s")
    emit(args, rows, "plan", name, "step_time", p.step_time, "s", base_t)
    emit(args, rows, "plan", name, "own_search_step_time", own_t, "s", base_t)
    emit(args, rows, "plan", name, "mfu", p.mfu, "fraction")


def run_gpt3(args, rows):
    cluster = weft.Cluster.preset("DGX-A100", nodes=128)
    t0 = time.perf_counter()
    graph = weft.models.build("GPT-175B", batch=args.gpt3_batch, dtype="f16").train_step(optimizer="adam")
    t_graph = time.perf_counter() - t0
    # The fast path: one block per layer (identical layers are searched once), whole-node
    # power-of-two submeshes, at most 16 stages and 8 replicas, the 12 best DP candidates simulated.
    p = weft.plan(graph, cluster, num_blocks=96, num_microbatches=args.gpt3_microbatches, whole_nodes_only=True,
                  power_of_two_nodes=True, max_stages=16, max_data_parallel=8, max_simulated=12,
                  compare_megatron=False, time_limit=600)
    dt = time.perf_counter() - t0
    if not args.json:
        print(f"GPT-175B on 128 DGX-A100 (1024 GPUs): graph {t_graph:.1f} s, whole plan {dt:.1f} s (goal < 60 s); "
              f"{p.strategy}, {p.num_stages} stages x dp {p.data_parallel}, M={p.num_microbatches}, "
              f"step {p.step_time:.3f} s, MFU {100 * p.mfu:.1f}%, peak {p.peak_memory / 1e9:.1f} GB", flush=True)
    emit(args, rows, "plan", "GPT-175B@1024xA100", "plan_time", dt, "s", 60.0)
    emit(args, rows, "plan", "GPT-175B@1024xA100", "step_time", p.step_time, "s")
    emit(args, rows, "plan", "GPT-175B@1024xA100", "mfu", p.mfu, "fraction")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="the two smallest cases of each table")
    ap.add_argument("--only", choices=["gpt", "moe", "wr", "gpt3"], default=None)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=900)
    ap.add_argument("--gpt3-batch", type=int, default=1536)
    ap.add_argument("--gpt3-microbatches", type=int, default=64)
    args = ap.parse_args()
    rows = []
    tables = {"gpt": (GPT, "f16"), "moe": (MOE, "f16"), "wr": (WR, "f16")}
    for key, (table, dtype) in tables.items():
        if args.only not in (None, key):
            continue
        for name, gpus in (table[:2] if args.quick else table):
            run_case(args, rows, name, gpus, args.batch, dtype)
    if args.only in (None, "gpt3"):
        run_gpt3(args, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
