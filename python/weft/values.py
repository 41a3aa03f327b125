"""The values a model carries: its parameters, buffers and constants, never invented.

    >>> g = weft.from_torch(model, (x,))            # real tensors: every value recorded
    >>> g = weft.from_torch(meta_model, (x,))       # meta: no values (planning needs none)
    >>> weft.load_values(g, model.state_dict())     # ... given later (or a .safetensors path)
    >>> g.save("model.json")                        # + model.json.values.safetensors for the large ones
    >>> g2 = weft.Graph.load("model.json")          # exact round trip

A leaf is an Input (fed per step), a Parameter, a Buffer (state that is not trained) or a Constant
(a value known at import). Every executor (:func:`weft.execute`, :func:`weft.execute_reference`,
:func:`weft.run`, ``python -m weft.run``) reads the values the graph carries; a rank of the torch
runtime reads only what its tiles need from the value file. A leaf that needs a value and has none
is a ``ValueError`` naming it before anything runs. Seeded initialisation (``init="seed"``) is for
the parameters of graphs built in code (the zoo) or when asked for; never for buffers or constants.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Union

import numpy as np

from . import _weft

__all__ = ["load_values", "values_of", "save_graph", "load_graph", "value_file_keys", "INITS"]

INITS = (None, "values", "seed")
_VALUE_ROLES = ("parameter", "buffer", "constant")


def check_init(init) -> bool:
    """``init`` -> whether every parameter without a value is drawn from the seed."""
    if init not in INITS:
        raise ValueError(f"init must be None / 'values' (the graph's values; seeded only for graphs built in code) "
                         f"or 'seed' (parameters without a value from the seed), got {init!r}")
    return init == "seed"


def _array(name: str, v) -> np.ndarray:
    """A tensor-like as a float64 numpy array (torch tensors on any device, bf16 included)."""
    if hasattr(v, "detach") and hasattr(v, "cpu"):  # a torch tensor (no torch import needed)
        if getattr(v, "is_meta", False) or str(getattr(v, "device", "")) == "meta":
            raise ValueError(f"load_values: '{name}' is on the meta device (it has no values)")
        t = v.detach().cpu()
        t = t.double() if t.is_floating_point() or str(t.dtype) == "torch.bool" else t.long()
        return t.numpy()
    try:
        return np.asarray(v)
    except Exception as e:  # noqa: BLE001
        raise TypeError(f"load_values: '{name}' is a {type(v).__name__}, not an array or a tensor") from e


def value_file_keys(path: str) -> Dict[str, dict]:
    """The tensors of a safetensors file: key -> {"dtype", "shape"} (read from its header only)."""
    return _weft._value_file_header(str(path))


def load_values(graph, values: Union[Mapping[str, Any], str, os.PathLike], *, strict: bool = True) -> list:
    """Gives ``graph`` (a forward graph or its training step) the values of its Parameter, Buffer and
    Constant leaves, by name (a module's ``state_dict`` names, as :func:`weft.from_torch` keeps them).

    ``values``: a mapping name -> tensor / array (copied, as float64), or the path of a
    ``.safetensors`` file (referenced, not read: each rank of a run reads what its tiles need).
    Keys that are not leaves of the graph are ignored (a state_dict holds buffers an import
    may not use). ``strict``: every Parameter and Buffer must then have a value (ValueError naming
    those left without). A shape mismatch is a ValueError. Returns the names that were set."""
    if not isinstance(graph, _weft.Graph):
        raise TypeError(f"load_values: expected a weft.Graph, got {type(graph).__name__}")
    leaves = {t["name"]: t for t in graph.tensors if t["producer"] is None and t["role"] in _VALUE_ROLES}
    done = []
    if isinstance(values, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(values))
        if not os.path.exists(path):
            raise ValueError(f"load_values: no such file {path!r}")
        keys = value_file_keys(path)
        for name, info in keys.items():
            t = leaves.get(name)
            if t is None:
                continue
            if tuple(info["shape"]) != tuple(t["shape"]):
                raise ValueError(f"load_values: '{name}' has shape {tuple(info['shape'])} in {path}, the graph's "
                                 f"tensor {tuple(t['shape'])}")
            graph.set_value_file(t["id"], path, name)
            done.append(name)
    elif isinstance(values, Mapping):
        for name, v in values.items():
            t = leaves.get(str(name))
            if t is None:
                continue
            a = _array(str(name), v)
            if tuple(a.shape) != tuple(t["shape"]):
                raise ValueError(f"load_values: '{name}' has shape {tuple(a.shape)}, the graph's tensor "
                                 f"{tuple(t['shape'])}")
            graph.set_value(t["id"], a)
            done.append(str(name))
    else:
        raise TypeError(f"load_values: values must be a mapping name -> tensor or a .safetensors path, got "
                        f"{type(values).__name__}")
    if strict:
        missing = [n for n, t in leaves.items() if t["role"] in ("parameter", "buffer") and not graph.tensor(t["id"])["has_value"]]
        if missing:
            shown = ", ".join(missing[:10]) + (f", ... ({len(missing)} in all)" if len(missing) > 10 else "")
            raise ValueError(f"load_values: no value for {shown} (strict=True; the given values have "
                             f"{len(done)} of the graph's leaves)")
    return done


def values_of(graph) -> Dict[str, np.ndarray]:
    """Name -> float64 array of every value ``graph`` carries (file-backed ones read)."""
    return {t["name"]: graph.value(t["id"]) for t in graph.tensors if t.get("has_value")}


def save_graph(graph, path: str, *, inline_limit: int = 4096) -> None:
    """Writes ``graph`` as JSON to ``path``; values of more than ``inline_limit`` elements go to the
    value file ``<path>.values.safetensors`` beside it (named in the JSON relative to it)."""
    path = os.fspath(path)
    sidecar = path + ".values.safetensors"
    text = graph.to_json(sidecar=sidecar, sidecar_ref=os.path.basename(sidecar), inline_limit=int(inline_limit))
    with open(path, "w") as f:
        f.write(text)


def load_graph(path: str):
    """A graph saved by :func:`save_graph` (or any graph JSON): relative value files are found beside it."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ValueError(f"no such file {path!r}")
    with open(path) as f:
        text = f.read()
    return _weft.Graph.from_json(text, base_dir=os.path.dirname(os.path.abspath(path)))


def install() -> None:
    _weft.Graph.save = save_graph
    _weft.Graph.load = staticmethod(load_graph)
