"""The planner's defaults on big clusters (issue 18): plan time with default options and the step
time against a wider / hand-tuned search of the same model and cluster, in the same run.

    PYTHONPATH=python python3 benchmarks/plan/bench_defaults.py [--json] [--quick] [--only NAME]
        [--threads N]

Cases (each: default options, then the reference search):
  gpt3     GPT-3 175B, batch 1536, 128 DGX-A100 nodes (1024 GPUs); reference: the nine hand-set
           options of benchmarks/plan/bench_plan.py (num_blocks=96, whole nodes, power-of-two
           nodes, <= 16 stages, <= 8 replicas, 64 micro-batches, 12 simulated).
  gpt39b   GPT-39B, batch 1024, 8 M8 nodes (64 V100); reference: the best over every power-of-two
           micro-batch count the batch allows (one planning run per count).
  moe      GShard MoE-32E-10B, batch 1024, 32 M8 nodes (256 V100); reference: every micro-batch count.
  wresnet  Wide-ResNet WR-6B, batch 1024, 32 M8 nodes (256 V100); reference: every micro-batch count.
Goals: each default < 60 s on 2 cores; gpt3 within 1 % of the reference, gpt39b within 2 %.
With --json, one JSON object per figure: {"bench","case","metric","value","unit","baseline"}.
"""
import argparse
import json
import sys
import time

import weft


def emit(args, bench_case, metric, value, unit, baseline=None):
    row = {"bench": "plan_defaults", "case": bench_case, "metric": metric, "value": value, "unit": unit,
           "baseline": baseline}
    if args.json:
        print(json.dumps(row), flush=True)
    return row


def timed_plan(graph, cluster, **opts):
    t0 = time.perf_counter()
    try:
        p = weft.plan(graph, cluster, **opts)
    except ValueError as e:
        return None, time.perf_counter() - t0, str(e).splitlines()[0][:160]
    return p, time.perf_counter() - t0, ""


def describe(p):
    return (f"{p.strategy}, {p.num_stages} stage(s) x dp {p.data_parallel}, M={p.num_microbatches}, "
            f"step {p.step_time:.4f} s")


def sweep_microbatches(graph, cluster, batch, base_opts, cap):
    """The reference: one planning run per power-of-two micro-batch count up to `cap`."""
    best, total = None, 0.0
    m = 1
    while m <= min(batch, cap):
        if batch % m == 0:
            p, dt, err = timed_plan(graph, cluster, num_microbatches=m, **base_opts)
            total += dt
            if p is not None and (best is None or p.step_time < best.step_time):
                best = p
        m *= 2
    return best, total


def run(args, name, graph, cluster, reference, goal_ratio):
    opts = {} if args.threads is None else {"threads": args.threads}
    p, dt, err = timed_plan(graph, cluster, **opts)
    if p is None:
        print(f"{name}: default FAILED after {dt:.1f} s: {err}", flush=True)
        emit(args, name, "default_plan_time", dt, "s", 60.0)
        return
    ref, ref_dt = reference(opts)
    ratio = p.step_time / ref.step_time if ref is not None else float("nan")
    if not args.json:
        print(f"{name}: default {dt:6.1f} s (goal < 60 s): {describe(p)}", flush=True)
        print(f"{'':{len(name)}}  search space: {p.search_space}", flush=True)
        if ref is not None:
            print(f"{'':{len(name)}}  reference {ref_dt:6.1f} s: {describe(ref)}; default / reference "
                  f"{ratio:.4f} (goal <= {goal_ratio})", flush=True)
    emit(args, name, "default_plan_time", dt, "s", 60.0)
    emit(args, name, "default_step_time", p.step_time, "s", ref.step_time if ref else None)
    emit(args, name, "step_ratio_to_reference", ratio, "ratio", goal_ratio)
    emit(args, name, "reference_plan_time", ref_dt, "s")


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="only the GPT-39B case, reference over M <= 64")
    ap.add_argument("--only", choices=["gpt3", "gpt39b", "moe", "wresnet"], default=None)
    ap.add_argument("--threads", type=int, default=None, help="planner threads (default: all cores)")
    args = ap.parse_args()

    def want(n):
        return (args.only in (None, n)) and (not args.quick or n == "gpt39b")

    if want("gpt3"):
        g = weft.models.build("GPT-175B", batch=1536, dtype="f16").train_step(optimizer="adam")
        c = weft.Cluster.preset("DGX-A100", nodes=128)

        def ref(opts):
            p, dt, err = timed_plan(g, c, num_blocks=96, num_microbatches=64, whole_nodes_only=True,
                                    power_of_two_nodes=True, max_stages=16, max_data_parallel=8,
                                    max_simulated=12, compare_megatron=False, time_limit=900, **opts)
            if p is None:
                print(f"gpt3 reference failed: {err}", flush=True)
            return p, dt
        run(args, "gpt3", g, c, ref, 1.01)
    if want("gpt39b"):
        g = weft.models.build("GPT-39B", batch=1024, dtype="f16").train_step(optimizer="adam")
        c = weft.Cluster.preset("M8", nodes=8)
        cap = 64 if args.quick else 1024
        run(args, "gpt39b", g, c, lambda opts: sweep_microbatches(g, c, 1024, opts, cap), 1.02)
    if want("moe"):
        g = weft.models.build("MoE-32E-10B", batch=1024, dtype="f16").train_step(optimizer="adam")
        c = weft.Cluster.preset("M8", nodes=32)
        run(args, "moe", g, c, lambda opts: sweep_microbatches(g, c, 1024, opts, 1024), 1.01)
    if want("wresnet"):
        g = weft.models.build("WR-6B", batch=1024, dtype="f16").train_step(optimizer="adam")
        c = weft.Cluster.preset("M8", nodes=32)
        run(args, "wresnet", g, c, lambda opts: sweep_microbatches(g, c, 1024, opts, 1024), 1.01)
    return 0


if __name__ == "__main__":
    sys.exit(main())
