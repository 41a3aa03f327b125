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
    and, with ``show_transfers``, one row per directed link with its transfers."""
    tl = sim.raw.timeline
    D = sim.schedule.num_devices
    collective = ("gather", "reduce")  # replica collectives: a row per device's communication stream
    streams = sorted({d for (k, s, m, d, p, a, b) in tl if k in collective}) if show_transfers else []
    links = sorted({(d, p) for (k, s, m, d, p, a, b) in tl if p >= 0}) if show_transfers else []
    rows = ([f"device {d}" for d in range(D)] + [f"{d} collectives" for d in streams]
            + [f"{a}->{b}" for a, b in links])
    row_of_stream = {d: D + i for i, d in enumerate(streams)}
    row_of_link = {link: D + len(streams) + i for i, link in enumerate(links)}
    for kind, stage, micro, dev, peer, start, end in tl:
        if (peer >= 0 or kind in collective) and not show_transfers:
            continue
        row = row_of_stream[dev] if kind in collective else dev if peer < 0 else row_of_link[(dev, peer)]
        ax.barh(row, end - start, left=start, height=0.8, color=_GANTT_COLORS.get(kind, "k"), edgecolor="white",
                linewidth=0.3)
        if peer < 0 and micro >= 0 and sim.schedule.num_micro <= 64:
            ax.text((start + end) / 2, row, str(micro), ha="center", va="center", fontsize=6, color="white")
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels(rows)
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    ax.set_title(title or f"{sim.schedule.name}: step {sim.raw.step_time:.4g} s, bubble {sim.raw.bubble_fraction:.1%}")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=k) for k, c in _GANTT_COLORS.items()], loc="upper right", fontsize=7,
              ncol=6)


def gantt_figure(sim, path: Optional[str] = None, show_transfers: bool = True, title: Optional[str] = None):
    """The Gantt chart of a SimulationResult (time in s) as a matplotlib Figure (see draw_gantt)."""
    rows = sim.schedule.num_devices * (2 if show_transfers else 1)
    fig = _figure(max(8.0, 0.5 * sim.schedule.num_micro), 0.5 * rows + 1.5)
    draw_gantt(fig.subplots(), sim, show_transfers, title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    return fig


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


def plan_figure(plan, param: Optional[str] = None, path: Optional[str] = None):
    """Devices by stage, the pipeline Gantt, memory per device id against the limit, and the
    sharding of ``param`` (default: the first 2-D parameter of stage 0) on its stage mesh."""
    from . import _weft
    from .simulation import SimulationResult

    fig = _figure(14, 9)
    axes = fig.subplots(2, 2)
    # 1. devices coloured by stage, labelled with their coordinate on the stage mesh
    ax = axes[0][0]
    devices = list(plan.devices_used)
    stage_of, coord_of = {}, {}
    for st in plan.stages:
        for pos, d in enumerate(st.devices):
            stage_of[d] = st.index
            coord_of[d] = tuple(int(x) for x in np.unravel_index(pos, st.mesh_shape)) if st.mesh_shape else ()
    cols = max(1, min(8, len(devices)))
    for k, d in enumerate(devices):
        r, c = divmod(k, cols)
        ax.add_patch(_rect(c, r, stage_of.get(d, 0)))
        ax.text(c + 0.5, r + 0.5, f"{d}\nS{stage_of.get(d, 0)} {coord_of.get(d, '')}", ha="center", va="center",
                fontsize=7)
    ax.set_xlim(0, cols)
    ax.set_ylim((len(devices) + cols - 1) // cols, 0)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"{len(devices)} devices: {plan.num_stages} stage(s), {plan.data_parallel} replica(s)")
    # 2. the simulated step
    schedule, stages, links = plan._pipeline()
    sim = SimulationResult(_weft._simulate(schedule, stages, links, 0.0, True, True), schedule)
    draw_gantt(axes[0][1], sim, show_transfers=False)
    # 3. memory per device id
    ax = axes[1][0]
    mem = np.asarray(plan.device_memory, dtype=float) / 1e9
    ax.bar([str(d) for d in devices], mem,
           color=["#4C72B0" if m * 1e9 <= plan.memory_limit else "#C44E52" for m in mem])
    if plan.memory_limit > 0:
        ax.axhline(plan.memory_limit / 1e9, color="k", linestyle="--", linewidth=1, label="limit")
        ax.legend(fontsize=7)
    ax.set_xlabel("device id")
    ax.set_ylabel("memory (GB)")
    ax.set_title(f"peak {plan.peak_memory / 1e9:.3g} GB per device")
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
    ax.set_title(f"{d['strategy']} + {d['balancer_used']}: {d['completion_time']:.4g} s "
                 f"(lower bound {d['lower_bound']:.4g} s, ratio {d['ratio']:.3f})")
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
