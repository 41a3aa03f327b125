"""Heterogeneous load balancing (Whale's Algorithm 1): predicted throughput of the balanced vs the even
split, data parallel and pipeline, on V100 + P100 and V100 + T4, BERT-large (seq 128) and GPT-Medium.

Usage: PYTHONPATH=python:build/<dir>/python python3 benchmarks/hetero/bench_hetero.py [--json]
"""
from __future__ import annotations

import argparse
import json
import time

import weft
from weft import hetero


def clusters():
    m8, p100, t4 = (weft.Cluster.preset(n) for n in ("M8", "P100", "T4"))
    return {
        "8xV100+8xP100": weft.cluster.concat(m8, p100),
        "8xV100+8xT4": weft.cluster.concat(m8, weft.Cluster.preset("T4", nodes=2)),
    }


def models():
    return {
        "BERT-large(s128)": lambda b: weft.models.bert(seq=128, batch=b),
        "GPT-Medium(s1024)": "GPT-Medium",
    }


def largest_even_batch(prof, cluster):
    """The same batch on every GPU, the largest the smallest GPU holds (the even baseline)."""
    mem = min(d.spec.memory_bytes for d in cluster.devices)
    k = 1
    while prof.peak_memory(k + 1) <= mem:
        k += 1
    return k


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    figures = []

    def emit(case, metric, value, unit, baseline=None):
        figures.append({"bench": "hetero", "case": case, "metric": metric, "value": value, "unit": unit,
                        "baseline": baseline})

    rows = []
    for mname, m in models().items():
        t0 = time.perf_counter()
        prof = hetero.profile(m)
        t_prof = time.perf_counter() - t0
        emit(mname, "profile_time", t_prof, "s")
        for cname, c in clusters().items():
            n = c.num_devices
            k = largest_even_batch(prof, c)
            for overlap in (True, False):
                t0 = time.perf_counter()
                r = hetero.balance_batch(c, prof, n * k, overlap_grad_sync=overlap)
                dt = time.perf_counter() - t0
                case = f"DP {mname} {cname} B={n * k}{'' if overlap else ' no-overlap'}"
                rows.append((case, r.even.throughput, r.balanced.throughput, r.speedup,
                             f"{r.batch[0]}/{r.batch[-1]}", dt))
                emit(case, "throughput_ratio", r.speedup, "x", "even split")
                emit(case, "balanced_throughput", r.balanced.throughput, "samples/s", r.even.throughput)
            # pipeline: 4 GPUs of each kind, one stage per GPU
            ids = [0, 1, 2, 3, 8, 9, 10, 11]
            mb, nm = (8, 16) if "BERT" in mname else (1, 16)
            for reps in (1, 2):  # 8 stages, or Whale's 4 stages x 2 replicas
                t0 = time.perf_counter()
                try:
                    p = hetero.balance_pipeline(c, prof, devices=ids, micro_batch=mb, num_micro=nm, replicas=reps)
                except ValueError as e:  # model does not fit the 8 GPUs
                    rows.append((f"PP {mname} {cname} 4+4", 0, 0, 0, str(e)[:40], 0))
                    continue
                dt = time.perf_counter() - t0
                case = f"PP {mname} {cname} 4+4 {8 // reps}x{reps} mb={mb} M={nm}"
                rows.append((case, p.even.throughput, p.balanced.throughput, p.speedup,
                             ",".join(map(str, p.layers)) + ("" if p.even.fits else " (even OOM)"), dt))
                emit(case, "throughput_ratio", p.speedup, "x", "even stage partition")
                emit(case, "balanced_throughput", p.balanced.throughput, "samples/s", p.even.throughput)
    if args.json:
        for f in figures:
            print(json.dumps(f))
        return
    print(f"{'case':<58} {'even/s':>9} {'balanced/s':>10} {'ratio':>6}  {'shares/layers':<28} {'plan s':>7}")
    for case, e, b, r, s, dt in rows:
        print(f"{case:<58} {e:9.1f} {b:10.1f} {r:6.3f}  {s:<28} {dt:7.3f}")


if __name__ == "__main__":
    main()
