"""Fused attention in the planner: GPT-175B (batch 1536, f16, Adam) on 128 DGX-A100 nodes laid out as
Megatron-LM ran it (t=8, p=16, d=8, 192 micro-batches), with the zoo's unfused attention
(einsum, softmax, einsum: the s x s probabilities saved) and with the IR's fused attention op
(flash attention: out and the log-sum-exp saved), under each recomputation mode: predicted step
time, peak memory per device and saved activations per micro-batch of a middle stage.

    PYTHONPATH=python:build/<dir>/python python3 benchmarks/plan/bench_fused_attention.py [--json]
"""
from __future__ import annotations

import argparse
import json
import time

import weft


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="one JSON object per figure")
    ap.add_argument("--nodes", type=int, default=128)
    args = ap.parse_args(argv)
    cluster = weft.Cluster.preset("DGX-A100", nodes=args.nodes)
    figures = []
    print(f"{'attention':<9} {'recompute':<10} {'step s':>8} {'peak GB':>8} {'saved GB/mb':>12} {'plan s':>7}")
    for fused in (False, True):
        step = weft.models.gpt("GPT-175B", batch=1536, dtype="f16",
                               fused_attention=fused).train_step(optimizer="adam")
        for mode in ("none", "selective", "full"):
            t = time.perf_counter()
            p = weft.megatron_plan(step, cluster, t=8, p=16, d=8, recompute=mode, num_microbatches=192,
                                   allow_infeasible=True)
            took = time.perf_counter() - t
            case = f"{'fused' if fused else 'unfused'}/{mode}"
            saved = p.stages[1].activation_memory
            print(f"{case.split('/')[0]:<9} {mode:<10} {p.step_time:>8.3f} {p.peak_memory / 1e9:>8.1f} "
                  f"{saved / 1e9:>12.3f} {took:>7.1f}")
            for metric, value, unit in (("step_time", p.step_time, "s"), ("peak_memory", p.peak_memory, "B"),
                                        ("saved_activations_per_microbatch", saved, "B")):
                figures.append(dict(bench="plan.fused_attention", case=case, metric=metric, value=value, unit=unit,
                                    baseline=None))
    if args.json:
        for f in figures:
            print(json.dumps(f))


if __name__ == "__main__":
    main()
