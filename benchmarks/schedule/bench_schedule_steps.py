"""Simulated steps of the pipeline schedules side by side: DualPipeV against ZB-V, ZB-H1 and
1F1B on equal stages, without communication and over links whose transfer takes a given
fraction of a chunk's forward. Figures only (weft's simulator, no timing of code).

Units: F, B (input gradient), W (weight gradient) per micro-batch of one device's whole share of
the model; the V schedules (ZB-V, DualPipeV) run two chunks per device, each in half that time
(the units of torch's issue-21 figures: ZB-V 25.5 at pp 4, M 8, F = B = W = 1). 1F1B runs
B + W as one backward. A link moves a chunk's activation (or gradient) in `comm` x F / 2.

Usage: python bench_schedule_steps.py [--json]
"""
from __future__ import annotations

import argparse
import json

import weft

KINDS = ("1f1b", "zb_h1", "zbv", "dualpipev")


def step(kind: str, D: int, M: int, F: float, B: float, W: float, comm: float) -> float:
    s = weft.schedule(kind, D, M)
    v = s.virtual_stages
    split = s.split_backward
    st = weft.StageSpec(forward_time=F / v, backward_time=(B if split else B + W) / v,
                        weight_time=W / v if split else 0.0, activation_bytes=1.0)
    if comm <= 0 or D == 1:
        return weft.simulate(s, st, record_timeline=False).step_time
    # one byte per transfer: bandwidth 1 / (comm x F/2) moves it in comm x F/2 seconds
    link = weft.PipelineLink(bandwidth=1.0 / (comm * F / 2))
    return weft.simulate(s, st, link, record_timeline=False).step_time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    times = [(1.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 1.5, 0.5)]
    shapes = [(2, 4), (2, 8), (4, 8), (4, 16), (8, 16)]
    if not args.json:
        print(f"{'D':>2s} {'M':>3s} {'F,B,W':>11s} {'comm':>5s} " + " ".join(f"{k:>9s}" for k in KINDS)
              + "  dualpipev/zbv")
    for D, M in shapes:
        for F, B, W in times:
            for comm in (0.0, 0.1, 0.5):
                t = {k: step(k, D, M, F, B, W, comm) for k in KINDS}
                if args.json:
                    for k, x in t.items():
                        print(json.dumps({"bench": "schedule_steps", "case": f"{k} D={D} M={M} F,B,W={F},{B},{W} "
                                          f"comm={comm}", "metric": "step", "value": x, "unit": "F"}))
                else:
                    print(f"{D:2d} {M:3d} {F:3g},{B:3g},{W:3g} {comm:5.1f} "
                          + " ".join(f"{t[k]:9.2f}" for k in KINDS) + f"  {t['dualpipev'] / t['zbv']:13.4f}")


if __name__ == "__main__":
    main()
