"""A character-level GPT, written as a plain torch module, trained with weft.Trainer on 4 processes.

The text is Ambrose Bierce's *The Devil's Dictionary* (1911, public domain; examples/data/README.md
says where it comes from). The model is a small GPT: character embedding + learned positions,
pre-LN blocks (causal softmax attention, GELU MLP), a final LayerNorm and an untied head; its
forward returns the cross-entropy loss, as weft.Trainer expects. Every rank builds the same module
(same seed) and draws the same global batch each step; the Trainer runs the rank's part of the plan:

* ``--plan tp-pp`` (default): 2 pipeline stages x 2-way tensor parallelism (``weft.megatron_plan``
  with t=2, p=2, d=1) on a p3.8xlarge-shaped cluster (4 devices; here 4 gloo processes on the CPU);
* ``--plan auto``: weft.plan's own choice on the same cluster (``--nproc`` other than 4: see
  ``cluster_of``).

It prints the loss every ``--every`` steps, saves the loss curve (``--plot loss.png``), then loads
``trainer.full_state_dict()`` into the module and, on rank 0 with plain torch, reports the loss on
held-out text and samples from the trained model.

    python examples/train_char_lm.py                        # 300 steps, about 4 minutes on 2 CPU cores
    python examples/train_char_lm.py --plan auto --plot loss.png
    python examples/train_char_lm.py --quick                # the short version the tests run
    torchrun --nproc-per-node 4 examples/train_char_lm.py   # under torchrun (gloo without GPUs)
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

import weft

DATA = Path(__file__).resolve().parent / "data" / "devils_dictionary.txt"


# ---- the model: plain torch, nothing weft-specific

class Block(nn.Module):
    def __init__(self, d: int, heads: int, seq: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        self.causal: torch.Tensor
        self.register_buffer("causal", torch.tril(torch.ones(seq, seq, dtype=torch.bool)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        hd = d // self.heads
        q, k, v = (t.view(b, s, self.heads, hd).transpose(1, 2) for t in self.qkv(self.ln1(x)).chunk(3, -1))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        mask = self.causal if s == self.causal.shape[0] else self.causal[:s, :s]
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, s, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class CharGPT(nn.Module):
    def __init__(self, vocab: int, d: int = 128, heads: int = 4, layers: int = 4, seq: int = 64):
        super().__init__()
        self.seq = seq
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads, seq) for _ in range(layers))
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        for name, p in self.named_parameters():  # GPT-2's initialisation
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        s = tokens.shape[1]
        x = self.tok(tokens) + (self.pos if s == self.seq else self.pos[:s])
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.norm(x))

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.logits(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


@torch.no_grad()
def sample(model: CharGPT, prompt: torch.Tensor, n: int, temperature: float = 0.8, seed: int = 0) -> torch.Tensor:
    """``n`` characters after ``prompt`` (1-D ids): greedy when temperature is 0, else sampled."""
    g = torch.Generator().manual_seed(seed)
    ids = prompt.clone()
    for _ in range(n):
        logits = model.logits(ids[-model.seq:][None])[0, -1]
        if temperature <= 0:
            nxt = logits.argmax()
        else:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=g)[0]
        ids = torch.cat([ids, nxt.view(1)])
    return ids


# ---- the data: the same global batch on every rank

class Chars:
    def __init__(self, path: Path = DATA, held_out: float = 0.1):
        text = path.read_text(encoding="utf-8")
        self.chars = sorted(set(text))
        self.index = {c: i for i, c in enumerate(self.chars)}
        ids = torch.tensor([self.index[c] for c in text], dtype=torch.long)
        cut = int(len(ids) * (1 - held_out))
        self.train, self.val = ids[:cut], ids[cut:]

    @property
    def vocab(self) -> int:
        return len(self.chars)

    def encode(self, s: str) -> torch.Tensor:
        return torch.tensor([self.index[c] for c in s], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def batch(self, step: int, batch: int, seq: int, split: str = "train", seed: int = 0):
        """(tokens, targets) of ``step``: random windows, drawn from a generator seeded by the step."""
        data = self.train if split == "train" else self.val
        g = torch.Generator().manual_seed(seed * 1_000_003 + step)
        starts = torch.randint(len(data) - seq - 1, (batch,), generator=g)
        x = torch.stack([data[s:s + seq] for s in starts.tolist()])
        y = torch.stack([data[s + 1:s + seq + 1] for s in starts.tolist()])
        return x, y


def make_model(args, vocab: int) -> CharGPT:
    torch.manual_seed(args.seed)  # every rank builds the same initial module
    return CharGPT(vocab, d=args.hidden, heads=args.heads, layers=args.layers, seq=args.seq)


def cluster_of(nproc: int):
    """The cluster the plan is for, one device per process: a p3.8xlarge (4 V100s on NVLink) for 4
    processes, an M8 node (8 V100s) for 8, else ``nproc`` single-V100 nodes (preset S1)."""
    if nproc == 4:
        return weft.Cluster.preset("p3.8xlarge")
    if nproc == 8:
        return weft.Cluster.preset("M8")
    return weft.Cluster.preset("S1", nodes=nproc)


def make_plan(args, model, example, cluster):
    """The plan of ``--plan``: Megatron's t=2 x p=2 layout, or None (weft.Trainer asks weft.plan)."""
    if args.plan == "auto":
        return None
    # made on the Trainer's own training graph (rank 0 plans, every rank lowers)
    return lambda graph, cluster: weft.megatron_plan(graph, cluster, t=2, p=2, d=1)


