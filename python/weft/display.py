"""Rich notebook displays: ``_repr_html_`` for the objects a user looks at in Jupyter — a compact
table of the key figures, with units (Plan, Graph, Cluster, DeviceMesh, ShardingSpec, Program,
ExecutionResult, Schedule, SimulationResult, weft.reshard.Plan, SpmdResult), and a short one-line
``__repr__`` for the ones whose C++ repr is not already one. Text only: no figure, no change to
matplotlib's state."""
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
    """A size in bytes with a readable unit (B, kB, MB, GB, TB; powers of 1000): the C++ summaries'
    own formatting (core/units.hpp)."""
    return _weft.format_bytes(float(n))


def _seconds(t: float) -> str:
    """A time with a readable unit (ns, µs, ms, s, min): 1.59 s, never 1.59e+03 ms."""
    return _weft.format_seconds(float(t))


def plan_html(p) -> str:
    rows = [("model", p.model), ("cluster", p.cluster), ("strategy", p.strategy),
            ("schedule", f"{p.schedule}, {p.num_microbatches} micro-batches × {p.microbatch_size} samples, "
                         f"{p.data_parallel} replica(s)"),
            ("step time", f"{_seconds(p.step_time)} (bubble {100 * p.bubble_fraction:.1f} %)"),
            ("throughput", f"{p.throughput:.4g} samples/s"), ("MFU", f"{100 * p.mfu:.1f} %"),
            ("peak memory", f"{_bytes(p.peak_memory)} per device (limit {_bytes(p.memory_limit)})"),
            ("planned in", _seconds(p.plan_seconds))]
    stages = _grid(["stage", "blocks", "devices", "mesh", "parameters"],
                   [(s.index, f"{s.first_block}-{s.last_block}", ",".join(map(str, s.devices)),
                     "x".join(map(str, s.mesh_shape)), len(s.params)) for s in p.stages])
    return _table("weft.Plan", rows, stages)


def plan_repr(p) -> str:
    """One line, times and sizes in a readable unit (the C++ repr printed 0.001217 s, 0.0013 GB)."""
    return (f"Plan({p.model} on {p.cluster}: {p.strategy}, {p.num_stages} stage(s), {p.schedule} x{p.num_microbatches} "
            f"micro-batches of {p.microbatch_size}, step {_seconds(p.step_time)}, {p.throughput:.4g} samples/s, "
            f"MFU {100 * p.mfu:.1f}%, peak {_bytes(p.peak_memory)}/device)")


def stage_repr(s) -> str:
    return (f"PlanStage({s.index}: blocks {s.first_block}-{s.last_block} on {len(s.devices)} devices, mesh "
            f"({'x'.join(map(str, s.mesh_shape))}), F {_seconds(s.forward_time)} B {_seconds(s.backward_time)}, "
            f"peak {_bytes(s.peak_memory)}" + (f", ZeRO-{s.zero} over {s.zero_group}" if s.zero else "") + ")")


def graph_html(g) -> str:
    """A forward graph (its forward and training FLOPs) or a training step (its FLOPs per step: a
    training graph has no separate forward count, and training_flops() would raise)."""
    ops = g.ops
    kinds = {}
    for o in ops:
        kinds[o["kind"]] = kinds.get(o["kind"], 0) + 1
    rows = [("name", g.name), ("tensors", len(g.tensors)), ("ops", len(ops)),
            ("parameters", f"{g.num_params() / 1e6:.4g} M ({_bytes(g.param_bytes())})")]
    if _weft.is_training_graph(g):
        rows += [("kind", "training step (forward + backward + optimizer)"),
                 ("FLOPs per step", f"{g.forward_flops():.4g}")]
    else:
        rows += [("forward FLOPs", f"{g.forward_flops():.4g}")]
        try:
            rows.append(("training FLOPs", f"{g.training_flops():.4g}"))
        except ValueError:  # no loss: no backward to count
            pass
    rows.append(("op kinds", ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda x: -x[1]))))
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
            ("wall time", _seconds(r.seconds))]
    if r.peak_bytes:
        rows += [("ranks", len(r.peak_bytes)), ("bytes sent", _bytes(r.total_bytes_sent)),
                 ("peak live bytes", f"max {_bytes(max(r.peak_bytes))} per rank")]
    if r.step_seconds:
        rows.append(("step time", f"max over ranks {_seconds(max(max(s) for s in r.step_seconds))}"))
    return _table("weft.ExecutionResult", rows)


def schedule_html(s) -> str:
    """A pipeline schedule: kind, stages / devices / micro-batches, ops, and per device the first
    ops of its order."""
    order = s.order
    peak = s.peak_in_flight()
    rows = [("schedule", s.name), ("logical stages", s.num_stages), ("devices", s.num_devices),
            ("micro-batches", s.num_micro), ("virtual stages per device", s.virtual_stages),
            ("backward split (B / W)", s.split_backward), ("ops", s.num_ops),
            ("peak in-flight micro-batches", f"{max(peak) if peak else 0} (per stage {list(peak)})")]
    if not s.default_placement:  # e.g. ZB-V's V shape; the default is stage s on device s mod D
        rows.append(("placement (device of each stage)", list(s.placement)))
    grid = _grid(["device", "ops", "order (kind, stage, micro-batch)"],
                 [(d, len(o), " ".join(f"{k}{st}.{m}" for k, st, m in o[:12]) + (" ..." if len(o) > 12 else ""))
                  for d, o in enumerate(order)])
    return _table("weft.Schedule", rows, grid)


