"""Predicted against published training throughput (issue 17): weft's prediction for exactly the
layout a paper ran, next to the throughput the paper measured, and the ratio; then weft's own plan
for the same model and cluster.

    PYTHONPATH=python python3 benchmarks/plan/bench_published.py [--quick] [--json] [--only NAME ...]
        [--own] [--time-limit S] [--gpt3]

Three families of published runs (issue 37 asks for >= 25 across Megatron-LM, ZeRO-3/FSDP and other
stacks; predicted / published within 0.8-1.25 on >= 85 %, geometric mean 0.9-1.1, none outside
0.6-1.6): Megatron-LM's tensor + pipeline + data parallel runs (below), MosaicML's FSDP
(ZeRO-3) runs (further below) and torchtitan's FSDP runs of Llama 3.1 8B on H100 (last). --gpt3 plans GPT-3 175B on 1,024 A100 with weft.plan's defaults
and prints its predicted MFU next to the best published MFU for that model and hardware.

Configurations: Megatron-LM's weak-scaling table (D. Narayanan et al., "Efficient Large-Scale
Language Model Training on GPU Clusters Using Megatron-LM", SC'21, Table 1): GPT models with
sequence 2048 and vocabulary 51200 on DGX A100 80 GB nodes (Selene: 8 GPUs per node, NVLink3, 8x
HDR InfiniBand), mixed precision (f16, f32 master weights and Adam moments), full activation
recomputation, tensor parallel t inside a node, pipeline p, data parallel d = GPUs / (t p). The
paper reports teraFLOP/s per GPU counted with its own formula, which includes the recomputed
forward (its eq. 3): F = 96 B s l h^2 (1 + s / (6 h) + V / (16 l h)) per step. weft's figure is
that same F over its predicted step time and the GPU count, so the two are comparable.

weft evaluates each layout with weft.megatron_plan(t, p, d, recompute="full", zero=0, schedule 1F1B)
(zero=0: the paper's runs replicate the optimizer states over d; weft's default ZeRO search would
shard them and, e.g., run the 18.4B row at one micro-batch under ZeRO-3, 1.32x the paper), at
the micro-batch count it finds best for that layout (its automatic counts, powers of two, and one
sample per micro-batch; the paper does not list its micro-batch sizes; its larger pipelines used
the interleaved schedule, which this comparison does not model).
Goal (issue 17): every ratio predicted / published within 0.8-1.25. The ratios are printed, not
asserted (CI runs --quick).

--own also plans each model with weft.plan on the same cluster (time limit --time-limit s) and
prints its predicted throughput next to the Megatron layout's.
With --json, one JSON object per figure: {"bench","case","metric","value","unit","baseline"}.
"""
import argparse
import json
import math
import time

import weft

# name, layers, hidden, heads, t, p, GPUs, global batch, published TFLOP/s per GPU (Table 1)
MEGATRON_SC21 = [
    ("GPT-1.7B", 24, 2304, 24, 1, 1, 32, 512, 137),
    ("GPT-3.6B", 30, 3072, 32, 2, 1, 64, 512, 138),
    ("GPT-7.5B", 36, 4096, 32, 4, 1, 128, 512, 142),
    ("GPT-18.4B", 40, 6144, 48, 8, 1, 256, 1024, 135),
    ("GPT-39.1B", 48, 8192, 64, 8, 2, 512, 1536, 138),
    ("GPT-76.1B", 60, 10240, 80, 8, 4, 1024, 1792, 140),
    ("GPT-145.6B", 80, 12288, 96, 8, 8, 1536, 2304, 148),
    ("GPT-310.1B", 96, 16384, 128, 8, 16, 1920, 2160, 155),
]
SEQ, VOCAB = 2048, 51200
QUICK = ("GPT-1.7B", "GPT-3.6B", "MPT-7B/8xA100-40GB", "Llama3.1-8B/8xH100")

