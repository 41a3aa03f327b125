"""Values without copies: a GPT built on torch.device("meta") imports allocating nothing; its weights,
given as a safetensors file (weft.load_values(step, path): referenced, not read), are loaded by 4
ranks of a plan, each reading only its tiles, peaking at <= its shard + the largest tensor
(issue 34). Prints, per rank: its shard, the largest tensor, the peak resident memory the loading
added (VmHWM after clear_refs: anonymous and file-mapped pages both), and that peak over the bound.

    PYTHONPATH=python python3 benchmarks/frontend/bench_values.py [--preset GPT-XL] [--t 4 --d 1]

GPT-XL is the 1.3 B GPT (24 layers, hidden 2048, vocabulary 50257): the value file is 5.3 GB (f32;
written once to --file, reused after). Linux only (/proc/self/status).
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_import import Gpt  # noqa: E402 (the nanoGPT-style module of the import benchmark)

import weft  # noqa: E402
from weft.runtime.rank import ValueFiles  # noqa: E402


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def _rank(program_json: str, rank: int, out) -> None:
    torch.set_num_threads(1)
    program = weft.Program.from_json(program_json)
    layout = weft._weft.ProgramLayout(program)
    g = program.graph
    stage = program.ranks[rank]["stage"]
    files = ValueFiles()
    leaves = sorted((b for b in program.leaf_buffer_ids if program.buffers[b]["stage"] == stage),
                    key=lambda b: -int(np.prod(program.buffers[b]["shape"] or [1])))  # as RankRuntime fills them
    plan_bytes, largest = 0, 0
    todo = []
    for b in leaves:
        t = program.buffers[b]["tensor_id"]
        src = g.value_source(t)
        if not isinstance(src, tuple):
            continue
        tile = layout.tile(b, rank)
        plan_bytes += 4 * int(np.prod(tile["local_shape"]))
        largest = max(largest, 4 * int(np.prod(g.tensor(t)["shape"])))
        todo.append((b, src, tile["global"]))
    held = []
    float(torch.ones(1 << 16).sum())  # torch's first kernel (its one-time setup) outside the measure
    with open(todo[0][1][0], "rb") as f:  # so is the safetensors reader's
        f.read(8)
    files.tile(todo[0][1][0], todo[-1][1][1], todo[-1][2])
    base = _status("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    for b, (path, key), glob in todo:
        x = files.tile(path, key, glob).to(torch.float32)
        float(x.sum())  # touched, as a step would: the pages of the tile are resident and counted
        held.append(x)
    seconds = time.perf_counter() - t0
    peak = _status("VmHWM") - base
    got = sum(x.numel() * x.element_size() for x in held)
    out.put((rank, len(todo), plan_bytes, got, largest, peak, seconds))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="GPT-XL")
    ap.add_argument("--file", default="/tmp/weft_bench_values_{preset}.safetensors")
    ap.add_argument("--t", type=int, default=1, help="tensor-parallel degree of the plan (4 ranks: t x d)")
    ap.add_argument("--d", type=int, default=4, help="data-parallel degree (ZeRO-3 when > 1: every parameter sharded)")
    a = ap.parse_args(argv)
    c = weft.models.preset_config(a.preset)
    with torch.device("meta"):
        m = Gpt(c["layers"], c["hidden"], c["heads"], c["seq"], c["vocab"])
        idx = torch.randint(0, c["vocab"], (8, c["seq"]))
        tgt = torch.randint(0, c["vocab"], (8, c["seq"]))
    base = _status("VmRSS")
    _reset_peak()
    t0 = time.perf_counter()
    g = weft.from_torch(m, (idx, tgt))
    t1 = time.perf_counter()
    print(f"{a.preset}: {g.num_params() / 1e9:.3f} B parameters; meta import {t1 - t0:.2f} s, peak added "
          f"{(_status('VmHWM') - base) / 2**20:.1f} MiB (the graph: {len(g.ops)} ops), values carried: "
          f"{len(g.value_names)}")
    path = a.file.format(preset=a.preset)
    if not os.path.exists(path):
        from safetensors.torch import save_file

        gen = torch.Generator().manual_seed(0)
        state = {n: 0.02 * torch.randn(p.shape, generator=gen) for n, p in m.named_parameters()}
        save_file(state, path)
        del state
        print(f"wrote {path} ({os.path.getsize(path) / 2**30:.2f} GiB)")
    step = g.train_step(optimizer="adam")
    base = _status("VmRSS")
    _reset_peak()
    weft.load_values(step, path)
    print(f"weft.load_values(step, file): peak added {(_status('VmHWM') - base) / 2**20:.1f} MiB "
          f"({len(step.value_names)} values referenced)")
    cluster = weft.Cluster.preset("p3.8xlarge")
    plan = weft.megatron_plan(step, cluster, t=a.t, p=1, d=a.d, zero=3 if a.d > 1 else 0)
    program = weft.lower(plan, step, cluster)
    print(f"plan: megatron t={a.t} d={a.d}{' ZeRO-3' if a.d > 1 else ''}, {program.num_ranks} ranks")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(program.to_json(), r, q)) for r in range(program.num_ranks)]
    for p in procs:
        p.start()
    rows = []
    while len(rows) < len(procs):
        try:
            rows.append(q.get(timeout=5))
        except Exception:  # noqa: BLE001 (queue.Empty): a rank that died says nothing
            dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                raise SystemExit(f"rank(s) {dead} died (exit codes {[procs[r].exitcode for r in dead]}; -9: killed, "
                                 "out of memory?)")
    rows.sort()
    for p in procs:
        p.join()
    print(f"{'rank':>4} {'tensors':>7} {'shard MiB':>10} {'largest MiB':>12} {'peak MiB':>9} {'peak/bound':>10} "
          f"{'seconds':>8}")
    worst = 0.0
    for rank, n, shard, got, largest, peak, secs in rows:
        assert got == shard, (got, shard)
        ratio = peak / (shard + largest)
        worst = max(worst, ratio)
        print(f"{rank:>4} {n:>7} {shard / 2**20:>10.1f} {largest / 2**20:>12.1f} {peak / 2**20:>9.1f} {ratio:>10.3f} "
              f"{secs:>8.2f}")
    print(f"largest peak / (shard + largest tensor): {worst:.3f} (target <= 1)")


if __name__ == "__main__":
    main()
