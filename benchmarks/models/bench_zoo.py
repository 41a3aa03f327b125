"""Model zoo benchmark: for every preset, parameters (computed vs the papers' names), forward op
count, forward build time, training-graph (forward + backward + Adam) build time and op count;
for the GPTs, training FLOPs against Megatron's formula. Then the headline case: GPT-3 175B's
training graph (96 layers), target < 2 s.

    PYTHONPATH=python:build/<dir>/python python3 benchmarks/models/bench_zoo.py [--json] [--batch B]
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import weft
import weft.models as wm


def _timed(f, repeat=1):
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = f()
        best = min(best, time.perf_counter() - t)
    return out, best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per figure")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--skip-training", action="store_true", help="forward graphs only")
    args = ap.parse_args(argv)
    figures = []

    def fig(case, metric, value, unit, baseline=None):
        figures.append(dict(bench="models.zoo", case=case, metric=metric, value=value, unit=unit, baseline=baseline))

    has_train = not args.skip_training
    hdr = f"{'preset':<14} {'params':>16} {'named':>10} {'dev %':>7} {'fwd ops':>8} {'fwd ms':>8}"
    if has_train:
        hdr += f" {'train ops':>9} {'train ms':>9} {'FLOPs/Megatron-1 %':>19}"
    print(hdr)
    for p in wm.presets():
        name = p["name"]
        g, t_fwd = _timed(lambda: wm.build(name, batch=args.batch))
        n = g.num_params()
        dev = 100 * (n / p["named_params"] - 1)
        line = f"{name:<14} {n:>16,} {p['named_params'] / 1e9:>9.3g}B {dev:>+7.2f} {len(g.ops):>8} {1e3 * t_fwd:>8.1f}"
        fig(name, "params", n, "params", p["named_params"])
        fig(name, "forward_ops", len(g.ops), "ops")
        fig(name, "forward_build_time", t_fwd, "s")
        if has_train:
            tg, t_tr = _timed(lambda: g.train_step())  # forward + backward + Adam
            tf = g.training_flops()
            line += f" {len(tg.ops):>9} {1e3 * t_tr:>9.1f}"
            fig(name, "training_ops", len(tg.ops), "ops")
            fig(name, "training_build_time", t_tr, "s")
            if p["family"] == "gpt":
                c = p["config"]
                mf = wm.megatron_flops(layers=c["layers"], hidden=c["hidden"], seq=c["seq"], vocab=c["vocab"],
                                       batch=args.batch)
                line += f" {100 * (tf / mf - 1):>+19.3f}"
                fig(name, "training_flops_vs_megatron", tf / mf - 1, "ratio-1", 0.0)
        print(line)

    if has_train:
        g = wm.gpt("GPT-175B", batch=args.batch)
        tg, t = _timed(lambda: g.train_step(), repeat=3)
        print(f"\nGPT-3 175B training graph (fwd+bwd+Adam, 96 layers): {len(tg.ops)} ops, "
              f"{len(tg.tensors)} tensors, built in {t:.3f} s (target < 2 s; best of 3)")
        fig("GPT-175B", "training_graph_build_time", t, "s", 2.0)
        fig("GPT-175B", "training_graph_ops", len(tg.ops), "ops")
        _, t_all = _timed(lambda: wm.gpt("GPT-175B", batch=args.batch).train_step(), repeat=3)
        print(f"GPT-3 175B forward build + training graph: {t_all:.3f} s (best of 3)")
        fig("GPT-175B", "forward_plus_training_build_time", t_all, "s", 2.0)
    if args.json:
        for f in figures:
            print(json.dumps(f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
