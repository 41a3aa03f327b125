"""The main job: a real model from the zoo on a real cluster shape, summarised.

Builds GPT-2.7B (Rhino/Alpa table configuration) with its training step (forward, backward,
Adam) and prints its size, FLOPs and the cluster it is meant for (2 Rhino M8 nodes).
"""
import argparse

import weft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model", default="GPT-2.7B")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--cluster", default="M8")
    ap.add_argument("--nodes", type=int, default=2)
    args = ap.parse_args()

    fwd = weft.models.build(args.model, batch=args.batch, dtype="f16")
    step = fwd.train_step(optimizer="adam")
    cluster = weft.Cluster.preset(args.cluster, nodes=args.nodes)
    print(f"weft {weft.__version__}")
    print(f"model   {fwd!r}")
    print(f"        {fwd.num_params() / 1e9:.2f} B parameters, {fwd.param_bytes() / 2**30:.1f} GiB of weights")
    print(f"        training step: {step!r}")
    print(f"        {fwd.training_flops() / 1e12:.1f} TFLOPs per step (batch {args.batch})")
    print(f"cluster {cluster}")


if __name__ == "__main__":
    main()