# FSDP (ZeRO-3: FULL_SHARD) runs of MosaicML's MPT models with Composer / llm-foundry, published in
# mosaicml/llm-foundry, scripts/train/benchmarking/README.md, tables "A100 80GB with 1600 Gbps
# node-node interconnect (RoCE)" and "A100 40GB with 1600 Gbps node-node interconnect (RoCE)"
# (columns # GPUs, MicroBatchSize, GradAccum, GlobalBatchSize, Activation Checkpointing and
# Throughput (T/s/GPU); every row at sequence 2048, bf16). The models' shapes are the repository's
# scripts/train/yamls/pretrain/mpt-<size>.yaml (d_model, n_heads, n_layers; vocab 50368, FFN 4h,
# flash/triton attention, causal (MPT is a decoder-only LM), no dropout): weft's zoo GPT with those
# shapes and fused causal attention (it adds biases and a learned position table, < 0.5 % of the
# parameters; ALiBi's bias is not priced). Until 2026-11-28 the rows ran the zoo's fused attention
# without its causal mask, pricing every (query, key) pair where flash attention computes about half. The cluster is weft's DGX-A100
# preset (8 GPUs a node, NVLink, 8 x 200 Gb/s NICs = 1600 Gbps), its memory set to 40 GiB for the
# 40 GB rows. weft evaluates megatron_plan(t=1, p=1, d=GPUs, zero=3, recompute="full" where the run
# checkpointed activations else "none", the run's GradAccum micro-batches); the ratio is predicted
# over published tokens per second per GPU.
MPT = {"70b": (80, 8192, 64), "30b": (48, 7168, 56), "13b": (40, 5120, 40), "7b": (32, 4096, 32),
       "3b": (32, 2560, 20), "1b": (24, 2048, 16)}
MPT_VOCAB = 50368
# size, GPU memory (GB), GPUs, micro-batch size, GradAccum, global batch, activation checkpointing,
# published tokens/s/GPU
MOSAIC_FSDP = [
    ("70b", 40, 128, 4, 1, 512, True, 376), ("70b", 40, 64, 2, 1, 128, True, 276),
    ("30b", 40, 128, 6, 1, 768, True, 865), ("30b", 40, 32, 4, 1, 128, True, 857),
    ("13b", 40, 128, 16, 1, 2048, True, 1972), ("13b", 40, 64, 16, 1, 1024, True, 1976),
    ("13b", 40, 32, 14, 1, 448, True, 1998), ("13b", 40, 16, 10, 1, 160, True, 1993),
    ("13b", 40, 8, 4, 16, 512, True, 1668),
    ("7b", 40, 128, 18, 1, 2304, True, 3623), ("7b", 40, 64, 18, 1, 1152, True, 3665),
    ("7b", 40, 32, 18, 1, 576, True, 3725), ("7b", 40, 16, 16, 1, 256, True, 3645),
    ("7b", 40, 8, 12, 4, 384, True, 3679),
    ("3b", 40, 128, 6, 1, 768, False, 9538),
    ("70b", 80, 64, 8, 4, 2048, True, 410), ("70b", 80, 32, 2, 16, 1024, True, 373),
    ("30b", 80, 8, 3, 21, 504, True, 916), ("13b", 80, 8, 2, 3, 48, False, 2262),
    ("7b", 80, 8, 6, 2, 96, False, 4641), ("1b", 80, 8, 14, 4, 448, False, 20513),
]

# torchtitan's own benchmark (pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md, runs of
# 2024-12 at torchtitan 9dec370): Table 1 (Llama 3.1 8B, 8 GPUs, local batch 2, global batch 16) and
# Table 3 (the same on 128 GPUs, global batch 256), 1D parallelism = FSDP (FSDP2, FULL_SHARD over every
# GPU), selective activation checkpointing, the "FSDP" rows only (without torch.compile and Float8,
# which weft prices neither); TPS/GPU = tokens per second per GPU. The sequence is 8192, the
# repository's train_configs/llama3_8b.toml of the time (seq_len = 8192, activation_checkpoint mode
# 'selective' with the 'op' policy, AdamW, bf16 FSDP mixed precision); the benchmark does not restate it.
# The model: the zoo's llama3-8b (Llama 3.1 8B's shapes; its long-context rope scaling changes no
# cost) with fused causal attention (torchtitan runs SDPA's flash kernel). torchtitan's 'op' policy
# recomputes every other matmul and the element-wise ops, which weft's modes cannot express (weft's
# selective recomputation drops the attention cores' saved results only, which the fused op does not
# keep: on this graph it equals no recomputation, which does not fit). weft evaluates
# megatron_plan(t=1, p=1, d=GPUs, zero=3, recompute="auto", num_microbatches=1): the recomputation
# the memory forces, chosen per block (none / selective / full, plan.md), the nearest weft has to
# recomputing only part of the model; the row prints weft's recompute="full" figure beside it (a
# bound: more recomputation than torchtitan's policy).
# Hardware as the file states: Grand Teton hosts of 8 H100 fully connected by NVLink, 96 GB HBM2e at
# 2.4 TB/s per GPU, 400 Gb/s RDMA per GPU, a 500 W power limit; "the actual peak TFLOPs number is between
# SXM and NVL, and we don't know its exact value". The cluster: weft's H100 preset (NVLink4 450 GB/s,
# 8 x 400 Gb/s NICs a node, Hopper's efficiency model) with 96 GiB, 2.4 TB/s and a dense bf16 peak of
# 912 TFLOP/s, the midpoint of the SXM's 989 (700 W) and the NVL's 835 (400 W): the 500 W cap lies
# between them and nothing finer is published. (At 989 or 835 every figure here moves by about
# +/-8 % at most: the step is mostly matmuls.)
TITAN_PEAK_BF16 = 912e12
TITAN_SEQ = 8192
# name, GPUs, local batch, global batch, published TPS/GPU, published memory GiB
TORCHTITAN_FSDP = [
    ("Llama3.1-8B/8xH100", 8, 2, 16, 5762, 82.4),
    ("Llama3.1-8B/128xH100", 128, 2, 256, 5605, 67.0),
]

