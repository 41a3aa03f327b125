"""The main job: plan a real model on a real cluster shape and print the plan.

Builds GPT-2.7B from the zoo (Rhino/Alpa table configuration) with its training step (forward,
backward, Adam), plans it on 2 Rhino M8 nodes (16 V100-32GB) — stage partition, submeshes,
SPMD sharding per stage, micro-batching, data-parallel replicas, resharding between stages,
simulated 1F1B step — and compares the plan with the best Megatron-style manual layout
(tensor parallel inside a node x pipeline x data parallel) under the same cost model. Then lowers
the plan to per-device programs, and runs a small GPT's plan on 8 GPUs on CPU threads against one
device.
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
    print(f"  {megatron.strategy}: step {weft.format_seconds(megatron.step_time)}, {megatron.throughput:.2f} samples/s, "
          f"MFU {100 * megatron.mfu:.1f}%, peak {weft.format_bytes(megatron.peak_memory)}/device "
          f"({megatron.num_microbatches} micro-batches)")
    print(f"  weft's plan: step {weft.format_seconds(plan.step_time)} -> {megatron.step_time / plan.step_time:.3f}x the Megatron layout's "
          "throughput")
    if args.json:
        with open(args.json, "w") as f:
            f.write(plan.to_json())
        assert weft.Plan.from_json(open(args.json).read()) == plan
        print(f"plan written to {args.json}")
    run_a_plan(plan, step, cluster)
    train_a_model()
    print(f"\ntotal {time.perf_counter() - t0:.1f} s")


def run_a_plan(plan, step, cluster):
    """Plans that run: lower the plan to per-device programs; then plan a small GPT on one 8-GPU
    node, lower it and execute it on CPU threads against the same training steps on one device."""
    print("\nPlans that run:")
    t0 = time.perf_counter()
    program = weft.lower(plan, step, cluster)
    ranks = program.ranks
    print(f"  the plan above lowered in {time.perf_counter() - t0:.2f} s: {len(ranks)} ranks in "
          f"{len({r['stage'] for r in ranks})} stage program(s), {max(r['num_instrs'] for r in ranks)} instructions "
          f"on the busiest rank, {len(program.buffers)} buffers")
    small = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8).train_step(optimizer="adam")
    eight = weft.Cluster.preset("M8")
    p = weft.plan(small, eight)
    program = weft.lower(p, small, eight)
    kinds = {}
    for r in range(program.num_ranks):
        for i in program.instructions(r):
            kinds[i["kind"]] = kinds.get(i["kind"], 0) + 1
    got = weft.execute(program, steps=3)
    ref = weft.execute_reference(small, steps=3)
    print(f"  a small GPT planned on {eight}: {p.strategy}, {p.num_stages} stage(s), {p.schedule}, "
          f"{p.num_microbatches} micro-batches x {p.data_parallel} replica(s); {program.num_ranks} ranks run "
          + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items(), key=lambda x: -x[1])[:6]))
    print(f"  CPU executor (ranks as threads, f64, 3 Adam steps): losses {[round(x, 6) for x in got.losses]}, "
          f"on one device {[round(x, 6) for x in ref.losses]}; largest relative difference (losses, parameters, "
          f"gradients) {got.max_relative_error(ref):.1e}")
    run_on_processes(small, ref)


def run_on_processes(small, ref):
    """The same small GPT planned on a 4-GPU node and run for real: one process per device on
    torch.distributed (gloo on this CPU; NCCL with backend="nccl" on GPUs; torchrun across nodes)."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("  (torch is not installed: skipping the run on torch.distributed processes)")
        return
    four = weft.Cluster.preset("p3.8xlarge")
    p = weft.plan(small, four)
    t0 = time.perf_counter()
    got = weft.run(p, small, four, steps=3, dtype="f64", backend="gloo")
    wall = time.perf_counter() - t0
    step_ms = [1e3 * sum(s[1:]) / max(1, len(s) - 1) for s in got.step_seconds]
    print(f"  the same GPT planned on {four}: {p.strategy}, {p.num_stages} stage(s), {p.schedule}; run as "
          f"{len(got.step_seconds)} processes on torch.distributed (gloo): losses {[round(x, 6) for x in got.losses]}; "
          f"largest relative difference to one device {got.max_relative_error(ref):.1e}; "
          f"{max(step_ms):.0f} ms per step after the first, {wall:.1f} s in all with process start-up")


def train_a_model():
    """Training for real: examples/train_char_lm.py's short version — a character-level GPT written as
    a plain torch module, trained by weft.Trainer on The Devil's Dictionary with 4 gloo processes
    under a 2-stage x 2-way tensor-parallel plan: the loss falls, then the trained module writes."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("  (torch is not installed: skipping the training run)")
        return
    import subprocess
    import sys
    from pathlib import Path

    print("\nTraining a model on its plan (weft.Trainer, 4 local processes):", flush=True)
    example = Path(__file__).resolve().parent / "train_char_lm.py"
    subprocess.run([sys.executable, str(example), "--quick", "--every", "10"], check=True)


if __name__ == "__main__":
    main()
