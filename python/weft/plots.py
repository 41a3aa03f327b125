"""Figures with matplotlib, returned as ``matplotlib.figure.Figure`` objects built with the
object-oriented API: no pyplot, no ``show()``, no change of backend, so a notebook's inline plots
keep working (a returned Figure displays itself) and a script can ``fig.savefig(path)``.

- ``plan.show(param=None)``: the cluster's devices coloured by pipeline stage (labelled with their
  mesh coordinate), the simulated step's pipeline Gantt, memory per device id against the limit,
  and one parameter's sharding on its stage mesh;
- ``spec.show()``: which device holds which block of a 1-D or 2-D tensor (strides visible);
- ``SimulationResult.plot_gantt()``: the Gantt chart alone;
- ``weft.reshard.Plan.show()``: the per-host timeline of a cross-mesh resharding plan.
"""
from __future__ import annotations

import sys
from typing import Optional

import numpy as np

_GANTT_COLORS = {"F": "#4C72B0", "B": "#55A868", "W": "#DD8452", "Opt": "#8C8C8C", "act": "#8172B3",
                 "grad": "#C44E52", "gather": "#64B5CD", "reduce": "#CCB974"}


_GANTT_NAMES = {"F": "forward", "B": "backward", "W": "weight grad", "Opt": "optimizer", "act": "activation send",
                "grad": "gradient send", "gather": "ZeRO gather", "reduce": "reduce(-scatter)"}


