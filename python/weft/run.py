"""Run a plan under torchrun, one process per rank (across nodes as torchrun does):

    torchrun --nproc-per-node 4 -m weft.run plan.json --model step.json --cluster cluster.json \\
        [--steps 3] [--backend gloo|nccl] [--dtype f32] [--seed 0] [--out result.npz]

``plan.json``: a lowered program (``Program.to_json``), or a plan (``Plan.to_json``) that every rank
lowers with ``--model`` (a graph JSON, or a zoo preset name) and ``--cluster`` (a cluster JSON, or a
preset spec such as ``p3.8xlarge`` / ``M8:2``). Rank 0 prints the losses and per-rank step times and
writes ``--out`` (losses, parameters, gradients, step_seconds). A failing rank prints its error
(naming the rank and the instruction) and exits 1; torchrun stops the others.

(Invoked as ``python -m weft.run``; in Python, ``weft.run`` is the function that starts local
processes itself.)
"""
from __future__ import annotations

import argparse
import datetime
import os
import signal
import sys
import types


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m weft.run", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plan", help="a program JSON, or a plan JSON (with --model and --cluster)")
    ap.add_argument("--model", default=None, help="the training graph JSON, or a zoo preset name")
    ap.add_argument("--cluster", default=None, help="a cluster JSON, or a preset spec (PRESET[:NODES])")
    ap.add_argument("--steps", type=int, default=3, help="training steps to run (default: 3)")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--dtype", default="f32", help="storage dtype of every float tensor: f64, f32, bf16, f16, or "
                    "'graph' (the graph's own dtypes) (default: f32)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic inputs (and of parameters under "
                    "--init seed) (default: 0)")
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds any wait may take")
    ap.add_argument("--out", default=None, help="rank 0 writes the result here (.npz)")
    ap.add_argument("--init", default=None, choices=["values", "seed"],
                    help="parameters without a value: an error (values) or drawn from the seed")
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    rank = int(os.environ.get("RANK", "-1"))
    world = int(os.environ.get("WORLD_SIZE", "0"))
    if rank < 0 or world < 1:
        print("python -m weft.run: RANK / WORLD_SIZE are not set: launch it with torchrun "
              "(or use `weft run --nproc N`, which starts the processes itself)", file=sys.stderr)
        return 2
    # torchrun stops the other ranks (SIGTERM) when one fails: each still says why it ends.
    def stopped(signum, frame):
        print(f"weft.run: rank {rank}: stopped: the launcher ended this rank (another rank failed)",
              file=sys.stderr, flush=True)
        os._exit(1)

    signal.signal(signal.SIGTERM, stopped)
    try:
        import torch.distributed as dist

        from .runtime import describe, load_program, save_result
        from .runtime.launch import check_options, device_for, run_rank

        dtype = None if args.dtype == "graph" else args.dtype
        program = load_program(args.plan, args.model, args.cluster)
        check_options(program, world, args.steps, args.backend, dtype, args.timeout)
        from .runtime.launch import check_values

        check_values(program, args.init, None)
        device = device_for(args.backend, int(os.environ.get("LOCAL_RANK", rank)))
        dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
        result = run_rank(program, steps=args.steps, seed=args.seed, dtype=dtype, device=device, init=args.init)
        if result is not None:
            print(describe(result), flush=True)
            if args.out:
                save_result(result, args.out)
                print(f"result written to {args.out}", flush=True)
        code = 0
    except Exception as e:  # noqa: BLE001 - every rank reports its own failure
        print(f"weft.run: rank {rank}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        code = 1
    sys.stdout.flush()
    # Leave at once: tearing down a process group whose peers failed can block.
    os._exit(code)


class _CallableModule(types.ModuleType):
    """``import weft.run`` binds this module where the package had the function weft.run; calling the
    module calls the function, so both spellings keep working."""

    def __call__(self, *args, **kwargs):
        from .runtime import run

        return run(*args, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
else:
    sys.modules[__name__].__class__ = _CallableModule