def schedule_repr(s) -> str:
    return f"Schedule({s.name}, {s.num_stages} stages on {s.num_devices} devices, {s.num_micro} micro-batches)"


def sim_html(r) -> str:
    """A simulated step: step time, bubble, peak in-flight micro-batches and memory, per device busy time."""
    raw = r.raw
    rows = [("schedule", r.schedule.name), ("step time", _seconds(raw.step_time)),
            ("bubble", f"{100 * raw.bubble_fraction:.1f} %"),
            ("peak in-flight micro-batches", max(raw.peak_in_flight_device) if raw.peak_in_flight_device else 0),
            ("tasks", raw.num_tasks), ("deadlock", raw.deadlock_report if raw.deadlock else "no")]
    grid = _grid(["device", "busy", "utilisation", "peak in-flight", "peak memory"],
                 [(d, _seconds(b), f"{100 * b / raw.step_time:.1f} %" if raw.step_time > 0 else "-",
                   raw.peak_in_flight_device[d] if d < len(raw.peak_in_flight_device) else "-",
                   _bytes(raw.peak_memory[d]) if d < len(raw.peak_memory) else "-")
                  for d, b in enumerate(raw.busy_time)])
    return _table("weft.SimulationResult", rows, grid)


def sim_repr(r) -> str:
    raw = r.raw
    return (f"SimulationResult({r.schedule.name}: step {_seconds(raw.step_time)}, "
            f"bubble {100 * raw.bubble_fraction:.1f} %, {raw.num_tasks} tasks"
            + (", DEADLOCK" if raw.deadlock else "") + ")")


def reshard_html(p) -> str:
    """A cross-mesh resharding plan: time against the lower bound, strategy, bytes per host."""
    d = p.to_dict()
    ops = d["ops"]
    remote = [o for o in ops if o["recv_hosts"]]
    sent, recv = p.nic_bytes_sent(), p.nic_bytes_received()
    rows = [("tensors", len(p._tensors)),
            ("shapes", "; ".join(f"{list(t[0])} {t[1]}: {t[2]} -> {t[4]}" for t in p._tensors[:4])
             + (" ..." if len(p._tensors) > 4 else "")),
            ("strategy", f"{d['strategy']} (balancer {d['balancer_used']})"),
            ("completion time", _seconds(d["completion_time"])), ("lower bound", _seconds(d["lower_bound"])),
            ("ratio to the bound", f"{d['ratio']:.4f}"), ("unit tasks", len(d["unit_tasks"])),
            ("transfers", f"{len(remote)} across hosts ({_bytes(sum(o['bytes'] for o in remote))}), "
                          f"{len(ops) - len(remote)} local copies")]
    hosts = d["hosts"]
    grid = _grid(["host", "devices", "bandwidth", "sent", "received", "ops"],
                 [(h, ",".join(map(str, v["devices"])), f"{v['bandwidth'] / 1e9:.4g} GB/s", _bytes(sent.get(int(h), 0)),
                   _bytes(recv.get(int(h), 0)), len(v["ops"]))
                  for h, v in sorted(hosts.items(), key=lambda kv: int(kv[0]))])
    return _table("weft.reshard.Plan", rows, grid)


def reshard_repr(p) -> str:
    return (f"reshard.Plan({len(p._tensors)} tensor(s), {len(p.ops)} transfers, {p.strategy}, "
            f"{_seconds(p.completion_time)}, {p.ratio:.3f}x the lower bound)")


def spmd_html(r) -> str:
    """An SPMD search result: predicted cost split, peak memory, ILP size, parameter specs."""
    d = r.report.to_dict()
    rows = [("mesh", f"{'x'.join(map(str, r.mesh.shape))} over devices {','.join(map(str, r.mesh.device_ids))}"),
            ("cost per step", f"{_seconds(r.cost)} (compute {_seconds(r.compute_time)}, "
                              f"communication {_seconds(r.comm_time)})"),
            ("peak memory", f"{_bytes(r.peak_memory)} per device (limit {_bytes(d.get('memory_limit', 0))})"),
            ("search", f"{d.get('status', '?')}, gap {100 * d.get('gap', 0.0):.2g} %, "
                       f"{_seconds(d.get('total_seconds', 0.0))}"),
            ("ILP", f"{d.get('nodes', 0)} nodes, {d.get('strategies', 0)} strategies, "
                    f"{d.get('ilp_variables', 0)} variables, {d.get('ilp_constraints', 0)} constraints")]
    grid = _grid(["parameter", "shape", "spec", "bytes per device"],
                 [(q["name"], list(q["shape"]), q["spec"], _bytes(q["bytes_per_device"])) for q in d.get("params", [])])
    return _table("weft.SpmdResult", rows, grid)


def install() -> None:
    _weft.Plan._repr_html_ = plan_html
    _weft.Plan.__repr__ = plan_repr
    _weft.PlanStage.__repr__ = stage_repr
    _weft.Graph._repr_html_ = graph_html
    _weft.Cluster._repr_html_ = cluster_html
    _weft.DeviceMesh._repr_html_ = mesh_html
    _weft.ShardingSpec._repr_html_ = spec_html
    _weft.Program._repr_html_ = program_html
    from .execution import ExecutionResult

    ExecutionResult._repr_html_ = result_html
    _weft.Schedule._repr_html_ = schedule_html
    _weft.Schedule.__repr__ = schedule_repr
    # SimulationResult, weft.reshard.Plan and SpmdResult are Python classes: their methods call
    # sim_html / reshard_html / spmd_html themselves.
