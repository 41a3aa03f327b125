"""Rich notebook displays: ``_repr_html_`` for the objects a user looks at in Jupyter — a compact
table of the key figures, with units (Plan, Graph, Cluster, DeviceMesh, ShardingSpec, Program,
ExecutionResult). Text only: no figure, no change to matplotlib's state."""
from __future__ import annotations

from html import escape
from typing import Iterable, Sequence, Tuple

from . import _weft

_STYLE = "border-collapse:collapse;font-family:monospace;font-size:12px"
_CELL = "border:1px solid #ccc;padding:2px 6px;text-align:left"


def _table(title: str, rows: Iterable[Tuple[str, object]], extra: str = "") -> str:
    body = "".join(f"<tr><th style='{_CELL}'>{escape(str(k))}</th><td style='{_CELL}'>{escape(str(v))}</td></tr>"
                   for k, v in rows)
    return f"<div><b>{escape(title)}</b><table style='{_STYLE}'>{body}</table>{extra}</div>"


def _grid(header: Sequence[str], rows: Iterable[Sequence[object]], limit: int = 12) -> str:
    rows = list(rows)
    head = "".join(f"<th style='{_CELL}'>{escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td style='{_CELL}'>{escape(str(c))}</td>" for c in r) + "</tr>"
                   for r in rows[:limit])
    more = f"<tr><td style='{_CELL}' colspan='{len(header)}'>... {len(rows) - limit} more</td></tr>" \
        if len(rows) > limit else ""
    return f"<table style='{_STYLE}'><tr>{head}</tr>{body}{more}</table>"


def _bytes(n: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def plan_html(p) -> str:
    rows = [("model", p.model), ("cluster", p.cluster), ("strategy", p.strategy),
            ("schedule", f"{p.schedule}, {p.num_microbatches} micro-batches × {p.microbatch_size} samples, "
                         f"{p.data_parallel} replica(s)"),
            ("step time", f"{p.step_time:.4g} s (bubble {100 * p.bubble_fraction:.1f} %)"),
            ("throughput", f"{p.throughput:.4g} samples/s"), ("MFU", f"{100 * p.mfu:.1f} %"),
            ("peak memory", f"{_bytes(p.peak_memory)} per device (limit {_bytes(p.memory_limit)})"),
            ("planned in", f"{p.plan_seconds:.3g} s")]
    stages = _grid(["stage", "blocks", "devices", "mesh", "parameters"],
                   [(s.index, f"{s.first_block}-{s.last_block}", ",".join(map(str, s.devices)),
                     "x".join(map(str, s.mesh_shape)), len(s.params)) for s in p.stages])
    return _table("weft.Plan", rows, stages)


def graph_html(g) -> str:
    ops = g.ops
    kinds = {}
    for o in ops:
        kinds[o["kind"]] = kinds.get(o["kind"], 0) + 1
    rows = [("name", g.name), ("tensors", len(g.tensors)), ("ops", len(ops)),
            ("parameters", f"{g.num_params() / 1e6:.4g} M ({_bytes(g.param_bytes())})"),
            ("forward FLOPs", f"{g.forward_flops():.4g}"), ("training FLOPs", f"{g.training_flops():.4g}"),
            ("op kinds", ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda x: -x[1])))]
    return _table("weft.Graph", rows)


def cluster_html(c) -> str:
    devs = c.devices
    kinds = {}
    for d in devs:
        kinds[d.kind] = kinds.get(d.kind, 0) + 1
    rows = [("cluster", repr(c)), ("nodes", c.num_nodes), ("devices", c.num_devices),
            ("device kinds", ", ".join(f"{n}× {k}" for k, n in kinds.items())), ("homogeneous", c.homogeneous)]
    return _table("weft.Cluster", rows)


def mesh_html(m) -> str:
    rows = [("shape", "x".join(map(str, m.shape))), ("devices", ",".join(map(str, m.device_ids)))]
    return _table("weft.DeviceMesh", rows)


def spec_html(s) -> str:
    rows = [("spec", str(s)), ("tensor shape", list(s.tensor_shape)), ("mesh shape", list(s.mesh_shape)),
            ("tile at coordinate 0", list(s.local_shape([0] * len(s.mesh_shape)))), ("DTensor", s.to_dtensor())]
    return _table("weft.ShardingSpec", rows)


def program_html(p) -> str:
    ranks = p.ranks
    rows = [("ranks", p.num_ranks), ("stages", len({r["stage"] for r in ranks})), ("buffers", len(p.buffers)),
            ("instructions", f"{sum(r['num_instrs'] for r in ranks)} (busiest rank "
                             f"{max(r['num_instrs'] for r in ranks)})")]
    grid = _grid(["rank", "device", "stage", "coord", "instructions"],
                 [(r["rank"], r["device"], r["stage"], tuple(r["coord"]), r["num_instrs"]) for r in ranks])
    return _table("weft.Program", rows, grid)


def result_html(r) -> str:
    rows = [("losses", ", ".join(f"{x:.6g}" for x in r.losses)), ("parameters", len(r.parameters)),
            ("wall time", f"{r.seconds:.3g} s")]
    if r.peak_bytes:
        rows += [("ranks", len(r.peak_bytes)), ("bytes sent", _bytes(r.total_bytes_sent)),
                 ("peak live bytes", f"max {_bytes(max(r.peak_bytes))} per rank")]
    if r.step_seconds:
        rows.append(("step time", f"max over ranks {max(max(s) for s in r.step_seconds) * 1e3:.3g} ms"))
    return _table("weft.ExecutionResult", rows)


def install() -> None:
    _weft.Plan._repr_html_ = plan_html
    _weft.Graph._repr_html_ = graph_html
    _weft.Cluster._repr_html_ = cluster_html
    _weft.DeviceMesh._repr_html_ = mesh_html
    _weft.ShardingSpec._repr_html_ = spec_html
    _weft.Program._repr_html_ = program_html
    from .execution import ExecutionResult

    ExecutionResult._repr_html_ = result_html
