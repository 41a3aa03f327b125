"""The planner on mixed GPUs (Whale's experiments, under weft's cost model): weft.plan on
8 V100-32GB + 8 P100-16GB (data parallel) and 4 + 4 (pipeline), BERT-large seq 128, against the
even split evaluated by the same cost model (data_parallel_plan with equal shares; the planner's
"pipeline (even split)" alternative: equal-FLOP blocks on equal device counts in Whale's order);
and Whale's uneven tensor split (VGG19 with a 100K-class classifier on 8 + 8) against the even one.

    PYTHONPATH=python:build/<dir>/python python3 benchmarks/plan/bench_hetero_plan.py [--json]

With --json, one JSON object per figure: {"bench","case","metric","value","unit","baseline"}.
"""
import argparse
import json
import time

import weft


def node(preset, gpus):
    d = json.loads(weft.Cluster.preset(preset, nodes=1).to_json())
    d["nodes"][0]["num_devices"] = gpus
    return weft.Cluster.from_json(json.dumps(d))


def emit(args, rows, case, metric, value, unit, baseline=None):
    rows.append({"bench": "hetero_plan", "case": case, "metric": metric, "value": value, "unit": unit,
                 "baseline": baseline})
    if args.json:
        print(json.dumps(rows[-1]), flush=True)


def best_even_dp(graph, cluster, batch):
    """The best even data-parallel plan over the micro-batch counts (each device the same share)."""
    n = cluster.num_devices
    best = None
    m = 1
    while m <= 32 and batch % (m * n) == 0:
        try:
            p = weft.data_parallel_plan(graph, cluster, [batch // (m * n)] * n, num_microbatches=m)
            if best is None or p.step_time < best.step_time:
                best = p
        except ValueError:  # does not fit at this micro-batch count
            pass
        m *= 2
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--batch", type=int, default=768, help="global batch of the data-parallel case")
    args = ap.parse_args()
    rows = []
    bert = weft.models.bert("BERT-large", batch=args.batch, seq=128).train_step(optimizer="adam")

    # Data parallel on 8 V100 + 8 P100 (the planner may also pick a pipeline: reported).
    c16 = weft.Cluster.concat(weft.Cluster.preset("M8"), weft.Cluster.preset("P100"))
    t = time.time()
    p = weft.plan(bert, c16, pipeline=False)
    plan_s = time.time() - t
    even = best_even_dp(bert, c16, args.batch)
    case = f"BERT-large s128 B={args.batch}, 8 V100 + 8 P100, data parallel"
    emit(args, rows, case, "plan_time", plan_s, "s")
    emit(args, rows, case, "throughput_uneven", p.throughput, "samples/s")
    emit(args, rows, case, "throughput_even", even.throughput, "samples/s")
    emit(args, rows, case, "speedup_vs_even", p.throughput / even.throughput, "x", "even shares")
    print(f"{case}: planned in {plan_s:.2f} s; uneven {p.throughput:.1f} samples/s "
          f"(M={p.num_microbatches}, shares {sorted(set(p.replica_microbatch), reverse=True)}), even "
          f"{even.throughput:.1f} (M={even.num_microbatches}): {p.throughput / even.throughput:.3f}x")
    t = time.time()
    full = weft.plan(bert, c16)
    emit(args, rows, case.replace("data parallel", "any strategy"), "throughput", full.throughput, "samples/s")
    print(f"  with pipelines allowed: {full.strategy}, {full.throughput:.1f} samples/s, planned in "
          f"{time.time() - t:.2f} s")

    # Pipeline on 4 V100 + 4 P100 (Whale: 4 stages; here the planner chooses the stage count).
    c8 = weft.Cluster.concat(node("P100", 4), node("M8", 4))
    bert_p = weft.models.bert("BERT-large", batch=128, seq=128).train_step(optimizer="adam")
    t = time.time()
    p = weft.plan(bert_p, c8, num_microbatches=16, max_alternatives=64)
    plan_s = time.time() - t
    pipes = [a for a in p.alternatives if a.feasible and a.strategy.startswith("pipeline (memory")]
    others = [a for a in p.alternatives if a.feasible and a.strategy.startswith("pipeline (other")]
    evens = [a for a in p.alternatives if a.feasible and a.strategy == "pipeline (even split)"]
    case = "BERT-large s128 B=128 M=16, 4 V100 + 4 P100, pipeline"
    bal = min(pipes + others, key=lambda a: a.step_time)
    ev = min(evens, key=lambda a: a.step_time)
    emit(args, rows, case, "plan_time", plan_s, "s")
    emit(args, rows, case, "step_balanced", bal.step_time, "s")
    emit(args, rows, case, "step_even", ev.step_time, "s")
    emit(args, rows, case, "speedup_vs_even", ev.step_time / bal.step_time, "x", "even split")
    print(f"{case}: planned in {plan_s:.2f} s; balanced {bal.strategy} {bal.layout} {bal.step_time:.4f} s; "
          f"even {ev.layout} {ev.step_time:.4f} s: {ev.step_time / bal.step_time:.3f}x; "
          f"chosen plan: {p.strategy} {p.step_time:.4f} s")

    # Whale's split (Figure 4: data-parallel features, split classifier): VGG19 with 100K classes,
    # batch 256, on 8 V100 + 8 P100 — one SPMD stage over all 16 GPUs with every split dimension
    # cut unevenly, against the same stage split evenly and the best plan of another kind.
    vgg = weft.models.vgg19(classes=100000, image=224, batch=256).train_step(optimizer="adam")
    t = time.time()
    p = weft.plan(vgg, c16, max_alternatives=256)
    plan_s = time.time() - t
    feas = [a for a in p.alternatives if a.feasible]
    uneven = min((a for a in feas if a.strategy == "spmd (uneven split)"), key=lambda a: a.step_time)
    even = min((a for a in feas if a.strategy == "spmd (even split)"), key=lambda a: a.step_time)
    other = min((a for a in feas if "split" not in a.strategy or a.strategy.startswith("pipeline")),
                key=lambda a: a.step_time)
    case = "VGG19-100K classes B=256, 8 V100 + 8 P100, uneven tensor split"
    emit(args, rows, case, "plan_time", plan_s, "s")
    emit(args, rows, case, "step_uneven", uneven.step_time, "s")
    emit(args, rows, case, "step_even", even.step_time, "s")
    emit(args, rows, case, "speedup_vs_even", even.step_time / uneven.step_time, "x", "even split")
    emit(args, rows, case, "speedup_vs_other", other.step_time / uneven.step_time, "x", other.strategy)
    print(f"{case}: planned in {plan_s:.2f} s; uneven {uneven.layout} {uneven.step_time:.4f} s "
          f"(fractions {sorted(set(round(f, 4) for f in p.split_fraction), reverse=True)}); even "
          f"{even.layout} {even.step_time:.4f} s: {even.step_time / uneven.step_time:.3f}x; best other "
          f"{other.strategy} {other.layout} {other.step_time:.4f} s: {other.step_time / uneven.step_time:.3f}x; "
          f"chosen plan: {p.strategy}")


if __name__ == "__main__":
    main()
