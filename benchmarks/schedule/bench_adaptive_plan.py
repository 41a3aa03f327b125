"""Ada-Grouper end to end (issue 21): a plan's pipeline under a preempted network, through the
planner's policy (weft.adaptive_policy / weft.plan(..., bandwidth_trace=, schedule="adaptive")).

The Ada-Grouper benchmark case (benchmarks/schedule/bench_adagrouper.py) as a real plan: GPT-Medium
(24 layers, hidden 1024, seq 1024, vocab 51200, f16), global batch 192, an 8-stage pipeline of 3
layers per stage, one V100S per node (preset S1) with 100 Gb/s RoCE and a 25 Gb/s variant, a
per-micro-batch overhead of 0.5 ms forward / 1 ms backward per stage (the benchmark's), the
preempted trace of bench_adagrouper (seed 2023, 1200 s, stretches at 30-60 %), 60 s windows,
k <= 6. Prints the frontier, the policy's expected step, every fixed k, 1F1B, and the ratios;
then weft.plan's own choice (schedule="adaptive", pipelines of <= 8 stages, one replica).
Goal (issue 21): policy <= every fixed k, 4-30 % faster than 1F1B.

    PYTHONPATH=python python3 benchmarks/schedule/bench_adaptive_plan.py [--json] [--quick]
"""
import argparse
import json
import time

import weft


def cluster(gbps: float, nodes: int = 8):
    c = json.loads(weft.Cluster.preset("S1", nodes=nodes).to_json())
    for n in c["nodes"]:
        n["nic"]["bandwidth"] = gbps * 1e9 / 8
    return weft.Cluster.from_json(json.dumps(c))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="300 s of trace, 4 samples per window")
    args = ap.parse_args()
    duration = 300.0 if args.quick else 1200.0
    samples = 4 if args.quick else 16
    g = weft.models.gpt(layers=24, hidden=1024, heads=16, seq=1024, vocab=51200, batch=192)
    trace = weft.BandwidthTrace.preempted(2023, duration=duration, normal_min=20, normal_max=120, preempt_min=20,
                                          preempt_max=120, low=0.3, high=0.6)
    for gbps in (100.0, 25.0):
        c = cluster(gbps)
        t0 = time.perf_counter()
        p = weft.layout_plan(g, c, [(i, i, [i], [1]) for i in range(8)], num_microbatches=48, num_blocks=8)
        a = weft.adaptive_policy(p, trace, window=60, k_max=6, duration=duration, samples_per_window=samples,
                                 forward_overhead=0.5e-3, backward_overhead=1e-3)
        dt = time.perf_counter() - t0
        case = f"GPT-Medium 8 stages @{gbps:g}Gb/s"
        one = a.fixed_step[a.one_f_one_b]
        rows = [("policy expected step", a.step, "s", one), ("1F1B (k=1) step", one, "s", None),
                ("best fixed step", a.fixed_step[a.best_fixed], "s", None),
                ("policy vs 1F1B", a.speedup_vs_1f1b(), "x", 1.0),
                ("policy vs best fixed", a.speedup_vs_best_fixed(), "x", 1.0), ("policy seconds", dt, "s", None)]
        if args.json:
            for metric, v, unit, base in rows:
                print(json.dumps({"bench": "adaptive_plan", "case": case, "metric": metric, "value": v, "unit": unit,
                                  "baseline": base}))
        else:
            print(f"\n{case}: plan step (no trace, 1F1B M=48) {p.step_time:.3f} s")
            print(a.summary())
            ok = all(a.step <= s for s in a.fixed_step)
            print(f"policy <= every fixed k: {ok}; {100 * (a.speedup_vs_1f1b() - 1):.1f}% faster than 1F1B "
                  f"(goal 4-30%); {dt:.2f} s")
    # The planner's own choice under the trace (100 Gb/s).
    c = cluster(100.0)
    t0 = time.perf_counter()
    p = weft.plan(g, c, schedule="adaptive", bandwidth_trace=trace, max_data_parallel=1, max_stages=8,
                  compare_megatron=False, adaptive_window=60, adaptive_k_max=6, adaptive_duration=duration,
                  adaptive_forward_overhead=0.5e-3, adaptive_backward_overhead=1e-3, time_limit=120)
    dt = time.perf_counter() - t0
    if args.json:
        print(json.dumps({"bench": "adaptive_plan", "case": "weft.plan @100Gb/s", "metric": "expected step",
                          "value": p.adaptive.step, "unit": "s", "baseline": None}))
    else:
        print(f"\nweft.plan(schedule='adaptive') @100Gb/s: {p.strategy}, {p.num_stages} stage(s), planned in "
              f"{dt:.1f} s\n{p.adaptive.summary()}")


if __name__ == "__main__":
    main()
