"""Sharded data parallelism (issue 22): weft's plan for a Llama2-7B-sized GPT on one DGX-A100 node
next to the layouts practitioners run for it, in weft's cost model.

    PYTHONPATH=python python3 benchmarks/plan/bench_zero.py [--json] [--hybrid]

The case (Galvatron's side-by-side in the issue): GPT with 32 layers, hidden 4096, 32 heads, seq
2048, vocabulary 32000, global batch 64, f16 with f32 master weights and Adam moments (16 bytes per
parameter), 8 A100-80GB capped at 38 GB (38912 MiB) each. Printed:
  - FSDP: ZeRO-3 over the 8 GPUs with full activation checkpointing (t=1 p=1 d=8, zero=3,
    recompute="full"), what Galvatron chose and most 7B runs use;
  - the best Megatron (t, p, d) layout, each with its best ZeRO level and recomputation;
  - weft.plan with the defaults (zero and recompute searched), and its planning time.
Goal: weft's plan fits (16 bytes per parameter counted) and is no slower than the other two.
--hybrid adds issue 22's hybrid case: a GPT-13B-sized model on 4 nodes whose NICs give 10 Gb/s,
ZeRO-3 over all 32 GPUs against shard-in-node / replicate-across-nodes.
With --json, one JSON object per figure: {"bench","case","metric","value","unit","baseline"}.
"""
import argparse
import json
import time

import weft

LIMIT = 38912 << 20


def emit(args, case, metric, value, unit, baseline=None):
    if args.json:
        print(json.dumps({"bench": "plan_zero", "case": case, "metric": metric, "value": value, "unit": unit,
                          "baseline": baseline}), flush=True)


def describe(p):
    return (f"{p.strategy}, M={p.num_microbatches} dp={p.data_parallel}, zero {p.zero}, "
            f"recompute {p.recompute}")


def llama7b(args):
    fwd = weft.models.gpt(layers=32, hidden=4096, heads=32, seq=2048, vocab=32000, batch=64, dtype="f16")
    g = fwd.train_step(optimizer="adam")
    c = weft.Cluster.preset("DGX-A100", nodes=1)
    kw = dict(memory_limit=LIMIT, memory_fraction=1.0)
    print(f"Llama2-7B-sized GPT ({fwd.num_params() / 1e9:.2f} B parameters, 16 bytes each) on 8 A100, "
          f"38 GB cap, batch 64, seq 2048")
    rows = []
    t0 = time.perf_counter()
    fsdp = weft.megatron_plan(g, c, t=1, p=1, d=8, zero=3, recompute="full", **kw)
    rows.append(("FSDP (ZeRO-3 + full checkpointing, d=8)", fsdp, time.perf_counter() - t0))
    t0 = time.perf_counter()
    meg = weft.megatron_plan(g, c, **kw)
    rows.append(("best Megatron layout", meg, time.perf_counter() - t0))
    t0 = time.perf_counter()
    own = weft.plan(g, c, **kw)
    plan_s = time.perf_counter() - t0
    rows.append(("weft.plan", own, plan_s))
    for name, p, secs in rows:
        print(f"  {name:42s} step {p.step_time:7.4f} s  peak {p.peak_memory / 1e9:6.2f} GB  "
              f"({describe(p)}; {secs:.1f} s)")
        emit(args, name, "step_time", p.step_time, "s")
        emit(args, name, "peak_memory", p.peak_memory, "B")
    print(f"  weft.plan / FSDP step: {own.step_time / fsdp.step_time:.3f};  weft.plan / best Megatron: "
          f"{own.step_time / meg.step_time:.3f};  planned in {plan_s:.1f} s")
    emit(args, "weft.plan", "ratio_to_fsdp", own.step_time / fsdp.step_time, "x", fsdp.step_time)
    emit(args, "weft.plan", "ratio_to_megatron", own.step_time / meg.step_time, "x", meg.step_time)
    emit(args, "weft.plan", "plan_seconds", plan_s, "s")
    fits = own.peak_memory <= LIMIT * (1 + 1e-9)
    print("  goal (fits, no slower than both): " +
          ("met" if fits and own.step_time <= min(fsdp.step_time, meg.step_time) * (1 + 1e-9) else "NOT met"))


def hybrid(args):
    fwd = weft.models.gpt(layers=40, hidden=5120, heads=40, seq=2048, vocab=32000, batch=128, dtype="f16")
    g = fwd.train_step(optimizer="adam")
    c = slow_nic_cluster(json.loads(weft.Cluster.preset("DGX-A100", nodes=1).to_json()))
    print(f"GPT-13B-sized ({fwd.num_params() / 1e9:.2f} B parameters) on 4 DGX-A100 nodes at 10 Gb/s per node")
    for hyb in (True, False):
        t0 = time.perf_counter()
        p = weft.megatron_plan(g, c, t=1, p=1, d=32, zero=3, hybrid_sharding=hyb)
        st = p.stages[0]
        name = "ZeRO-3 " + ("hybrid (shard in node)" if st.zero_group < 32 else "over all 32")
        print(f"  {name:42s} step {p.step_time:7.4f} s  peak {p.peak_memory / 1e9:6.2f} GB  "
              f"(group {st.zero_group}, M={p.num_microbatches}, recompute {st.recompute}; "
              f"{time.perf_counter() - t0:.1f} s)")
        emit(args, name, "step_time", p.step_time, "s")


def slow_nic_cluster(node_json):
    node = node_json["nodes"][0]
    node["nic"]["bandwidth"] = 1.25e9
    return weft.Cluster.from_json(json.dumps({"nodes": [node] * 4}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--hybrid", action="store_true")
    args = ap.parse_args()
    llama7b(args)
    if args.hybrid:
        hybrid(args)


if __name__ == "__main__":
    main()
