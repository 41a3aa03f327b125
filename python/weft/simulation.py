"""Discrete-event simulation of pipeline schedules (``weft.simulate``), Chrome trace and Gantt chart.

Timing model (docs/modules/sim.md): one compute stream per device running its ops in the
schedule's order; each op starts when its inputs are there and the previous op ended. Activation
and gradient transfers run on separate streams, serialised per link and direction in the
sender's order, with ``latency + bytes / (bandwidth * trace fraction)`` integrated exactly over
the bandwidth trace; receives are posted ahead.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence, Union

from ._weft import BandwidthTrace, PipelineLink, Schedule, SimResult, StageSpec
from . import _weft


@dataclass(frozen=True)
class SimulationResult:
    """A :class:`SimResult` plus exports. Attribute access falls through to the C++ result."""

    raw: SimResult
    schedule: Schedule

    def __getattr__(self, name):  # step_time, bubble_fraction, peak_in_flight, peak_memory, ...
        return getattr(self.raw, name)

    def __repr__(self) -> str:
        from .display import sim_repr

        return sim_repr(self)

    def _repr_html_(self) -> str:
        """Notebook display: step time (s), bubble (%), per device busy time and peak memory (bytes)."""
        from .display import sim_html

        return sim_html(self)

    def to_chrome_trace(self, path: Optional[str] = None) -> dict:
        """The timeline as Chrome trace-event JSON (open in chrome://tracing or Perfetto).

        Model time is written as seconds (ts in microseconds). Returns the dict; writes it to
        ``path`` when given."""
        doc = json.loads(self.raw.chrome_trace_json())
        if path is not None:
            with open(path, "w") as f:
                json.dump(doc, f)
        return doc

    if TYPE_CHECKING:  # defined by weft.plots (the figures depend on the simulation, not the reverse)
        def plot_gantt(self, path: Optional[str] = None, *, show_transfers: bool = True,
                       title: Optional[str] = None) -> Any: ...


def _as_list(x, cls):
    if x is None:
        return []
    if isinstance(x, cls):
        return [x]
    return list(x)


def simulate(
    schedule: Schedule,
    stages: Union[StageSpec, Sequence[StageSpec], None] = None,
    links: Union[PipelineLink, Sequence[PipelineLink], None] = None,
    *,
    trace_offset: float = 0.0,
    check_pairing: bool = True,
    record_timeline: bool = True,
    replica_trace: Optional[BandwidthTrace] = None,
) -> SimulationResult:
    """Simulate one training step of ``schedule``.

    stages: one StageSpec for all stages or one per logical stage (default: F=1, B=2, no bytes).
    links: none (no communication cost), one for every device boundary, or one per boundary
    (link d joins device d and d+1; interleaved schedules on more than two devices also need link
    D-1 joining D-1 and 0). trace_offset: absolute trace time at simulation time 0.
    A stage's ``replica`` collectives (``ReplicaCollectives``: ZeRO's gathers and reduce-scatters,
    the gradient all-reduce) run on each device's communication stream; ``replica_trace`` slows them.
    A cyclic order is reported (``deadlock`` True, ``deadlock_report``), not raised.
    """
    st = _as_list(stages, StageSpec) or [StageSpec()]
    ln = _as_list(links, PipelineLink)
    raw = _weft._simulate(schedule, st, ln, trace_offset, check_pairing, record_timeline,
                          replica_trace if replica_trace is not None else BandwidthTrace())
    return SimulationResult(raw, schedule)
