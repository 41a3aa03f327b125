"""Measure activation recomputation on one GPU (issue 17): a stack of pre-LN GPT blocks (attention
unfused, as weft's IR models it) trained with no recomputation, with selective recomputation (the
attention core — scores, softmax, probabilities x values — under torch.utils.checkpoint) and with
full recomputation (every block under checkpoint), against weft's prediction for the same stack.

On the GPU machine (torch with CUDA):
    python3 benchmarks/cost/gpu_recompute.py --out recompute.json
Then here, to set the measurement next to weft's prediction (layout_plan on one device of the
matching preset, one block per layer):
    PYTHONPATH=python python3 benchmarks/cost/gpu_recompute.py --compare recompute.json

Measured per mode: forward time, forward + backward time (median of CUDA-event samples), and the
bytes the forward leaves allocated for the backward (memory_allocated after the forward minus
before: the saved activations of the stack). Prints (B_mode - B_none) / F_none (weft: exactly 1 for
full) and the saved bytes per layer next to weft's activation_memory.
"""
from __future__ import annotations

import argparse
import json
import statistics

CONFIGS = [  # hidden, heads, seq, micro-batch, layers
    (2048, 16, 2048, 4, 4),
    (4096, 32, 2048, 2, 4),
]


def measure(out_path):
    import torch
    from torch.utils.checkpoint import checkpoint

    def timed(fn, samples=7):
        fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        out = []
        for _ in range(samples):
            s.record()
            fn()
            e.record()
            torch.cuda.synchronize()
            out.append(s.elapsed_time(e) / 1e3)
        return statistics.median(out)

    rows = []
    dt = torch.bfloat16
    for h, heads, s, b, layers in CONFIGS:
        torch.manual_seed(0)
        d = h // heads
        blocks = []
        for _ in range(layers):
            blocks.append({
                "ln1": torch.nn.LayerNorm(h).to("cuda", dt), "qkv": torch.nn.Linear(h, 3 * h).to("cuda", dt),
                "proj": torch.nn.Linear(h, h).to("cuda", dt), "ln2": torch.nn.LayerNorm(h).to("cuda", dt),
                "up": torch.nn.Linear(h, 4 * h).to("cuda", dt), "down": torch.nn.Linear(4 * h, h).to("cuda", dt)})

        def core(q, k, v):  # q arrives scaled by 1/sqrt(d), as in weft's GPT (no pass over the scores)
            a = torch.softmax(q @ k.transpose(-1, -2), dim=-1)
            return a @ v

        def block(p, x, selective):
            y = p["ln1"](x)
            q, k, v = p["qkv"](y).view(b, s, 3, heads, d).permute(2, 0, 3, 1, 4)
            q = q * d**-0.5
            c = checkpoint(core, q, k, v, use_reentrant=False) if selective else core(q, k, v)
            z = x + p["proj"](c.transpose(1, 2).reshape(b, s, h))
            return z + p["down"](torch.nn.functional.gelu(p["up"](p["ln2"](z))))

        def forward(x, mode):
            for p in blocks:
                if mode == "full":
                    x = checkpoint(block, p, x, False, use_reentrant=False)
                else:
                    x = block(p, x, mode == "selective")
            return x

        x0 = torch.randn(b, s, h, device="cuda", dtype=dt, requires_grad=True)
        for mode in ("none", "selective", "full"):
            def fwd():
                forward(x0, mode)

            def step():
                out = forward(x0, mode)
                out.backward(torch.ones_like(out))

            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
            out = forward(x0, mode)
            torch.cuda.synchronize()
            saved = torch.cuda.memory_allocated() - before - out.numel() * out.element_size()
            del out
            f = timed(fwd)
            fb = timed(step)
            row = dict(hidden=h, heads=heads, seq=s, batch=b, layers=layers, dtype="bf16", mode=mode,
                       forward_s=f, forward_backward_s=fb, backward_s=fb - f, saved_bytes=saved)
            print(json.dumps(row), flush=True)
            rows.append(row)
    with open(out_path, "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, fh, indent=1)


def compare(path):
    import weft

    data = json.load(open(path))
    print(f"measured on {data['device']} (torch {data['torch']}); weft: layout_plan on one H100 of the preset")
    by = {}
    for r in data["rows"]:
        by.setdefault((r["hidden"], r["heads"], r["seq"], r["batch"], r["layers"]), {})[r["mode"]] = r
    cluster = weft.Cluster.preset("H100", nodes=1)
    for (h, heads, s, b, layers), modes in by.items():
        g = weft.models.gpt(layers=layers, hidden=h, heads=heads, seq=s, vocab=128, batch=b,
                            dtype="bf16").train_step(optimizer="sgd")
        pred = {m: weft.layout_plan(g, cluster, [(0, layers - 1, [0])], num_blocks=layers, recompute=m).stages[0]
                for m in ("none", "selective", "full")}
        n = modes["none"]
        print(f"h={h} heads={heads} seq={s} micro-batch={b} layers={layers}")
        print(f"  {'mode':<10} {'F ms':>8} {'weft':>8} {'B ms':>8} {'weft':>8} {'(B-B0)/F0':>10} {'weft':>8} "
              f"{'saved MB/layer':>15} {'weft':>8}")
        for m in ("none", "selective", "full"):
            r, p = modes[m], pred[m]
            meas = (r["backward_s"] - n["backward_s"]) / n["forward_s"]
            wft = (p.backward_time - pred["none"].backward_time) / pred["none"].forward_time
            print(f"  {m:<10} {1e3 * r['forward_s']:>8.2f} {1e3 * p.forward_time:>8.2f} {1e3 * r['backward_s']:>8.2f} "
                  f"{1e3 * p.backward_time:>8.2f} {meas:>10.3f} {wft:>8.3f} "
                  f"{r['saved_bytes'] / layers / 1e6:>15.1f} {p.activation_memory / layers / 1e6:>8.1f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="measure on this GPU and write the JSON here")
    ap.add_argument("--compare", help="a measurement JSON to set next to weft's prediction")
    args = ap.parse_args()
    if args.out:
        measure(args.out)
    if args.compare:
        compare(args.compare)


if __name__ == "__main__":
    main()
