"""weft's runtime against PyTorch's own engines, on the same imported GPT, in the same processes.

One GPT, written below as a plain torch ``nn.Module`` (learned token and position embeddings,
pre-LN blocks with separate Q, K, V projections and CAUSAL softmax attention written out
(matmul, mask, softmax), a GELU MLP, a final LayerNorm and an UNTIED head; the forward returns the
mean cross-entropy), is trained from the same initial weights (deep copies of one seeded model),
on the same batches (random tokens seeded per step, the same on every rank), with Adam in f32
(``torch.optim.Adam`` / ``weft.optim.Adam``, the same hyper-parameters), one optimizer step per
global batch, by weft.Trainer on a plan and by its torch peer:

* ``dp``: ``weft.data_parallel_plan`` (B / world samples per process) vs torch DDP;
* ``zero3``: ``weft.megatron_plan(t=1, p=1, d=world, zero=3)`` vs FSDP2 (``fully_shard`` on every
  block and on the root);
* ``tp``: ``weft.megatron_plan(t=world, p=1, d=1)`` vs DTensor (``parallelize_module`` on a 1-D mesh
  of the world: ColwiseParallel on Q, K, V and the first MLP linear, RowwiseParallel on the
  attention's output projection and the second MLP linear; embeddings, LayerNorms and the head
  REPLICATED, each process computing them on the whole batch);
* ``pp2`` / ``pp4``: ``weft.megatron_plan(t=1, p=world, d=1, num_microbatches=M, schedule="1f1b")``
  with M = 2 / 4 vs ``torch.distributed.pipelining`` (a manual split: ``PipelineStage`` per rank,
  the blocks divided evenly, the embeddings on the first stage, the final LayerNorm and the head on
  the last) with ``Schedule1F1B`` and the same M (torch refuses 1F1B with fewer micro-batches
  than stages: then ``ScheduleGPipe``, which 1F1B is when M < stages; the figure says so);
* ``single``: one process (a separate launch): weft.Trainer on the one-device plan
  (``megatron_plan(t=1, p=1, d=1)``) vs eager torch in that process.

In each launch the cases run in the same processes, alternating: every step, each of weft's and
torch's runs of every case, in an order rotated by one each step, each between two barriers (a
step is the slowest rank's). Figures per case: the median step seconds of weft and of torch over
the timed steps, the ratio weft / torch with the issue's target as the baseline (1.05 for dp and
zero3, 1.10 for tp and the pipelines, 1.0 for one device), the global loss of both at the last
step and their relative difference (the largest over all steps too), weft's collective launches
per step (its program's collectives, a gradient bucket counted once, plus the Trainer's one
all-reduce of the global gradient norm and loss; a pipeline's sends and receives are not counted)
and torch's (the gloo collectives torch.profiler sees in one more step; DDP's include the broadcast
of the module's buffers before every forward). The torch side's step is what a torch user
writes (forward, backward, ``opt.step()``); its global loss is gathered outside the timed region.
weft's Trainer runs with ``check_batch=False`` (its per-step check that every rank was given the
same batch is one more small all-reduce that torch does not do) and no clipping (it still reduces
the gradient norm every step, as its metrics report it).

    PYTHONPATH=python:build/<dir>/python python3 benchmarks/runtime/bench_vs_torch.py --config medium
        [--nproc 2] [--steps 10] [--warmup 2] [--cases dp,zero3,tp,pp2,pp4,single]
        [--precision f32|f64] [--profile tp] [--save benchmarks/data/bench_vs_torch_<date>.txt] [--json]

Configs: ``medium`` 4 layers x 256 hidden, 4 heads, seq 128, vocab 4096, global batch 16, 2
processes; ``small`` 4 x 128, 4 heads, seq 64, vocab 2048, batch 8, 4 processes. ``--profile CASE``:
after the timed steps, a few more weft steps of CASE on rank 0 under cProfile and with every
instruction timed by kind (compute by op kind), printed (and saved) as the breakdown of weft's step.
A case that cannot be built (a torch API missing, weft refusing the plan) is printed as skipped with
the reason. With --json, one JSON object per figure: {"bench","case","metric","value","unit","baseline"}.
"""
import argparse
import copy
import cProfile
import datetime
import io
import json
import math
import os
import platform
import pstats
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import weft

