"""Lowering and CPU-executor benchmark.

1. Lowering time of GPT-3 175B's plan on 128 DGX-A100 nodes (1024 GPUs; the planner's fast path as
   in benchmarks/plan/bench_plan.py: a pipeline of SPMD stages with data-parallel replicas and
   micro-batches): planning and lowering seconds (goal < 10 s), ranks, instructions (all ranks),
   shared lists, buffers, sends. --quick: GPT-1.3B's training step on one node (mesh [8]) instead.
2. The CPU executor's step time vs execute_reference (one device, same kernels) on a small GPT
   under Megatron's layout on 4 ranks, and under a 2-stage 1F1B pipeline (t=2 p=2, 4
   micro-batches): the overhead of tiles, collectives, transfers and threads.

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
    if args.quick:
        name = "GPT-1.3B"
        cluster = weft.Cluster.preset("DGX-A100", nodes=1)
        step = weft.models.build(name, batch=1, dtype="f16").train_step(optimizer="adam")
        mesh = weft.DeviceMesh([8], list(range(8)))
        t0 = time.perf_counter()
        res = weft.spmd_search(step, cluster, mesh, level="O2", memory_limit=-1)
        t1 = time.perf_counter()
        prog = weft.lower_spmd(step, cluster, mesh, res)
        t2 = time.perf_counter()
        case = f"{name} train step on [8]"
    else:
        cluster = weft.Cluster.preset("DGX-A100", nodes=128)
        step = weft.models.build("GPT-175B", batch=1536, dtype="f16").train_step(optimizer="adam")
        t0 = time.perf_counter()
        plan = weft.plan(step, cluster, num_blocks=96, whole_nodes_only=True, power_of_two_nodes=True,
                         max_stages=16, max_data_parallel=8, max_simulated=12, compare_megatron=False,
                         time_limit=600)
        t1 = time.perf_counter()
        prog = weft.lower(plan, step, cluster)
        t2 = time.perf_counter()
        case = (f"GPT-175B on 1024 A100 ({plan.num_stages} stages x dp {plan.data_parallel}, "
                f"M={plan.num_microbatches})")
    ranks = prog.ranks
    emit(args, "lower", case, "plan / search", t1 - t0, "s")
    emit(args, "lower", case, "lowering", t2 - t1, "s", baseline="goal < 10 s")
    emit(args, "lower", case, "ranks", len(ranks), "")
    emit(args, "lower", case, "instructions (all ranks)", sum(r["num_instrs"] for r in ranks), "")
    emit(args, "lower", case, "instructions per rank (max)", max(r["num_instrs"] for r in ranks), "")
    emit(args, "lower", case, "shared lists (stages)", len({r["stage"] for r in ranks}), "")
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

    four = weft.Cluster.preset("p3.8xlarge")
    plan = weft.megatron_plan(step, four, t=2, p=2, d=1, num_microbatches=4)
    t0 = time.perf_counter()
    prog = weft.lower(plan, step, four)
    t1 = time.perf_counter()
    got = weft.execute(prog, steps=steps)
    t2 = time.perf_counter()
    case = "GPT 2x64, t=2 p=2 1F1B, 4 micro-batches"
    per_dist = (t2 - t1) / steps
    emit(args, "exec", case, "lowering", t1 - t0, "s")
    emit(args, "exec", case, "CPU executor step", per_dist, "s")
    emit(args, "exec", case, "executor / reference", per_dist / per_ref, "x", baseline=1.0)
    emit(args, "exec", case, "cross-stage bytes per step", sum(r.get("send", 0) for r in got.bytes_sent) / steps, "B")
    emit(args, "exec", case, "max relative error", got.max_relative_error(ref), "", baseline="< 1e-10")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--quick", action="store_true", help="GPT-1.3B on one node instead of GPT-3's plan, fewer steps")
    args = ap.parse_args()
    bench_executor(args)
    bench_lowering(args)


if __name__ == "__main__":
    main()