def optimizer_of(args):
    return weft.optim.AdamW(lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1, no_decay=("bias", "ln", "norm"))


# ---- one process of the job

def train(args, out_fd: int | None = None) -> dict | None:
    """Runs on every rank (torch.distributed initialised). Rank 0 returns the curve, the held-out
    loss and the sample; the others None."""
    rank = weft.distributed.rank()
    out = os.fdopen(os.dup(out_fd), "w") if out_fd is not None and rank == 0 else (sys.stdout if rank == 0 else None)

    def say(msg: str) -> None:
        if out is not None:
            print(msg, file=out, flush=True)

    data = Chars()
    model = make_model(args, data.vocab)
    example = data.batch(0, args.batch, args.seq, seed=args.seed)
    cluster = cluster_of(args.nproc)
    t0 = time.perf_counter()
    plan = make_plan(args, model, example, cluster)
    trainer = weft.Trainer(model, example, plan=plan, cluster=cluster, optimizer=optimizer_of(args),
                           lr_schedule=weft.optim.warmup_cosine(warmup=args.warmup, total=args.steps, min_factor=0.1),
                           grad_clip=1.0, precision="f32", progress=False)
    setup = time.perf_counter() - t0
    n_params = sum(p.numel() for p in model.parameters())
    say(f"char LM: {n_params / 1e3:.0f}k parameters, vocab {data.vocab}, {len(data.train)} training characters; "
        f"{weft.distributed.world_size()} processes, plan: {trainer.plan.strategy if trainer.plan else args.plan} "
        f"(set up in {setup:.1f} s)")
    curve, t_train = [], time.perf_counter()
    window = []
    for i in range(args.steps):
        m = trainer.step(data.batch(i, args.batch, args.seq, seed=args.seed))
        curve.append((m["step"], m["loss"]))
        window.append(m)
        if m["step"] % args.every == 0 or m["step"] == 1 or m["step"] == args.steps:
            loss = sum(w["loss"] for w in window) / len(window)
            tps = sum(w["tokens_per_s"] for w in window) / len(window)
            say(f"step {m['step']:5d}  loss {m['loss']:.4f}  (mean of last {len(window)}: {loss:.4f})  "
                f"grad norm {m['grad_norm']:.3f}  lr {m['lr']:.2e}  {tps:7.0f} tokens/s  "
                f"{time.perf_counter() - t_train:6.1f} s")
            window = []
    t_train = time.perf_counter() - t_train
    state = trainer.full_state_dict(rank0_only=True)  # a collective: every rank calls it
    trainer.close()
    if rank != 0:
        return None
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():  # the trained module, plain torch: held-out loss
        val = sum(float(model(*data.batch(i, args.batch, args.seq, "val", args.seed))) for i in range(args.eval_batches))
        val /= args.eval_batches
    prompt = data.encode(args.prompt)
    text = data.decode(sample(model, prompt, args.sample_chars, args.temperature, args.seed))
    say(f"held-out loss of the trained module (plain torch, {args.eval_batches} batches): {val:.4f}")
    if out is not None and out is not sys.stdout:
        out.close()
    return {"curve": curve, "val_loss": val, "sample": text, "train_seconds": t_train, "setup_seconds": setup,
            "plan": trainer.plan.strategy if trainer.plan else "", "params": n_params,
            "tokens_per_step": args.batch * args.seq}