ROOT = Path(__file__).resolve().parents[2]

CONFIGS = {
    "medium": dict(layers=4, hidden=256, heads=4, seq=128, vocab=4096, batch=16, nproc=2),
    "small": dict(layers=4, hidden=128, heads=4, seq=64, vocab=2048, batch=8, nproc=4),
}
TARGETS = {"dp": 1.05, "zero3": 1.05, "tp": 1.10, "pp2": 1.10, "pp4": 1.10, "single": 1.0}
PEERS = {"dp": "DDP", "zero3": "FSDP2", "tp": "DTensor TP", "pp2": "torch pipelining", "pp4": "torch pipelining",
         "single": "eager torch"}
MULTI = ("dp", "zero3", "tp", "pp2", "pp4")


# ---- the model: plain torch

class Attention(nn.Module):
    def __init__(self, d, heads, seq):
        super().__init__()
        self.hd = d // heads
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.proj = nn.Linear(d, d)
        self.register_buffer("causal", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def forward(self, x):
        b, s, _ = x.shape
        # -1 heads: under DTensor's ColwiseParallel the local projections hold heads / world heads
        q, k, v = (f(x).view(b, s, -1, self.hd).transpose(1, 2) for f in (self.q, self.k, self.v))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        att = att.masked_fill(~self.causal, float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, d, heads, seq):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(d), Attention(d, heads, seq)
        self.ln2, self.mlp = nn.LayerNorm(d), MLP(d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embed(nn.Module):
    def __init__(self, vocab, d, seq):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)

    def forward(self, tokens):
        return self.tok(tokens) + self.pos.weight  # every sequence has the full length


class GPT(nn.Module):
    def __init__(self, layers, hidden, heads, seq, vocab):
        super().__init__()
        self.embed = Embed(vocab, hidden, seq)
        self.blocks = nn.ModuleList(Block(hidden, heads, seq) for _ in range(layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def logits(self, tokens):
        x = self.embed(tokens)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))

    def forward(self, tokens, targets):
        return lm_loss(self.logits(tokens), targets)


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Stage(nn.Module):
    """A pipeline stage of the GPT for torch.distributed.pipelining: its blocks (the embedding on the
    first stage, the final LayerNorm and the head on the last)."""

    def __init__(self, gpt, lo, hi, first, last):
        super().__init__()
        self.embed = gpt.embed if first else None
        self.blocks = nn.ModuleList(gpt.blocks[lo:hi])
        self.ln_f = gpt.ln_f if last else None
        self.head = gpt.head if last else None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x)) if self.head is not None else x


def batch_of(step, cfg):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=g)
    y = torch.randint(cfg["vocab"], (cfg["batch"], cfg["seq"]), generator=g)
    return x, y


# ---- the torch peers: each a (step(batch) -> local loss or None, global_loss(local) -> float)

