"""Writes the fuzz targets' seed corpus (fuzz/corpus/<target>/) from weft's own outputs: small zoo
graphs, cluster presets, plans, schedules, traces, a lowered program and sharding specs. Run from
the repository root with the Python package importable; the corpus is checked in."""
import json
import os
import struct

import weft

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def values():
    """A graph carrying values (inline, and in a value file: the value_file target's seed)."""
    import tempfile

    import numpy as np

    g = weft.Graph("values")
    x = g.input("x", [2, 3])
    w = g.parameter("w", [3, 4])
    c = g.constant("c", [1])
    g.set_loss(g.reduce("mean", g.mul(g.matmul(x, w), c), [0, 1]))
    g.set_value(int(w), np.arange(12.0).reshape(3, 4) / 7)
    g.set_value(int(c), np.array([-np.inf]))
    write("graph_json", "values_inline", g.to_json())
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "g.json")
        g.save(path, inline_limit=4)
        write("graph_json", "values_sidecar", open(path).read())
        write("value_file", "weft_written", open(path + ".values.safetensors", "rb").read())


def main():
    values()
    tiny = weft.models.gpt(layers=1, hidden=8, heads=2, seq=4, vocab=16, batch=2)
    write("graph_json", "gpt_forward", tiny.to_json())
    write("graph_json", "gpt_train", tiny.train_step(optimizer="adam").to_json())
    mlp = weft.Graph("mlp")
    x = mlp.input("x", [4, 6])
    h = mlp.dropout(mlp.unary("gelu", mlp.matmul(x, mlp.parameter("w", [6, 3]))), 0.1, 1)
    mlp.set_loss(mlp.reduce("mean", h, [0, 1]))
    write("graph_json", "mlp_dropout", mlp.to_json())
    for name, c in [("m8", weft.Cluster.preset("M8")), ("dgx2", weft.Cluster.preset("DGX-A100", nodes=2)),
                    ("mixed", weft.Cluster.concat(weft.Cluster.preset("p3.8xlarge"), weft.Cluster.preset("P100")))]:
        write("cluster_json", name, c.to_json())
    write("cluster_json", "preset_count", json.dumps({"nodes": [{"preset": "T4", "count": 2}]}))
    step = tiny.train_step(optimizer="adam")
    c4 = weft.Cluster.preset("p3.8xlarge")
    plan = weft.plan(step, c4, spmd_time_limit=5)
    write("plan_json", "plan_gpt_tiny", plan.to_json())
    dp = weft.data_parallel_plan(step, c4, [1, 1, 0, 0], num_microbatches=1)
    write("plan_json", "plan_dp", dp.to_json())
    for name, s in [("1f1b", weft.schedule("1f1b", stages=2, micro_batches=3)),
                    ("kfkb", weft.schedule("kfkb", stages=2, micro_batches=4, k=2)),
                    ("zb_h1", weft.schedule("zb_h1", stages=2, micro_batches=3))]:
        write("schedule_json", name, s.to_json())
    write("trace_json", "steps", json.dumps({"times": [0, 1, 2.5], "fractions": [1, 0.25, 0.75]}))
    write("trace_json", "constant", json.dumps({"times": [0], "fractions": [0.5]}))
    prog = weft.lower(dp, step, c4)
    write("program_json", "program_dp", prog.to_json())
    # program_verify: the program as text (byte mutations), and edit scripts over the target's own tiny
    # lowered GPT program (4 bytes per edit: node-set and value selector, node index, how; see
    # fuzz/fuzz_program_verify.cpp). "x": no edit (the valid program verifies and runs).
    write("program_verify", "program_dp", prog.to_json())
    for name, script in [("no_edit", b"x"), ("edit_numbers", bytes([1, 0, 40, 0, 2, 1, 17, 1, 9, 0, 200, 3])),
                         ("edit_strings", bytes([3, 0, 90, 1, 5, 0, 91, 0, 6, 2, 3, 1])),
                         ("edit_arrays", bytes([2, 0, 12, 1, 4, 0, 33, 0])),
                         ("edit_graph", bytes([0x81, 0, 50, 0, 0x82, 1, 0, 2]))]:
        write("program_verify", name, script)
    # spec: 4 header bytes (rank - 1 in the low bits of byte 0, dims in bytes 1..3 as 1 + b % 24,
    # mesh 1 + b % 4 and 1 + (b >> 4) % 4 in byte 3), then the text.
    for name, head, text in [("s0_r", (1, 7, 3, 0x11), "S(0) R"), ("strided", (1, 7, 3, 0x11), "S(0,2) S(1)"),
                             ("partial", (0, 7, 0, 0x11), "P(sum) S(0)"), ("dtensor", (1, 7, 7, 0x11),
                                                                           "[Shard(0), Replicate()]")]:
        write("spec", name, struct.pack("4B", *head) + text.encode())


if __name__ == "__main__":
    main()
