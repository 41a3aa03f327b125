"""Pipeline schedules (``weft.schedule``): static per-device orders of F/B/W ops.

``weft.schedule("kfkb", stages=8, micro_batches=32, k=2)`` builds a :class:`weft.Schedule`; see
docs/modules/schedule.md for the exact construction of each kind.
"""
from __future__ import annotations

from ._weft import Schedule, check_order

KINDS = ("gpipe", "1f1b", "kfkb", "eager_1f1b", "interleaved", "zb_h1", "zb_interleaved", "zbv",
         "dualpipev", "kfkb_interleaved")


def schedule(kind: str, stages: int, micro_batches: int, *, k: int = 1, v: int = 1, check: bool = False) -> Schedule:
    """Generate a pipeline schedule.

    kind: one of ``gpipe``, ``1f1b``, ``kfkb`` (group size ``k``), ``eager_1f1b``,
    ``interleaved`` (``v`` virtual stages per device: ``stages`` devices, ``stages*v`` logical
    stages; ``micro_batches`` at least ``stages`` when ``v > 1``), ``zb_h1`` (backward split into
    B and W), ``zb_interleaved`` (interleaved zero bubble: ``v`` chunks per device, B/W split),
    ``zbv`` (ZB-V: ``2*stages`` logical stages in the V placement, device d holding stages d and
    ``2*stages-1-d``, B/W split), ``dualpipev`` (DualPipeV, torch's ScheduleDualPipeV: the same
    V placement, overlapped pairs of F and whole backward of the other chunk; whole backwards are
    B then W at once) or ``kfkb_interleaved`` (interleaved 1F1B over groups of ``k``
    micro-batches; needs ``ceil(micro_batches/k) >= stages`` when ``v > 1``). ``stages`` is the
    number of devices; see ``Schedule.placement`` for where each logical stage runs. With
    ``check=True`` the dependency and send/recv pairing checks run and a failure raises
    ValueError.
    """
    from . import _weft

    s = _weft.make_schedule(kind, stages, micro_batches, k, v)
    if check:
        c = check_order(s)
        if not c.ok:
            raise ValueError("; ".join(c.problems))
    return s
