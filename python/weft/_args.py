"""Text arguments shared by the CLI, ``weft.runtime.load_program`` and ``weft.Trainer``: a cluster
spec (a preset, ``PRESET:NODES+PRESET:NODES``, or a cluster JSON file) and a model (a zoo preset
name, or a graph JSON file). No import of the CLI or the runtime: both import this module."""
from __future__ import annotations

import os


def cluster_spec(text: str, nodes: int):
    """"M8" (``nodes`` nodes) or a mixed cluster "M8:1+P100:2" (preset:nodes, joined in order)."""
    from ._weft import Cluster

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
        c = Cluster.preset(name, nodes=n)
        cluster = c if cluster is None else Cluster.concat(cluster, c)
    return cluster


def cluster_arg(text: str, nodes: int = 1):
    """A cluster JSON file, or a preset spec (see :func:`cluster_spec`; ``nodes`` for a preset
    given without ``:NODES``, 1 everywhere by default as ``Cluster.preset``)."""
    from ._weft import Cluster

    if text.endswith(".json") or os.path.sep in text:
        if not os.path.exists(text):
            raise ValueError(f"--cluster: no such file {text!r}")
        with open(text) as f:
            return Cluster.from_json(f.read())
    return cluster_spec(text, nodes)


def graph_arg(model: str, batch: int, dtype: str):
    """A zoo preset name, or a graph JSON file (its own batch and dtypes)."""
    from ._weft import Graph
    from . import models

    if model.endswith(".json") or os.path.sep in model:
        if not os.path.exists(model):
            raise ValueError(f"--model: no such file {model!r}")
        return Graph.load(model)  # its value file (Graph.save) found beside it
    return models.build(model, batch=batch, dtype=dtype)
