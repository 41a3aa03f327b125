"""A training script as a user writes it for torchrun (test_trainer.py starts it on two launchers):
weft.distributed.init() from torchrun's environment, then test_trainer's TinyLlama trained by
weft.Trainer under Megatron t=2 x p=2; rank 0 writes the losses, grad norms and trained weights."""
import sys

import numpy as np

import weft
from test_trainer import train

if __name__ == "__main__":
    weft.distributed.init(backend="gloo", timeout_s=120)
    got = train(["t2p2"])[0]
    if weft.distributed.rank() == 0:
        arrays = {"losses": np.asarray(got["losses"]), "norms": np.asarray(got["norms"])}
        arrays.update({f"param/{k}": v for k, v in got["state"].items()})
        np.savez(sys.argv[1], **arrays)
