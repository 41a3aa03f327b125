"""Builds GPT-3 175B's training graph (forward + backward + Adam, 96 layers) and times it.

Two forward graphs: the model zoo's (weft.models.gpt("GPT-3 175B"), when the models module is
built) and an equivalent 96-layer GPT written here with the weft.Graph builder (so the benchmark
also runs without the zoo). For each: forward op count, training-graph op count, the time of
build_training_graph (target < 2 s), training FLOPs, and a JSON round trip of the training graph.

    PYTHONPATH=python:build/<dir>/python python3 benchmarks/ir/bench_train_graph.py [--json]
"""
from __future__ import annotations

import argparse
import json
import time

import weft


def builder_gpt(layers=96, hidden=12288, heads=96, seq=2048, vocab=51200, batch=1):
    """Pre-LN GPT: fused QKV, causal-free attention core, 4h GeLU FFN, tied logits."""
    g = weft.Graph(f"gpt-{layers}L-{hidden}h")
    d = hidden // heads
    ids = g.input("ids", [batch, seq], dtype="i32")
    labels = g.input("labels", [batch, seq], dtype="i32")
    wte = g.parameter("wte", [vocab, hidden])
    wpe = g.parameter("wpe", [seq, hidden])
    x = g.add(g.embedding(wte, ids), wpe)
    for l in range(layers):
        p = f"l{l}."
        ln1 = g.layer_norm(x, g.parameter(p + "ln1.g", [hidden]), g.parameter(p + "ln1.b", [hidden]))
        qkv = g.add(g.matmul(ln1, g.parameter(p + "qkv.w", [hidden, 3 * hidden])), g.parameter(p + "qkv.b", [3 * hidden]))
        qkv = g.reshape(qkv, [batch, seq, 3, heads, d])
        q = g.reshape(g.slice(qkv, 2, 0, 1), [batch, seq, heads, d])
        k = g.reshape(g.slice(qkv, 2, 1, 2), [batch, seq, heads, d])
        v = g.reshape(g.slice(qkv, 2, 2, 3), [batch, seq, heads, d])
        s = g.scale(g.einsum("bsnd,btnd->bnst", [q, k]), 1.0 / d**0.5)
        a = g.einsum("bnst,btnd->bsnd", [g.softmax(s, -1), v])
        o = g.add(g.matmul(g.reshape(a, [batch, seq, hidden]), g.parameter(p + "proj.w", [hidden, hidden])),
                  g.parameter(p + "proj.b", [hidden]))
        x = g.add(x, o)
        ln2 = g.layer_norm(x, g.parameter(p + "ln2.g", [hidden]), g.parameter(p + "ln2.b", [hidden]))
        h = g.gelu(g.add(g.matmul(ln2, g.parameter(p + "fc1.w", [hidden, 4 * hidden])),
                         g.parameter(p + "fc1.b", [4 * hidden])))
        f = g.add(g.matmul(h, g.parameter(p + "fc2.w", [4 * hidden, hidden])), g.parameter(p + "fc2.b", [hidden]))
        x = g.add(x, f)
    x = g.layer_norm(x, g.parameter("lnf.g", [hidden]), g.parameter("lnf.b", [hidden]))
    logits = g.einsum("bsh,vh->bsv", [x, wte])
    g.set_loss(g.cross_entropy(logits, labels, name="loss"))
    return g


def measure(case, make):
    t0 = time.perf_counter()
    g = make()
    t_fwd = time.perf_counter() - t0
    t0 = time.perf_counter()
    t = g.train_step("adam")
    t_train = time.perf_counter() - t0
    t0 = time.perf_counter()
    s = t.to_json()
    back = weft.Graph.from_json(s)
    t_json = time.perf_counter() - t0
    assert back == t
    return [
        (case, "forward_ops", len(g.ops), "ops"),
        (case, "train_ops", len(t.ops), "ops"),
        (case, "params", g.num_params(), "params"),
        (case, "forward_build_s", t_fwd, "s"),
        (case, "train_build_s", t_train, "s"),
        (case, "training_tflops", g.training_flops() / 1e12, "TFLOP"),
        (case, "json_roundtrip_s", t_json, "s"),
        (case, "json_mb", len(s) / 1e6, "MB"),
    ]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = measure("builder GPT 96L h12288 s2048", builder_gpt)
    models = getattr(weft, "models", None)
    if models is None:
        try:
            from weft import models  # noqa: F811
        except ImportError:
            models = None
    if models is not None and hasattr(models, "gpt"):
        rows += measure("weft.models GPT-3 175B", lambda: models.gpt("GPT-3 175B"))
    if args.json:
        for case, metric, value, unit in rows:
            baseline = 2.0 if metric == "train_build_s" else None
            print(json.dumps({"bench": "ir.train_graph", "case": case, "metric": metric, "value": value,
                              "unit": unit, "baseline": baseline}))
        return
    print(f"{'case':34} {'metric':18} {'value':>14} unit")
    for case, metric, value, unit in rows:
        v = f"{value:14.4f}" if isinstance(value, float) else f"{value:14d}"
        print(f"{case:34} {metric:18} {v} {unit}")
    print("target: train_build_s < 2 s (forward + backward + Adam graph of GPT-3 175B)")


if __name__ == "__main__":
    main()
