"""weft.training: train the user's own torch module on a weft plan, in the user's own loop.

- :class:`Trainer` — rank-local (torchrun or :func:`launch`): ``step(batch)`` with the global batch,
  the optimizer applied to each rank's shards, ``full_state_dict()`` back into the module;
  ``save(path)`` / ``load(path)``: torch.distributed.checkpoint in torch's key layout, loadable
  under another plan or world size (:mod:`weft.training.checkpoint`);
- :mod:`weft.optim` — SGD, Adam, AdamW with parameter groups; LambdaLR-style schedules;
- :mod:`weft.distributed` — ``init()`` from torchrun's environment, ``launch(fn, nproc)``.

torch is imported when a Trainer is made or a process launched: ``import weft`` stays torch-free.
"""
from __future__ import annotations

from . import distributed, optim
from .distributed import launch

__all__ = ["Trainer", "distributed", "optim", "launch"]


def __getattr__(name):
    if name == "Trainer":
        from .trainer import Trainer

        return Trainer
    raise AttributeError(name)
