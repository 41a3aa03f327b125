"""torch importer benchmark: a nanoGPT-style GPT built on torch.device("meta") (no weights
allocated) imported with weft.from_torch, for the zoo's GPT presets up to --max-params; prints
the import time, the parameter count and FLOPs against the zoo GPT of the same config.
Target (issue 16): GPT-1.3B (GPT-XL) in < 10 s.

    PYTHONPATH=python:build/<dir>/python python3 benchmarks/frontend/bench_import.py [--presets GPT-XL ...]
"""
from __future__ import annotations

import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import weft


class Attention(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.c_attn, self.c_proj, self.heads = nn.Linear(h, 3 * h), nn.Linear(h, h), heads

    def forward(self, x):
        B, T, C = x.shape
        n, d = self.heads, C // self.heads
        q, k, v = (t.view(B, T, n, d).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
        y = F.softmax((q * (1.0 / math.sqrt(d))) @ k.transpose(-2, -1), dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.ln_1, self.attn, self.ln_2 = nn.LayerNorm(h), Attention(h, heads), nn.LayerNorm(h)
        self.mlp = nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(approximate="tanh"), nn.Linear(4 * h, h))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, layers, h, heads, seq, vocab):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, h), nn.Parameter(torch.zeros(seq, h))
        self.h = nn.ModuleList([Block(h, heads) for _ in range(layers)])
        self.ln_f, self.lm_head = nn.LayerNorm(h), nn.Linear(h, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe[: idx.shape[1]]
        for b in self.h:
            x = b(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", nargs="*", default=["GPT-Medium", "GPT-XL", "GPT-2.7B"])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--plan", action="store_true",
                    help="also plan imported and zoo model on 2 M8 nodes (about a minute per plan at 2.7B)")
    a = ap.parse_args(argv)
    for name in a.presets:
        c = weft.models.preset_config(name)
        t0 = time.perf_counter()
        with torch.device("meta"):
            m = Gpt(c["layers"], c["hidden"], c["heads"], c["seq"], c["vocab"])
            idx = torch.randint(0, c["vocab"], (a.batch, c["seq"]))
            tgt = torch.randint(0, c["vocab"], (a.batch, c["seq"]))
        t1 = time.perf_counter()
        g = weft.from_torch(m, (idx, tgt))
        t2 = time.perf_counter()
        zoo = weft.models.gpt(name, batch=a.batch)
        print(f"{name:12s} meta model {t1 - t0:6.2f} s  import {t2 - t1:6.2f} s  ops {len(g.ops):5d}  "
              f"params {g.num_params() / 1e9:6.3f} B (zoo {zoo.num_params() / 1e9:6.3f} B)  "
              f"FLOPs / zoo {g.flops() / zoo.flops():.6f}", flush=True)
        if a.plan:
            cluster = weft.Cluster.preset("M8", nodes=2)
            for what, graph in (("imported", g), ("zoo", zoo)):
                t = time.perf_counter()
                p = weft.plan(graph, cluster)
                print(f"  plan on 2 M8 nodes, {what:8s}: step {p.step_time:.9f} s  {p.strategy}  "
                      f"({time.perf_counter() - t:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
