"""Pipeline schedules (``weft.schedule``): static per-device orders of F/B/W ops.

``weft.schedule("kfkb", stages=8, micro_batches=32, k=2)`` builds a :class:`weft.Schedule`; see
docs/modules/schedule.md for the exact construction of each kind.
"""
from __future__ import annotations

from ._weft import Schedule, check_order

KINDS = ("gpipe", "1f1b", "kfkb", "eager_1f1b", "interleaved", "zb_h1")


def schedule(kind: str, stages: int, micro_batches: int, *, k: int = 1, v: int = 1, check: bool = False) -> Schedule:
    """Generate a pipeline schedule.

    kind: one of ``gpipe``, ``1f1b``, ``kfkb`` (group size ``k``), ``eager_1f1b``,
    ``interleaved`` (``v`` virtual stages per device: ``stages`` devices, ``stages*v`` logical
    stages; ``micro_batches`` must be a multiple of ``stages``) or ``zb_h1`` (backward split into
    B and W). With ``check=True`` the dependency and send/recv pairing checks run and a failure
    raises ValueError.
    """
    from . import _weft

    s = _weft.make_schedule(kind, stages, micro_batches, k, v)
    if check:
        c = check_order(s)
        if not c.ok:
            raise ValueError("; ".join(c.problems))
    return s
