"""The ``weft`` command line."""
from __future__ import annotations

import argparse
import os
import sys


def _cluster(text: str, nodes: int):
    """"M8" (``nodes`` nodes) or a mixed cluster "M8:1+P100:2" (preset:nodes, joined in order)."""
    import weft

    parts = [p.strip() for p in text.replace(",", "+").split("+") if p.strip()]
    if not parts:
        raise ValueError(f"--cluster: empty cluster {text!r}")
    cluster = None
    for part in parts:
        name, _, count = part.partition(":")
        try:
            n = int(count) if count else nodes
        except ValueError:
            raise ValueError(f"--cluster: bad node count in {part!r} (expected PRESET:NODES)") from None
        c = weft.Cluster.preset(name, nodes=n)
        cluster = c if cluster is None else weft.Cluster.concat(cluster, c)
    return cluster


def _graph(model: str, batch: int, dtype: str):
    """A zoo preset name, or a graph JSON file (its own batch and dtypes)."""
    import weft

    if model.endswith(".json") or os.path.sep in model:
        if not os.path.exists(model):
            raise ValueError(f"--model: no such file {model!r}")
        return weft.Graph.from_json(open(model).read())
    return weft.models.build(model, batch=batch, dtype=dtype)


def _cluster_arg(text: str, nodes: int):
    """A cluster JSON file, or a preset spec (see _cluster)."""
    import weft

    if text.endswith(".json") or os.path.sep in text:
        if not os.path.exists(text):
            raise ValueError(f"--cluster: no such file {text!r}")
        return weft.Cluster.from_json(open(text).read())
    return _cluster(text, nodes)


def _check_writable(path) -> None:
    """Fail before a long search, not after it."""
    if path in (None, "-"):
        return
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d) or not os.access(d, os.W_OK):
        raise ValueError(f"cannot write {path!r}: {d} is not a writable directory")


