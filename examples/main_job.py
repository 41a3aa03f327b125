"""The main job: plan a real model on a real cluster shape and print the plan.

Builds GPT-2.7B from the zoo (Rhino/Alpa table configuration) with its training step (forward,
backward, Adam), plans it on 2 Rhino M8 nodes (16 V100-32GB) — stage partition, submeshes,
SPMD sharding per stage, micro-batching, data-parallel replicas, resharding between stages,
simulated 1F1B step — and compares the plan with the best Megatron-style manual layout
(tensor parallel inside a node x pipeline x data parallel) under the same cost model.
"""
import argparse
import time

import weft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="GPT-2.7B")
    ap.add_argument("--batch", type=int, default=16, help="global batch")
    ap.add_argument("--cluster", default="M8")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--schedule", default="1F1B")
    ap.add_argument("--json", default=None, help="also write the plan as JSON here")
    args = ap.parse_args()

    t0 = time.perf_counter()
    fwd = weft.models.build(args.model, batch=args.batch, dtype="f16")
    step = fwd.train_step(optimizer="adam")
    cluster = weft.Cluster.preset(args.cluster, nodes=args.nodes)
    print(f"weft {weft.__version__}")
    print(f"model   {fwd!r}")
    print(f"        {fwd.num_params() / 1e9:.2f} B parameters, {fwd.param_bytes() / 2**30:.1f} GiB of weights, "
          f"{fwd.training_flops() / 1e12:.1f} TFLOPs per step (batch {args.batch})")
    print(f"cluster {cluster}")
    print()

    # The planner's search space includes the Megatron-style layouts (they compete as candidates);
    # the comparison below re-evaluates them on their own.
    plan = weft.plan(step, cluster, schedule=args.schedule)
    print(plan.summary())
    megatron = weft.megatron_plan(step, cluster, schedule=args.schedule)
    print("Best Megatron-style layout under the same cost model:")
    print(f"  {megatron.strategy}: step {megatron.step_time:.4f} s, {megatron.throughput:.2f} samples/s, "
          f"MFU {100 * megatron.mfu:.1f}%, peak {megatron.peak_memory / 1e9:.2f} GB/device "
          f"({megatron.num_microbatches} micro-batches)")
    print(f"  weft's plan: step {plan.step_time:.4f} s -> {megatron.step_time / plan.step_time:.3f}x the Megatron layout's "
          "throughput")
    if args.json:
        with open(args.json, "w") as f:
            f.write(plan.to_json())
        assert weft.Plan.from_json(open(args.json).read()) == plan
        print(f"plan written to {args.json}")
    run_a_plan(plan, step, cluster)
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


def run_a_plan(plan, step, cluster):
    """Plans that run: lower a plan to per-rank programs and execute them on CPU threads, against
    the same training steps on one device."""
    print("\nPlans that run (CPU reference executor, f64, 3 Adam steps):")
    try:
        weft.lower(plan, step, cluster)
    except ValueError as e:
        print(f"  the plan above is not lowered yet: {str(e).split(';')[0]}")
    small = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8).train_step(optimizer="adam")
    four = weft.Cluster.preset("p3.8xlarge")
    p = weft.plan(small, four, num_microbatches=1, pipeline=False, max_data_parallel=1, uneven_split=False,
                  compare_megatron=False, two_d_meshes=True)
    program = weft.lower(p, small, four)
    got = weft.execute(program, steps=3)
    ref = weft.execute_reference(small, steps=3)
    print(f"  a small GPT planned on {four}: {p.strategy} on mesh {p.stages[0].mesh_shape}, "
          f"{len(program.instructions(0))} instructions per rank")
    print(f"  losses on {program.num_ranks} ranks {[round(x, 6) for x in got.losses]}, on one device "
          f"{[round(x, 6) for x in ref.losses]}; largest relative difference (losses, parameters, gradients) "
          f"{got.max_relative_error(ref):.1e}")


if __name__ == "__main__":
    main()