# GPT-3 175B on 1,024 A100 (128 DGX-A100), batch 1536, sequence 2048 (issue 37's case). The best
# published MFU for that model on A100 we know of: 51.4 % (Megatron-LM's README table of model and
# hardware FLOPs utilization, from Korthikanti et al., "Reducing Activation Recomputation in Large
# Transformer Models", MLSys 2023: tensor + pipeline parallel with sequence parallelism and
# selective recomputation, measured with a data-parallel size of one).
GPT3_PUBLISHED_MFU = 0.514
# The published measurement of fully sharded data parallelism with tensor parallelism at that scale:
# OPT-175B on 992 A100 80 GB, FSDP with Megatron-LM tensor parallelism, "utilization of up to 147
# TFLOP/s per GPU" (Zhang et al., "OPT: Open Pre-trained Transformer Language Models", 2022, §2.4).
OPT175_FSDP_TP_TFLOPS = 147.0


def mpt_case(size, mem, gpus):
    return f"MPT-{size.upper()}/{gpus}xA100-{mem}GB"


def a100_cluster(mem_gb, gpus):
    c = weft.Cluster.preset("DGX-A100", nodes=max(1, gpus // 8))
    if mem_gb == 80:
        return c
    d = json.loads(c.to_json())
    for node in d["nodes"]:
        node["device"]["memory_bytes"] = mem_gb * 2.0**30
        node["device"]["kind"] = f"A100-SXM4-{mem_gb}GB"
    return weft.Cluster.from_json(json.dumps(d))


def fsdp_rows(args, ratios):
    for size, mem, gpus, mb, ga, batch, ckpt, published in MOSAIC_FSDP:
        case = mpt_case(size, mem, gpus)
        if (args.quick and case not in QUICK) or (args.only and case not in args.only):
            continue
        layers, hidden, heads = MPT[size]
        graph = weft.models.gpt(layers=layers, hidden=hidden, heads=heads, seq=SEQ, vocab=MPT_VOCAB, batch=batch,
                                dtype="bf16", fused_attention=True, causal=True).train_step(optimizer="adam")
        t0 = time.perf_counter()
        plan = weft.megatron_plan(graph, a100_cluster(mem, gpus), t=1, p=1, d=gpus, zero=3,
                                  recompute="full" if ckpt else "none", num_microbatches=ga, allow_infeasible=True)
        dt = time.perf_counter() - t0
        predicted = batch * SEQ / plan.step_time / gpus
        ratio = predicted / published
        ratios.append(ratio)
        note = "" if plan.feasible else f"  (does not fit in weft's model: {plan.infeasible_reason[:90]})"
        print(f"{case:<22} {f'fsdp d={gpus} mb={mb}':<16} {gpus:>5} {batch:>5} {published:>10.0f} {predicted:>8.0f} "
              f"{ratio:>6.3f} {plan.num_microbatches:>4} {100 * plan.mfu:>5.1f}% {dt:>7.1f}{note}", flush=True)
        emit(args, case, "tokens_per_s_per_gpu", predicted, "token/s", published)
        emit(args, case, "ratio_to_published", ratio, "x")


def grand_teton_cluster(gpus):
    c = weft.Cluster.preset("H100", nodes=max(1, gpus // 8))
    d = json.loads(c.to_json())
    for node in d["nodes"]:
        dev = node["device"]
        dev["kind"] = "H100-HBM2e-96GB-500W"
        dev["memory_bytes"] = 96 * 2.0**30
        dev["memory_bandwidth"] = 2.4e12
        dev["peak_flops"]["bf16"] = dev["peak_flops"]["f16"] = TITAN_PEAK_BF16
    return weft.Cluster.from_json(json.dumps(d))


def torchtitan_rows(args, ratios):
    for case, gpus, local, batch, published, mem_gib in TORCHTITAN_FSDP:
        if (args.quick and case not in QUICK) or (args.only and case not in args.only):
            continue
        graph = weft.models.llama("llama3-8b", batch=batch, seq=TITAN_SEQ, dtype="bf16",
                                  fused_attention=True).train_step(optimizer="adam")
        cluster = grand_teton_cluster(gpus)
        t0 = time.perf_counter()
        plan = weft.megatron_plan(graph, cluster, t=1, p=1, d=gpus, zero=3, recompute="auto",
                                  num_microbatches=1, allow_infeasible=True)
        dt = time.perf_counter() - t0
        full = weft.megatron_plan(graph, cluster, t=1, p=1, d=gpus, zero=3, recompute="full", num_microbatches=1,
                                  allow_infeasible=True)
        predicted = batch * TITAN_SEQ / plan.step_time / gpus
        predicted_full = batch * TITAN_SEQ / full.step_time / gpus
        ratio = predicted / published
        ratios.append(ratio)
        note = "" if plan.feasible else \
            f"  (does not fit in weft's model: {plan.peak_memory / 2**30:.0f} GiB; published {mem_gib} GiB)"
        print(f"{case:<22} {f'fsdp d={gpus} mb={local}':<16} {gpus:>5} {batch:>5} {published:>10.0f} {predicted:>8.0f} "
              f"{ratio:>6.3f} {plan.num_microbatches:>4} {100 * plan.mfu:>5.1f}% {dt:>7.1f}{note}", flush=True)
        print(f"{'':<22} {'  with full recompute':<16} {'':>5} {'':>5} {'':>10} {predicted_full:>8.0f} "
              f"{predicted_full / published:>6.3f} {full.num_microbatches:>4} {100 * full.mfu:>5.1f}%"
              f"{'' if full.feasible else '  (does not fit)'}", flush=True)
        emit(args, case, "tokens_per_s_per_gpu", predicted, "token/s", published)
        emit(args, case, "ratio_to_published", ratio, "x")
        emit(args, case, "tokens_per_s_per_gpu_full_recompute", predicted_full, "token/s", published)


def gpt3_pick(args):
    cluster = weft.Cluster.preset("DGX-A100", nodes=128)
    graph = weft.models.gpt("GPT-3", batch=1536, seq=SEQ, dtype="f16").train_step(optimizer="adam")
    t0 = time.perf_counter()
    plan = weft.plan(graph, cluster)
    dt = time.perf_counter() - t0
    zero = f", ZeRO {sorted(set(plan.zero))}"
    print(f"GPT-3 175B on 1,024 A100, batch 1536: weft.plan picks {plan.strategy}, {plan.num_stages} stage(s) x dp "
          f"{plan.data_parallel}, M={plan.num_microbatches}, recompute {sorted(set(plan.recompute))}{zero}: step "
          f"{plan.step_time:.2f} s, predicted MFU {100 * plan.mfu:.1f}% vs the best published "
          f"{100 * GPT3_PUBLISHED_MFU:.1f}% ({plan.mfu / GPT3_PUBLISHED_MFU:.3f}x); planned in {dt:.1f} s", flush=True)
    tflops = plan.mfu * 312.0  # model TFLOP/s per GPU on the A100's 312 TFLOP/s dense f16 peak
    print(f"  {tflops:.0f} TFLOP/s per GPU; OPT-175B with FSDP + tensor parallelism on 992 A100 published "
          f"{OPT175_FSDP_TP_TFLOPS:.0f} ({tflops / OPT175_FSDP_TP_TFLOPS:.3f}x)", flush=True)
    emit(args, "GPT-3/1024xA100", "predicted_mfu", plan.mfu, "", GPT3_PUBLISHED_MFU)
    emit(args, "GPT-3/1024xA100", "plan_seconds", dt, "s")


def megatron_flops(batch, layers, hidden):
    """Megatron-LM's FLOPs per step with full recomputation (SC'21, eq. 3)."""
    s, l, h, v = SEQ, layers, hidden, VOCAB
    return 96.0 * batch * s * l * h * h * (1 + s / (6.0 * h) + v / (16.0 * l * h))


def emit(args, case, metric, value, unit, baseline=None):
    if args.json:
        print(json.dumps({"bench": "plan_published", "case": case, "metric": metric, "value": value, "unit": unit,
                          "baseline": baseline}), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)} (CI)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--only", action="append", help="a configuration by name (repeat for several)")
    ap.add_argument("--own", action="store_true", help="also weft.plan's own plan per configuration")
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per weft.plan (--own)")
    ap.add_argument("--gpt3", action="store_true", help="also GPT-3 175B on 1,024 A100: weft.plan's pick and MFU")
    args = ap.parse_args()
    rows = [r for r in MEGATRON_SC21 if (not args.quick or r[0] in QUICK) and (not args.only or r[0] in args.only)]
    print(f"{'model':<22} {'layout':<16} {'GPUs':>5} {'batch':>5} {'published':>10} {'weft':>8} {'ratio':>6}"
          f" {'M':>4} {'MFU':>6} {'plan s':>7}")
    ratios = []
    for name, layers, hidden, heads, t, p, gpus, batch, published in rows:
        # Megatron-LM's default dropout (hidden and attention 0.1), as its runs trained.
        graph = weft.models.gpt(layers=layers, hidden=hidden, heads=heads, seq=SEQ, vocab=VOCAB, batch=batch,
                                dtype="f16", hidden_dropout=0.1, attention_dropout=0.1).train_step(optimizer="adam")
        cluster = weft.Cluster.preset("DGX-A100", nodes=gpus // 8)
        d = gpus // (t * p)
        t0 = time.perf_counter()
        plan = weft.megatron_plan(graph, cluster, t=t, p=p, d=d, recompute="full", zero=0, allow_infeasible=True)
        # weft's automatic micro-batch counts are the powers of two dividing the replica's batch;
        # Megatron also ran micro-batches of one sample (e.g. 144 per replica for the 310B row).
        if batch % d == 0 and (batch // d) & (batch // d - 1):
            one = weft.megatron_plan(graph, cluster, t=t, p=p, d=d, recompute="full", zero=0, allow_infeasible=True,
                                     num_microbatches=batch // d)
            if (one.feasible, -one.step_time) > (plan.feasible, -plan.step_time):
                plan = one
        dt = time.perf_counter() - t0
        predicted = megatron_flops(batch, layers, hidden) / plan.step_time / gpus / 1e12
        ratio = predicted / published
        ratios.append(ratio)
        note = "" if plan.feasible else f"  (does not fit: {plan.infeasible_reason})"
        print(f"{name:<22} {f't={t} p={p} d={d}':<16} {gpus:>5} {batch:>5} {published:>10.0f} {predicted:>8.1f} "
              f"{ratio:>6.3f} {plan.num_microbatches:>4} {100 * plan.mfu:>5.1f}% {dt:>7.1f}{note}", flush=True)
        emit(args, name, "tflops_per_gpu", predicted, "TFLOP/s", published)
        emit(args, name, "ratio_to_published", ratio, "x")
        if args.own:
            t0 = time.perf_counter()
            own = weft.plan(graph, cluster, time_limit=args.time_limit)
            dt = time.perf_counter() - t0
            print(f"{'':<11} weft's own plan: {own.strategy}, {own.num_stages} stage(s) x dp {own.data_parallel}, "
                  f"M={own.num_microbatches}, recompute {sorted(set(own.recompute))}: step {own.step_time:.3f} s "
                  f"vs Megatron layout {plan.step_time:.3f} s ({plan.step_time / own.step_time:.3f}x), "
                  f"MFU {100 * own.mfu:.1f}% vs {100 * plan.mfu:.1f}%; planned in {dt:.1f} s", flush=True)
            emit(args, name, "own_plan_speedup", plan.step_time / own.step_time, "x")
    print(f"{'':<22} {'(FSDP rows: published and weft in tokens/s per GPU)'}")
    fsdp_rows(args, ratios)
    print(f"{'':<22} {'(torchtitan FSDP rows: TPS/GPU, H100 at 500 W; published and weft in tokens/s per GPU)'}")
    torchtitan_rows(args, ratios)
    if ratios:
        inside = sum(0.8 <= r <= 1.25 for r in ratios)
        outside = sum(not 0.6 <= r <= 1.6 for r in ratios)
        geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
        print(f"ratios predicted / published: min {min(ratios):.3f}, max {max(ratios):.3f}; "
              f"{inside} of {len(ratios)} within 0.8-1.25 ({100 * inside / len(ratios):.0f} %), geometric mean "
              f"{geo:.3f}, {outside} outside 0.6-1.6")
        emit(args, "all", "share_within_0.8_1.25", inside / len(ratios), "")
        emit(args, "all", "geometric_mean_ratio", geo, "x")
    if args.gpt3:
        gpt3_pick(args)


if __name__ == "__main__":
    main()