def plot(curve, path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, losses = zip(*curve)
    k = max(1, len(losses) // 30)
    smooth = [sum(losses[max(0, i - k + 1):i + 1]) / len(losses[max(0, i - k + 1):i + 1]) for i in range(len(losses))]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, losses, lw=0.6, alpha=0.4, label="loss per step")
    ax.plot(steps, smooth, lw=1.5, label=f"mean of {k}")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / char)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--nproc", type=int, default=4, help="processes (the tp-pp plan needs 4)")
    ap.add_argument("--plan", choices=["tp-pp", "auto"], default="tp-pp")
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64, help="global batch (sequences per step)")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--every", type=int, default=25, help="print the loss every N steps")
    ap.add_argument("--plot", default=None, help="save the loss curve here (PNG)")
    ap.add_argument("--prompt", default="LOVE, n.  ")
    ap.add_argument("--sample-chars", type=int, default=400)
    ap.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="the short version the tests run")
    args = ap.parse_args(argv)
    if args.quick:
        args.steps, args.batch, args.seq, args.warmup = 80, 32, 64, 10
        args.every, args.sample_chars, args.eval_batches = 10, 120, 4
    if args.plan == "tp-pp" and args.nproc != 4:
        ap.error("--plan tp-pp is 2 stages x 2-way tensor parallel: it needs --nproc 4")
    if args.hidden % args.heads or args.heads % 2:
        ap.error("--hidden must be a multiple of --heads, and --heads even (2-way tensor parallel)")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    t0 = time.perf_counter()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
        weft.distributed.init()
        result = train(args)
        if weft.distributed.rank() != 0:
            return 0
    else:
        sys.stdout.flush()
        fd = os.dup(sys.stdout.fileno())  # rank 0 prints its progress here (launch sends ranks' output to logs)
        try:
            result = weft.launch(train, args, fd, nproc=args.nproc)[0]
        finally:
            os.close(fd)
    wall = time.perf_counter() - t0
    assert result is not None  # rank 0's (under torchrun the other ranks returned above)
    (s0, l0), (s1, l1) = result["curve"][0], result["curve"][-1]
    tail = [l for _, l in result["curve"][-10:]]
    print(f"loss: {l0:.4f} at step {s0} -> {l1:.4f} at step {s1} (mean of the last {len(tail)} steps "
          f"{sum(tail) / len(tail):.4f}); held-out {result['val_loss']:.4f}")
    print(f"time: {wall:.1f} s in all, {result['train_seconds']:.1f} s training "
          f"({result['tokens_per_step'] * s1 / result['train_seconds']:.0f} tokens/s), "
          f"{result['setup_seconds']:.1f} s import + plan + lowering")
    if args.plot:
        plot(result["curve"], args.plot, f"char GPT on The Devil's Dictionary, {args.plan}")
        print(f"loss curve saved to {args.plot}")
    print(f"sample (temperature {args.temperature}, prompt {args.prompt!r}):")
    print("-" * 60)
    print(result["sample"])
    print("-" * 60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
