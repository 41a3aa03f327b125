"""Pipeline stage partition benchmark.

1. Rhino's stage ILP on U-Net (skip connections) and GPT training graphs, with and without bound
   tightening: ILP size, nodes fixed by the bounds, solve time, status, cut bytes, against the best
   cut of a linear (topological) order under the same balance tolerance.
2. Alpa's stage DP for GPT-3 175B blocks on 128 DGX-A100 nodes x 8 (1024 GPUs, 131 submesh
   shapes) with a synthetic cost callback (FLOPs / (devices · peak · efficiency(devices)),
   infeasible when parameters + Adam states do not fit): time, DP runs and callback calls, with
   the branch-and-bound search of the t_max bound against Alpa's scan of every candidate.

    PYTHONPATH=python:build/<dir>/python python3 benchmarks/pipeline/bench_partition.py [--json] [--quick]
"""
from __future__ import annotations

import argparse
import json
import math
import time

import weft
import weft.pipeline as wp


def best_linear_cut(d, S, eps):
    """Best contiguous split of the DAG's node order (a topological order), O(S·n²) DP."""
    n = d.num_nodes
    comp = list(d.compute)
    tot = sum(comp)
    hi, lo = (1 + eps) * tot / S * (1 + 1e-12), (1 - eps) * tot / S * (1 - 1e-12)
    reads = [[] for _ in range(n)]
    for vi, (p, cons, b) in enumerate(d.values):
        for c in cons:
            reads[c].append((vi, p, b))
    INF = float("inf")
    F = [[INF] * (n + 1) for _ in range(S + 1)]
    F[0][0] = 0
    prefix = [0.0]
    for c in comp:
        prefix.append(prefix[-1] + c)
    for b in range(n):
        seen, inb = set(), 0
        for e in range(b + 1, n + 1):
            for vi, p, by in reads[e - 1]:
                if p < b and vi not in seen:
                    seen.add(vi)
                    inb += by
            w = prefix[e] - prefix[b]
            if w > hi:
                break
            if w < lo:
                continue
            for k in range(1, S + 1):
                if F[k - 1][b] + inb < F[k][e]:
                    F[k][e] = F[k - 1][b] + inb
    return F[S][n]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per figure")
    ap.add_argument("--quick", action="store_true", help="fewer cases, shorter ILP time limit")
    ap.add_argument("--time-limit", type=float, default=20.0, help="per ILP solve (s)")
    args = ap.parse_args(argv)
    limit = 5.0 if args.quick else args.time_limit
    figures = []

    def fig(case, metric, value, unit, baseline=None):
        figures.append(dict(bench="pipeline.partition", case=case, metric=metric, value=value, unit=unit,
                            baseline=baseline))

    # ---- 1. ILP
    print("Stage ILP (Rhino §5): with vs without bound tightening "
          f"(time limit {limit:g} s per solve; 'linear' = best cut of the topological order)")
    print(f"{'model':<11} {'S':>2} {'eps':>5} {'nodes':>5} {'tight':>5} {'vars':>6} {'rows':>6} {'fixed':>5} "
          f"{'time s':>8} {'status':>9} {'gap':>6} {'cut MB':>9} {'linear MB':>9}")
    models = [("UNet-33M", 0.25), ("GPT-Medium", 0.1)]
    stages = [2, 4] if args.quick else [2, 4, 8]
    for name, eps in models:
        g = weft.models.build(name, batch=1).train_step()
        d = wp.dag_from_graph(g)
        for S in stages:
            lin = best_linear_cut(d, S, eps)
            for tight in (True, False):
                case = f"{name} S={S} eps={eps} {'tight' if tight else 'plain'}"
                try:
                    r = wp.partition_ilp(g, num_stages=S, epsilon=eps, bound_tightening=tight, time_limit_s=limit)
                except ValueError as e:  # the bounds prove infeasibility before any solve
                    print(f"{name:<11} {S:>2} {eps:>5} {d.num_nodes:>5} {str(tight):>5}  infeasible by bounds: {e}")
                    fig(case, "status", "infeasible", "")
                    continue
                cut = f"{r.cut_bytes / 1e6:9.3f}" if r.has_solution else f"{'-':>9}"
                linv = f"{lin / 1e6:9.3f}" if lin != float("inf") else f"{'none':>9}"
                print(f"{name:<11} {S:>2} {eps:>5} {d.num_nodes:>5} {str(tight):>5} {r.num_variables:>6} "
                      f"{r.num_constraints:>6} {r.num_fixed_nodes:>5} {r.wall_s:>8.3f} {r.status:>9} {r.gap:>6.3f} "
                      f"{cut} {linv}")
                fig(case, "ilp_time", r.wall_s, "s")
                fig(case, "ilp_variables", r.num_variables, "vars")
                fig(case, "ilp_rows", r.num_constraints, "rows")
                fig(case, "status", r.status, "")
                if r.has_solution:
                    fig(case, "cut_bytes", r.cut_bytes, "B", lin if lin != float("inf") else None)

    # ---- 2. DP
    c = weft.Cluster.preset("DGX-A100", 128)
    subs = wp.submesh_shapes(c)
    t0 = time.perf_counter()
    g = weft.models.build("GPT-175B", batch=1, dtype="f16").train_step()
    t_build = time.perf_counter() - t0
    B = 64
    print(f"\nStage DP (Alpa §5.2): GPT-175B training graph ({len(g.ops)} ops, built in {t_build:.2f} s) on "
          f"{c.num_devices} GPUs, {len(subs)} submesh shapes, B = {B} micro-batches, synthetic costs")
    print(f"{'blocks':>6} {'group s':>8} {'search':>7} {'DP s':>8} {'DP runs':>7} {'calls':>7} {'stages':>6} "
          f"{'latency':>9}  devices per stage")
    peak, mem = 312e12, 80e9
    Ls = [16, 32] if args.quick else [16, 32, 64, 96]
    for L in Ls:
        t0 = time.perf_counter()
        lg = wp.group_layers(g, L)
        t_group = time.perf_counter() - t0
        pre, pp = [0.0], [0]
        for b in lg.blocks:
            pre.append(pre[-1] + b.compute_flops)
            pp.append(pp[-1] + b.param_bytes)

        def cost(i, j, m):
            n = subs[m].num_devices
            flops, params = pre[j + 1] - pre[i], pp[j + 1] - pp[i]
            if params * 8 / n > mem:  # mixed-precision Adam: 2 + 2 + f32 master, m, v = 8x the f16 bytes
                return None
            return flops / (n * peak * 0.6 / (1 + 0.08 * math.log2(n)))

        for bnb in (True, False):
            if not bnb and L > 32:
                continue  # the scan takes minutes beyond 32 blocks
            p = wp.partition_dp(L, c, cost, num_microbatches=B, branch_and_bound=bnb, time_limit_s=600)
            devs = [subs[s.submesh_index].num_devices for s in p.stages]
            search = "B&B" if bnb else "scan"
            print(f"{L:>6} {t_group:>8.3f} {search:>7} {p.wall_s:>8.3f} {p.t_max_evaluated:>7} {p.cost_calls:>7} "
                  f"{len(p.stages):>6} {p.latency_s:>9.4f}  {devs}")
            case = f"GPT-175B L={L} 1024 GPUs {search}"
            fig(case, "dp_time", p.wall_s, "s")
            fig(case, "dp_runs", p.t_max_evaluated, "runs")
            fig(case, "latency", p.latency_s, "s")
            fig(f"GPT-175B L={L}", "group_layers_time", t_group, "s")

    if args.json:
        for f in figures:
            print(json.dumps(f))


if __name__ == "__main__":
    main()
