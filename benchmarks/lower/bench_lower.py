"""Lowering and CPU-executor benchmark.

1. Lowering time of a big plan: GPT-3 175B's training step (one micro-batch) laid out by the SPMD
   search (O2) on one DGX-A100 node (mesh [8]), lowered to 8 per-rank programs: search and lowering
   seconds, instructions and buffers. (The issue's goal is < 10 s for the 1024-GPU pipeline plan;
   pipelines are not lowered yet, so the figure here is one SPMD stage.)
2. The CPU executor's step time vs execute_reference (one device, same kernels) on a small GPT
   under Megatron's layout on 4 ranks: the overhead of tiles, collectives and threads.

    PYTHONPATH=python:build/<dir>/python python3 benchmarks/lower/bench_lower.py [--json] [--quick]

With --json, one JSON object per figure: {"bench","case","metric","value","unit","baseline"}.
"""
import argparse
import json
import time

import weft


def emit(args, bench, case, metric, value, unit, baseline=None):
    row = {"bench": bench, "case": case, "metric": metric, "value": value, "unit": unit, "baseline": baseline}
    if args.json:
        print(json.dumps(row), flush=True)
    else:
        base = f"  (baseline {baseline})" if baseline is not None else ""
        print(f"{bench:8s} {case:34s} {metric:26s} {value:12.4g} {unit}{base}", flush=True)


def megatron_specs(layers):
    f = {"wte": "S(0)"}
    for l in range(layers):
        p = f"h{l}"
        f.update({p + ".attn.qkv.w": "S(1,16)", p + ".attn.qkv.b": "S(0,16)", p + ".attn.proj.w": "S(0)",
                  p + ".mlp.fc1.w": "S(1)", p + ".mlp.fc1.b": "S(0)", p + ".mlp.fc2.w": "S(0)"})
    return f


def bench_lowering(args):
    name = "GPT-1.3B" if args.quick else "GPT-3"
    cluster = weft.Cluster.preset("DGX-A100", nodes=1)
    step = weft.models.build(name, batch=1, dtype="f16").train_step(optimizer="adam")
    mesh = weft.DeviceMesh([8], list(range(8)))
    t0 = time.perf_counter()
    res = weft.spmd_search(step, cluster, mesh, level="O2", memory_limit=-1)
    t1 = time.perf_counter()
    prog = weft.lower_spmd(step, cluster, mesh, res)
    t2 = time.perf_counter()
    case = f"{name} train step on [8]"
    emit(args, "lower", case, "spmd search (O2)", t1 - t0, "s")
    emit(args, "lower", case, "lowering", t2 - t1, "s", baseline="goal < 10 s")
    emit(args, "lower", case, "ops", len(step.ops), "")
    emit(args, "lower", case, "instructions per rank", len(prog.instructions(0)), "")
    emit(args, "lower", case, "buffers", len(prog.buffers), "")


def bench_executor(args):
    step = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8).train_step(optimizer="adam")
    cluster = weft.Cluster.preset("M8", nodes=1)
    mesh = weft.DeviceMesh([4], list(range(4)))
    res = weft.spmd_search(step, cluster, mesh, level="O2", memory_limit=-1, fixed_specs=megatron_specs(2))
    prog = weft.lower_spmd(step, cluster, mesh, res)
    steps = 2 if args.quick else 5
    t0 = time.perf_counter()
    ref = weft.execute_reference(step, steps=steps)
    t1 = time.perf_counter()
    got = weft.execute(prog, steps=steps)
    t2 = time.perf_counter()
    case = "GPT 2x64, Megatron on 4 ranks"
    per_ref, per_dist = (t1 - t0) / steps, (t2 - t1) / steps
    emit(args, "exec", case, "reference step", per_ref, "s")
    emit(args, "exec", case, "CPU executor step", per_dist, "s")
    emit(args, "exec", case, "executor / reference", per_dist / per_ref, "x", baseline=1.0)
    emit(args, "exec", case, "max relative error", got.max_relative_error(ref), "", baseline="< 1e-10")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="GPT-1.3B instead of GPT-3, fewer steps")
    args = ap.parse_args()
    bench_executor(args)
    bench_lowering(args)


if __name__ == "__main__":
    main()
