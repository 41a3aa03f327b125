"""SPMD strategy search benchmark (issue 6): search time and plan cost vs depth for GPT with hidden
512 on a 2x4 mesh (one M8 node), O2 (with and without repeated-layer reuse) and O3 (with a time
limit) side by side on the training step, each with shared resharding (the default) and O2 against
the same search pricing every reader's resharding alone ("apart", the baseline in the same run);
then GPT-6.7B and MoE-32E-10B on 16 V100 (two M8 nodes, mesh 2x8): search time and predicted step
time.

    PYTHONPATH=python:build/<dir>/python python3 benchmarks/spmd/bench_spmd.py [--json]
        [--depths 1,6,12] [--o3-limit 60] [--skip-large] [--batch 8] [--seq 1024]
"""
from __future__ import annotations

import argparse
import json
import time

import weft
import weft.models as wm


def _run(g, cluster, mesh, **kw):
    t = time.perf_counter()
    r = weft.spmd_search(g, cluster, mesh, **kw)
    return r, time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per figure")
    ap.add_argument("--depths", default="1,6,12,24,36,48,72,96")
    ap.add_argument("--o3-limit", type=float, default=60.0, help="O3 ILP time limit (s)")
    ap.add_argument("--o3-max-depth", type=int, default=96, help="skip O3 above this depth")
    ap.add_argument("--noreuse-max-depth", type=int, default=12, help="skip O2 without reuse above this depth")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--skip-large", action="store_true", help="skip GPT-6.7B / MoE-32E-10B")
    ap.add_argument("--large-batch", type=int, default=16)
    args = ap.parse_args(argv)
    figures = []

    def fig(case, metric, value, unit, baseline=None):
        figures.append(dict(bench="spmd", case=case, metric=metric, value=value, unit=unit, baseline=baseline))

    m8 = weft.Cluster.preset("M8")
    mesh = weft.DeviceMesh.iota([2, 4])
    print(f"GPT hidden 512, 8 heads, batch {args.batch}, seq {args.seq}, training step (Adam), "
          f"M8 node, mesh 2x4; O3 time limit {args.o3_limit:g} s")
    print(f"{'layers':>6} {'ops':>6} {'O2 s':>8} {'O2 noreuse s':>13} {'O3 s':>8} {'O3 status':>16} "
          f"{'O2 cost ms':>11} {'O3 cost ms':>11} {'O2/O3':>7} {'segs':>5} {'reused':>6} "
          f"{'apart O2 s':>10} {'apart O2 ms':>11} {'O2/apart':>8}")
    for L in [int(x) for x in args.depths.split(",") if x]:
        g = wm.gpt(layers=L, hidden=512, heads=8, batch=args.batch, seq=args.seq).train_step()
        case = f"gpt-h512-L{L}"
        o2, t2 = _run(g, m8, mesh, level="O2")
        rep = o2.report.to_dict()
        fig(case, "o2_search_time", t2, "s")
        fig(case, "o2_cost", o2.cost, "s")
        t2n = None
        if L <= args.noreuse_max_depth:
            o2n, t2n = _run(g, m8, mesh, level="O2", reuse_repeated_layers=False)
            fig(case, "o2_noreuse_search_time", t2n, "s")
            fig(case, "o2_noreuse_cost", o2n.cost, "s")
        apart, ta = _run(g, m8, mesh, level="O2", shared_resharding=False)
        fig(case, "o2_apart_search_time", ta, "s")
        fig(case, "o2_apart_cost", apart.cost, "s")
        fig(case, "o2_over_apart", o2.cost / apart.cost, "ratio", 1.0)
        o3 = None
        if L <= args.o3_max_depth:
            try:
                o3, t3 = _run(g, m8, mesh, level="O3", time_limit=args.o3_limit)
                fig(case, "o3_search_time", t3, "s")
                fig(case, "o3_cost", o3.cost, "s")
            except ValueError as e:  # no incumbent within the limit
                print(f"  O3: {e}")
        o3s = f"{t3:8.2f}" if o3 else f"{'-':>8}"
        o3st = o3.report.to_dict()["status"] if o3 else "skipped/none"
        o3c = f"{o3.cost * 1e3:11.4f}" if o3 else f"{'-':>11}"
        ratio = f"{o2.cost / o3.cost:7.4f}" if o3 else f"{'-':>7}"
        if o3:
            fig(case, "o2_over_o3", o2.cost / o3.cost, "ratio", 1.05)
        print(f"{L:>6} {len(g.ops):>6} {t2:8.2f} {_f(t2n, 13)} {o3s} "
              f"{o3st:>16} {o2.cost * 1e3:11.4f} {o3c} {ratio} {rep['segments']:>5} {rep['reused_segments']:>6} "
              f"{ta:10.2f} {apart.cost * 1e3:11.4f} {o2.cost / apart.cost:8.4f}")

    if not args.skip_large:
        m16 = weft.Cluster.preset("M8", nodes=2)
        mesh16 = weft.DeviceMesh.iota([2, 8])
        print(f"\n16 V100 (2 M8 nodes), mesh 2x8, batch {args.large_batch}, seq 1024, training step (Adam), O2")
        print(f"{'model':<14} {'ops':>6} {'search s':>9} {'step s':>9} {'compute s':>10} {'comm s':>9} "
              f"{'peak GB':>8} {'status':>10}")
        for name, build in (("GPT-6.7B", wm.gpt), ("MoE-32E-10B", wm.moe)):
            g = build(name, batch=args.large_batch).train_step()
            r, t = _run(g, m16, mesh16, level="O2")
            d = r.report.to_dict()
            fig(name, "search_time", t, "s")
            fig(name, "step_time", r.cost, "s")
            fig(name, "comm_time", r.comm_time, "s")
            fig(name, "peak_memory", r.peak_memory, "B")
            print(f"{name:<14} {len(g.ops):>6} {t:9.2f} {r.cost:9.4f} {r.compute_time:10.4f} {r.comm_time:9.4f} "
                  f"{r.peak_memory / 1e9:8.2f} {d['status']:>10}")
    if args.json:
        for f in figures:
            print(json.dumps(f))


def _f(x, w):
    return f"{x:{w}.2f}" if x is not None else f"{'-':>{w}}"


if __name__ == "__main__":
    main()
