"""Ada-Grouper: adaptive kFkB under a memory limit and a changing network.

``frontier`` lists, for each k, the largest micro-batch size that fits (the memory-limit curve);
``tune`` picks the candidate with the shortest simulated step for the given links (a window of
the bandwidth trace, read from ``t0``); ``drive`` replays a long trace, re-tuning at iteration
boundaries. Model and policies: docs/modules/sim.md.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

from ._weft import BandwidthTrace, Candidate, DriverResult, PipelineLink, StageModel, TuneResult
from . import _weft


def frontier(stages: Sequence[StageModel], global_batch: int, memory_limit: float, k_max: int = 8) -> List[Candidate]:
    """(k, b) candidates on the memory-limit curve: for each k <= k_max the largest b dividing
    ``global_batch`` whose peak memory static + min(M, k(S-s))*b*act fits on every stage."""
    return _weft.adagrouper_frontier(list(stages), global_batch, memory_limit, k_max)


def tune(candidates: Sequence[Candidate], stages: Sequence[StageModel], links: Sequence[PipelineLink], t0: float = 0.0,
         *, replica_trace: Optional[BandwidthTrace] = None) -> TuneResult:
    """Simulate every candidate from absolute trace time ``t0``; ``best`` is the shortest step.
    ``replica_trace`` slows the stages' replica collectives (``StageModel(replica=...)``)."""
    return _weft.adagrouper_tune(list(candidates), list(stages), list(links), t0,
                                 replica_trace if replica_trace is not None else BandwidthTrace())


def drive(
    candidates: Sequence[Candidate],
    stages: Sequence[StageModel],
    links: Sequence[PipelineLink],
    *,
    start: float = 0.0,
    until: float = 600.0,
    retune_every: int = 1,
    estimate: str = "lookahead",
    window: float = 10.0,
    fixed: Optional[int] = None,
    max_iterations: int = 100000,
    replica_trace: Optional[BandwidthTrace] = None,
) -> DriverResult:
    """Replay the links' traces from ``start`` until ``until``, iteration after iteration.

    ``estimate='lookahead'``: the tuner sees the true trace from the iteration start;
    ``'past_mean'``: it sees each link's mean fraction over the last ``window`` seconds.
    ``fixed=i`` runs candidate i throughout (a fixed-k baseline). ``replica_trace`` slows the stages'
    replica collectives as the links' traces slow the links."""
    return _weft.adagrouper_drive(
        list(candidates), list(stages), list(links), start, until, max_iterations, retune_every, estimate, window,
        -1 if fixed is None else fixed, replica_trace if replica_trace is not None else BandwidthTrace(),
    )