def _time_unit(t: float):
    """(unit, seconds per unit) for an axis reaching ``t`` seconds: min, s, ms, µs or ns."""
    t = abs(t)
    for unit, scale in (("min", 60.0), ("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if t >= scale:
            return unit, scale
    return "ns", 1e-9


def _byte_unit(n: float):
    """(unit, bytes per unit) for an axis reaching ``n`` bytes: B, kB, MB, GB or TB."""
    n = abs(n)
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return unit, scale
    return "B", 1.0


def _legend_outside(ax, handles, **kw) -> None:
    """A legend right of the axes (never over the bars), upper left corner at the axes' top right."""
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=7, **kw)


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    _ipython_png(Figure)
    return Figure(figsize=(w, h))


def _ipython_png(figure_type) -> None:
    """Inside IPython / Jupyter, make a returned Figure display itself as a PNG even when pyplot was
    never imported (IPython registers that formatter only when pyplot's inline backend loads): the
    same formatter, registered once; no backend is selected or changed."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    if shell is None:
        return
    formatter = shell.display_formatter.formatters.get("image/png")
    if formatter is None:
        return
    try:
        formatter.lookup_by_type(figure_type)
        return  # already displayable (the inline backend, or an earlier call)
    except KeyError:
        pass
    from IPython.core.pylabtools import print_figure

    formatter.for_type(figure_type, lambda fig: print_figure(fig, "png", bbox_inches="tight"))


def draw_gantt(ax, sim, show_transfers: bool = True, title: Optional[str] = None) -> None:
    """One row per device (F blue, B green, W orange, optimizer grey, labelled with the micro-batch)
    and, with ``show_transfers``, one row per directed link with its transfers. The time axis takes
    the step's unit (µs, ms, s, min); the legend, right of the axes, lists the kinds drawn."""
    from .display import _seconds

    tl = sim.raw.timeline
    D = sim.schedule.num_devices
    collective = ("gather", "reduce")  # replica collectives: a row per device's communication stream
    streams = sorted({d for (k, s, m, d, p, a, b) in tl if k in collective}) if show_transfers else []
    links = sorted({(d, p) for (k, s, m, d, p, a, b) in tl if p >= 0}) if show_transfers else []
    rows = ([f"device {d}" for d in range(D)] + [f"{d} collectives" for d in streams]
            + [f"{a}->{b}" for a, b in links])
    row_of_stream = {d: D + i for i, d in enumerate(streams)}
    row_of_link = {link: D + len(streams) + i for i, link in enumerate(links)}
    unit, scale = _time_unit(max([sim.raw.step_time] + [b for (k, s, m, d, p, a, b) in tl]))
    drawn = []
    for kind, stage, micro, dev, peer, start, end in tl:
        if (peer >= 0 or kind in collective) and not show_transfers:
            continue
        if end <= start:  # nothing to see (e.g. a free optimizer step): not drawn, not in the legend
            continue
        row = row_of_stream[dev] if kind in collective else dev if peer < 0 else row_of_link[(dev, peer)]
        ax.barh(row, (end - start) / scale, left=start / scale, height=0.8, color=_GANTT_COLORS.get(kind, "k"),
                edgecolor="white", linewidth=0.3)
        if kind not in drawn:
            drawn.append(kind)
        if peer < 0 and micro >= 0 and sim.schedule.num_micro <= 64:
            ax.text((start + end) / 2 / scale, row, str(micro), ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows)
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(title or f"{sim.schedule.name}: step {_seconds(sim.raw.step_time)}, "
                          f"bubble {sim.raw.bubble_fraction:.1%}")
    from matplotlib.patches import Patch

    order = [k for k in _GANTT_COLORS if k in drawn] + [k for k in drawn if k not in _GANTT_COLORS]
    _legend_outside(ax, [Patch(color=_GANTT_COLORS.get(k, "k"), label=f"{k} ({_GANTT_NAMES[k]})" if k in _GANTT_NAMES
                               else k) for k in order])


def gantt_figure(sim, path: Optional[str] = None, show_transfers: bool = True, title: Optional[str] = None):
    """The Gantt chart of a SimulationResult (time in s) as a matplotlib Figure (see draw_gantt)."""
    rows = sim.schedule.num_devices * (2 if show_transfers else 1)
    fig = _figure(max(8.0, 0.5 * sim.schedule.num_micro) + 2.0, 0.5 * rows + 1.5)  # + the legend's column
    draw_gantt(fig.subplots(), sim, show_transfers, title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def plot_gantt(sim, path: Optional[str] = None, *, show_transfers: bool = True, title: Optional[str] = None):
    """Draw the timeline as a Gantt chart (a matplotlib Figure, no pyplot, the backend untouched);
    save to ``path`` when given. One row per device (F blue, B green, W orange, optimizer grey,
    labelled with the micro-batch) and, when ``show_transfers``, one row per directed link with its
    transfers. ``SimulationResult.plot_gantt`` (installed by this module)."""
    return gantt_figure(sim, path, show_transfers, title)


def draw_spec(ax, spec, title: Optional[str] = None) -> None:
    """Each element of a 1-D or 2-D tensor coloured by the device (mesh position, row-major) that
    holds it; replicated axes show the first holder, partial specs are labelled."""
    shape = list(spec.tensor_shape)
    if len(shape) > 2:
        raise ValueError(f"spec.show draws 1-D and 2-D tensors, this one has shape {shape}")
    grid_shape = shape if len(shape) == 2 else [1] + shape
    owner = np.full(grid_shape, -1.0)
    mesh = list(spec.mesh_shape)
    ndev = int(np.prod(mesh))
    for pos in range(ndev - 1, -1, -1):  # position 0 drawn last: the first holder wins
        coord = list(np.unravel_index(pos, mesh)) if mesh else []
        per_dim = [list(range(n)) for n in shape]
        for d in range(len(shape)):
            per_dim[d] = [i for i in range(shape[d]) if spec.local_index(coord, d, i) >= 0]
        if len(shape) == 2:
            owner[np.ix_(per_dim[0], per_dim[1])] = pos
        else:
            owner[0, per_dim[0]] = pos
    ax.imshow(owner, cmap="tab20", vmin=0, vmax=max(ndev - 1, 1), aspect="auto", interpolation="nearest")
    if owner.size <= 256:
        for (i, j), v in np.ndenumerate(owner):
            ax.text(j, i, str(int(v)), ha="center", va="center", fontsize=6)
    ax.set_title(title or f"{spec} on mesh {mesh}" + (" (partial)" if spec.partial_count() > 1 else ""))
    ax.set_xlabel(f"dim {len(shape) - 1}")
    ax.set_ylabel("dim 0" if len(shape) == 2 else "")


def spec_figure(spec, path: Optional[str] = None):
    """Which device (mesh position, row-major) holds each element of a 1-D or 2-D tensor, as a
    matplotlib Figure (strides visible; ValueError for more dims); saved as PNG to ``path``."""
    fig = _figure(6, 3 if len(spec.tensor_shape) == 1 else 5)
    draw_spec(fig.subplots(), spec)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def _stage_replicas(plan, st) -> int:
    """Data-parallel replicas of a stage: its devices are replica-major, its mesh starts with the
    replica axis when there are several (docs/modules/plan.md)."""
    dp = int(plan.data_parallel)
    n = len(st.devices)
    return dp if dp > 1 and n % dp == 0 else 1


def _coord_text(coord) -> str:
    """A mesh coordinate as "(1,0)" for 2-D meshes, "1" for 1-D ones, "" for one device."""
    if len(coord) == 0:
        return ""
    return str(coord[0]) if len(coord) == 1 else "(" + ",".join(map(str, coord)) + ")"


def plan_figure(plan, param: Optional[str] = None, path: Optional[str] = None):
    """Devices by stage (mesh coordinate; for a ZeRO stage, the state shard each device holds), the
    pipeline Gantt, memory per device id against the limit (state, hatched when ZeRO-sharded and
    labelled with the shard, activations, transient; the unit follows the peak), and the sharding
    of ``param`` (default: the first 2-D parameter of stage 0) on its stage mesh."""
    from matplotlib.patches import Patch

    from . import _weft
    from .display import _bytes
    from .simulation import SimulationResult

    fig = _figure(15, 9)
    axes = fig.subplots(2, 2)
    # 1. devices coloured by stage, labelled with their coordinate on the stage mesh and their ZeRO shard
    ax = axes[0][0]
    devices = list(plan.devices_used)
    stage_of, coord_of, shard_of = {}, {}, {}
    for st in plan.stages:
        replicas = _stage_replicas(plan, st)
        per_replica = len(st.devices) // replicas
        group = max(1, int(st.zero_group))
        for pos, d in enumerate(st.devices):
            stage_of[d] = st.index
            coord_of[d] = tuple(int(x) for x in np.unravel_index(pos, st.mesh_shape)) if st.mesh_shape else ()
            if st.zero > 0 and replicas > 1:
                shard_of[d] = (pos // per_replica) % group, group  # replica r holds shard r mod z of its group
    zeros = {st.index: int(st.zero) for st in plan.stages}
    cols = max(1, min(8, len(devices)))
    for k, d in enumerate(devices):
        r, c = divmod(k, cols)
        s = stage_of.get(d, 0)
        ax.add_patch(_rect(c, r, s))
        label = f"dev {d}\nS{s} {_coord_text(coord_of.get(d, ()))}".rstrip()
        if d in shard_of:
            label += f"\nZeRO-{zeros[s]}\nshard {shard_of[d][0] + 1}/{shard_of[d][1]}"
        ax.text(c + 0.5, r + 0.5, label, ha="center", va="center", fontsize=7)
    ax.set_xlim(0, cols)
    ax.set_ylim((len(devices) + cols - 1) // cols, 0)
    ax.set_aspect("equal")
    ax.axis("off")
    zero_text = ", ".join(f"S{i} ZeRO-{z}" for i, z in zeros.items())
    ax.set_title(f"{len(devices)} devices: {plan.num_stages} stage(s), {plan.data_parallel} replica(s)\n{zero_text}",
                 fontsize=10)
    # 2. the simulated step
    schedule, stages, links = plan._pipeline()
    sim = SimulationResult(_weft._simulate(schedule, stages, links, 0.0, True, True), schedule)
    draw_gantt(axes[0][1], sim, show_transfers=False)
    # 3. memory per device id: state (params + grads + optimizer, hatched when ZeRO-sharded), the
    # in-flight activations, the transient rest; the axis unit follows the peak, not the limit
    ax = axes[1][0]
    total = np.asarray(plan.device_memory, dtype=float)
    by_stage = {st.index: st for st in plan.stages}
    state = np.zeros(len(devices))
    act = np.zeros(len(devices))
    for i, d in enumerate(devices):
        st = by_stage.get(stage_of.get(d, -1))
        if st is not None:  # a device of uneven shares holds more or less than its stage's peak: the
            # part above the state splits between activations and transient as the stage's does
            state[i] = min(st.static_memory, total[i])
            a, t = st.in_flight * st.activation_memory, st.transient_memory
            act[i] = (total[i] - state[i]) * (a / (a + t) if a + t > 0 else 0.0)
    rest = np.maximum(total - state - act, 0.0)
    limit = float(plan.memory_limit)
    peak = float(total.max()) if len(total) else 0.0
    show_limit = limit > 0 and limit <= 2.0 * peak  # a far-away limit would flatten the bars: it goes in the title
    unit, scale = _byte_unit(max(peak, limit if show_limit else 0.0))
    names = [str(d) for d in devices]
    over = total > limit if limit > 0 else np.zeros(len(devices), bool)
    colors = ["#C44E52" if o else "#4C72B0" for o in over]
    sharded = [d in shard_of for d in devices]
    bars = ax.bar(names, state / scale, color=colors, edgecolor="black", linewidth=0.5)
    for patch, sh in zip(bars, sharded):
        if sh:
            patch.set_hatch("//")
    ax.bar(names, act / scale, bottom=state / scale, color="#55A868", edgecolor="black", linewidth=0.5)
    ax.bar(names, rest / scale, bottom=(state + act) / scale, color="#BBBBBB", edgecolor="black", linewidth=0.5)
    for i, d in enumerate(devices):
        if d in shard_of:
            ax.text(i, state[i] / scale / 2, f"Z{zeros[stage_of[d]]}\n{shard_of[d][0] + 1}/{shard_of[d][1]}",
                    ha="center", va="center", fontsize=6, color="white")
    handles = [Patch(facecolor="#4C72B0", edgecolor="black", hatch="//" if any(sharded) else None,
                     label="state" + (" (hatched: ZeRO shard i/n)" if any(sharded) else "")),
               Patch(facecolor="#55A868", edgecolor="black", label="in-flight activations"),
               Patch(facecolor="#BBBBBB", edgecolor="black", label="transient")]
    if any(over):
        handles.append(Patch(facecolor="#C44E52", edgecolor="black", label="over the limit"))
    if show_limit:
        line = ax.axhline(limit / scale, color="k", linestyle="--", linewidth=1, label="limit")
        handles.append(line)
    _legend_outside(ax, handles)
    ax.set_xlabel("device id")
    ax.set_ylabel(f"memory ({unit})")
    ax.set_title(f"peak {_bytes(plan.peak_memory)} per device of {_bytes(limit)} usable"
                 + (f" ({100 * plan.peak_memory / limit:.2g} %)" if limit > 0 and not show_limit else ""), fontsize=10)
    # 4. one parameter's sharding on its stage mesh
    ax = axes[1][1]
    spec = _param_spec(plan, param)
    if spec is None:
        ax.axis("off")
        ax.set_title("no 1-D / 2-D parameter to draw")
    else:
        draw_spec(ax, spec[1], title=f"{spec[0]}: {spec[1]}")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def _rect(x, y, stage):
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle

    return Rectangle((x + 0.05, y + 0.05), 0.9, 0.9, color=colormaps["tab10"](stage % 10), alpha=0.6)


def _param_spec(plan, name):
    from . import _weft

    for st in plan.stages:
        for ps in st.params:
            if (name is None and len(ps.shape) == 2) or ps.name == name:
                mesh = list(st.mesh_shape)
                return ps.name, _weft.ShardingSpec.parse(ps.spec, list(ps.shape), mesh, True)
    if name is not None:
        raise ValueError(f"the plan has no parameter '{name}'")
    return None


def reshard_figure(plan, path: Optional[str] = None):
    """One row per host; one bar per transfer on its sending host's row, from ``start`` for
    ``duration`` seconds, coloured by the (first) receiving host; an intra-host copy (no receiving
    host) is hatched grey. The plan's lower bound is the dashed line."""
    from matplotlib import colormaps
    from matplotlib.patches import Patch

    d = plan.to_dict()
    hosts = sorted(int(h) for h in d["hosts"])
    row = {h: i for i, h in enumerate(hosts)}
    fig = _figure(10, 0.45 * len(hosts) + 1.8)
    ax = fig.subplots()
    cmap = colormaps["tab10"]
    for op in d["ops"]:
        dst = op["recv_hosts"]
        local = not dst
        ax.barh(row[op["send_host"]], op["duration"], left=op["start"], height=0.8,
                color="#BBBBBB" if local else cmap(dst[0] % 10), edgecolor="black", linewidth=0.3,
                hatch="//" if local else None)
        if len(d["ops"]) <= 64:
            label = "copy" if local else "→" + ",".join(map(str, dst))
            ax.text(op["start"] + op["duration"] / 2, row[op["send_host"]], label, ha="center", va="center",
                    fontsize=6)
    ax.axvline(d["lower_bound"], color="k", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(hosts)))
    ax.set_yticklabels([f"host {h} (dev {','.join(map(str, d['hosts'][str(h)]['devices']))})" for h in hosts])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    from .display import _seconds

    ax.set_title(f"{d['strategy']} + {d['balancer_used']}: {_seconds(d['completion_time'])} "
                 f"(lower bound {_seconds(d['lower_bound'])}, ratio {d['ratio']:.3f})")
    receivers = sorted({op["recv_hosts"][0] for op in d["ops"] if op["recv_hosts"]})
    ax.legend(handles=[Patch(color=cmap(h % 10), label=f"to host {h}") for h in receivers[:10]], fontsize=7,
              loc="upper right")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


def install() -> None:
    from . import _weft

    _weft.Plan.show = plan_figure
    _weft.ShardingSpec.show = spec_figure
    from .simulation import SimulationResult

    SimulationResult.plot_gantt = plot_gantt  # type: ignore[method-assign]
