"""Tensor handles for the graph builder: every builder call of :class:`weft.Graph` returns a
:class:`Tensor` (the tensor's integer id, with its name, shape and dtype), and takes one wherever a
tensor is expected.

    >>> g = weft.Graph("mlp")
    >>> x = g.input("x", [8, 16])            # Tensor(0, 'x', shape=[8, 16], dtype=f32)
    >>> w = g.parameter("w", [16, 4])
    >>> y = g.matmul(x, w)                   # y.shape == (8, 4), y.name, y.dtype, y.id
    >>> g.set_loss(g.reduce("mean", y, [0, 1]))

``Tensor`` is an ``int`` subclass (its value is the id), so code that stored, compared or indexed
with ids keeps working. Passing a bare ``int`` id to a builder call still works, with a
``DeprecationWarning`` pointing at the call (weft's own modules are exempt).
"""
from __future__ import annotations

import functools
import sys
import warnings
from typing import Any, Callable, Dict, Tuple

__all__ = ["Tensor"]


class Tensor(int):
    """A handle on one tensor of a :class:`weft.Graph`: ``id`` (its index in ``graph.tensors``; the
    handle's integer value), ``name``, ``shape`` (a tuple of element counts per dimension) and
    ``dtype`` ("f32", "bf16", "i64", ...). Immutable; equal to, and hashed as, its id."""

    name: str
    shape: Tuple[int, ...]
    dtype: str

    def __new__(cls, id: int, name: str, shape, dtype: str) -> "Tensor":
        self = super().__new__(cls, int(id))
        object.__setattr__(self, "name", str(name))
        object.__setattr__(self, "shape", tuple(int(s) for s in shape))
        object.__setattr__(self, "dtype", str(dtype))
        return self

    @property
    def id(self) -> int:
        """The tensor's id in its graph (a plain int)."""
        return int(self)

    @property
    def ndim(self) -> int:
        """The number of dimensions."""
        return len(self.shape)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError("a weft.Tensor handle is immutable")

    def __reduce__(self):
        return (Tensor, (int(self), self.name, self.shape, self.dtype))

    __str__ = int.__repr__  # str(t), f"{t}" and json stay the id

    def __repr__(self) -> str:
        return f"Tensor({int(self)}, {self.name!r}, shape={list(self.shape)}, dtype={self.dtype})"


def handle(graph, tid) -> Any:
    """The Tensor handle of id ``tid`` in ``graph`` (None stays None; a Tensor is returned as is)."""
    if tid is None or isinstance(tid, Tensor) or not isinstance(tid, int):
        return tid
    info = graph.tensor(tid)
    return Tensor(tid, info["name"], info["shape"], info["dtype"])


def _internal(frame) -> bool:
    name = frame.f_globals.get("__name__", "") if frame is not None else ""
    return name == "weft" or name.startswith("weft.")


def _bare(value: Any) -> bool:
    """A bare int id (not a Tensor handle, not a bool), or a list / tuple holding one."""
    if isinstance(value, (list, tuple)):
        return any(type(v) is int for v in value)
    return type(value) is int


def _warn_bare(method: str, params, frame) -> None:
    if not _internal(frame):
        warnings.warn(f"Graph.{method}: {', '.join(repr(p) for p in params)} got a bare int tensor id; pass the "
                      "weft.Tensor handle the builder returned (bare ints are deprecated here)", DeprecationWarning,
                      stacklevel=3)


# Builder call -> its tensor parameters as (name, position after self).
_TENSOR_PARAMS: Dict[str, Tuple[Tuple[str, int], ...]] = {
    "input": (), "parameter": (), "constant": (),
    "einsum": (("operands", 1),), "matmul": (("a", 0), ("b", 1)), "unary": (("x", 1),), "scale": (("x", 0),),
    "dropout": (("x", 0),), "cast": (("x", 0),), "binary": (("a", 1), ("b", 2)), "reduce": (("x", 1),), "softmax": (("x", 0),),
    "layer_norm": (("x", 0), ("gamma", 1), ("beta", 2)), "embedding": (("table", 0), ("ids", 1)),
    "cross_entropy": (("logits", 0), ("labels", 1), ("weight", 3)), "transpose": (("x", 0),), "reshape": (("x", 0),),
    "concat": (("xs", 0),), "slice": (("x", 0),), "conv2d": (("x", 0), ("w", 1)), "pool2d": (("x", 1),),
    "opaque": (("inputs", 0),), "set_loss": (("t", 0),), "mark_output": (("t", 0),),
    "attention": (("q", 0), ("k", 1), ("v", 2)),
}
for _fn in ("relu", "gelu", "tanh", "exp", "log", "sigmoid", "sqrt", "rsqrt", "square", "neg"):
    _TENSOR_PARAMS[_fn] = (("x", 0),)
for _fn in ("add", "sub", "mul", "div", "maximum"):
    _TENSOR_PARAMS[_fn] = (("a", 0), ("b", 1))
# Lookups that return an id (as a handle); their arguments are not checked.
_LOOKUPS = ("find", "grad", "grad_of")


def _wrap_builder(name: str, orig: Callable, params: Tuple[Tuple[str, int], ...]) -> Callable:
    @functools.wraps(orig)
    def method(self, *args, **kwargs):
        bare = [p for p, pos in params if _bare(args[pos] if pos < len(args) else kwargs.get(p))]
        if bare:
            _warn_bare(name, bare, sys._getframe(1))
        out = orig(self, *args, **kwargs)
        if isinstance(out, tuple):  # several results (attention's out and lse): a handle each
            return tuple(handle(self, t) for t in out)
        return handle(self, out)

    method.__doc__ = (orig.__doc__ or "") + "\n\nReturns a :class:`weft.Tensor` handle (an int subclass: the id)."
    return method


def _wrap_lookup(orig: Callable) -> Callable:
    @functools.wraps(orig)
    def method(self, *args, **kwargs):
        return handle(self, orig(self, *args, **kwargs))

    return method


def install() -> None:
    """Wraps the builder methods of the C++ ``Graph`` class (once)."""
    from . import _weft

    G = _weft.Graph
    if getattr(G, "_weft_tensor_handles", False):
        return
    for name, params in _TENSOR_PARAMS.items():
        orig = getattr(G, name, None)
        if orig is not None:
            setattr(G, name, _wrap_builder(name, orig, params))
    for name in _LOOKUPS:
        orig = getattr(G, name, None)
        if orig is not None:
            setattr(G, name, _wrap_lookup(orig))
    loss = G.__dict__["loss"]
    outputs = G.__dict__["outputs"]
    G.loss = property(lambda g: handle(g, loss.fget(g)), doc="The loss tensor (a Tensor handle) or None.")
    G.outputs = property(lambda g: [handle(g, t) for t in outputs.fget(g)],
                         doc="The tensors marked as outputs (Tensor handles).")
    G._weft_tensor_handles = True
