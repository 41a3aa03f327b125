"""Writes the example notebooks of examples/notebooks/ (without outputs) from the cells below.

    python examples/notebooks/make_notebooks.py        # rewrite the .ipynb files

Edit the cells here, not the .ipynb files. tests/python/test_notebooks.py executes every notebook
with nbclient and checks that it ran without an error and drew a figure.
"""
from __future__ import annotations

import os

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))

NOTEBOOKS = {
    "01_quickstart": [
        ("md", "# weft quickstart: plan, summary, show\n\n"
               "Plan one training step of a small GPT on a 4-GPU node, read the plan's key figures "
               "(step time in s, throughput in samples/s, memory in GB) and draw it."),
        ("code", "import weft\n"
                 "model = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8)\n"
                 "cluster = weft.Cluster.preset(\"p3.8xlarge\")   # 4x V100-SXM2-16GB, NVLink\n"
                 "model   # a Graph displays as a table: parameters (M), FLOPs, op kinds"),
        ("code", "plan = weft.plan(model, cluster, schedule=\"1F1B\")\n"
                 "plan    # step time (s), throughput (samples/s), MFU (%), memory per device (GB)"),
        ("code", "print(plan.summary())"),
        ("code", "fig = plan.show()   # devices by stage, the simulated Gantt, memory per device, one sharding\n"
                 "fig"),
        ("code", "# the Megatron-style baseline under the same cost model\n"
                 "base = weft.megatron_plan(model, cluster, t=2, p=2, d=1, num_microbatches=4)\n"
                 "print(f\"weft {plan.step_time * 1e3:.3f} ms vs Megatron t=2 p=2 {base.step_time * 1e3:.3f} ms per step\")"),
    ],
    "02_heterogeneous_cluster": [
        ("md", "# A heterogeneous cluster\n\n"
               "One V100 node and one P100 node joined into one cluster: the planner weighs uneven "
               "data-parallel shares, Whale's uneven tensor split and pipelines over the GPU kinds."),
        ("code", "import weft\n"
                 "cluster = weft.Cluster.concat(weft.Cluster.preset(\"p3.8xlarge\", nodes=1),\n"
                 "                              weft.Cluster.preset(\"P100\", nodes=1))\n"
                 "cluster"),
        ("code", "model = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=16)\n"
                 "plan = weft.plan(model, cluster, compare_megatron=False, max_stages=2)\n"
                 "plan"),
        ("code", "for alt in plan.alternatives[:6]:\n"
                 "    print(f\"{alt.strategy:34s} {alt.step_time * 1e3:8.3f} ms  {alt.peak_memory / 1e9:.3f} GB\")"),
        ("code", "# which GPU kinds each stage runs on, and its time per micro-batch (s)\n"
                 "kinds = [d.kind for d in cluster.devices]\n"
                 "for st in plan.stages:\n"
                 "    print(st.index, sorted({kinds[d] for d in st.devices}), f\"F {st.forward_time:.3g} s, B {st.backward_time:.3g} s\")\n"
                 "plan.show()"),
    ],
    "03_busy_network_kfkb": [
        ("md", "# A busy network and kFkB\n\n"
               "Simulate 1F1B and kFkB (k forward micro-batches, then k backward) on a pipeline whose "
               "links lose bandwidth to other jobs (a preempted bandwidth trace), and let "
               "Ada-Grouper's idea show: grouping micro-batches hides the slow transfers."),
        ("code", "import weft\n"
                 "trace = weft.BandwidthTrace.preempted(seed=1, duration=60.0, low=0.2, high=0.4)\n"
                 "link = weft.PipelineLink(bandwidth=1e9, latency=1e-5, trace=trace)   # bytes/s, s\n"
                 "stage = weft.StageSpec(forward_time=0.010, backward_time=0.020,      # s per micro-batch\n"
                 "                       activation_bytes=16e6)                       # bytes sent per micro-batch\n"
                 "trace"),
        ("code", "results = {}\n"
                 "for name, k in [(\"1f1b\", 1), (\"kfkb\", 2), (\"kfkb\", 4)]:\n"
                 "    sched = weft.schedule(name, stages=4, micro_batches=16, k=k)\n"
                 "    results[sched.name] = weft.simulate(sched, stage, link)\n"
                 "for n, r in results.items():\n"
                 "    print(f\"{n:10s} step {r.step_time * 1e3:8.2f} ms  bubble {100 * r.bubble_fraction:5.1f} %  \"\n"
                 "          f\"peak in-flight {max(r.peak_in_flight_device)}\")"),
        ("code", "sched = weft.schedule(\"kfkb\", stages=4, micro_batches=16, k=2)\n"
                 "sched   # the per-device order of F and B"),
        ("code", "best = min(results.values(), key=lambda r: r.step_time)\n"
                 "best"),
        ("code", "best.plot_gantt()   # one bar per (stage, micro-batch, phase), and the transfers per link"),
    ],
    "04_resharding": [
        ("md", "# Cross-mesh resharding\n\n"
               "A stage boundary moves a sharded tensor from one device mesh to another. "
               "`weft.reshard.plan` decomposes it into unit tasks, picks senders and balances the hosts' "
               "NICs; the plan's time is compared with a lower bound, and the CPU executor checks it moves "
               "the right elements."),
        ("code", "import numpy as np\n"
                 "import weft\n"
                 "p = weft.reshard.plan([1024, 1024], \"f32\",\n"
                 "                      \"S(0) R\", ([2, 2], [0, 1, 2, 3]),     # rows split over x, replicated over y\n"
                 "                      \"S(1) R\", ([2, 2], [4, 5, 6, 7]),     # columns split over x\n"
                 "                      devices_per_host=2, bandwidth=12.5e9)   # bytes/s per host NIC\n"
                 "p"),
        ("code", "p.show()   # per-host timeline: one bar per transfer"),
        ("code", "x = np.arange(1024 * 1024, dtype=np.float32).reshape(1024, 1024)\n"
                 "out = p.execute(x)\n"
                 "assert np.array_equal(out[4], x[:, :512]) and np.array_equal(out[6], x[:, 512:])\n"
                 "{d: a.shape for d, a in out.items()}"),
        ("code", "for strategy in weft.reshard.STRATEGIES:\n"
                 "    q = weft.reshard.plan([1024, 1024], \"f32\", \"S(0) R\", ([2, 2], [0, 1, 2, 3]),\n"
                 "                          \"S(1) R\", ([2, 2], [4, 5, 6, 7]), strategy=strategy,\n"
                 "                          devices_per_host=2, bandwidth=12.5e9)\n"
                 "    print(f\"{strategy:18s} {q.completion_time * 1e6:8.1f} us  ({q.ratio:.2f}x the lower bound)\")"),
    ],
    "05_torch_model": [
        ("md", "# Bring your own PyTorch model\n\n"
               "`weft.from_torch` turns an `nn.Module` (through `torch.export`) into a weft graph with "
               "its loss; the planner then treats it like any zoo model."),
        ("code", "import torch\n"
                 "import weft\n"
                 "\n"
                 "class MLP(torch.nn.Module):\n"
                 "    def __init__(self, d=64, h=256, classes=10):\n"
                 "        super().__init__()\n"
                 "        self.fc1 = torch.nn.Linear(d, h)\n"
                 "        self.fc2 = torch.nn.Linear(h, classes)\n"
                 "\n"
                 "    def forward(self, x, y):\n"
                 "        return torch.nn.functional.cross_entropy(self.fc2(torch.relu(self.fc1(x))), y)\n"
                 "\n"
                 "model = MLP()\n"
                 "x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))\n"
                 "graph = weft.from_torch(model, (x, y))\n"
                 "graph"),
        ("code", "# the imported graph computes the module's loss (the reference interpreter, float64)\n"
                 "feeds = weft.feeds_from_torch(model, (x, y))\n"
                 "loss = weft.interpret(graph, feeds)[graph.loss.name]\n"
                 "with torch.no_grad():\n"
                 "    print(float(loss), float(model(x, y)))"),
        ("code", "plan = weft.plan(graph, weft.Cluster.preset(\"p3.8xlarge\"), compare_megatron=False)\n"
                 "plan"),
        ("code", "plan.show()"),
    ],
}


def build(name: str, cells) -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.cells = [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        path = os.path.join(HERE, name + ".ipynb")
        nbformat.write(build(name, cells), path)
        print(path)


if __name__ == "__main__":
    main()
