"""The ``weft`` command line: plan, simulate, reshard, show, zoo, run, calibrate (``weft -h``).

Bad input (an unknown model, schedule or option, a missing file, an unwritable output) exits 2 with
one line on stderr, before any long work. ``-v`` / ``-vv`` log through the ``weft`` logger."""
from __future__ import annotations

import argparse
import os
import sys

# the cluster and model arguments live in _args (the runtime and the Trainer take the same specs)
from ._args import cluster_arg as _cluster_arg, cluster_spec as _cluster, graph_arg as _graph


_SUFFIX = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def _quantity(text: str, what: str, unit: str) -> float:
    """A number with an optional SI prefix and unit: "16e9", "16G", "16GB", "25GB/s" (unit B or B/s)."""
    t = text.strip()
    for u in (unit, unit.replace("/", "")):
        if u and t.endswith(u):
            t = t[: -len(u)]
            break
    prefix = t[-1:] if t[-1:] in "kKMGT" and t[-1:] != "" else ""
    try:
        value = float(t[: -1] if prefix else t) * _SUFFIX[prefix]
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a number (e.g. 16e9, 16G, 16G{unit})") from None
    return value


def _ids(text: str) -> list:
    """Device ids "0,1,2,3", ranges "0-3", or both "0-3,8-11"."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        a, sep, b = part.partition("-")
        try:
            out += list(range(int(a), int(b) + 1)) if sep else [int(a)]
        except ValueError:
            raise ValueError(f"bad device ids {text!r} (e.g. 0,1,2,3 or 0-3)") from None
    return out


def _mesh_arg(text: str, what: str):
    """A mesh "2x2" (devices 0..3), "2x2:4-7" or "2x2:4,5,6,7": shape, then its device ids in row-major order."""
    import weft

    shape_text, _, ids_text = text.partition(":")
    try:
        shape = [int(x) for x in shape_text.lower().split("x")]
    except ValueError:
        raise ValueError(f"{what}: bad mesh {text!r} (e.g. 2x2 or 2x2:4-7)") from None
    n = 1
    for x in shape:
        n *= x
    ids = _ids(ids_text) if ids_text else list(range(n))
    if len(ids) != n:
        raise ValueError(f"{what}: mesh {shape_text} has {n} devices, {len(ids)} ids given")
    return weft.DeviceMesh(shape, ids)


def _shape_arg(text: str) -> list:
    try:
        shape = [int(x) for x in text.lower().replace("x", ",").split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--shape: bad shape {text!r} (e.g. 1024,4096 or 1024x4096)") from None
    if not shape or any(x <= 0 for x in shape):
        raise ValueError(f"--shape: every dimension must be positive, got {text!r}")
    return shape


def _check_writable(path) -> None:
    """Fail before a long search, not after it."""
    if path in (None, "-"):
        return
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d) or not os.access(d, os.W_OK):
        raise ValueError(f"cannot write {path!r}: {d} is not a writable directory")


# weft plan's planner options: (flag, keyword of weft.plan, type, help). Booleans are tri-state
# (--x / --no-x; neither = the planner's default), numbers default to the planner's own.
_PLAN_OPTIONS = [
    ("--schedule-k", "schedule_k", int, "kFkB group size k"),
    ("--schedule-v", "schedule_v", int, "interleaved, zb_interleaved, kfkb_interleaved: virtual stages per device"),
    ("--num-microbatches", "num_microbatches", int, "micro-batches per step (default: searched)"),
    ("--max-microbatches", "max_microbatches", int, "largest micro-batch count searched (default: no cap)"),
    ("--num-blocks", "num_blocks", int, "layer-grouping blocks (default: auto)"),
    ("--max-stages", "max_stages", int, "most pipeline stages"),
    ("--max-data-parallel", "max_data_parallel", int, "most pipeline replicas (data parallel)"),
    ("--max-simulated", "max_simulated", int, "candidate plans simulated"),
    ("--max-logical-shapes", "max_logical_shapes", int, "logical mesh shapes tried per submesh"),
    ("--max-alternatives", "max_alternatives", int, "alternatives kept in the plan"),
    ("--level", "spmd_level", str, "SPMD search level: O2 (segments) or O3 (one ILP)"),
    ("--recompute", "recompute", str,
     "activation recomputation per stage: auto (default: the planner picks, per block where that is enough), "
     "none, selective, full"),
    ("--zero", "zero", str,
     "ZeRO level across data-parallel replicas: auto (default: the planner picks per stage), 0, 1, 2, 3 (FSDP)"),
    ("--hybrid-sharding", "hybrid_sharding", bool,
     "also shard states over one node's replicas only, replicated across nodes (default on)"),
    ("--spmd-time-limit", "spmd_time_limit", float, "seconds per SPMD search (each block on each mesh)"),
    ("--spmd-relative-gap", "spmd_relative_gap", float, "relative ILP gap accepted"),
    ("--shared-resharding", "shared_resharding", bool,
     "a tensor several readers need in one layout is resharded once (default on)"),
    ("--time-limit", "time_limit", float,
     "seconds for the whole search (then the best plan so far, marked timeout)"),
    ("--threads", "threads", int, "threads for the SPMD searches (default: all cores)"),
    ("--memory-limit", "memory_limit", "bytes", "bytes per device (e.g. 16e9 or 16GB; default: the device's)"),
    ("--memory-reserve", "memory_reserve", "bytes",
     "bytes per device kept from the plan for the CUDA context and communication buffers (default: 1 GiB on "
     "devices of 8 GiB or more, none under a --memory-limit)"),
    ("--memory-fraction", "memory_fraction", float,
     "fraction of a device's memory less the reserve the plan may use (the rest: fragmentation margin)"),
    ("--grad-bucket-bytes", "grad_bucket_bytes", "bytes", "gradient all-reduce bucket size (bytes, e.g. 25MB)"),
    ("--step-allreduce-bytes", "step_allreduce_bytes", "bytes",
     "the training loop's per-step all-reduce over every device (default 16: weft.Trainer's gradient norm "
     "and loss; 0: none, for weft.run's bare programs)"),
    ("--pipeline", "pipeline", bool, "consider pipelines (--no-pipeline: SPMD / data parallel only)"),
    ("--two-d-meshes", "two_d_meshes", bool, "2-D logical meshes inside stages (slower)"),
    ("--overlap-grad-sync", "overlap_grad_sync", bool, "overlap gradient sync with the last backward"),
    ("--whole-nodes-only", "whole_nodes_only", bool, "submeshes of whole nodes only"),
    ("--power-of-two-nodes", "power_of_two_nodes", bool, "submeshes of 2^k nodes only"),
    ("--all-node-counts", "all_node_counts", bool,
     "every node count as a submesh (default: beyond 8 nodes, powers of two and divisors of the node count)"),
    ("--bound-search", "bound_search", bool,
     "skip (micro-batch, replica) pairs whose lower bound is not below the best step found (default on)"),
    ("--uniform-partitions", "uniform_partitions", bool, "equal-block stage partitions only"),
    ("--stage-ilp", "stage_ilp", bool, "Rhino's stage ILP on non-linear block graphs"),
    ("--uneven-split", "uneven_split", bool, "mixed GPUs: Whale's uneven tensor split"),
    ("--compare-megatron", "compare_megatron", bool, "also cost the Megatron-style baseline"),
    ("--sequence-parallel", "sequence_parallel", bool,
     "Megatron's sequence parallelism in tensor-parallel stages (the residual stream split along the tokens)"),
    ("--adaptive-window", "adaptive_window", float, "with --trace / --schedule adaptive: seconds per policy window"),
    ("--adaptive-k-max", "adaptive_k_max", int, "with --trace / --schedule adaptive: largest kFkB group size"),
    ("--adaptive-duration", "adaptive_duration", float,
     "with --trace / --schedule adaptive: seconds of trace covered (default: its last change + one window)"),
    ("--adaptive-forward-overhead", "adaptive_forward_overhead", float,
     "with --trace / --schedule adaptive: fixed forward seconds per micro-batch and stage"),
    ("--adaptive-backward-overhead", "adaptive_backward_overhead", float,
     "with --trace / --schedule adaptive: fixed backward seconds per micro-batch and stage"),
]


def _plan_options(args) -> dict:
    """The weft.plan keywords the command line set (anything left unset keeps the planner's default)."""
    opts = {}
    for flag, key, kind, _ in _PLAN_OPTIONS:
        v = getattr(args, key)
        if v is None:
            continue
        if kind == "bytes":
            v = _quantity(v, flag, "B")
        if kind is int and v < 0:
            raise ValueError(f"{flag} must be >= 0, got {v}")
        if kind == "bytes" or kind is float:
            if v < 0:
                raise ValueError(f"{flag} must be >= 0, got {v}")
        opts[key] = v
    if opts.get("spmd_level") not in (None, "O2", "O3"):
        raise ValueError(f"--level must be O2 or O3, got {opts['spmd_level']!r}")
    if opts.get("recompute") not in (None, "auto", "none", "selective", "full"):
        raise ValueError(f"--recompute must be auto, none, selective or full, got {opts['recompute']!r}")
    if opts.get("zero") not in (None, "auto", "0", "1", "2", "3"):
        raise ValueError(f"--zero must be auto, 0, 1, 2 or 3, got {opts['zero']!r}")
    if args.fast:
        opts.update(whole_nodes_only=True, power_of_two_nodes=True)
    return opts


def _trace_arg(text: str):
    """--trace: a BandwidthTrace JSON file ({"times": [...], "fractions": [...]}) or
    preempted:SEED[:DURATION] (the preempted-network generator)."""
    import weft

    if text.startswith("preempted:"):
        parts = text.split(":")
        try:
            seed = int(parts[1])
            duration = float(parts[2]) if len(parts) > 2 else 600.0
        except (IndexError, ValueError):
            raise ValueError(f"--trace: expected preempted:SEED[:DURATION], got {text!r}") from None
        return weft.BandwidthTrace.preempted(seed, duration=duration)
    if not os.path.isfile(text):
        raise ValueError(f"--trace: no such file {text!r} (a trace JSON, or preempted:SEED[:DURATION])")
    with open(text) as f:
        return weft.BandwidthTrace.from_json(f.read())


def _plan(args) -> int:
    import weft

    from .planning import _schedule_name

    _check_writable(args.json)
    _schedule_name(args.schedule)  # bad names fail here, before the model is built
    opts = _plan_options(args)
    if args.calibration is not None:  # read (and checked) before the model is built
        from .planning import load_calibration

        opts["calibration"] = load_calibration(args.calibration)
    if args.trace is not None:  # read (and checked) before the model is built
        opts["bandwidth_trace"] = _trace_arg(args.trace)
    graph = _graph(args.model, args.batch, args.dtype)
    cluster = _cluster_arg(args.cluster, args.nodes)
    p = weft.plan(graph, cluster, schedule=args.schedule, progress=args.progress, verbose=args.verbose, **opts)
    # --json -: the plan on stdout (parseable), the summary on stderr.
    print(p.summary(), file=sys.stderr if args.json == "-" else sys.stdout)
    _write_json(args.json, p.to_json())
    return 0


def _write_json(dest, text: str) -> None:
    """--json: '-' prints the JSON on stdout (the human summary went to stderr), a path writes it."""
    if dest == "-":
        print(text)
    elif dest:
        from ._files import write_text

        write_text(dest, text)
        print(f"plan written to {dest}")


def _reshard(args) -> int:
    from . import reshard
    from .display import _bytes, _seconds

    _check_writable(args.json)
    _check_writable(args.out)
    shape = _shape_arg(args.shape)
    src_mesh = _mesh_arg(args.src_mesh, "--src-mesh")
    dst_mesh = _mesh_arg(args.dst_mesh, "--dst-mesh")
    bandwidth = _quantity(args.bandwidth, "--bandwidth", "B/s")
    if bandwidth <= 0:
        raise ValueError(f"--bandwidth must be positive, got {args.bandwidth!r}")
    hosts = {}
    if args.devices_per_host is not None:
        hosts["devices_per_host"] = args.devices_per_host
    elif args.cluster is not None:
        hosts["cluster"] = _cluster_arg(args.cluster, args.nodes)
    p = reshard.plan(shape, args.dtype, args.src, src_mesh, args.dst, dst_mesh, strategy=args.strategy,
                     balancer=args.balancer, seed=args.seed, bandwidth=bandwidth, **hosts)
    d = p.to_dict()
    out = sys.stderr if args.json == "-" else sys.stdout
    sent, recv = p.nic_bytes_sent(), p.nic_bytes_received()
    print(f"{shape} {args.dtype}: {args.src} on {src_mesh!r} -> {args.dst} on {dst_mesh!r}", file=out)
    print(f"{d['strategy']} + {d['balancer_used']}: {len(d['unit_tasks'])} unit tasks, {len(d['ops'])} transfers, "
          f"completion {_seconds(d['completion_time'])}, lower bound {_seconds(d['lower_bound'])} "
          f"(ratio {d['ratio']:.4f})", file=out)
    print(f"{'host':>5s} {'devices':16s} {'bandwidth':>12s} {'sent':>10s} {'received':>10s}", file=out)
    for h in sorted(d["hosts"], key=int):
        v = d["hosts"][h]
        print(f"{h:>5s} {','.join(map(str, v['devices'])):16s} {v['bandwidth'] / 1e9:>9.4g} GB/s "
              f"{_bytes(sent.get(int(h), 0)):>10s} {_bytes(recv.get(int(h), 0)):>10s}", file=out)
    _write_json(args.json, p.to_json())
    if args.out:
        p.show(path=args.out)
        print(f"timeline written to {args.out}", file=out)
    return 0


def _show(args) -> int:
    import weft

    if not os.path.exists(args.plan):
        raise ValueError(f"no such file {args.plan!r}")
    _check_writable(args.out)
    plan = weft.Plan.from_json(open(args.plan).read())
    from .display import _seconds

    plan.show(param=args.param, path=args.out)
    print(f"{plan.strategy}: step {_seconds(plan.step_time)}; figure written to {os.path.abspath(args.out)}")
    return 0


def _simulate(args) -> int:
    import weft

    _check_writable(args.out)
    aliases = {"eager": "eager_1f1b", "zb-h1": "zb_h1", "zbh1": "zb_h1", "zb-v": "zbv",
               "zb-interleaved": "zb_interleaved", "dualpipe-v": "dualpipev"}
    kind = aliases.get(args.schedule.lower(), args.schedule.lower())
    sched = weft.schedule(kind, stages=args.stages, micro_batches=args.microbatches, k=args.k, v=args.v)
    spec = weft.StageSpec(forward_time=args.forward, backward_time=args.backward, weight_time=args.weight)
    r = weft.simulate(sched, spec)
    from .display import _seconds

    print(f"{sched.name}: {args.stages} stages x {args.microbatches} micro-batches: step {_seconds(r.step_time)}, "
          f"bubble {100 * r.bubble_fraction:.1f} %, peak in-flight micro-batches {r.peak_in_flight}")
    if args.out:
        r.plot_gantt(args.out)
        print(f"Gantt chart written to {args.out}")
    return 0


def _count(n: float) -> str:
    """A parameter count with its scale: 33 M, 350 M, 1.3 B, 175 B."""
    for unit, scale in ((" B", 1e9), (" M", 1e6), (" k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def _zoo(args) -> int:
    import weft

    rows = weft.models.presets()
    if args.family:
        rows = [r for r in rows if r["family"] == args.family]
        if not rows:
            raise ValueError(f"no presets of family {args.family!r}")
    print(f"{'preset':20s} {'family':12s} {'parameters':>12s}  config")
    for r in rows:
        cfg = ", ".join(f"{k}={v}" for k, v in r["config"].items() if k not in ("name", "family"))
        print(f"{r['name']:20s} {r['family']:12s} {_count(r['named_params']):>12s}  {cfg}")
    return 0


def _calibrate(args) -> int:
    from .calibration import calibrate

    cluster = _cluster(args.cluster, 1) if args.cluster else None
    dtypes = [t.strip() for t in args.dtypes.split(",") if t.strip()] if args.dtypes else None
    report = calibrate(device=args.device, nproc=args.nproc, dtypes=dtypes, cluster=cluster, quick=args.quick,
                       threads=args.threads)
    print(report.summary())
    from ._files import write_text

    write_text(args.out, report.to_json() + "\n")  # the Calibration JSON only: weft.Calibration.from_json loads it
    print(f"calibration written to {args.out}")
    if args.report:
        write_text(args.report, report.report_json() + "\n")
        print(f"measurements written to {args.report}")
    if args.local_cluster:
        # This host as a cluster of --nproc devices priced as measured: `weft plan --cluster FILE`.
        write_text(args.local_cluster, report.local_cluster().to_json() + "\n")
        print(f"local cluster ({report.nproc} processes on this host) written to {args.local_cluster}")
    return 0


def _run(args) -> int:
    import numpy as np

    import weft

    from .runtime import describe, load_program, model_step, save_result

    program = load_program(args.plan, args.model, args.cluster)
    if args.dtype is None:  # f64 under --check: its default bound (1e-9) then holds on any model
        args.dtype = "f64" if args.check else "f32"
    dtype = None if args.dtype == "graph" else args.dtype
    print(f"running {program!r} on {program.num_ranks} local processes ({args.backend}, {args.dtype})", flush=True)
    if args.check and args.model is None:
        raise ValueError("--check needs --model (the training graph, to run on one device)")
    result = weft.run(program, nproc=args.nproc, steps=args.steps, backend=args.backend, seed=args.seed, dtype=dtype,
                      timeout_s=args.timeout, init=args.init)
    print(describe(result))
    code = 0
    bad = [i for i, x in enumerate(result.losses) if not np.isfinite(x)]
    if bad:  # a run that diverged is a failure, not a result
        hint = " (f16 without loss scaling: weft.Trainer(precision='f16-mixed') scales the loss)" if dtype == "f16" else ""
        print(f"weft run: the loss is {result.losses[bad[0]]} at step {bad[0] + 1}{hint}", file=sys.stderr)
        code = 1
    if args.check:
        if args.rtol is None:
            args.rtol = 1e-9 if dtype == "f64" else 1e-3

        import json

        with open(args.plan) as f:  # the graph the plan was lowered with (a zoo preset: at the plan's batch)
            text = f.read()
        head = json.loads(text)
        program_file = isinstance(head, dict) and str(head.get("format", "")).startswith("weft.program")
        step = model_step(args.model, None if program_file else text)
        ref = weft.execute_reference(step, steps=args.steps, seed=args.seed,
                                     dtype="f64" if dtype == "f64" else "f32", init=args.init)
        print("one device (CPU reference executor): losses " + " ".join(f"{x:.6f}" for x in ref.losses))
        what, err = result.worst(ref, atol=args.atol)
        print(f"largest relative difference (losses, parameters, gradients): {err:.3g}" + (f" at {what}" if what else ""))
        if not err <= args.rtol:  # NaN or inf fails too
            print(f"check FAILED: {what} differs by {err:.3g} (relative, atol {args.atol:g}) > --rtol {args.rtol:g}",
                  file=sys.stderr)
            code = 1
        else:
            print(f"check passed (<= --rtol {args.rtol:g})")
    if args.out:
        save_result(result, args.out)
        print(f"result written to {args.out}")
    return code


def main(argv: list[str] | None = None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(prog="weft", description=__doc__)
    parser.add_argument("--version", action="version", version=f"weft {__version__}")  # as `weft version`
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log through the 'weft' logger on stderr (-v INFO, -vv DEBUG: the planner's phases)")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", dest="sub_verbose", action="count", default=0,
                        help="as weft -v (INFO; -vv DEBUG)")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("version", parents=[common], help="print the version")
    zp = sub.add_parser("zoo", parents=[common], help="list the model zoo's presets with their sizes")
    zp.add_argument("--family", default=None, help="only this family (gpt, moe, bert, llama, wide_resnet, unet, vgg19)")
    sp = sub.add_parser("simulate", parents=[common], help="simulate a pipeline schedule with given stage times")
    sp.add_argument("--schedule", default="1F1B", help="GPipe, 1F1B, kFkB, eager-1F1B, interleaved, ZB-H1, "
                    "zb_interleaved, ZB-V, DualPipeV, kfkb_interleaved")
    sp.add_argument("--stages", type=int, default=4, help="pipeline stages (default: 4)")
    sp.add_argument("--microbatches", type=int, default=8, help="micro-batches per step (default: 8)")
    sp.add_argument("--k", type=int, default=1, help="kFkB group size")
    sp.add_argument("--v", type=int, default=1, help="virtual stages per device (interleaved schedules)")
    sp.add_argument("--forward", type=float, default=1.0, help="forward seconds per micro-batch and stage")
    sp.add_argument("--backward", type=float, default=2.0, help="backward seconds (input + weight gradient)")
    sp.add_argument("--weight", type=float, default=0.0, help="of which the weight gradient (ZB schedules)")
    sp.add_argument("--out", default=None, help="write the Gantt chart (PNG)")
    shp = sub.add_parser("show", parents=[common],
                         help="draw a saved plan (devices by stage, Gantt, memory, a parameter's sharding)")
    shp.add_argument("plan", help="a plan JSON (weft plan --json)")
    shp.add_argument("--out", default="plan.png",
                     help="the PNG to write (default: plan.png in the current directory; the path written is printed)")
    shp.add_argument("--param", default=None, help="the parameter whose sharding is drawn")
    pp = sub.add_parser("plan", parents=[common], help="plan a model on a cluster and print the plan")
    pp.add_argument("--model", default="GPT-2.7B", help="zoo preset name (weft zoo), or a graph JSON file")
    pp.add_argument("--batch", type=int, default=16, help="global batch size")
    pp.add_argument("--dtype", default="f16", help="a zoo model's dtype: f16, bf16, f32 (default: f16; a graph "
                    "JSON keeps its own)")
    pp.add_argument("--cluster", default="M8",
                    help="cluster preset name, mixed GPU kinds as PRESET:NODES+PRESET:NODES (e.g. M8:1+P100:1), "
                         "or a cluster JSON file")
    pp.add_argument("--nodes", type=int, default=1,
                    help="nodes of a preset given without :NODES (default: 1, as Cluster.preset and weft run)")
    pp.add_argument("--schedule", default="1F1B", help="1F1B, GPipe, kFkB (--schedule-k), eager-1F1B, "
                    "interleaved (--schedule-v), ZB-H1, zb_interleaved (--schedule-v), ZB-V, DualPipeV, "
                    "kfkb_interleaved, adaptive "
                    "(Ada-Grouper under --trace)")
    for flag, key, kind, help_text in _PLAN_OPTIONS:
        if kind is bool:
            pp.add_argument(flag, dest=key, action=argparse.BooleanOptionalAction, default=None, help=help_text)
        else:
            pp.add_argument(flag, dest=key, type=str if kind == "bytes" else kind, default=None, help=help_text)
    pp.add_argument("--calibration", default=None,
                    help="price the plan on the cluster as measured: the JSON `weft calibrate` writes")
    pp.add_argument("--trace", default=None,
                    help="a busy network: bandwidth trace JSON of the inter-stage links (or preempted:SEED"
                         "[:DURATION]); the plan reports Ada-Grouper's k per window (with --schedule adaptive)")
    pp.add_argument("--fast", action="store_true", help="whole-node, power-of-two submeshes only")
    # the old spelling of --no-compare-megatron, kept working and out of the help
    pp.add_argument("--no-megatron", dest="compare_megatron", action="store_const", const=False, default=None,
                    help=argparse.SUPPRESS)
    pp.add_argument("--progress", action="store_true", help="show a progress bar")
    pp.add_argument("--json", default=None, help="write the plan as JSON to this file ('-': stdout)")
    xp = sub.add_parser("reshard", parents=[common],
                         help="plan the cross-mesh resharding of one tensor (per-host transfers)")
    xp.add_argument("--shape", required=True, help="the tensor's shape, e.g. 1024,4096 or 1024x4096")
    xp.add_argument("--dtype", default="f32", help="f32, f16, bf16, f64, i32, i64")
    xp.add_argument("--src", required=True, help="source spec, e.g. 'S(0) R' or S0R")
    xp.add_argument("--src-mesh", required=True, help="source mesh: SHAPE[:IDS], e.g. 2x2 or 2x2:0-3")
    xp.add_argument("--dst", required=True, help="destination spec")
    xp.add_argument("--dst-mesh", required=True, help="destination mesh, e.g. 2x2:4-7")
    xp.add_argument("--bandwidth", default="100GB/s", help="bytes/s per host and direction (e.g. 12.5e9, 100GB/s)")
    xp.add_argument("--devices-per-host", type=int, default=None,
                    help="host of device d = d // N (default: each mesh row is a host)")
    xp.add_argument("--cluster", default=None, help="hosts and NIC bandwidths from a cluster preset or JSON")
    xp.add_argument("--nodes", type=int, default=1, help="nodes of a --cluster preset given without :NODES (default: 1)")
    xp.add_argument("--strategy", default="broadcast", help="send_recv, local_allgather, global_allgather, broadcast")
    xp.add_argument("--balancer", default="best", help="naive, largest_first, dfs, random_greedy, best")
    xp.add_argument("--seed", type=int, default=0)
    xp.add_argument("--json", default=None, help="write the plan as JSON to this file ('-': stdout)")
    xp.add_argument("--out", default=None, help="write the per-host timeline (PNG)")
    cp = sub.add_parser("calibrate", parents=[common],
                         help="time matmuls, memory-bound ops and collectives here; write a calibration")
    cp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    cp.add_argument("--nproc", type=int, default=2, help="local processes for the collectives (1 = none)")
    cp.add_argument("--quick", action="store_true", help="small shapes, short timings")
    cp.add_argument("--out", default="calibration.json", help="the calibration JSON (weft.Calibration)")
    cp.add_argument("--report", default=None, help="also write the measurements and fits as JSON to this file")
    cp.add_argument("--cluster", default=None,
                    help="preset whose link α/β the measured ones are scaled against (alpha_scale, beta_scale)")
    cp.add_argument("--dtypes", default=None, help="matmul dtypes, e.g. f32,bf16 (default: per device)")
    cp.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    cp.add_argument("--local-cluster", default=None,
                    help="also write this host as a cluster JSON of --nproc devices priced as measured "
                         "(for `weft plan --cluster FILE`)")
    rp = sub.add_parser("run", parents=[common],
                         help="run a plan (or a lowered program) on local processes with torch.distributed")
    rp.add_argument("plan", help="a program JSON, or a plan JSON (with --model and --cluster)")
    rp.add_argument("--model", default=None, help="the training graph JSON, or a zoo preset name")
    rp.add_argument("--cluster", default=None, help="a cluster JSON, or a preset spec (PRESET[:NODES])")
    rp.add_argument("--nproc", type=int, default=None, help="processes (default: the program's ranks)")
    rp.add_argument("--steps", type=int, default=3, help="training steps to run (default: 3)")
    rp.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    rp.add_argument("--dtype", default=None, help="storage dtype of every float tensor: f64, f32, bf16, f16, or "
                    "'graph' (the graph's own dtypes) (default: f32; f64 with --check, which then holds to 1e-9: in "
                    "f32, Adam turns the rounding noise of a gradient that is ~0, such as an attention key's bias, "
                    "into steps of the learning rate, and the parameters can differ by more than 1e-3)")
    rp.add_argument("--seed", type=int, default=0, help="seed of the synthetic inputs (and of parameters under "
                    "--init seed) (default: 0)")
    rp.add_argument("--timeout", type=float, default=60.0, help="seconds any wait may take")
    rp.add_argument("--check", action="store_true", help="also run the steps on one device and compare; exits 1 "
                    "when they differ by more than --rtol (NaN fails)")
    rp.add_argument("--rtol", type=float, default=None, help="--check's bound on the relative difference (default: "
                    "1e-9 in f64, 1e-3 otherwise)")
    rp.add_argument("--atol", type=float, default=1e-12, help="--check's floor under each tensor's scale")
    rp.add_argument("--init", default=None, choices=["values", "seed"], help="parameters without a value: an error "
                    "(values, the default for imported models) or drawn from the seed")
    rp.add_argument("--out", default=None, help="write the result (.npz: losses, param/..., grad/...)")
    args = parser.parse_args(argv)
    if args.cmd == "version":
        print(f"weft {__version__}")  # the same line as weft --version
        return 0
    handler = {"simulate": _simulate, "show": _show, "zoo": _zoo, "plan": _plan, "run": _run,
               "calibrate": _calibrate, "reshard": _reshard}[args.cmd]
    args.verbose = args.verbose + getattr(args, "sub_verbose", 0)
    from .log import verbosity

    try:
        from ._files import check_writable

        for opt in ("json", "out", "report"):  # every output checked before the work that fills it
            check_writable(getattr(args, opt, None), f"--{opt}")
        with verbosity(args.verbose):
            return handler(args)
    except (ValueError, TypeError, ImportError) as e:  # bad input: one line, exit 2
        print(f"weft {args.cmd}: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file that cannot be read or written: one line
        print(f"weft {args.cmd}: {e.strerror or e}" + (f": {e.filename!r}" if e.filename else ""), file=sys.stderr)
        return 1
    except RuntimeError as e:
        if args.cmd != "run":
            raise
        print(f"weft run: {e}", file=sys.stderr)  # a rank failed: its message names it and the instruction
        return 1
    except KeyboardInterrupt:
        # Searches run off the GIL and answer Ctrl-C at once; a worker thread stops at its next
        # progress report. Leave without waiting for it (no interpreter teardown under it).
        print(f"weft {args.cmd}: interrupted", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(130)


if __name__ == "__main__":
    sys.exit(main())