def _plan(args) -> int:
    import weft

    _check_writable(args.json)
    graph = _graph(args.model, args.batch, args.dtype)
    cluster = _cluster_arg(args.cluster, args.nodes)
    opts = {}
    if args.num_microbatches:
        opts["num_microbatches"] = args.num_microbatches
    if args.max_stages:
        opts["max_stages"] = args.max_stages
    if args.num_blocks:
        opts["num_blocks"] = args.num_blocks
    if args.fast:
        opts.update(whole_nodes_only=True, power_of_two_nodes=True)
    p = weft.plan(graph, cluster, schedule=args.schedule, progress=args.progress, time_limit=args.time_limit,
                  compare_megatron=not args.no_megatron, **opts)
    # --json -: the plan on stdout (parseable), the summary on stderr.
    print(p.summary(), file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json == "-":
        print(p.to_json())
    elif args.json:
        with open(args.json, "w") as f:
            f.write(p.to_json())
        print(f"plan written to {args.json}")
    return 0


def _show(args) -> int:
    import weft

    if not os.path.exists(args.plan):
        raise ValueError(f"no such file {args.plan!r}")
    _check_writable(args.out)
    plan = weft.Plan.from_json(open(args.plan).read())
    plan.show(param=args.param, path=args.out)
    print(f"{plan.strategy}: step {plan.step_time:.4g} s; figure written to {args.out}")
    return 0


def _simulate(args) -> int:
    import weft

    _check_writable(args.out)
    kind = {"eager": "eager_1f1b", "zb-h1": "zb_h1", "zbh1": "zb_h1"}.get(args.schedule.lower(), args.schedule.lower())
    sched = weft.schedule(kind, stages=args.stages, micro_batches=args.microbatches, k=args.k, v=args.v)
    spec = weft.StageSpec(forward_time=args.forward, backward_time=args.backward, weight_time=args.weight)
    r = weft.simulate(sched, spec)
    print(f"{sched.name}: {args.stages} stages x {args.microbatches} micro-batches: step {r.step_time:.6g} s, "
          f"bubble {100 * r.bubble_fraction:.1f} %, peak in-flight micro-batches {r.peak_in_flight}")
    if args.out:
        r.plot_gantt(args.out)
        print(f"Gantt chart written to {args.out}")
    return 0


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
        print(f"{r['name']:20s} {r['family']:12s} {r['named_params'] / 1e9:>10.2f} B  {cfg}")
    return 0


def _calibrate(args) -> int:
    from .calibration import calibrate

    cluster = _cluster(args.cluster, 1) if args.cluster else None
    dtypes = [t.strip() for t in args.dtypes.split(",") if t.strip()] if args.dtypes else None
    report = calibrate(device=args.device, nproc=args.nproc, dtypes=dtypes, cluster=cluster, quick=args.quick,
                       threads=args.threads)
    print(report.summary())
    with open(args.out, "w") as f:  # the Calibration JSON only: weft.Calibration.from_json loads it
        f.write(report.to_json() + "\n")
    print(f"calibration written to {args.out}")
    if args.report:
        with open(args.report, "w") as f:
            f.write(report.report_json() + "\n")
        print(f"measurements written to {args.report}")
    return 0


def _run(args) -> int:
    import weft

    from .runtime import describe, load_program, save_result

    program = load_program(args.plan, args.model, args.cluster)
    dtype = None if args.dtype == "graph" else args.dtype
    print(f"running {program!r} on {program.num_ranks} local processes ({args.backend}, {args.dtype})", flush=True)
    result = weft.run(program, nproc=args.nproc, steps=args.steps, backend=args.backend, seed=args.seed, dtype=dtype,
                      timeout_s=args.timeout)
    print(describe(result))
    if args.check:
        if args.model is None:
            raise ValueError("--check needs --model (the training graph, to run on one device)")
        from .planning import _training_graph

        ref = weft.execute_reference(_training_graph(_graph(args.model, 1, "f32")), steps=args.steps, seed=args.seed,
                                     dtype="f64" if dtype == "f64" else "f32")
        print("one device (CPU reference executor): losses " + " ".join(f"{x:.6f}" for x in ref.losses))
        print(f"largest relative difference (losses, parameters, gradients): {result.max_relative_error(ref):.3g}")
    if args.out:
        save_result(result, args.out)
        print(f"result written to {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(prog="weft", description=__doc__)
    parser.add_argument("--version", action="version", version=f"weft {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("version", help="print the version")
    zp = sub.add_parser("zoo", help="list the model zoo's presets with their sizes")
    zp.add_argument("--family", default=None, help="only this family (gpt, moe, bert, wresnet, unet, vgg)")
    sp = sub.add_parser("simulate", help="simulate a pipeline schedule with given stage times")
    sp.add_argument("--schedule", default="1F1B", help="GPipe, 1F1B, kFkB, eager-1F1B, interleaved, ZB-H1")
    sp.add_argument("--stages", type=int, default=4)
    sp.add_argument("--microbatches", type=int, default=8)
    sp.add_argument("--k", type=int, default=1, help="kFkB group size")
    sp.add_argument("--v", type=int, default=1, help="interleaved virtual stages")
    sp.add_argument("--forward", type=float, default=1.0, help="forward seconds per micro-batch and stage")
    sp.add_argument("--backward", type=float, default=2.0, help="backward seconds (input + weight gradient)")
    sp.add_argument("--weight", type=float, default=0.0, help="of which the weight gradient (ZB schedules)")
    sp.add_argument("--out", default=None, help="write the Gantt chart (PNG)")
    shp = sub.add_parser("show", help="draw a saved plan (devices by stage, Gantt, memory, a parameter's sharding)")
    shp.add_argument("plan", help="a plan JSON (weft plan --json)")
    shp.add_argument("--out", default="plan.png", help="the PNG to write")
    shp.add_argument("--param", default=None, help="the parameter whose sharding is drawn")
    pp = sub.add_parser("plan", help="plan a model on a cluster and print the plan")
    pp.add_argument("--model", default="GPT-2.7B", help="zoo preset name (weft zoo), or a graph JSON file")
    pp.add_argument("--batch", type=int, default=16, help="global batch size")
    pp.add_argument("--dtype", default="f16")
    pp.add_argument("--cluster", default="M8",
                    help="cluster preset name, mixed GPU kinds as PRESET:NODES+PRESET:NODES (e.g. M8:1+P100:1), "
                         "or a cluster JSON file")
    pp.add_argument("--nodes", type=int, default=2, help="nodes of a preset given without :NODES")
    pp.add_argument("--schedule", default="1F1B")
    pp.add_argument("--num-microbatches", type=int, default=0, help="0 = auto")
    pp.add_argument("--num-blocks", type=int, default=0, help="layer-grouping blocks, 0 = auto")
    pp.add_argument("--max-stages", type=int, default=0)
    pp.add_argument("--time-limit", type=float, default=600.0, help="seconds")
    pp.add_argument("--fast", action="store_true", help="whole-node, power-of-two submeshes only")
    pp.add_argument("--no-megatron", action="store_true", help="skip the Megatron-style baseline")
    pp.add_argument("--progress", action="store_true", help="show a progress bar")
    pp.add_argument("--json", default=None, help="write the plan as JSON to this file ('-': stdout)")
    cp = sub.add_parser("calibrate", help="time matmuls, memory-bound ops and collectives here; write a calibration")
    cp.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    cp.add_argument("--nproc", type=int, default=2, help="local processes for the collectives (1 = none)")
    cp.add_argument("--quick", action="store_true", help="small shapes, short timings")
    cp.add_argument("--out", default="calibration.json", help="the calibration JSON (weft.Calibration)")
    cp.add_argument("--report", default=None, help="also write the measurements and fits as JSON to this file")
    cp.add_argument("--cluster", default=None,
                    help="preset whose link α/β the measured ones are scaled against (alpha_scale, beta_scale)")
    cp.add_argument("--dtypes", default=None, help="matmul dtypes, e.g. f32,bf16 (default: per device)")
    cp.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    rp = sub.add_parser("run", help="run a plan (or a lowered program) on local processes with torch.distributed")
    rp.add_argument("plan", help="a program JSON, or a plan JSON (with --model and --cluster)")
    rp.add_argument("--model", default=None, help="the training graph JSON, or a zoo preset name")
    rp.add_argument("--cluster", default=None, help="a cluster JSON, or a preset spec (PRESET[:NODES])")
    rp.add_argument("--nproc", type=int, default=None, help="processes (default: the program's ranks)")
    rp.add_argument("--steps", type=int, default=3)
    rp.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    rp.add_argument("--dtype", default="f32", help="f64, f32, bf16, f16, or 'graph' (the graph's dtypes)")
    rp.add_argument("--seed", type=int, default=0)
    rp.add_argument("--timeout", type=float, default=60.0, help="seconds any wait may take")
    rp.add_argument("--check", action="store_true", help="also run the steps on one device and compare")
    rp.add_argument("--out", default=None, help="write the result (.npz: losses, param/..., grad/...)")
    args = parser.parse_args(argv)
    if args.cmd == "version":
        print(__version__)
        return 0
    handler = {"simulate": _simulate, "show": _show, "zoo": _zoo, "plan": _plan, "run": _run,
               "calibrate": _calibrate}[args.cmd]
    try:
        return handler(args)
    except (ValueError, TypeError, ImportError) as e:  # bad input: one line, exit 2
        print(f"weft {args.cmd}: {e}", file=sys.stderr)
        return 2
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
