"""Sharding benchmarks: enumerate every valid spec of a rank-3 tensor on a 3-D mesh, and resolve
10k resharding queries through a cached ReshardPlanner (queries drawn from a pool of distinct
(src, dst) pairs, so the first query of each pair runs the Dijkstra search and the rest hit the
cache). Prints a table; --json prints one JSON object per figure.

    PYTHONPATH=python:build/<dir>/python python3 benchmarks/sharding/bench_sharding.py [--json]
"""
import argparse
import json
import time

import numpy as np

import weft


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--queries", type=int, default=10000)
    ap.add_argument("--pairs", type=int, default=500, help="distinct (src, dst) pairs the queries are drawn from")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    shape, mesh = [64, 128, 256], [2, 2, 4]
    t0 = time.perf_counter()
    specs = weft.enumerate_specs(shape, mesh)
    t_enum = time.perf_counter() - t0
    t0 = time.perf_counter()
    block = weft.enumerate_specs(shape, mesh, strided=False)
    t_enum_block = time.perf_counter() - t0

    cluster = weft.Cluster.preset("M8", 2)
    dmesh = weft.DeviceMesh.iota(mesh)
    planner = weft.ReshardPlanner(dmesh.axis_links(cluster), "f16")
    rng = np.random.default_rng(args.seed)
    pool = [(specs[rng.integers(len(specs))], specs[rng.integers(len(specs))]) for _ in range(args.pairs)]
    order = rng.integers(len(pool), size=args.queries)
    # cold searches, timed one by one, are the first occurrence of each pair
    cold = []
    t_all = time.perf_counter()
    for i in order:
        a, b = pool[i]
        before = planner.searches
        t = time.perf_counter()
        planner.plan(a, b)
        dt = time.perf_counter() - t
        if planner.searches != before:
            cold.append(dt)
    t_all = time.perf_counter() - t_all
    # warm: the same 10k queries again, all cached
    t_warm = time.perf_counter()
    for i in order:
        planner.plan(*pool[i])
    t_warm = time.perf_counter() - t_warm

    rows = [
        ("enumerate", f"rank-3 {shape} on mesh {mesh}, strided", "specs", len(specs), "count"),
        ("enumerate", f"rank-3 {shape} on mesh {mesh}, strided", "time", t_enum * 1e3, "ms"),
        ("enumerate", f"rank-3 {shape} on mesh {mesh}, block only", "specs", len(block), "count"),
        ("enumerate", f"rank-3 {shape} on mesh {mesh}, block only", "time", t_enum_block * 1e3, "ms"),
        ("reshard", f"{args.queries} queries over {args.pairs} pairs (cache cold at start)", "mean_per_query",
         t_all / args.queries * 1e6, "us"),
        ("reshard", f"{args.queries} queries, all cached", "mean_per_query", t_warm / args.queries * 1e6, "us"),
        ("reshard", "first query of a pair (Dijkstra search)", "mean_search", float(np.mean(cold)) * 1e6, "us"),
        ("reshard", "first query of a pair (Dijkstra search)", "max_search", float(np.max(cold)) * 1e6, "us"),
    ]
    if args.json:
        for bench, case, metric, value, unit in rows:
            print(json.dumps({"bench": f"sharding.{bench}", "case": case, "metric": metric, "value": value,
                              "unit": unit, "baseline": None}))
    else:
        print(f"{'bench':10} {'case':58} {'metric':16} {'value':>12} unit")
        for bench, case, metric, value, unit in rows:
            print(f"{bench:10} {case:58} {metric:16} {value:12.3f} {unit}")


if __name__ == "__main__":
    main()