def plain_step(m, adam):
    """One eager training step of ``m`` with torch.optim.Adam: the loss (detached)."""
    opt = torch.optim.Adam(m.parameters(), **adam)

    def step(batch):
        opt.zero_grad(set_to_none=True)
        loss = m(*batch)
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def torch_peer(case, model, cfg, args, rank, world):
    """The torch side of ``case`` on a deep copy of ``model``: (step, loss) where step(batch) runs one
    training step and returns what loss(value) turns into the global batch's loss (a collective)."""
    m = copy.deepcopy(model)
    adam = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    share = cfg["batch"] // world

    def mean_over_world(v):
        t = torch.tensor([float(v)], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t) / world

    if case == "single":
        return plain_step(m, adam), float
    if case in ("dp", "zero3"):
        if case == "dp":
            m = torch.nn.parallel.DistributedDataParallel(m)
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("cpu", (world,))
            for blk in m.blocks:
                fully_shard(blk, mesh=mesh)
            fully_shard(m, mesh=mesh)
        opt = torch.optim.Adam(m.parameters(), **adam)

        def step(batch):
            x, y = (t[rank * share:(rank + 1) * share] for t in batch)
            opt.zero_grad(set_to_none=True)
            loss = m(x, y)
            loss.backward()
            opt.step()
            return loss.detach()

        return step, mean_over_world
    if case == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        if cfg["heads"] % world:
            raise ValueError(f"{cfg['heads']} heads are not divisible by {world} processes")
        mesh = init_device_mesh("cpu", (world,))
        tp = {}
        for i in range(len(m.blocks)):
            for n in ("attn.q", "attn.k", "attn.v", "mlp.fc1"):
                tp[f"blocks.{i}.{n}"] = ColwiseParallel()
            for n in ("attn.proj", "mlp.fc2"):
                tp[f"blocks.{i}.{n}"] = RowwiseParallel()
        parallelize_module(m, mesh, tp)
        return plain_step(m, adam), float  # the loss is replicated: every process computes it on the whole batch
    if case in ("pp2", "pp4"):
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

        mb = int(case[2:])
        layers = len(m.blocks)
        if layers % world:
            raise ValueError(f"{layers} blocks do not split evenly over {world} stages")
        per = layers // world
        stage_mod = Stage(m, rank * per, (rank + 1) * per, rank == 0, rank == world - 1)
        stage = PipelineStage(stage_mod, rank, world, torch.device("cpu"))
        cls = Schedule1F1B if mb >= world else ScheduleGPipe
        sched = cls(stage, mb, loss_fn=lm_loss)
        opt = torch.optim.Adam(stage_mod.parameters(), **adam)

        def step(batch):
            x, y = batch
            opt.zero_grad(set_to_none=True)
            if rank == 0:
                sched.step(x)
                out = None
            elif rank == world - 1:
                losses = []
                sched.step(target=y, losses=losses)
                out = torch.stack([v.detach() for v in losses]).mean()  # equal micro-batches
            else:
                sched.step()
                out = None
            opt.step()
            return out

        def loss(v):  # the last stage's, to every rank
            t = torch.tensor([float(v) if v is not None else 0.0], dtype=torch.float64)
            dist.all_reduce(t)
            return float(t)

        step.schedule = cls.__name__
        return step, loss
    raise ValueError(f"unknown case {case!r}")


def cluster_of(n):
    """p3.8xlarge's node with n of its 4 GPUs (megatron_plan's t·p·d must equal the devices)."""
    text = weft.Cluster.preset("p3.8xlarge").to_json()
    assert '"num_devices":4' in text
    return weft.Cluster.from_json(text.replace('"num_devices":4', f'"num_devices":{n}'))


