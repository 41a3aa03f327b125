"""Simulator speed through the Python bindings: events (task completions) per second on a
64-stage, 1024-micro-batch schedule with a preempted-bandwidth trace (goal >= 1e6 events/s).
The C++ twin is build/<dir>/benchmarks/weft_bench_sim_speed.

Usage: python bench_sim_speed.py [--json] [--repeat N]
"""
from __future__ import annotations

import argparse
import json
import time

import weft


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    S, M = 64, 1024
    st = weft.StageSpec(forward_time=1e-3, backward_time=2e-3, weight_time=1e-3, activation_bytes=8e6,
                        activation_memory=1e8)
    tr = weft.BandwidthTrace.preempted(1, duration=600, normal_min=0.05, normal_max=0.3, preempt_min=0.05,
                                       preempt_max=0.3)
    link = weft.PipelineLink(bandwidth=12.5e9, latency=1e-5, trace=tr)
    cases = [("1f1b", weft.schedule("1f1b", S, M)), ("kfkb(k=4)", weft.schedule("kfkb", S, M, k=4)),
             ("zb_h1", weft.schedule("zb_h1", S, M)), ("interleaved(v=2)", weft.schedule("interleaved", S, M, v=2))]
    if not args.json:
        print(f"{'schedule (S=64, M=1024)':24s} {'tasks':>8s} {'best s':>8s} {'events/s':>10s}")
    for name, s in cases:
        best, events = 1e30, 0
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            r = weft.simulate(s, st, link, check_pairing=False, record_timeline=False)
            best = min(best, time.perf_counter() - t0)
            events = r.events
        if args.json:
            print(json.dumps({"bench": "sim_speed", "case": f"{name} S=64 M=1024", "metric": "events_per_s",
                              "value": events / best, "unit": "1/s", "baseline": 1e6}))
        else:
            print(f"{name:24s} {events:8d} {best:8.4f} {events / best:10.3g}")


if __name__ == "__main__":
    main()