def weft_plan(case, graph, cluster, cfg, world):
    if case == "single":
        return weft.megatron_plan(graph, cluster, t=1, p=1, d=1)
    if case == "dp":
        return weft.data_parallel_plan(graph, cluster, [cfg["batch"] // world] * world)
    if case == "zero3":
        return weft.megatron_plan(graph, cluster, t=1, p=1, d=world, zero=3)
    if case == "tp":
        return weft.megatron_plan(graph, cluster, t=world, p=1, d=1)
    if case in ("pp2", "pp4"):
        return weft.megatron_plan(graph, cluster, t=1, p=world, d=1, num_microbatches=int(case[2:]), schedule="1f1b")
    raise ValueError(f"unknown case {case!r}")


def weft_calls(trainer):
    """weft's collective launches per step: the program's (a bucket once) + the norm/loss all-reduce."""
    n = max(1, trainer.steps_done)
    kinds = {k: v / n for k, v in sorted(trainer.engine.comm.calls.items())}
    if trainer.world > 1:
        kinds["norm+loss all-reduce"] = 1
    return sum(kinds.values()), ", ".join(f"{k} {v:g}" for k, v in kinds.items())


def torch_collectives(step, batch):
    """The torch side's collective launches in one more step (torch.profiler's gloo events): (count, by kind)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return 0, ""
    from torch.profiler import profile

    with profile() as prof:
        step(batch)
    kinds = defaultdict(int)
    for e in prof.events():
        if e.name.startswith("gloo:"):
            kinds[e.name[5:]] += 1
    return sum(kinds.values()), ", ".join(f"{k} {v}" for k, v in sorted(kinds.items()))


def profile_weft(trainer, cfg, steps):
    """A few more steps of ``trainer`` on rank 0: seconds per instruction kind (compute by op kind)
    and cProfile's top functions. Returns the text."""
    eng = trainer.engine
    spent, count = defaultdict(float), defaultdict(int)
    inner = eng.execute

    def timed(ins, step):
        kind = ins["kind"]
        if kind == "compute":
            kind = "compute " + eng.ops[ins["op"]]["kind"]
        t0 = time.perf_counter()
        inner(ins, step)
        spent[kind] += time.perf_counter() - t0
        count[kind] += 1

    eng.execute = timed
    inner_bucket = eng.execute_bucket

    def timed_bucket(instrs):
        t0 = time.perf_counter()
        inner_bucket(instrs)
        spent["bucket (all-reduces)"] += time.perf_counter() - t0
        count["bucket (all-reduces)"] += 1

    eng.execute_bucket = timed_bucket
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for i in range(steps):
        trainer.step(batch_of(10_000 + i, cfg))
    prof.disable()
    total = time.perf_counter() - t0
    eng.execute, eng.execute_bucket = inner, inner_bucket
    lines = [f"weft step breakdown on rank 0 ({steps} steps, {total / steps:.4f} s per step under the profiler; "
             f"{len(eng.instrs)} instructions per step; seconds per step by instruction kind):"]
    for k, v in sorted(spent.items(), key=lambda kv: -kv[1]):
        lines.append(f"  {k:36s} {v / steps:9.4f} s  {count[k] / steps:6.0f} per step  "
                     f"{1e6 * v / max(1, count[k]):9.1f} us each")
    lines.append(f"  {'(sum of instructions)':36s} {sum(spent.values()) / steps:9.4f} s")
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(18)
    lines.append("cProfile, by own time (tottime):")
    lines += ["  " + ln for ln in s.getvalue().splitlines() if ln.strip()][3:]
    return "\n".join(lines)


def run(args, cases):
    """One process of a launch. Rank 0 returns the figures of ``cases``: a step is timed from a barrier
    before it to a barrier after it, so it is the slowest rank's."""
    cfg = args.cfg
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = GPT(cfg["layers"], cfg["hidden"], cfg["heads"], cfg["seq"], cfg["vocab"])
    if args.precision == "f64":
        model = model.double()
    example = batch_of(0, cfg)
    cluster = cluster_of(world)  # shapes the plan only: the processes are CPU gloo ranks
    opt = weft.optim.Adam(lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    graph = weft.Trainer.training_graph(model, example, opt, args.precision)
    runners, loss_of, skipped, calls, notes = {}, {}, {}, {}, {}
    trainers = {}
    for case in cases:
        # Built on every rank; a failure skips the case everywhere (all ranks fail alike: the same
        # refusal of the same plan, the same missing API).
        err = None
        try:
            plan = weft_plan(case, graph, cluster, cfg, world)
            tr = weft.Trainer(copy.deepcopy(model), example, plan=plan, cluster=cluster, optimizer=opt,
                              precision=args.precision, progress=False, check_batch=False)
        except Exception as e:  # noqa: BLE001 - reported as skipped
            err = f"weft: {type(e).__name__}: {e}"
        errs = [None] * world
        dist.all_gather_object(errs, err)
        if any(errs):
            skipped[case] = next(e for e in errs if e)
            continue
        try:
            step, loss = torch_peer(case, model, cfg, args, rank, world)
        except Exception as e:  # noqa: BLE001
            err = f"torch: {type(e).__name__}: {e}"
        dist.all_gather_object(errs, err)
        if any(errs):
            skipped[case] = next(e for e in errs if e)
            continue
        trainers[case] = tr
        runners[(case, "weft")] = lambda b, tr=tr: tr.step(b)["loss"]
        runners[(case, "torch")] = step
        loss_of[case] = loss
        notes[case] = getattr(step, "schedule", None)
    order0 = list(runners)
    times = {k: [] for k in order0}
    losses = {k: [] for k in order0}
    for i in range(args.warmup + args.steps):
        batch = batch_of(i, cfg)
        order = order0[i % len(order0):] + order0[:i % len(order0)] if order0 else []  # rotate who goes first
        for key in order:
            dist.barrier()
            t0 = time.perf_counter()
            out = runners[key](batch)
            dist.barrier()
            if i >= args.warmup:
                times[key].append(time.perf_counter() - t0)
            losses[key].append(out if key[1] == "weft" else loss_of[key[0]](out))  # outside the timed region
    torch_calls = {}
    for case, tr in trainers.items():
        calls[case] = weft_calls(tr)
        torch_calls[case] = torch_collectives(runners[(case, "torch")], batch_of(args.warmup + args.steps, cfg))
    prof = None
    if args.profile in trainers:
        tr = trainers[args.profile]
        if rank == 0:
            prof = profile_weft(tr, cfg, args.profile_steps)
        else:
            for i in range(args.profile_steps):
                tr.step(batch_of(10_000 + i, cfg))
    if rank != 0:
        return None
    return {"times": times, "losses": losses, "skipped": skipped, "calls": calls, "notes": notes,
            "torch_calls": torch_calls,
            "instrs": {c: len(t.engine.instrs) for c, t in trainers.items()},
            "strategy": {c: t.plan.strategy for c, t in trainers.items()}, "profile": prof,
            "params": sum(p.numel() for p in model.parameters())}


def rel(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def commit():
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except Exception:  # noqa: BLE001 - not a checkout
        return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", choices=sorted(CONFIGS), default="medium")
    ap.add_argument("--nproc", type=int, default=None, help="processes of the multi-process cases (default: the config's)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps of each")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--cases", default=",".join(MULTI + ("single",)),
                    help=f"comma-separated, of {', '.join(MULTI + ('single',))}")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--precision", choices=["f32", "f64"], default="f32",
                    help="f64: the module in float64 (the losses then agree to f64 rounding)")
    ap.add_argument("--profile", default=None, help="a case whose weft step is profiled after the timed steps")
    ap.add_argument("--profile-steps", type=int, default=3)
    ap.add_argument("--save", default=None, help="also write the figures (with a header) to this file (appended "
                                                  "when --append)")
    ap.add_argument("--append", action="store_true", help="append to --save instead of replacing it")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.cfg = dict(CONFIGS[args.config])
    nproc = args.nproc or args.cfg["nproc"]
    args.cfg["nproc"] = nproc
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    bad = [c for c in cases if c not in TARGETS]
    if bad:
        ap.error(f"unknown cases {bad}; of {list(TARGETS)}")
    if args.cfg["batch"] % nproc:
        ap.error("the global batch must be a multiple of --nproc")
    if args.profile is not None and args.profile not in cases:
        ap.error("--profile must name one of --cases")
    t0 = time.perf_counter()
    load = os.getloadavg()[0]
    res = {"times": {}, "losses": {}, "skipped": {}, "calls": {}, "torch_calls": {}, "notes": {}, "instrs": {},
           "strategy": {},
           "profile": None}
    multi = [c for c in cases if c in MULTI]
    launches = [(multi, nproc)] if multi else []
    if "single" in cases:
        launches.append((["single"], 1))
    for cs, n in launches:
        if n == 1 and cs != ["single"]:
            continue
        got = weft.launch(run, args, cs, nproc=n, timeout_s=1800)[0]
        for k in res:
            if k == "params":
                continue
            if k == "profile":
                res[k] = res[k] or got[k]
            else:
                res[k].update(got[k])
        res["params"] = got["params"]
    wall = time.perf_counter() - t0
    cfg = args.cfg
    lines = []

    def emit(case, metric, value, unit, baseline=None):
        row = {"bench": "vs_torch", "case": case, "metric": metric, "value": value, "unit": unit,
               "baseline": baseline}
        if args.json:
            line = json.dumps(row)
        else:
            base = f"  (target {baseline})" if baseline is not None else ""
            v = f"{value:12.4g}" if isinstance(value, (int, float)) else f"{value:>12s}"
            line = f"vs_torch  {case:7s} {metric:40s} {v} {unit}{base}"
        print(line, flush=True)
        lines.append(line)

    for case in cases:
        procs = 1 if case == "single" else nproc
        if case in res["skipped"]:
            emit(case, "skipped", "-", res["skipped"][case])
            continue
        tw, tt = (statistics.median(res["times"][(case, s)]) for s in ("weft", "torch"))
        peer = PEERS[case] + (f" ({res['notes'][case]})" if res["notes"].get(case) else "")
        emit(case, f"weft step (median, {procs} procs)", tw, f"s  [{res['strategy'][case]}]")
        emit(case, "torch step (median)", tt, f"s  [{peer}]")
        emit(case, "weft / torch step time", tw / tt, "x", TARGETS[case])
        lw, lt = res["losses"][(case, "weft")], res["losses"][(case, "torch")]
        emit(case, "weft loss, last step", lw[-1], "")
        emit(case, "torch loss, last step", lt[-1], "")
        emit(case, "loss rel. diff, last step", rel(lw[-1], lt[-1]), "", 1e-6)
        emit(case, "loss rel. diff, largest of all steps", max(rel(a, b) for a, b in zip(lw, lt)), "")
        emit(case, "weft collective launches per step", res["calls"][case][0], f"({res['calls'][case][1]})")
        if procs > 1:
            emit(case, "torch collective launches per step", res["torch_calls"][case][0],
                 f"({res['torch_calls'][case][1]}"
                 + ("; gloo runs a reduce-scatter as an all_reduce)" if case == "zero3" else ")"))
        emit(case, "weft instructions per step (rank 0)", res["instrs"][case], "")
    if res["profile"]:
        print(res["profile"], flush=True)
        lines += res["profile"].splitlines()
    if args.save:
        model = (f"GPT {res.get('params', 0) / 1e6:.2f}M params ({args.config}: {cfg['layers']} layers x "
                 f"{cfg['hidden']} hidden, {cfg['heads']} heads, seq {cfg['seq']}, vocab {cfg['vocab']}, global "
                 f"batch {cfg['batch']}), {nproc} gloo procs, Adam {args.precision}")
        head = [f"# benchmarks/runtime/bench_vs_torch.py --config {args.config}, "
                f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit()}",
                f"# {model}; {args.warmup} warm-up + {args.steps} timed steps of each, alternating; medians",
                f"# machine: {platform.machine()}, {os.cpu_count()} CPU cores (shared), torch {torch.__version__}, "
                f"1 thread per process; load average {load:.1f} before the run; {wall:.0f} s in all"]
        mode = "a" if args.append else "w"
        with open(args.save, mode) as f:
            f.write("\n".join(head + lines) + "\n\n")
        print(f"saved to {args.save}")


if __name__ == "__main__":
    sys.exit(main())
