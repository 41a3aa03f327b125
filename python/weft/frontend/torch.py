"""Import a PyTorch ``nn.Module`` into a weft forward graph (with a scalar loss), exactly.

    >>> ce = lambda logits, y: F.cross_entropy(logits.flatten(0, 1), y.flatten())
    >>> g = weft.from_torch(model, (tokens,), loss_fn=ce, targets=(labels,))
    >>> feeds = weft.feeds_from_torch(model, (tokens,), (labels,), loss_fn=ce)
    >>> weft.interpret(g, feeds)[g.tensor(g.loss)["name"]]   # == the module's loss

The module is captured with ``torch.export.export`` (non-strict; ATen ops, before the core
decompositions so that ``linear``, ``layer_norm`` and ``scaled_dot_product_attention`` arrive
whole). Every ATen op maps to weft IR ops through one small handler in :data:`HANDLERS`; an op
without a handler raises ``ValueError`` naming the op, the module path it came from and the
supported ops. Nothing is approximated: an op whose semantics the IR cannot express exactly
(a data-dependent mask, channel dropout in training mode, ...) is rejected. Dropout in training
mode becomes the IR's ``dropout`` op: the same probability, but its mask is the IR's counter-based
hash (so every shard of a distributed plan draws its part of one mask), not torch's RNG stream.

Leaves: parameters keep their ``state_dict`` names (a parameter shared by several modules is one
tensor, named by its first name); user inputs are named after ``forward``'s arguments, targets
after ``loss_fn``'s arguments. Buffers and everything computed only from buffers, literals and
factory ops (``arange``, ``tril``, ``ones``, ``masked_fill`` masks, ...) are folded in torch and
enter the graph as Constant leaves: a buffer under its ``state_dict`` name, anything else as
``const.<node>``. Constant values are *fed*: :func:`feeds_from_torch` returns them together with
the parameters and inputs. A module on ``device="meta"`` imports without allocating anything
(export traces with fake tensors; folded constants stay meta).

torch is imported lazily: ``import weft`` works without it. See docs/modules/frontend.md.
"""
from __future__ import annotations

import inspect
import math
import operator
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import _weft
from .attention_fusion import fuse_written_attention

__all__ = ["from_torch", "feeds_from_torch", "supported_ops", "HANDLERS"]


# ---- values flowing through the import

@dataclass
class _T:
    """A weft tensor: its id and shape."""
    id: int
    shape: Tuple[int, ...]


@dataclass
class _C:
    """A folded constant: a torch tensor (real, or meta for a meta model). `name` is set for a
    buffer / lifted constant (its state_dict name)."""
    value: Any
    name: Optional[str] = None


class _Unusable:
    """An output of a multi-output op that the IR does not compute (e.g. layer norm's mean)."""

    def __init__(self, what: str):
        self.what = what


class _Perm:
    """A transpose not emitted yet: einsums read `src` with permuted letters and elementwise
    unary ops apply to `src`, so that attention's transposes fold into its einsums as in the
    zoo's layout. Emitted (once) where another op needs it."""

    def __init__(self, src: _T, perm: List[int], name: str):
        self.src, self.perm, self.name = src, list(perm), name
        self.shape = tuple(src.shape[p] for p in perm)
        self.done: Optional[_T] = None


class _Lazy:
    """A value made when something reads it, in the form the reader needs (frontend/indexing.py: an
    integer comparison — a bool tensor in torch —, a one-hot): `materialise(ctx, floating)` gives the
    weft tensor, floating point where the reader converts it to a float or combines it with one (the
    IR has no dtype conversion), else integer."""

    shape: Tuple[int, ...] = ()

    def materialise(self, ctx, floating: bool) -> _T:
        raise NotImplementedError


@dataclass
class _LogSoftmax(_T):
    """A log_softmax result, remembered so that nll_loss(log_softmax(x)) becomes cross_entropy."""
    src: int = -1
    dim: int = -1


def _torch():
    import torch  # noqa: PLC0415 (lazy: weft works without torch)
    return torch


def _weft_dtype(tdtype, float_dtype: str) -> str:
    torch = _torch()
    if tdtype.is_floating_point:
        return float_dtype
    if tdtype == torch.int64:
        return "i64"
    if tdtype in (torch.int32, torch.int16, torch.int8, torch.uint8):
        return "i32"
    raise ValueError(f"weft.from_torch: tensors of dtype {tdtype} are not supported as graph inputs")


_SIGNIFICAND = {"bf16": 8, "f16": 11, "f32": 24, "f64": 53}


def _float_dtype_of(tdtype) -> str:
    torch = _torch()
    return {torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}.get(tdtype, "f32")


class _HoldFloatDtype:
    """A torch function mode (made on first use: torch is imported lazily) under which every ATen op's
    float dtype argument is `dtype` (`to(x, float32)`, `_to_copy(dtype=...)`, `softmax(x, d, float32)`,
    a factory's `dtype=`): constants folded during an import with float_casts="ignore" hold the
    module's float dtype, as the graph does. Higher-order ops (an autocast-disabled region) are called
    as they are: the ATen ops inside them meet the mode."""

    def __init__(self, dtype):
        self.dtype = dtype
        self._mode = None

    def __enter__(self):
        if self._mode is None:
            torch = _torch()
            from torch.overrides import TorchFunctionMode  # noqa: PLC0415

            want = self.dtype

            def hold(v):
                if isinstance(v, torch.dtype) and v.is_floating_point and v != want:
                    return want
                if isinstance(v, (list, tuple)):
                    return type(v)(hold(x) for x in v)
                return v

            class Mode(TorchFunctionMode):
                def __torch_function__(self, func, types, args=(), kwargs=None):
                    kwargs = kwargs or {}
                    if isinstance(func, torch._ops.OpOverload):
                        args, kwargs = hold(tuple(args)), {k: hold(v) for k, v in kwargs.items()}
                    return func(*args, **kwargs)

            self._mode = Mode()
        return self._mode.__enter__()

    def __exit__(self, *exc):
        return self._mode.__exit__(*exc)


_FLOAT_CASTS = ("module", "ignore")


def _check_float_casts(float_casts, who: str) -> str:
    if not isinstance(float_casts, str) or float_casts not in _FLOAT_CASTS:
        raise ValueError(f"weft.{who}: float_casts must be one of {', '.join(map(repr, _FLOAT_CASTS))}, "
                         f"got {float_casts!r}")
    return float_casts


class _Ctx:
    """State of one import: the graph, the current node, constants and leaf values."""

    def __init__(self, g, float_dtype: str, module_dtype=None):
        self.g = g
        self.float_dtype = float_dtype
        # The module's own float dtype is the graph's (float_dtype); a value of another float dtype
        # (an f32 region of an f64 model: Llama's RMSNorm) keeps its own, reached through a cast.
        self.module_dtype = module_dtype
        self.cur_float = float_dtype  # the float dtype of the node being imported (new constants take it)
        self.mixed = False  # whether a cast was emitted: only then are operands of each node converted
        self._casts: Dict[Tuple[int, str], _T] = {}
        self.node = None
        self.path = ""
        self.values: Dict[str, Any] = {}  # leaf name -> torch tensor (or None for user inputs)
        self.buffer_names: set = set()  # the module's buffers (Buffer leaves; other folded values are Constants)
        self.batch: Optional[int] = None  # the leading size of the first user input (the batch)
        self._const_ids: Dict[str, Tuple[int, List[int], str]] = {}  # constant leaf name -> (id, shape, dtype)
        self._n_scalars = 0
        self._n_dropouts = 0
        self.out_perm: Dict[Any, List[int]] = {}  # fx node -> permutation fused into its final einsum
        self.fused_attention = True  # scaled_dot_product_attention without mask / dropout as one op

    # -- naming
    def name(self, suffix: str = "") -> str:
        base = (self.path + "." if self.path else "") + self.node.name
        return base + ("." + suffix if suffix else "")

    # -- errors
    def fail(self, msg: str):
        raise ValueError(f"weft.from_torch: {self.node.target} (node '{self.node.name}'{self._where()}): {msg}")

    def _where(self) -> str:
        """The user's module of the current node (its path and class), or 'in loss_fn' for an op of
        the loss function (run by the importer's wrapper module, which the user never wrote)."""
        stack = list((self.node.meta.get("nn_module_stack") or {}).values())
        c = stack[-1][1] if stack else ""
        cls = c if isinstance(c, str) else f"{c.__module__}.{c.__qualname__}"
        if self.path:
            return f", module {self.path!r} {cls}".rstrip()
        if stack and str(stack[0][1]).endswith("_WithLoss"):
            return ", in loss_fn"
        return ""

    # -- operands
    def const(self, value, suffix: str) -> _C:
        """A new folded constant made by a handler (named const.<node>.<suffix>)."""
        c = _C(value, "const." + self.node.name + ("." + suffix if suffix else ""))
        return c

    def tensor(self, v, like: Optional[_T] = None) -> _T:
        """Any operand as a weft tensor: constants and Python scalars become Constant leaves."""
        torch = _torch()
        if isinstance(v, _T):
            return v
        if isinstance(v, _Unusable):
            self.fail(f"uses {v.what}, which weft does not compute")
        if isinstance(v, _Lazy):
            return v.materialise(self, like is not None and _is_float_weft(self.g, like.id))
        if isinstance(v, _Flat):
            if v.done is None:
                v.done = self._t(self.g.reshape(v.src.id, list(v.shape), v.node_name))
            return v.done
        if isinstance(v, _Perm):
            if v.done is None:
                v.done = self._t(self.g.transpose(v.src.id, v.perm, v.name))
            return v.done
        if isinstance(v, (bool, int, float)):
            dt = torch.float64 if (isinstance(v, float) or like is None or
                                   _is_float_weft(self.g, like.id)) else torch.int64
            self._n_scalars += 1
            v = self.const(torch.tensor(v, dtype=dt), f"s{self._n_scalars}")
        if not isinstance(v, _C):
            self.fail(f"expected a tensor operand, got {type(v).__name__}")
        val = v.value
        shape = [int(s) for s in val.shape]
        name = v.name or f"const.{self.node.name}"
        # One leaf per name: a buffer reached through several shape-preserving views is one tensor
        # (read at another float dtype -- the same constant in an f32 region -- it is a leaf of its own).
        dt = self.cur_float if (val.dtype.is_floating_point or val.dtype == torch.bool) else \
            _weft_dtype(val.dtype, self.float_dtype)
        key = name
        while key in self._const_ids and self._const_ids[key][1:] != (shape, dt):
            key += "'"
        if (key not in self._const_ids and name not in self.buffer_names and self.batch is not None
                and len(shape) >= 1 and shape[0] == self.batch > 1 and val.device.type != "meta"
                and bool((val == val[:1]).all())):
            # Batch-sized with every sample's row the same (T5's all-ones masks, OPT's position ids from
            # a cumsum of ones(batch, seq)): one row broadcast over the batch, so the graph re-batches.
            row = self.tensor(_C(val[0], name + ".row"), like)
            out = self.g.broadcast_to(row.id, shape, [0], name + ".rows")
            self._const_ids[key] = (out, shape, dt)
            return _T(out, tuple(shape))
        if key not in self._const_ids:
            if val.dtype == torch.bool:
                val = val.to(torch.float64)
            make = self.g.buffer if name in self.buffer_names else self.g.constant
            self._const_ids[key] = (make(key, shape, dt), shape, dt)
            self.values[key] = val
        return _T(self._const_ids[key][0], tuple(shape))

    # -- float dtypes (a cast, and what a node computes in)
    def weft_float(self, tdtype) -> str:
        """The graph's dtype of a torch float dtype: the module's own is the graph's, any other its own."""
        if self.module_dtype is None or tdtype == self.module_dtype:
            return self.float_dtype
        return _float_dtype_of(tdtype)

    def dtype_of(self, v) -> Optional[str]:
        """The weft dtype of a graph value (a view: of its source); None for anything else."""
        if isinstance(v, (_Perm, _Flat)):
            v = v.src if v.done is None else v.done
        return self.g.tensor(v.id)["dtype"] if isinstance(v, _T) else None

    def cast(self, v, dtype: str) -> _T:
        """v converted to the float dtype `dtype` (itself when it has it): one cast op per (tensor, dtype)."""
        t = self.tensor(v)
        if self.g.tensor(t.id)["dtype"] == dtype:
            return t
        key = (t.id, dtype)
        if key not in self._casts:
            self._casts[key] = self._t(self.g.cast(t.id, dtype, self.name("to_" + dtype)))
            self.mixed = True
        return self._casts[key]

    def node_float(self, node) -> Optional[str]:
        """The float dtype node computes in: its (first) result's, when floating point."""
        torch = _torch()
        val = node.meta.get("val")
        if isinstance(val, (list, tuple)):
            val = next((x for x in val if isinstance(x, torch.Tensor)), None)
        if isinstance(val, torch.Tensor) and val.is_floating_point():
            return self.weft_float(val.dtype)
        return None

    def harmonise(self, args, kwargs, want: Optional[str]):
        """The node's float operands converted to the dtype it computes in (torch's promotion: a node
        with a float result computes in that result's dtype; one without, e.g. a comparison, in the
        widest of its operands')."""
        floats = set()

        def scan(v):
            if isinstance(v, (list, tuple)):
                for x in v:
                    scan(x)
            else:
                d = self.dtype_of(v)
                if d is not None and not d.startswith("i"):
                    floats.add(d)

        scan(args)
        scan(list(kwargs.values()))
        if want is None:
            if len(floats) < 2:
                return args, kwargs
            want = max(floats, key=lambda d: _SIGNIFICAND[d])
        if not floats or floats == {want}:
            return args, kwargs

        def conv(v):
            if isinstance(v, (list, tuple)):
                return type(v)(conv(x) for x in v)
            d = self.dtype_of(v)
            return self.cast(v, want) if d is not None and not d.startswith("i") and d != want else v

        return conv(args), {k: conv(x) for k, x in kwargs.items()}

    # -- emitting (names: the node's name, suffixed for the 2nd.. op of a handler)
    def _t(self, tid: int) -> _T:
        return _T(tid, tuple(self.g.tensor(tid)["shape"]))

    def op_name(self, suffix: str) -> str:
        return self.name(suffix)

    def einsum(self, eq, xs, suffix=""):
        lhs, rhs = eq.split("->")
        terms = lhs.split(",")
        ids = []
        for i, x in enumerate(xs):
            if isinstance(x, _Perm) and x.done is None:  # read the source with permuted letters
                src_term = [""] * len(x.perm)
                for j, p in enumerate(x.perm):
                    src_term[p] = terms[i][j]
                terms[i] = "".join(src_term)
                ids.append(x.src.id)
            else:
                ids.append(self.tensor(x).id)
        if not suffix and self.out_perm.get(self.node) is not None:  # a transpose of this result, fused
            rhs = "".join(rhs[p] for p in self.out_perm[self.node])
        return self._t(self.g.einsum(",".join(terms) + "->" + rhs, ids, self.op_name(suffix)))

    def unary(self, fn, x, suffix="", scalar=0.0):
        if isinstance(x, _Perm) and x.done is None:  # elementwise: commutes with the transpose
            y = self._t(self.g.unary(fn, x.src.id, self.op_name(suffix), float(scalar)))
            return _Perm(y, x.perm, self.name((suffix + "." if suffix else "") + "transpose"))
        return self._t(self.g.unary(fn, self.tensor(x).id, self.op_name(suffix), float(scalar)))

    def dropout(self, x, p, suffix=""):
        """Training-mode dropout: the IR's counter-based mask (not torch's RNG), seeded by the
        dropout's place in the module (1, 2, ... in execution order): each dropout draws its own
        mask, and every shard of a plan draws its part of the same one."""
        p = float(p)
        if not 0 <= p < 1:
            self.fail(f"dropout probability {p} is not in [0, 1)")
        self._n_dropouts += 1
        return self._t(self.g.dropout(self.tensor(x).id, p, self._n_dropouts, self.op_name(suffix)))

    def binary(self, fn, a, b, suffix=""):
        if isinstance(a, _Lazy) or isinstance(b, _Lazy):  # torch promotes a bool / int operand to the other's kind
            a, b = (v.materialise(self, _floating_operand(self, w)) if isinstance(v, _Lazy) else v
                    for v, w in ((a, b), (b, a)))
        if isinstance(a, _C) and _is_graph(b):
            a = _squeeze_const(a, b.shape)
        if isinstance(b, _C) and _is_graph(a):
            b = _squeeze_const(b, a.shape)
        like = self.tensor(a) if _is_graph(a) else self.tensor(b) if _is_graph(b) else None
        return self._t(self.g.binary(fn, self.tensor(a, like).id, self.tensor(b, like).id, self.op_name(suffix)))

    def reshape(self, x, shape, suffix=""):
        """A lazy reshape (see _Flat)."""
        shape = tuple(int(s) for s in shape)
        if tuple(x.shape) == shape:
            return x
        if isinstance(x, _Lazy) and hasattr(x, "reshaped"):  # a view of a comparison stays one
            return x.reshaped(self, shape)
        src = x.src if isinstance(x, _Flat) else self.tensor(x)
        if tuple(src.shape) == shape:
            return src
        return _Flat(src, shape, self.op_name(suffix))

    def reduce(self, fn, x, axes, suffix=""):
        return self._t(self.g.reduce(fn, self.tensor(x).id, list(axes), self.op_name(suffix)))


def _squeeze_const(c: _C, other_shape) -> _C:
    """A constant operand of a broadcasting op without its leading dims that are broadcast
    (stride 0, e.g. a mask expanded over the batch) or of size 1, when the result's shape stays
    the same: no batch-sized constant (the planner re-batches activations, not constants)."""
    v = c.value
    shape = list(v.shape)
    full = _broadcast_shape(shape, list(other_shape))
    while v.dim() > 0 and (v.shape[0] == 1 or v.stride(0) == 0):
        w = v[0]
        if _broadcast_shape(list(w.shape), list(other_shape)) != full:
            break
        v = w
    return c if v.dim() == len(shape) else _C(v, (c.name or "const") + ".squeezed")


def _broadcast_shape(a, b):
    r = max(len(a), len(b))
    a, b = [1] * (r - len(a)) + a, [1] * (r - len(b)) + b
    return [max(x, y) if 1 in (x, y) else (x if x == y else -1) for x, y in zip(a, b)]


def _is_graph(v) -> bool:
    """A value that lives in the weft graph (emitted or lazily pending)."""
    return isinstance(v, (_T, _Perm, _Flat, _Lazy))


def _floating_operand(ctx, v) -> bool:
    """Whether an operand is floating point (a float scalar, a float constant or graph tensor)."""
    if isinstance(v, _Lazy):
        return False
    if _is_graph(v):
        return _is_float_weft(ctx.g, ctx.tensor(v).id)
    if isinstance(v, _C):
        return v.value.is_floating_point()
    return isinstance(v, float)


def _is_float_weft(g, tid: int) -> bool:
    return not g.tensor(tid)["dtype"].startswith("i")


# ---- the registry: ATen op -> handler(ctx, node, *args, **kwargs) -> value

HANDLERS: Dict[Any, Callable] = {}
_BY_NAME: Dict[str, Callable] = {}  # "aten.linear.default" -> handler (filled lazily into HANDLERS)


def _reg(*names: str):
    """Registers a handler for ATen overloads given as 'linear.default' (aten namespace)."""
    def deco(fn):
        for n in names:
            _BY_NAME["aten." + n] = fn
        return fn
    return deco


def _handler_for(target):
    if not HANDLERS:
        torch = _torch()
        for n, fn in _BY_NAME.items():
            _, op, ov = n.split(".")
            packet = getattr(torch.ops.aten, op, None)
            if packet is not None and hasattr(packet, ov):
                HANDLERS[getattr(packet, ov)] = fn
        HANDLERS[operator.getitem] = _getitem
    return HANDLERS.get(target)


_VIEW_OPS = ("view", "reshape", "_unsafe_view", "transpose", "permute", "t", "numpy_T", "mT", "mH", "adjoint",
             "slice", "select", "expand",
             "unsqueeze", "squeeze", "split", "split_with_sizes", "chunk", "unbind", "alias", "flatten", "unflatten",
             "view_as",
             "as_strided", "diagonal", "narrow")


def _functional_of(target):
    """aten.add_.Tensor -> aten.add.Tensor (the functional form of an in-place op), or None."""
    name = str(target)
    parts = name.split(".")
    if len(parts) != 3 or parts[0] != "aten" or not parts[1].endswith("_") or parts[1].startswith("_"):
        return None
    packet = getattr(_torch().ops.aten, parts[1][:-1], None)
    return getattr(packet, parts[2], None) if packet is not None else None


def _only_converted_to_float(node, live) -> bool:
    """Whether every use of an (integer or bool) input reaches a conversion to floating point
    through shape-only ops: then the input is declared floating point (the graph's dtype) and the
    conversion is the identity, or a cast to another float dtype (the IR converts no integers). An
    arithmetic op whose result is floating point converts too: torch promotes the integer operand
    (Hugging Face T5's `causal_mask + attention_mask[:, None, None, :]`)."""
    seen, stack, found = set(), list(node.users), False
    while stack:
        u = stack.pop()
        if u in seen or u not in live:
            continue
        seen.add(u)
        parts = str(u.target).split(".")
        op = parts[1] if len(parts) == 3 and parts[0] == "aten" else None
        val = u.meta.get("val")
        if op in ("_to_copy", "to", "type_as") and val is not None and val.is_floating_point():
            found = True
        elif op in ("add", "sub", "rsub", "mul", "div") and val is not None and val.is_floating_point():
            found = True  # promoted by the op
        elif op in ("add", "sub", "rsub", "mul") and val is not None and not val.is_floating_point() \
                and "bool" not in str(val.dtype):
            stack.extend(u.users)  # integer arithmetic before the promotion (1 - mask): exact in floats
        elif op in _VIEW_OPS or op in ("contiguous", "clone", "detach", "expand_as", "broadcast_to"):
            stack.extend(u.users)
        else:
            return False
    return found


def supported_ops() -> List[str]:
    """The ATen ops (overloads) the importer maps, sorted."""
    return sorted(_BY_NAME)


def _out_shape(node) -> Tuple[int, ...]:
    v = node.meta.get("val")
    return tuple(int(s) for s in v.shape)


def _norm(d: int, r: int) -> int:
    return d + r if d < 0 else d


_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _getitem(ctx, node, seq, i):
    return seq[i]


# -- identities
@_reg("contiguous.default", "clone.default", "alias.default", "lift_fresh_copy.default")
def _identity(ctx, node, x, *args, **kwargs):
    return x


@_reg("detach.default")
def _detach(ctx, node, x, *args, **kwargs):
    """detach: the same value, no gradient through it. Exact as the identity where no parameter is
    upstream (a mask, a position table: no gradient to stop); a stop-gradient on a tensor that depends
    on a parameter has no IR op yet: refused, never a silently different gradient."""
    if _is_graph(x) and _depends_on_parameter(ctx.g, ctx.tensor(x).id):
        ctx.fail("detach of a tensor that depends on a parameter (a stop-gradient) is not supported: its gradient "
                 "would flow through here")
    return x


def _depends_on_parameter(g, tid: int) -> bool:
    """Whether a Parameter leaf is upstream of tensor tid in g."""
    inputs_of = {o["name"]: o["inputs"] for o in g.ops}
    seen, stack = set(), [tid]
    while stack:
        t = stack.pop()
        if t in seen:
            continue
        seen.add(t)
        info = g.tensor(t)
        if info["role"] == "parameter" and info["producer"] is None:
            return True
        if info["producer"] is not None:
            stack.extend(inputs_of[info["producer"]])
    return False


@_reg("_to_copy.default", "to.dtype", "to.dtype_layout", "to.device", "type_as.default")
def _to(ctx, node, x, *args, **kwargs):
    """A conversion: float -> float is the IR's cast (an identity where the dtypes agree); int -> int
    the identity; int -> float only where the input was declared floating point (see
    _only_converted_to_float), else refused."""
    out = node.meta["val"].dtype
    if isinstance(x, _Lazy):  # a comparison / one-hot: made in the dtype kind asked for
        return x.materialise(ctx, out.is_floating_point)
    src = ctx.dtype_of(x) or ctx.g.tensor(ctx.tensor(x).id)["dtype"]  # a value weft cannot use fails here
    if out.is_floating_point != (not src.startswith("i")):
        ctx.fail("a conversion between integer and floating point tensors is not supported")
    if out.is_floating_point:
        return ctx.cast(x, ctx.weft_float(out))
    return x


@_reg("dropout.default")
def _dropout(ctx, node, x, p, train):
    if p == 0 or not train:
        return x
    return ctx.dropout(x, p)


@_reg("native_dropout.default")
def _native_dropout(ctx, node, x, p, train):
    y = x if (p == 0 or train is False) else ctx.dropout(x, p)
    return y, _Unusable("native_dropout's mask")


@_reg("feature_dropout.default")
def _feature_dropout(ctx, node, x, p, train):
    if p == 0 or not train:
        return x
    ctx.fail(f"channel dropout (Dropout1d/2d/3d) with p={p} in training mode is not supported: its mask is "
             "per channel (put the module in eval() or use p=0)")


# -- matmuls
def _rows(ctx, x):
    """x = t.view(-1, k) (lazy) with t's leading dims merged into the rows (Conv1D / addmm style):
    t viewed as [lead..., k] (no reshape when t is [lead..., k]), or None."""
    if not (isinstance(x, _Flat) and len(x.shape) == 2 and len(x.src.shape) > 2):
        return None
    src, (N, k) = x.src, x.shape
    prod, i = 1, 0
    while i < len(src.shape) and prod < N:
        prod *= src.shape[i]
        i += 1
    if prod != N or i < 2:
        return None
    return ctx.reshape(src, list(src.shape[:i]) + [k], "rows_in")


def _matmul_rows(ctx, node, x, w, bias, w_term):
    """y = x @ w (+ bias) over the last dim of x. When x is a lazy view(-1, k) of [..., k], the
    product is taken on [..., k] and its view(-1, n) is lazy again, so that the batch stays in
    dim 0 (a following view back to [..., n] costs nothing, and the planner can re-batch)."""
    src = _rows(ctx, x)
    xx = src if src is not None else x
    lead = _LETTERS[:len(xx.shape) - 1]
    y = ctx.einsum(f"{lead}z,{w_term}->{lead}y", [xx, w], "matmul" if bias is not None else "")
    if bias is not None:
        y = ctx.binary("add", y, bias)
    if src is not None:
        y = _Flat(ctx.tensor(y), _out_shape(node), ctx.name("rows"))
    return y


@_reg("linear.default")
def _linear(ctx, node, x, w, b=None):
    if len(w.shape) != 2:
        ctx.fail("linear weight must be 2-D")
    return _matmul_rows(ctx, node, x, w, b, "yz")


def _beta_alpha(ctx, bias, b, beta, alpha):
    """beta·bias + alpha·(a @ b) as (bias', b'): alpha scales the right factor (usually a weight,
    never the batch-sized side), beta the bias. beta == 0: torch ignores the bias's values but
    still gives it a (zero) gradient, so a bias in the graph is kept, scaled by 0 (a NaN in it would
    then propagate); a constant bias is dropped."""
    b = _scale(ctx, b, alpha, "alpha") if alpha != 1 else b
    if beta == 0 and not _is_graph(bias):
        return None, b
    return (ctx.unary("scale", bias, "beta", float(beta)) if beta != 1 else bias), b


@_reg("addmm.default")
def _addmm(ctx, node, bias, a, b, beta=1, alpha=1):
    bias, b = _beta_alpha(ctx, bias, b, beta, alpha)
    return _matmul_rows(ctx, node, a, b, bias, "zy")


@_reg("baddbmm.default")
def _baddbmm(ctx, node, bias, a, b, beta=1, alpha=1):
    bias, b = _beta_alpha(ctx, bias, b, beta, alpha)
    y = ctx.einsum("bmk,bkn->bmn", [a, b], "bmm" if bias is not None else "")
    return ctx.binary("add", y, bias) if bias is not None else y


@_reg("addbmm.default")
def _addbmm(ctx, node, bias, a, b, beta=1, alpha=1):
    # Σ_b a[b] @ b[b]: the batch letter is contracted
    bias, b = _beta_alpha(ctx, bias, b, beta, alpha)
    y = ctx.einsum("bmk,bkn->mn", [a, b], "bmm" if bias is not None else "")
    return ctx.binary("add", y, bias) if bias is not None else y


@_reg("mm.default")
def _mm(ctx, node, a, b):
    return _matmul_rows(ctx, node, a, b, None, "zy")


@_reg("bmm.default")
def _bmm(ctx, node, a, b):
    return ctx.einsum("bmk,bkn->bmn", [a, b])


@_reg("matmul.default")
def _matmul(ctx, node, a, b):
    a, b = (x if _is_graph(x) else ctx.tensor(x) for x in (a, b))
    ra, rb = len(a.shape), len(b.shape)
    # Contraction letters: k; a's row m (if ra >= 2), b's column n (if rb >= 2).
    ta = ("m" if ra >= 2 else "") + "k"
    tb = "k" + ("n" if rb >= 2 else "")
    to = ("m" if ra >= 2 else "") + ("n" if rb >= 2 else "")
    ba, bb = list(a.shape[:-2] if ra >= 2 else ()), list(b.shape[:-2] if rb >= 2 else ())
    nb = max(len(ba), len(bb))
    letters = "pqrstuvwxy"[:nb]
    la, lb, lo = "", "", ""
    keep_a, keep_b = [], []
    for i in range(nb):  # aligned from the right
        ia, ib = i - (nb - len(ba)), i - (nb - len(bb))
        sa = ba[ia] if ia >= 0 else None
        sb = bb[ib] if ib >= 0 else None
        c = letters[i]
        if sa is not None and sb is not None and sa != sb and 1 not in (sa, sb):
            ctx.fail(f"matmul batch dims {ba} and {bb} do not broadcast")
        use_a = sa is not None and not (sa == 1 and sb not in (None, 1))
        use_b = sb is not None and not (sb == 1 and sa not in (None, 1))
        if sa is not None:
            keep_a.append(use_a)
        if sb is not None:
            keep_b.append(use_b)
        la += c if use_a else ""
        lb += c if use_b else ""
        lo += c
    if not all(keep_a):  # drop broadcast size-1 batch dims so that the letter lives on one side
        a = ctx.reshape(a, [s for s, k in zip(ba, keep_a) if k] + list(a.shape[len(ba):]), "squeeze_a")
    if not all(keep_b):
        b = ctx.reshape(b, [s for s, k in zip(bb, keep_b) if k] + list(b.shape[len(bb):]), "squeeze_b")
    return ctx.einsum(f"{la}{ta},{lb}{tb}->{lo}{to}", [a, b])


@_reg("einsum.default")
def _einsum(ctx, node, equation, operands, path=None):
    xs = [x if _is_graph(x) else ctx.tensor(x) for x in operands]
    eq = equation.replace(" ", "")
    lhs, rhs = eq.split("->") if "->" in eq else (eq, None)
    terms = lhs.split(",")
    used = set(c for c in eq if c.isalpha())
    free = [c for c in _LETTERS if c not in used]
    ell_rank = 0
    for t, x in zip(terms, xs):
        if "..." in t:
            ell_rank = max(ell_rank, len(x.shape) - (len(t) - 3))
    ell = "".join(free[:ell_rank])
    new_terms = []
    for t, x in zip(terms, xs):
        if "..." in t:
            k = len(x.shape) - (len(t) - 3)
            t = t.replace("...", ell[ell_rank - k:])
        if len(set(t)) != len(t):
            ctx.fail(f"einsum '{equation}': a letter repeated within one operand (a diagonal) is not supported")
        new_terms.append(t)
    if rhs is None:
        counts: Dict[str, int] = {}
        for t in new_terms:
            for c in t:
                counts[c] = counts.get(c, 0) + 1
        rhs = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    else:
        rhs = rhs.replace("...", ell)
    sizes: Dict[str, int] = {}
    for t, x in zip(new_terms, xs):
        for c, s in zip(t, x.shape):
            if sizes.setdefault(c, s) != s:
                ctx.fail(f"einsum '{equation}': broadcasting of index '{c}' ({sizes[c]} vs {s}) is not supported")
    return ctx.einsum(",".join(new_terms) + "->" + rhs, xs)


# -- layout
def _perm_of(node, rank):
    """The permutation of a t / transpose / permute node (out dim i = in dim perm[i])."""
    t = str(node.target)
    if t.startswith("aten.t."):
        return list(range(rank))[::-1] if rank == 2 else list(range(rank))
    if t.startswith("aten.numpy_T."):  # x.T: every dim reversed
        return list(range(rank))[::-1]
    if t.startswith(("aten.mT.", "aten.mH.", "aten.adjoint.")):  # the last two dims swapped (real: mH == mT)
        return list(range(rank - 2)) + [rank - 1, rank - 2]
    if t.startswith("aten.transpose."):
        perm = list(range(rank))
        d0, d1 = _norm(node.args[1], rank), _norm(node.args[2], rank)
        perm[d0], perm[d1] = perm[d1], perm[d0]
        return perm
    return [_norm(d, rank) for d in node.args[1]]


def _permute_any(ctx, node, x, *args):
    if x is None:
        return x
    if isinstance(x, _C):
        ctx.fail("internal: a constant transpose was not folded")
    perm = _perm_of(node, len(x.shape))
    if perm == list(range(len(perm))):
        return x
    if isinstance(x, _Perm) and x.done is None:  # compose: out dim i = src dim x.perm[perm[i]]
        return _Perm(x.src, [x.perm[p] for p in perm], ctx.name())
    return _Perm(ctx.tensor(x), perm, ctx.name())


_reg("t.default", "transpose.int", "permute.default", "numpy_T.default", "mT.default", "mH.default",
     "adjoint.default")(_permute_any)


_LOSS_OPS = ("aten.cross_entropy_loss.", "aten.nll_loss")


@_reg("view.default", "reshape.default", "_unsafe_view.default", "flatten.using_ints", "unflatten.int",
      "unsqueeze.default", "squeeze.default", "squeeze.dim", "squeeze.dims", "view_as.default")
def _reshape(ctx, node, x, *args, **kwargs):
    return ctx.reshape(x, _out_shape(node))


class _Flat:
    """A reshape not emitted yet (see _Ctx.reshape): a chain of reshapes becomes one reshape of
    the first source, and logits.view(-1, C) / labels.view(-1) feeding the loss are never emitted
    (weft's cross entropy takes any leading dims, and a graph whose batch stays in dim 0 can be
    re-batched by the planner). Emitted (once) where another op needs it."""

    def __init__(self, src: _T, shape, node_name: str):
        self.src, self.shape, self.node_name = src, tuple(shape), node_name
        self.done: Optional[_T] = None


def _unflatten_pair(ctx, logits, target):
    """Cross entropy's (logits, target), logits.view(-1, C) undone: the loss reads the logits
    unflattened and the labels reshaped to their leading dims (no reshape when the labels were
    flattened from that shape). Returns (logits, target, unflattened)."""
    if (isinstance(logits, _Flat) and len(logits.shape) == 2 and len(logits.src.shape) > 2
            and logits.src.shape[-1] == logits.shape[-1] and _is_graph(target) and len(target.shape) == 1):
        lead = tuple(logits.src.shape[:-1])
        return logits.src, ctx.tensor(ctx.reshape(target, lead, "labels")), True
    return ctx.tensor(logits), ctx.tensor(target), False


@_reg("expand.default", "expand_as.default", "broadcast_to.default")
def _expand(ctx, node, x, *args, **kwargs):
    out = _out_shape(node)
    x = ctx.tensor(x)
    if tuple(x.shape) == out:
        return x
    return _broadcast(ctx, node, x, out)


def _broadcast(ctx, node, x, out, suffix=""):
    """x broadcast to `out` by the IR's broadcast_to (new leading dims inserted, size-1 dims
    widened; its gradient sums over them): no constant holds the new dims, so an expand over the
    batch (a class token, `cls.expand(B, -1, -1)`) leaves the batch to the planner, which
    re-batches the broadcast's target shape."""
    x = ctx.tensor(x)
    new = list(range(len(out) - len(x.shape)))
    return ctx._t(ctx.g.broadcast_to(x.id, [int(s) for s in out], new, ctx.op_name(suffix)))


def _device(node):
    """Where a handler makes its constants: always the CPU. They are made from literals and shapes
    (masks, zeros, fills), small, and real even in a meta-device import, so that the graph carries
    their values (a constant that depends on the module's tensors is folded from them instead)."""
    return "cpu"


def _slice_t(ctx, x, axis, begin, end, suffix=""):
    if begin == 0 and end == x.shape[axis]:
        return x
    return ctx._t(ctx.g.slice(x.id, axis, int(begin), int(end), ctx.name(suffix)))


@_reg("slice.Tensor")
def _slice(ctx, node, x, dim=0, start=None, end=None, step=1):
    x = ctx.tensor(x)
    if step < 1:
        ctx.fail(f"slicing with a step {step} < 1 is not supported")
    r = len(x.shape)
    dim = _norm(dim, r)
    n = x.shape[dim]
    s = 0 if start is None else (start + n if start < 0 else start)
    e = n if end is None else (end + n if end < 0 else end)
    s, e = max(0, min(s, n)), max(0, min(e, n))
    if e <= s:
        ctx.fail("an empty slice is not supported")
    if step == 1:
        return _slice_t(ctx, x, dim, s, e)
    return _strided_slice(ctx, x, dim, s, e, step)


def _strided_slice(ctx, x, dim, s, e, step):
    """x[.., s:e:step, ..] (GPT-J's rotate_every_two: x[..., ::2]): the whole strides [s, s + step·k) viewed
    as [.., k, step, ..] and the first of each taken (a reshape and a slice: the dim stays one factor
    pair, as the convolutions' strided windows), plus the last element when the final stride is cut short
    by e (a slice, concatenated)."""
    count = -(-(e - s) // step)  # the elements s, s + step, ..., < e
    whole = count if s + step * count <= x.shape[dim] else count - 1  # strides that fit in x
    shp = list(x.shape)
    parts = []
    if whole > 0:
        w = _slice_t(ctx, x, dim, s, s + step * whole, "strides")
        split = ctx.tensor(ctx.reshape(w, shp[:dim] + [whole, step] + shp[dim + 1:], "strides.split"))
        first = _slice_t(ctx, split, dim + 1, 0, 1, "strides.first")
        parts.append(ctx.tensor(ctx.reshape(first, shp[:dim] + [whole] + shp[dim + 1:], "strides.taken")))
    if whole < count:
        last = s + step * whole
        parts.append(_slice_t(ctx, x, dim, last, last + 1, "last"))
    return parts[0] if len(parts) == 1 else ctx._t(ctx.g.concat([p.id for p in parts], dim, ctx.name()))


@_reg("select.int")
def _select(ctx, node, x, dim, index):
    x = ctx.tensor(x)
    dim = _norm(dim, len(x.shape))
    index = index + x.shape[dim] if index < 0 else index
    y = _slice_t(ctx, x, dim, index, index + 1, "slice")
    return ctx.reshape(y, _out_shape(node))


def _split_at(ctx, x, sizes, dim):
    dim = _norm(dim, len(x.shape))
    k = len(sizes)
    if k > 1 and len(set(sizes)) == 1 and sizes[0] > 1:
        # k equal parts: [.., k*c, ..] -> [.., k, c, ..], a slice of the k axis, the k axis
        # dropped (as the zoo splits a fused QKV: the parts' dims keep their own factors).
        c = sizes[0]
        shp = list(x.shape)
        split = ctx.reshape(x, shp[:dim] + [k, c] + shp[dim + 1:], "parts")
        split_t = ctx.tensor(split)
        out = []
        for i in range(k):
            part = ctx._t(ctx.g.slice(split_t.id, dim, i, i + 1, ctx.name(str(i))))
            out.append(ctx.reshape(part, shp[:dim] + [c] + shp[dim + 1:], f"{i}.squeeze"))
        return out
    x = ctx.tensor(x)
    out, b = [], 0
    for i, s in enumerate(sizes):
        out.append(_slice_t(ctx, x, dim, b, b + s, str(i)))
        b += s
    return out


@_reg("split.Tensor")
def _split(ctx, node, x, size, dim=0):
    n = x.shape[_norm(dim, len(x.shape))]
    return _split_at(ctx, x, [min(size, n - b) for b in range(0, n, size)], dim)


@_reg("split_with_sizes.default")
def _split_sizes(ctx, node, x, sizes, dim=0):
    return _split_at(ctx, x, list(sizes), dim)


@_reg("chunk.default")
def _chunk(ctx, node, x, chunks, dim=0):
    n = x.shape[_norm(dim, len(x.shape))]
    size = -(-n // chunks)
    return _split_at(ctx, x, [min(size, n - b) for b in range(0, n, size)], dim)


@_reg("unbind.int")
def _unbind(ctx, node, x, dim=0):
    x = ctx.tensor(x)
    dim = _norm(dim, len(x.shape))
    parts = _split_at(ctx, x, [1] * x.shape[dim], dim)
    shape = list(x.shape[:dim]) + list(x.shape[dim + 1:])
    return [ctx.reshape(p, shape, f"{i}.squeeze") for i, p in enumerate(parts)]


@_reg("stack.default")
def _stack(ctx, node, xs, dim=0):
    """torch.stack: each operand with a size-1 dim inserted (a reshape), concatenated along it."""
    ts = [ctx.tensor(x) for x in xs]
    r = len(ts[0].shape) + 1
    d = _norm(dim, r)
    parts = [ctx.tensor(ctx.reshape(t, list(t.shape[:d]) + [1] + list(t.shape[d:]), f"{i}.unsqueeze"))
             for i, t in enumerate(ts)]
    return parts[0] if len(parts) == 1 else ctx._t(ctx.g.concat([p.id for p in parts], d, ctx.name()))


@_reg("cat.default")
def _cat(ctx, node, xs, dim=0):
    ts = [ctx.tensor(x) for x in xs]
    if len(ts) == 1:
        return ts[0]
    return ctx._t(ctx.g.concat([t.id for t in ts], _norm(dim, len(ts[0].shape)), ctx.name()))


# -- elementwise
def _binary_op(fn):
    def h(ctx, node, a, b, alpha=1, rounding_mode=None):
        if rounding_mode is not None:
            ctx.fail(f"division with rounding_mode={rounding_mode!r} is not supported")
        if alpha != 1:
            b = _scale(ctx, b, alpha, "alpha")
        scal = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
        if fn == "mul" and scal(b):
            return _scale(ctx, a, b)
        if fn == "mul" and scal(a):
            return _scale(ctx, b, a)
        if fn == "div" and scal(b):
            return _scale(ctx, a, 1.0 / b)
        if fn in ("add", "sub") and scal(b) and b == 0:
            return a
        return ctx.binary(fn, a, b)
    return h


def _scale(ctx, x, s, suffix=""):
    if s == 1:
        return x
    return ctx.unary("scale", x, suffix, float(s))


for _fn in ("add", "sub", "mul", "div"):
    _reg(f"{_fn}.Tensor", f"{_fn}.Scalar")(_binary_op(_fn))
_reg("div.Tensor_mode")(_binary_op("div"))


@_reg("rsub.Scalar", "rsub.Tensor")
def _rsub(ctx, node, a, b, alpha=1):
    return _binary_op("sub")(ctx, node, b, _scale(ctx, a, alpha) if alpha != 1 else a)


@_reg("maximum.default", "max.other")
def _maximum(ctx, node, a, b):
    return ctx.binary("max", a, b)


@_reg("minimum.default", "min.other")
def _minimum(ctx, node, a, b):
    # min(a, b) = −max(−a, −b): the IR's binary max (its gradient goes to b on a tie)
    na = ctx.unary("neg", a, "neg_a") if _is_graph(a) else _negated(ctx, a, "neg_a")
    nb = ctx.unary("neg", b, "neg_b") if _is_graph(b) else _negated(ctx, b, "neg_b")
    return ctx.unary("neg", ctx.binary("max", na, nb, "max"))


def _negated(ctx, v, suffix):
    """−v for a constant operand or Python scalar (folded, no op; a new constant of this node)."""
    return ctx.const(-v.value, suffix) if isinstance(v, _C) else -v


@_reg("abs.default")
def _abs(ctx, node, x):
    return _abs_of(ctx, x, "")


def _abs_of(ctx, x, suffix):
    """|x| = relu(x) + relu(−x): exact, and its gradient is sign(x) (0 at 0, as torch's)."""
    pre = suffix + "." if suffix else ""
    return ctx.binary("add", ctx.unary("relu", x, pre + "pos"),
                      ctx.unary("relu", ctx.unary("neg", x, pre + "neg"), pre + "neg.relu"), suffix)


def _min_scalar(ctx, x, c, suffix):
    """min(x, c) for a Python scalar c: −max(−x, −c)."""
    pre = suffix + "." if suffix else ""
    m = ctx.binary("max", ctx.unary("neg", x, pre + "neg"), -float(c), pre + "max")
    return ctx.unary("neg", m, suffix)


# -- losses (reduction: 0 none, 1 mean, 2 sum, as ATen numbers them)
@_reg("broadcast_tensors.default")
def _broadcast_tensors(ctx, node, xs):
    outs = [tuple(int(s) for s in v.shape) for v in node.meta["val"]]
    shape = lambda x: tuple(x.value.shape) if isinstance(x, _C) else tuple(x.shape)  # noqa: E731
    # a constant is expanded in torch (stride 0: the op reading it drops the broadcast dims again)
    return [x if shape(x) == o else _C(x.value.expand(o), ctx.const(None, str(i)).name) if isinstance(x, _C)
            else _broadcast(ctx, node, x, o, str(i)) for i, (x, o) in enumerate(zip(xs, outs))]


def _reduced(ctx, loss, reduction, what):
    if reduction == 0:
        return loss
    if reduction not in (1, 2):
        ctx.fail(f"{what} with reduction code {reduction} is not supported")
    x = ctx.tensor(loss)
    return ctx.reduce("mean" if reduction == 1 else "sum", x, list(range(len(x.shape))))


def _diff(ctx, node, x, y):
    # torch broadcasts differing shapes (with a warning; broadcast_tensors comes first): so does sub
    return ctx.binary("sub", x, y, "diff")


@_reg("mse_loss.default")
def _mse_loss(ctx, node, x, y, reduction=1):
    return _reduced(ctx, ctx.unary("square", _diff(ctx, node, x, y), "square"), reduction, "mse_loss")


@_reg("l1_loss.default")
def _l1_loss(ctx, node, x, y, reduction=1):
    return _reduced(ctx, _abs_of(ctx, _diff(ctx, node, x, y), "abs"), reduction, "l1_loss")


def _huber_terms(ctx, d, beta, quad_scale):
    """With a = |d| and c = min(a, β): quad_scale·c²/2 + k·(a − c) is smooth L1 (quad_scale = 1/β,
    k = 1) and Huber (quad_scale = 1, k = δ): the branches of torch's formula without a
    data-dependent select (value and gradient exact away from the measure-zero tie a = β)."""
    a = _abs_of(ctx, d, "abs")
    c = _min_scalar(ctx, a, beta, "clip")
    quad = _scale(ctx, ctx.unary("square", c, "clip.square"), 0.5 * quad_scale, "quad")
    return a, c, quad


@_reg("smooth_l1_loss.default")
def _smooth_l1_loss(ctx, node, x, y, reduction=1, beta=1.0):
    d = _diff(ctx, node, x, y)
    if beta == 0:  # torch: plain L1
        return _reduced(ctx, _abs_of(ctx, d, "abs"), reduction, "smooth_l1_loss")
    if beta < 0:
        ctx.fail(f"smooth_l1_loss with beta={beta} < 0")
    a, c, quad = _huber_terms(ctx, d, beta, 1.0 / beta)
    lin = ctx.binary("sub", a, c, "linear")
    return _reduced(ctx, ctx.binary("add", quad, lin, "elementwise"), reduction, "smooth_l1_loss")


@_reg("huber_loss.default")
def _huber_loss(ctx, node, x, y, reduction=1, delta=1.0):
    if delta <= 0:
        ctx.fail(f"huber_loss with delta={delta} <= 0")
    a, c, quad = _huber_terms(ctx, _diff(ctx, node, x, y), delta, 1.0)
    lin = _scale(ctx, ctx.binary("sub", a, c, "linear"), delta, "linear.scale")
    return _reduced(ctx, ctx.binary("add", quad, lin, "elementwise"), reduction, "huber_loss")


def _unary_op(fn):
    def h(ctx, node, x):
        return ctx.unary(fn, x)
    return h


for _aten, _fn in (("neg", "neg"), ("exp", "exp"), ("log", "log"), ("rsqrt", "rsqrt"), ("sqrt", "sqrt"),
                   ("tanh", "tanh"), ("relu", "relu"), ("sigmoid", "sigmoid"), ("square", "square")):
    _reg(f"{_aten}.default")(_unary_op(_fn))


@_reg("reciprocal.default")
def _reciprocal(ctx, node, x):
    return ctx.binary("div", 1.0, x)


@_reg("silu.default")
def _silu(ctx, node, x):
    return ctx.binary("mul", x, ctx.unary("sigmoid", x, "sigmoid"))


@_reg("gelu.default")
def _gelu(ctx, node, x, approximate="none"):
    if approximate not in ("tanh", "none"):
        ctx.fail(f"GELU approximation {approximate!r} (weft has 'tanh' and the exact erf form)")
    return ctx.unary("gelu" if approximate == "tanh" else "gelu_erf", x)


@_reg("pow.Tensor_Scalar")
def _pow(ctx, node, x, e):
    if e == 2:
        return ctx.unary("square", x)
    if e == 1:
        return x
    if e == 0.5:
        return ctx.unary("sqrt", x)
    if e == -0.5:
        return ctx.unary("rsqrt", x)
    if e == -1:
        return ctx.binary("div", 1.0, x)
    if e == 3:
        return ctx.binary("mul", x, ctx.unary("square", x, "square"))
    if e == 4:
        return ctx.unary("square", ctx.unary("square", x, "square"))
    ctx.fail(f"pow by {e} is not supported (only 1, 2, 3, 4, 0.5, -0.5, -1)")


def _const_mask(ctx, m, shape):
    """A constant mask as bool, without the leading dims it is broadcast along (see _squeeze_const)."""
    if not isinstance(m, _C):
        ctx.fail("the mask/condition is computed from the model's inputs or parameters (data-dependent); "
                 "only masks computed from buffers and constants are supported")
    return _squeeze_const(m, shape).value.to(_torch().bool)


def _select_fill(ctx, x, keep_mask, fill_value, suffix=""):
    """out = x where keep_mask else fill_value, exactly: x * keep + fill (fill 0 where kept)."""
    torch = _torch()
    pre = suffix + "." if suffix else ""
    keep = ctx.const(keep_mask.to(torch.float64), pre + "keep")
    fill = ctx.const(torch.where(keep_mask, torch.zeros((), dtype=torch.float64, device=keep_mask.device),
                                 torch.as_tensor(fill_value, dtype=torch.float64, device=keep_mask.device)),
                     pre + "fill")
    return ctx.binary("add", ctx.binary("mul", x, keep, pre + "keep"), fill, suffix)


@_reg("masked_fill.Scalar", "masked_fill.Tensor")
def _masked_fill(ctx, node, x, mask, value):
    torch = _torch()
    if _is_graph(mask):  # a comparison (labels == -100, padding_mask == 0): a selection
        from .indexing import choose, lazy_mask
        pick = lazy_mask(ctx, mask)
        if pick is not None:
            return choose(ctx, pick, value.value if isinstance(value, _C) else value, x, _out_shape(node))
    m = _const_mask(ctx, mask, x.shape)  # (a float mask computed in the graph: refused there)
    if isinstance(value, _C):
        value = value.value.to(torch.float64)
    elif not isinstance(value, (int, float)):
        ctx.fail("masked_fill with a non-constant value is not supported")
    return _select_fill(ctx, x, ~m, value)


@_reg("where.self", "where.ScalarOther", "where.ScalarSelf", "where.Scalar")
def _where(ctx, node, cond, a, b):
    torch = _torch()
    if _is_graph(cond):  # a comparison: a selection
        from .indexing import choose, lazy_mask
        pick = lazy_mask(ctx, cond)
        if pick is not None:
            return choose(ctx, pick, a, b, _out_shape(node))
    m = _const_mask(ctx, cond, _out_shape(node))  # (a float condition computed in the graph: refused there)
    val = lambda v: v.value.to(torch.float64) if isinstance(v, _C) else v  # noqa: E731
    if not _is_graph(a):
        return _select_fill(ctx, b, ~m, val(a))
    if not _is_graph(b):
        return _select_fill(ctx, a, m, val(b))
    keep = ctx.const(m.to(torch.float64), "cond")
    other = ctx.const((~m).to(torch.float64), "not_cond")
    return ctx.binary("add", ctx.binary("mul", a, keep, "a"), ctx.binary("mul", b, other, "b"))


# -- reductions
def _reduce_dims(x, dims):
    r = len(x.shape)
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(r))
    if isinstance(dims, int):
        dims = [dims]
    return sorted(_norm(d, r) for d in dims)


def _reduce_op(fn):
    def h(ctx, node, x, dims=None, keepdim=False, dtype=None):
        x = ctx.tensor(x)
        if len(x.shape) == 0:
            return x
        axes = _reduce_dims(x, dims)
        if (fn == "sum" and len(axes) == len(x.shape) and ctx.batch is not None and x.shape[0] == ctx.batch):
            # A loss summed over the batch: the mean times its count. The same value, and a plan that
            # splits the batch (micro-batches, replicas: each step's gradients are their mean) then
            # computes the sum: each part's mean times the whole count, averaged.
            count = int(np.prod(x.shape))
            y = ctx.unary("scale", ctx.reduce("mean", x, axes, "mean"), "", scalar=float(count))
            return ctx.reshape(y, _out_shape(node)) if keepdim else y
        y = ctx.reduce(fn, x, axes, "reduce" if keepdim else "")
        return ctx.reshape(y, _out_shape(node)) if keepdim else y
    return h


_reg("sum.dim_IntList", "sum.default")(_reduce_op("sum"))
_reg("mean.dim", "mean.default")(_reduce_op("mean"))
_reg("amax.default")(_reduce_op("max"))


# -- routing (MoE routers): top-k / argmax, gather, scatter_add. The routed axis is need-replication
# in the IR (a device holds it whole); every other dim stays splittable, the batch included.
def _topk_t(ctx, x, k, dim, largest, suffix=""):
    """(values, indices) of the IR's topk: sorted best first, ties broken by the lower index."""
    x = ctx.tensor(x)
    if len(x.shape) == 0:
        ctx.fail("top-k of a 0-d tensor is not supported")
    d = _norm(dim, len(x.shape))
    if not 1 <= k <= x.shape[d]:
        ctx.fail(f"k={k} is not in [1, {x.shape[d]}] (the size of dim {dim})")
    v, i = ctx.g.topk(x.id, int(k), d, bool(largest), ctx.name(suffix))
    return ctx._t(v), ctx._t(i)


@_reg("topk.default")
def _topk(ctx, node, x, k, dim=-1, largest=True, sorted=True):
    # sorted=False: torch leaves the order unspecified, so the sorted order is one it may return;
    # a model whose result depends on that order is not portable in torch either.
    return _topk_t(ctx, x, k, dim, largest)


def _arg_best(ctx, node, x, dim, keepdim, largest):
    """argmax / argmin (the first best, as torch documents) and max / min over a dim: top-1."""
    x = ctx.tensor(x)
    if dim is None:  # over every element: the flattened tensor
        x = ctx.tensor(ctx.reshape(x, [max(1, int(np.prod(x.shape)))], "flat"))
        dim = 0
    v, i = _topk_t(ctx, x, 1, dim, largest, "top1")
    out = _out_shape(node) if not isinstance(node.meta["val"], (list, tuple)) else _out_shape_i(node, 0)
    return ctx.reshape(v, out, "values"), ctx.reshape(i, out, "indices")


def _out_shape_i(node, i):
    return tuple(int(s) for s in node.meta["val"][i].shape)


@_reg("argmax.default")
def _argmax(ctx, node, x, dim=None, keepdim=False):
    return _arg_best(ctx, node, x, dim, keepdim, True)[1]


@_reg("argmin.default")
def _argmin(ctx, node, x, dim=None, keepdim=False):
    return _arg_best(ctx, node, x, dim, keepdim, False)[1]


@_reg("max.dim")
def _max_dim(ctx, node, x, dim, keepdim=False):
    # (values, indices); the values' gradient goes to the first maximum only, as torch's
    return _arg_best(ctx, node, x, dim, keepdim, True)


@_reg("min.dim")
def _min_dim(ctx, node, x, dim, keepdim=False):
    return _arg_best(ctx, node, x, dim, keepdim, False)


def _within(ctx, x, shape, skip, suffix):
    """x cut to `shape` (its leading part) along every dim but `skip`: torch's gather / scatter_add
    read only those positions of an operand larger than the index, so the cut is exact."""
    x = ctx.tensor(x)
    for d, n in enumerate(shape):
        if d != skip and x.shape[d] > n:
            x = _slice_t(ctx, x, d, 0, n, f"{suffix}{d}")
    return x


def _index_operand(ctx, index, what):
    index = ctx.tensor(index)
    if _is_float_weft(ctx.g, index.id):
        ctx.fail(f"{what}'s index must be an integer tensor")
    return index


@_reg("gather.default")
def _gather(ctx, node, x, dim, index, sparse_grad=False):
    x, index = ctx.tensor(x), _index_operand(ctx, index, "gather")
    if len(index.shape) != len(x.shape):
        ctx.fail(f"gather index of rank {len(index.shape)} for an input of rank {len(x.shape)}")
    d = _norm(dim, len(x.shape))
    x = _within(ctx, x, index.shape, d, "cut")
    return ctx._t(ctx.g.gather(x.id, index.id, d, ctx.name()))


@_reg("scatter_add.default")
def _scatter_add(ctx, node, base, dim, index, src):
    base, index = ctx.tensor(base), _index_operand(ctx, index, "scatter_add")
    d = _norm(dim, len(base.shape))
    if len(index.shape) != len(base.shape):
        ctx.fail(f"scatter_add index of rank {len(index.shape)} for an input of rank {len(base.shape)}")
    if any(index.shape[i] != base.shape[i] for i in range(len(base.shape)) if i != d):
        ctx.fail(f"scatter_add with an index {list(index.shape)} smaller than the input {list(base.shape)} off "
                 f"dim {d} is not supported (weft's index covers the input off the scattered dim)")
    src = _within(ctx, src, index.shape, -1, "src.cut")  # torch reads src only where index is
    return ctx._t(ctx.g.scatter_add(base.id, index.id, src.id, d, ctx.name()))


@_reg("var.correction", "var.dim", "std.correction", "std.dim")
def _var(ctx, node, x, dims=None, *args, correction=None, keepdim=False, unbiased=None):
    """Σ (x − mean)² / (N − correction) over dims (std: its sqrt), torch's two-pass formula."""
    if args:  # var.dim(x, dim, unbiased=True, keepdim=False)
        unbiased = args[0]
        keepdim = args[1] if len(args) > 1 else keepdim
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    x = ctx.tensor(x)
    axes = _reduce_dims(x, dims)
    kshape = [1 if i in axes else s for i, s in enumerate(x.shape)]
    n = 1
    for a in axes:
        n *= x.shape[a]
    if n - correction <= 0:
        ctx.fail(f"variance of {n} elements with correction {correction}")
    mean = ctx.reshape(ctx.reduce("mean", x, axes, "mean"), kshape, "mean.keepdim")
    dev = ctx.binary("sub", x, mean, "centered")
    var = _scale(ctx, ctx.reduce("sum", ctx.unary("square", dev, "square"), axes, "sum"), 1.0 / (n - correction),
                 "scale")
    if "std" in str(node.target):
        var = ctx.unary("sqrt", var, "sqrt")
    return ctx.reshape(var, _out_shape(node), "keepdim") if keepdim else var


@_reg("zeros_like.default", "ones_like.default", "full_like.default", "new_zeros.default", "new_ones.default",
      "new_full.default", "empty_like.default")
def _like(ctx, node, x, *args, **kwargs):
    """A tensor made only from another's shape: a constant (its value does not depend on x)."""
    torch = _torch()
    op = str(node.target).split(".")[1]
    if op == "empty_like":
        ctx.fail("empty_like has no defined value")
    val = node.meta["val"]
    fill = {"zeros_like": 0.0, "new_zeros": 0.0, "ones_like": 1.0, "new_ones": 1.0}.get(op)
    if fill is None:  # full_like(x, v) / new_full(x, size, v)
        fill = args[0] if op == "full_like" else args[1]
    shape = tuple(int(s) for s in val.shape)
    if (shape and ctx.batch is not None and shape[0] == ctx.batch and len(shape) == len(x.shape)
            and (op.endswith("_like") or shape == tuple(x.shape))):
        # batch-sized (an RNN's zero state, T5's labels.new_zeros(labels.shape)): one row broadcast over
        # the batch, so the graph re-batches
        row = ctx.tensor(ctx.const(torch.full(shape[1:], fill, dtype=val.dtype, device=_device(node)), "row"))
        return ctx._t(ctx.g.broadcast_to(row.id, list(shape), [0], ctx.op_name("")))
    return ctx.const(torch.full(shape, fill, dtype=val.dtype, device=_device(node)), "")


@_reg("softmax.int", "_softmax.default")
def _softmax(ctx, node, x, dim, *args):
    x = ctx.tensor(x)
    return ctx._t(ctx.g.softmax(x.id, _norm(dim, len(x.shape)), ctx.name()))


def _keepdim_shape(shape, dim):
    s = list(shape)
    s[dim] = 1
    return s


@_reg("log_softmax.int", "_log_softmax.default")
def _log_softmax(ctx, node, x, dim, *args):
    # (x - m) - log(sum(exp(x - m))), m = max over dim: torch's own formula.
    x = ctx.tensor(x)
    d = _norm(dim, len(x.shape))
    m = ctx.reshape(ctx.reduce("max", x, [d], "max"), _keepdim_shape(x.shape, d), "max.keepdim")
    sh = ctx.binary("sub", x, m, "shifted")
    lse = ctx.unary("log", ctx.reduce("sum", ctx.unary("exp", sh, "exp"), [d], "sum"), "log")
    y = ctx.binary("sub", sh, ctx.reshape(lse, _keepdim_shape(x.shape, d), "log.keepdim"))
    return _LogSoftmax(y.id, y.shape, src=x.id, dim=d)


def _check_ce(ctx, logits, target, weight, reduction, ignore_index, label_smoothing=0.0, class_dim=-1):
    """The class weights as a weft tensor (or None) after checking the arguments torch's cross entropy took."""
    if reduction not in (1, 2):
        ctx.fail("reduction='none' is not supported (the IR's cross entropy is a scalar): use 'mean' or 'sum'")
    if not 0 <= label_smoothing <= 1:
        ctx.fail(f"label_smoothing={label_smoothing} is not in [0, 1]")
    if not isinstance(target, _T) or _is_float_weft(ctx.g, target.id):
        ctx.fail("targets must be integer class indices (class probabilities are not supported)")
    if not isinstance(ignore_index, int):
        ctx.fail(f"ignore_index={ignore_index!r} is not an integer")
    if weight is None:
        return None
    w = ctx.tensor(weight)
    n_classes = logits.shape[class_dim]
    if list(w.shape) != [n_classes]:
        ctx.fail(f"class weights of shape {list(w.shape)}, expected [{n_classes}] (one per class)")
    if not _is_float_weft(ctx.g, w.id):
        ctx.fail("class weights must be floating point")
    return w


def _ce_tokens(ctx, target) -> int:
    n = 1
    for d in target.shape:
        n *= int(d)
    return n


def _ce_op(ctx, logits_id, target, weight, reduction, ignore_index, label_smoothing=0.0):
    """torch's cross entropy as the IR's one op (ignored labels, class weights, label smoothing inside:
    ir::CrossEntropyAttrs). 'mean' divides by the weighted count of valid labels of the whole training
    step (the executors give each micro-batch its share); 'sum' is the op divided by the token count
    times the tokens of the import (a literal, which micro-batches keep: the lowering's mean over them
    weighs each by its samples)."""
    plain = reduction == 1
    ce = ctx._t(ctx.g.cross_entropy(logits_id, target.id, ctx.name("" if plain else "nll"),
                                    weight=None if weight is None else weight.id, ignore_index=int(ignore_index),
                                    label_smoothing=float(label_smoothing), normalize="valid" if plain else "tokens"))
    return ce if plain else _scale(ctx, ce, float(_ce_tokens(ctx, target)), "sum")


def _class_last(ctx, logits):
    """Logits [N, C, d1, ...] (torch's class dim 1) -> [N, d1, ..., C] for weft's class-last op."""
    r = len(logits.shape)
    if r <= 2:
        return logits
    perm = [0] + list(range(2, r)) + [1]
    return ctx._t(ctx.g.transpose(logits.id, perm, ctx.name("class_last")))


@_reg("cross_entropy_loss.default")
def _cross_entropy(ctx, node, logits, target, weight=None, reduction=1, ignore_index=-100, label_smoothing=0.0):
    if len(logits.shape) < 2:
        ctx.fail("unbatched cross entropy (1-D logits) is not supported")
    logits, target, unflattened = _unflatten_pair(ctx, logits, target)
    if not unflattened:  # unflattened logits [..., C] are already class-last
        logits = _class_last(ctx, logits)
    w = _check_ce(ctx, logits, target, weight, reduction, ignore_index, label_smoothing)
    return _ce_op(ctx, logits.id, target, w, reduction, ignore_index, label_smoothing)


@_reg("nll_loss.default", "nll_loss_nd.default", "nll_loss2d.default")
def _nll_loss(ctx, node, x, target, weight=None, reduction=1, ignore_index=-100):
    if isinstance(x, _Flat) and isinstance(x.src, _LogSoftmax) and x.src.dim == len(x.src.shape) - 1:
        # log_softmax(logits, -1).view(-1, C) with labels.view(-1): the unflattened cross entropy
        logits, target, ok = _unflatten_pair(ctx, x, target)
        if ok:
            w = _check_ce(ctx, logits, target, weight, reduction, ignore_index)
            return _ce_op(ctx, logits.src, target, w, reduction, ignore_index)
        x = ctx.tensor(x)
    target = ctx.tensor(target)
    w = _check_ce(ctx, x, target, weight, reduction, ignore_index, class_dim=1 if len(x.shape) >= 2 else 0)
    if not isinstance(x, _LogSoftmax) or x.dim != (1 if len(x.shape) >= 2 else 0):
        ctx.fail("nll_loss is supported only on log_softmax over the class dim (plain cross entropy)")
    if len(x.shape) < 2:
        ctx.fail("unbatched nll_loss is not supported")
    return _ce_op(ctx, _class_last(ctx, ctx._t(x.src)).id, target, w, reduction, ignore_index)


# -- normalisation
@_reg("layer_norm.default")
def _layer_norm(ctx, node, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return _ln(ctx, node, x, normalized_shape, weight, bias, eps)


@_reg("native_layer_norm.default")
def _native_layer_norm(ctx, node, x, normalized_shape, weight, bias, eps):
    y = _ln(ctx, node, x, normalized_shape, weight, bias, eps)
    return (y, _Unusable("layer norm's mean"), _Unusable("layer norm's rstd"))


def _ln(ctx, node, x, normalized_shape, weight, bias, eps):
    torch = _torch()
    x = ctx.tensor(x)
    if len(normalized_shape) != 1:
        ctx.fail("layer norm over more than the last dim is not supported")
    h = x.shape[-1]
    dev = _device(node)
    if weight is None:
        weight = ctx.const(torch.ones(h, dtype=torch.float64, device=dev), "ones")
    if bias is None:
        bias = ctx.const(torch.zeros(h, dtype=torch.float64, device=dev), "zeros")
    return ctx._t(ctx.g.layer_norm(x.id, ctx.tensor(weight).id, ctx.tensor(bias).id, float(eps), ctx.name()))


@_reg("rms_norm.default")
def _rms_norm(ctx, node, x, normalized_shape, weight=None, eps=None):
    torch = _torch()
    x = ctx.tensor(x)
    if len(normalized_shape) != 1:
        ctx.fail("RMS norm over more than the last dim is not supported")
    if eps is None:
        eps = torch.finfo(node.meta["val"].dtype).eps
    d = len(x.shape) - 1
    ms = ctx.reshape(ctx.reduce("mean", ctx.unary("square", x, "square"), [d], "mean"),
                     _keepdim_shape(x.shape, d), "mean.keepdim")
    r = ctx.unary("rsqrt", ctx.binary("add", ms, float(eps), "eps"), "rsqrt")
    y = ctx.binary("mul", x, r, "normed" if weight is not None else "")
    return ctx.binary("mul", y, weight) if weight is not None else y


@_reg("embedding.default")
def _embedding(ctx, node, table, ids, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if scale_grad_by_freq:
        ctx.fail("embedding with scale_grad_by_freq is not supported")
    table = ctx.tensor(table)
    if padding_idx not in (-1, None):
        # torch's gradient skips row padding_idx (the lookup's part only: a tied LM head still
        # updates it): the IR's embedding carries it, its gradient skips that row.
        V = table.shape[0]
        pad = padding_idx + V if padding_idx < 0 else padding_idx
        return ctx._t(ctx.g.embedding(table.id, ctx.tensor(ids).id, ctx.name(), int(pad)))
    return ctx._t(ctx.g.embedding(table.id, ctx.tensor(ids).id, ctx.name()))


@_reg("scaled_dot_product_attention.default")
def _sdpa(ctx, node, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """Without a mask or dropout: the IR's fused attention op (is_causal, scale); with them (or with
    from_torch(fused_attention=False)): scores, mask, softmax, dropout and the product with v as
    separate ops, exactly."""
    torch = _torch()
    q, k, v = (x if _is_graph(x) else ctx.tensor(x) for x in (q, k, v))
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        lead = _broadcast_shape(list(q.shape[:-2]), _broadcast_shape(list(k.shape[:-2]), list(v.shape[:-2])))
        if -1 in lead or len(q.shape) != len(k.shape) or len(k.shape) != len(v.shape):
            ctx.fail(f"q, k, v batch dims differ ({q.shape}, {k.shape}, {v.shape}) and do not broadcast: "
                     "grouped-query attention is not supported (repeat k and v to the query heads)")
        # torch broadcasts them (multi-query attention: one k / v head for every query head, Falcon's):
        # so does broadcast_to, whose gradient sums over the broadcast heads
        q, k, v = (x if tuple(x.shape[:-2]) == tuple(lead) else
                   _broadcast(ctx, node, x, list(lead) + list(x.shape[-2:]), f"{n}.broadcast")
                   for x, n in ((q, "q"), (k, "k"), (v, "v")))
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    lead = _LETTERS[:len(q.shape) - 2]
    s = 1.0 / math.sqrt(E) if scale is None else scale
    if ctx.fused_attention and attn_mask is None and not dropout_p:
        out, _ = ctx.g.attention(ctx.tensor(q).id, ctx.tensor(k).id, ctx.tensor(v).id, float(s), bool(is_causal),
                                 ctx.op_name(""))
        perm = ctx.out_perm.get(node)
        if perm is not None:  # the transpose of this result that capture folded into it
            return ctx._t(ctx.g.transpose(out, list(perm), ctx.op_name("transpose")))
        return ctx._t(out)
    qs = _scale(ctx, q, s, "q_scaled")
    scores = ctx.einsum(f"{lead}ly,{lead}sy->{lead}ls", [qs, k], "scores")
    dev = _device(node)
    if is_causal:
        if attn_mask is not None:
            ctx.fail("attn_mask together with is_causal is not supported")
        keep = torch.ones(L, S, dtype=torch.bool, device=dev).tril()
        scores = _select_fill(ctx, scores, keep, float("-inf"), "causal")
    elif attn_mask is not None:
        if isinstance(attn_mask, _C) and attn_mask.value.dtype == torch.bool:
            m = attn_mask.value
            if tuple(m.shape) != tuple(scores.shape):
                m = m.expand(scores.shape)
            scores = _select_fill(ctx, scores, m, float("-inf"), "masked")
        else:
            scores = ctx.binary("add", scores, attn_mask, "masked")
    probs = ctx._t(ctx.g.softmax(scores.id, len(scores.shape) - 1, ctx.name("probs")))
    if dropout_p:
        probs = ctx.dropout(probs, dropout_p, "probs_dropout")
    return ctx.einsum(f"{lead}ls,{lead}sz->{lead}lz", [probs, v])


@_reg("batch_norm.default")
def _batch_norm(ctx, node, x, weight, bias, running_mean, running_var, training, momentum, eps, cudnn=False):
    """Training mode: batch statistics (biased variance), exactly as torch normalises; the running
    statistics are not updated (the IR has no state). Eval mode: the running statistics are
    constants: (x - mean) * rsqrt(var + eps) * weight + bias."""
    x = ctx.tensor(x)
    r = len(x.shape)
    if r < 2:
        ctx.fail("batch norm needs [N, C, ...] input")
    C = x.shape[1]
    cshape = [C] + [1] * (r - 2)
    axes = [0] + list(range(2, r))
    if training or running_mean is None:
        mean = ctx.reshape(ctx.reduce("mean", x, axes, "mean"), cshape, "mean.reshape")
        xc = ctx.binary("sub", x, mean, "centered")
        var = ctx.reshape(ctx.reduce("mean", ctx.unary("square", xc, "square"), axes, "var"), cshape,
                          "var.reshape")
        rstd = ctx.unary("rsqrt", ctx.binary("add", var, float(eps), "var_eps"), "rstd")
    else:
        if not isinstance(running_mean, _C) or not isinstance(running_var, _C):
            ctx.fail("eval-mode batch norm needs its running statistics as buffers")
        # the running statistics are Constant leaves under their state_dict names (shape [C])
        mean = ctx.reshape(ctx.tensor(running_mean), cshape, "mean.reshape")
        var = ctx.reshape(ctx.tensor(running_var), cshape, "var.reshape")
        xc = ctx.binary("sub", x, mean, "centered")
        rstd = ctx.unary("rsqrt", ctx.binary("add", var, float(eps), "var_eps"), "rstd")
    y = ctx.binary("mul", xc, rstd, "normed" if (weight is not None or bias is not None) else "")
    if weight is not None:
        y = ctx.binary("mul", y, ctx.reshape(ctx.tensor(weight), cshape, "weight.reshape"),
                       "scaled" if bias is not None else "")
    if bias is not None:
        y = ctx.binary("add", y, ctx.reshape(ctx.tensor(bias), cshape, "bias.reshape"))
    return y


# ---- capture

_PERM_OPS = ("aten.t.", "aten.transpose.", "aten.permute.", "aten.numpy_T.", "aten.mT.", "aten.mH.",
             "aten.adjoint.")
_EINSUM_OPS = {"aten.matmul.default", "aten.bmm.default", "aten.mm.default", "aten.einsum.default",
               "aten.scaled_dot_product_attention.default"}

_SAME_VALUE_OPS = {"alias", "slice", "contiguous", "clone", "detach", "lift_fresh_copy", "view", "reshape",
                   "_to_copy", "to", "expand", "_unsafe_view"}

_RANDOM_OPS = ("rand", "randn", "randint", "bernoulli", "normal", "uniform", "dropout", "randperm",
               "multinomial", "native_dropout")


def _type_name(t) -> str:
    """A module type as torch records it (a class or its qualified name), as a short name."""
    return getattr(t, "__qualname__", None) or str(t).rsplit(".", 1)[-1].rstrip("'>")


def _source_line(node) -> str:
    """', at file:line' of the user's source that made this node (torch.export's stack trace), or ''."""
    trace = node.meta.get("stack_trace") or ""
    lines = [ln.strip() for ln in trace.splitlines() if ln.strip().startswith("File ")]
    if not lines:
        return ""
    last = lines[-1]  # 'File "/path/model.py", line 12, in forward'
    try:
        file = last.split('"')[1]
        line = last.split("line ")[1].split(",")[0]
        return f", at {file}:{line}"
    except IndexError:
        return ""


def _export_hint(exc: BaseException) -> str:
    """A sentence explaining a torch.export failure that users meet on real models, or "".
    Training-mode LayerDrop / stochastic depth (`if self.training and torch.rand(()) < p: continue`)
    branches in Python on a random number: data-dependent control flow, which torch.export cannot
    capture (the graph would hold one draw of the branch). To be used in _export's error."""
    text = f"{type(exc).__name__}: {exc}"
    data_dependent = ("data-dependent" in text or "GuardOnDataDependent" in text
                      or "DataDependentOutput" in text or "_local_scalar_dense" in text)
    if not data_dependent:
        return ""
    randomness = any(f"aten.{r}." in text or f"torch.{r}(" in text for r in _RANDOM_OPS)
    where = _raising_line(text)
    if where is not None and not randomness:
        # the number drawn a few lines above the branch (HF BART / mBART / Whisper's LayerDrop:
        # `dropout_probability = torch.rand([])` then `if dropout_probability < self.layerdrop:`, which
        # branches in training mode even when layerdrop is 0)
        randomness = any(f"{r}(" in line for line in where[2] for r in ("rand", "randn", "bernoulli", "rand_like"))
    at = f" at {where[0]}:{where[1]}" if where is not None else ""
    if randomness:
        return ("the module branches in Python on a random number (data-dependent control flow from "
                f"torch.rand & co.{at}, e.g. training-mode LayerDrop or stochastic depth): torch.export cannot "
                "capture that; import the module in eval() mode (dropout is then off too: give the modules "
                "dropout 0 if training should match)")
    return (f"the module branches in Python on a tensor's value (data-dependent control flow{at}), which "
            "torch.export cannot capture")


def _raising_line(text: str):
    """(file name, line, [that line and the 3 before it]) of the user's code where torch.export's
    data-dependent guard was raised, from its message ("The following call raised this error: File
    ..., line N"), or None."""
    import linecache
    import os
    import re

    m = re.search(r'The following call raised this error:\s*File "([^"]+)", line (\d+)', text)
    if m is None:
        return None
    path, n = m.group(1), int(m.group(2))
    lines = [linecache.getline(path, i) for i in range(max(1, n - 3), n + 1)]
    return os.path.basename(path), n, lines


def _signature_names(fn, n: int, skip: int, fallback: str) -> List[str]:
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params[skip:skip + n]]
    if len(names) < n:
        names += [f"{fallback}{i}" if n > 1 else fallback for i in range(len(names), n)]
    return names


def _loss_of(out):
    """The loss a module returns: itself, or the ``loss`` of a Hugging Face ModelOutput / a dict."""
    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    return out if loss is None else loss


def _export(module, example_inputs, loss_fn, targets):
    torch = _torch()
    keys = None
    if isinstance(example_inputs, dict):  # keyword inputs (Hugging Face: input_ids=..., labels=...)
        keys = [str(k) for k in example_inputs]
        example_inputs = tuple(example_inputs.values())
    inputs = tuple(example_inputs)
    targets = tuple(targets)
    for x in inputs + targets:
        if not isinstance(x, torch.Tensor):
            raise ValueError(f"weft.from_torch: example inputs and targets must be tensors, got {type(x).__name__}")
    if loss_fn is None and targets:
        raise ValueError("weft.from_torch: targets given without a loss_fn")
    if keys is not None:
        class _WithKeywords(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.model = m

            def forward(self, *args):
                out = self.model(**dict(zip(keys, args[:len(inputs)])))
                return loss_fn(out, *args[len(inputs):]) if loss_fn is not None else _loss_of(out)

        root = _WithKeywords(module)
    elif loss_fn is None:
        root = module
    else:
        class _WithLoss(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.model = m

            def forward(self, *args):
                return loss_fn(self.model(*args[:len(inputs)]), *args[len(inputs):])

        root = _WithLoss(module)
    try:
        ep = torch.export.export(root, inputs + targets, strict=False)
    except Exception as e:  # noqa: BLE001 (any capture failure is the user's model's: say so)
        hint = _export_hint(e)
        raise ValueError(f"weft.from_torch: torch.export could not capture the module"
                         f"{': ' + hint if hint else ''} ({type(e).__name__}: {e})") from e
    names = keys if keys is not None else _signature_names(module.forward, len(inputs), 0, "input")
    if targets:
        names += _signature_names(loss_fn, len(targets), 1, "target")
    prefix = "model." if (loss_fn is not None or keys is not None) else ""
    return ep, root, names, prefix


def _import(module, example_inputs, loss_fn=None, targets=(), dtype=None, name=None, values=None,
            fused_attention=True, float_casts="module"):
    torch = _torch()
    ep, root, user_names, prefix = _export(module, example_inputs, loss_fn, targets)
    if isinstance(example_inputs, dict):
        example_inputs = tuple(example_inputs.values())
    gm = ep.graph_module
    # canonical names by object identity: a tied parameter is one tensor under its first name
    canon: Dict[int, str] = {}
    for n, p in module.named_parameters(remove_duplicate=False):
        canon.setdefault(id(p), n)
    for n, b in module.named_buffers(remove_duplicate=False):
        canon.setdefault(id(b), n)
    root_state = dict(root.named_parameters(remove_duplicate=False))
    root_state.update(dict(root.named_buffers(remove_duplicate=False)))
    fp = next((p for p in module.parameters() if p.is_floating_point()), None)
    if dtype is None:
        dtype = _float_dtype_of(fp.dtype) if fp is not None else "f32"
    g = _weft.Graph(name or type(module).__name__)
    module_dtype = fp.dtype if fp is not None else torch.float32
    # float_casts="ignore": no value of another float dtype (ctx.weft_float maps every one to the graph's),
    # and constants folded in torch hold the module's dtype too (a float32 rotary table of an f64 Llama)
    ctx = _Ctx(g, dtype, module_dtype if float_casts == "module" else None)
    ctx.fused_attention = bool(fused_attention)
    fold_mode = _HoldFloatDtype(module_dtype) if float_casts == "ignore" else None
    if fused_attention:
        def real_buffer(target, obj):
            if values is None or not getattr(obj, "is_meta", False):
                return obj
            nm = canon.get(id(obj), target[len(prefix):] if target.startswith(prefix) else target)
            if nm not in values:
                return obj
            real = values[nm]
            real = real if isinstance(real, torch.Tensor) else torch.as_tensor(np.asarray(real))
            return real.to(obj.dtype) if tuple(real.shape) == tuple(obj.shape) else obj

        fuse_written_attention(ep, root_state, real_buffer)

    nodes = list(gm.graph.nodes)
    out_node = next(n for n in nodes if n.op == "output")
    # dead code: only what the output needs — and every in-place write into a view of a live tensor
    # (`x[..., 1:] = y` is copy_(slice(x), y), whose result nobody reads: x changes through its view;
    # dropping it would import x unchanged, silently wrong). Such a write then meets its handler.
    live = set()

    def mark(n):
        stack = [n]
        while stack:
            n = stack.pop()
            if n in live:
                continue
            live.add(n)
            stack.extend(n.all_input_nodes)

    view_base = _view_base
    mark(out_node)
    order = {n: i for i, n in enumerate(nodes)}
    writes = [n for n in nodes if n.op == "call_function" and str(n.target).startswith("aten.")
              and str(n.target).split(".")[1].endswith("_") and n.args and isinstance(n.args[0], torch.fx.Node)
              and view_base(n.args[0]) is not n.args[0]]
    grown = True
    while grown:
        grown = False
        for n in writes:
            if n not in live and view_base(n.args[0]) in live:
                mark(n)
                grown = True

    # A transpose whose input is an einsum-like op's only use folds into that op's output letters.
    fused_out = set()
    for node in nodes:
        if node in live and node.op == "call_function" and str(node.target).startswith(_PERM_OPS):
            src = node.args[0]
            if (hasattr(src, "target") and str(src.target) in _EINSUM_OPS and len(src.users) == 1
                    and src in live):
                ctx.out_perm[src] = _perm_of(node, len(src.meta["val"].shape))
                fused_out.add(node)
    specs = {s.arg.name: s for s in ep.graph_signature.input_specs}
    env: Dict[Any, Any] = {}
    user_i = 0
    leaf_values: Dict[str, Any] = ctx.values
    params_by_name: Dict[str, _T] = {}
    for node in nodes:
        if node.op != "placeholder":
            continue
        spec = specs[node.name]
        kind = spec.kind.name
        if kind == "USER_INPUT":
            x = example_inputs[user_i] if user_i < len(example_inputs) else targets[user_i - len(example_inputs)]
            nm = user_names[user_i]
            user_i += 1
            if node not in live:
                continue
            shape = [int(s) for s in x.shape]
            wdt = _weft_dtype(x.dtype, dtype) if x.dtype != torch.bool else None
            if (wdt is None or wdt.startswith("i")) and _only_converted_to_float(node, live):
                wdt = dtype  # e.g. an int attention_mask used only as .to(float): a float input
                x = x.to(torch.float64)
            if wdt is None:
                raise ValueError(f"weft.from_torch: input '{nm}' is a bool tensor used as such")
            env[node] = _T(g.input(nm, shape, wdt), tuple(shape))
            leaf_values[nm] = x
            if ctx.batch is None and shape:
                ctx.batch = shape[0]
            continue
        if node not in live:
            continue
        if kind == "PARAMETER":
            obj = root_state[spec.target]
            nm = canon.get(id(obj), spec.target[len(prefix):] if spec.target.startswith(prefix) else spec.target)
            if nm not in params_by_name:
                if not obj.is_floating_point():
                    raise ValueError(f"weft.from_torch: parameter {nm} is not floating point")
                params_by_name[nm] = _T(g.parameter(nm, [int(s) for s in obj.shape], dtype),
                                        tuple(int(s) for s in obj.shape))
                leaf_values[nm] = obj
            env[node] = params_by_name[nm]
        elif kind == "BUFFER":
            obj = root_state.get(spec.target)
            if obj is None:
                obj = ep.constants[spec.target]
            nm = canon.get(id(obj), spec.target[len(prefix):] if spec.target.startswith(prefix) else spec.target)
            ctx.buffer_names.add(nm)
            if values is not None and nm in values and getattr(obj, "is_meta", False):
                # a meta module's buffer, real in `values`: constants folded from it get real values too
                real = values[nm]
                real = real if isinstance(real, torch.Tensor) else torch.as_tensor(np.asarray(real))
                if tuple(real.shape) != tuple(obj.shape):
                    raise ValueError(f"weft.from_torch: values['{nm}'] has shape {tuple(real.shape)}, the module's "
                                     f"buffer {tuple(obj.shape)}")
                obj = real.to(obj.dtype)
            env[node] = _C(obj.detach(), nm)
        elif kind in ("CONSTANT_TENSOR", "CUSTOM_OBJ"):
            obj = ep.constants[spec.target]
            if not isinstance(obj, torch.Tensor):
                raise ValueError(f"weft.from_torch: constant {spec.target} is not a tensor")
            env[node] = _C(obj.detach(), "const." + node.name)
        else:
            raise ValueError(f"weft.from_torch: unsupported graph input kind {kind} ({node.name})")

    def load(a):
        return torch.fx.node.map_arg(a, lambda n: env[n])

    def has_t(v) -> bool:
        if isinstance(v, (_T, _Unusable, _Flat, _Perm, _Lazy)):
            return True
        if isinstance(v, (list, tuple)):
            return any(has_t(x) for x in v)
        if isinstance(v, dict):
            return any(has_t(x) for x in v.values())
        return False

    def to_torch(v):
        if isinstance(v, _C):
            return v.value
        if isinstance(v, (list, tuple)):
            return type(v)(to_torch(x) for x in v)
        if isinstance(v, dict):
            return {k: to_torch(x) for k, x in v.items()}
        return v

    def wrap(v, name):
        if isinstance(v, torch.Tensor):
            return _C(v, name)
        if isinstance(v, (list, tuple)):
            return type(v)(wrap(x, f"{name}.{i}") for i, x in enumerate(v))
        return v

    def fold_name(node, args, result):
        # a view of a buffer that keeps its shape (alias, full slice, contiguous, ...) keeps its name
        cs = [a for a in args if isinstance(a, _C)]
        base = str(node.target).split(".")[1] if str(node.target).startswith("aten.") else ""
        if (len(cs) == 1 and cs[0].name and base in _SAME_VALUE_OPS and isinstance(result, torch.Tensor)
                and tuple(result.shape) == tuple(cs[0].value.shape)):
            return cs[0].name
        return "const." + node.name

    for node in nodes:
        if node.op == "get_attr" and node in live:
            # a submodule of a higher-order op (e.g. HF's autocast-disabled rotary embedding) or a
            # tensor attribute: folded with the op when every operand is constant
            obj = gm
            for part in str(node.target).split("."):
                obj = getattr(obj, part)
            env[node] = _C(obj.detach(), "const." + node.name) if isinstance(obj, torch.Tensor) else obj
            continue
        if node.op != "call_function" or node not in live:
            continue
        args, kwargs = load(node.args), load(node.kwargs)
        stack = node.meta.get("nn_module_stack") or {}
        path = list(stack.values())[-1][0] if stack else ""
        if prefix and path.startswith(prefix):
            path = path[len(prefix):]
        elif prefix and path == prefix[:-1]:
            path = ""
        ctx.node, ctx.path = node, path
        target = node.target
        opname = str(target)
        if (_view_name(node) is not None and node.users and has_t(load(node.args))
                and all(str(u.target) in _OVERWRITES and u.args[0] is node for u in node.users)):
            # a view (of a graph tensor) only overwritten (x[..., 1:] = y: copy_ / fill_ read no value of
            # it): the write replaces that region of the base (_write_through_views); nothing to emit
            env[node] = _Unusable(f"the view '{node.name}' (only overwritten)")
            continue
        if node in fused_out and not isinstance(env[node.args[0]], _C):
            env[node] = env[node.args[0]]  # already permuted by the producing einsum
            continue
        if not has_t((args, kwargs)) and target is not operator.getitem:
            # folded: computed in torch from constants (meta tensors stay meta)
            if any(r in str(target) for r in _RANDOM_OPS):
                ctx.fail("random ops are not supported")
            fkw = to_torch(kwargs)
            val = node.meta.get("val")
            if (str(target).split(".")[1:2] in (["full"], ["ones"], ["zeros"], ["scalar_tensor"])
                    and isinstance(val, torch.Tensor) and val.is_floating_point()):
                fkw["dtype"] = torch.float64  # weft computes in f64: no overflow of e.g. finfo(f64).min
            if fold_mode is not None:
                with fold_mode:
                    result = target(*to_torch(args), **fkw)
            else:
                result = target(*to_torch(args), **fkw)
            env[node] = wrap(result, fold_name(node, args, result))
            continue
        h = _handler_for(target)
        inplace = None
        if h is None:
            inplace = _functional_of(target)
            h = _handler_for(inplace) if inplace is not None else None
        if h is None and node in writes:
            ctx.fail("an in-place write into a view of a tensor by this op is not supported (copy_, fill_ and the "
                     "in-place forms of the supported ops are): build the tensor with torch.cat instead")
        if h is None:
            raise ValueError(
                f"weft.from_torch: unsupported op {opname} (node '{node.name}', module "
                f"{path or '<root>'!r}"
                f"{' ' + _type_name(list(stack.values())[-1][1]) if stack else ''}{_source_line(node)}); "
                f"weft.frontend.supported_ops() lists the {len(supported_ops())} ops it maps")
        if inplace is not None and isinstance(node.args[0], torch.fx.Node):
            _check_no_stale_view(ctx, node, view_base(node.args[0]), order, live)
        if h is not _to and h is not _getitem:  # a conversion makes its own dtype; getitem picks one
            ctx.cur_float = ctx.node_float(node) or ctx.float_dtype
            if ctx.mixed:
                args, kwargs = ctx.harmonise(args, kwargs, ctx.node_float(node))
        env[node] = h(ctx, node, *args, **kwargs)
        ctx.cur_float = ctx.float_dtype
        if inplace is not None and isinstance(node.args[0], torch.fx.Node):
            # x.add_(y): later readers of x see the new value; x[..., 1:] = y (copy_ into a view of x):
            # x becomes x with that region replaced (functionalised: slices of x and the new part, concatenated)
            src = node.args[0]
            if view_base(src) is not src:
                _write_through_views(ctx, env, node, src, env[node], view_base)
            else:
                env[src] = env[node]
    outs = load(out_node.args[0])
    out = outs[0] if isinstance(outs, (list, tuple)) else outs
    if isinstance(outs, (list, tuple)) and len(outs) != 1:
        raise ValueError(f"weft.from_torch: the module returns {len(outs)} values; give a loss_fn that "
                         "reduces them to a scalar loss")
    if not _is_graph(out):
        raise ValueError("weft.from_torch: the loss does not depend on the inputs or parameters")
    out = ctx.tensor(out)
    if len(out.shape) != 0:
        raise ValueError(f"weft.from_torch: the output has shape {list(out.shape)}, not a scalar: give a "
                         "loss_fn (and targets) that reduce it to the loss")
    g.set_loss(out.id)
    _record_values(g, leaf_values)
    return g, leaf_values


def _record_values(g, leaf_values) -> None:
    """The module's own values become part of the graph: every Parameter, Buffer and Constant leaf
    whose tensor is real (a meta-device import records none: weft.load_values gives them later).
    The parameters are the module's, so the graph's parameters are never seeded."""
    from ..values import _array

    torch = _torch()
    g.seed_parameters = False
    for t in g.tensors:
        if t["producer"] is not None or t["role"] not in ("parameter", "buffer", "constant"):
            continue
        v = leaf_values.get(t["name"])
        if v is None or not isinstance(v, torch.Tensor) or v.device.type == "meta":
            continue
        if tuple(v.shape) != tuple(t["shape"]):
            continue  # a scalar folded into a broadcast shape: the graph's own, already given
        g.set_value(t["id"], _array(t["name"], v))


def from_torch(module, example_inputs: Sequence[Any], *, loss_fn: Optional[Callable] = None,
               targets: Sequence[Any] = (), dtype: Optional[str] = None, name: Optional[str] = None,
               values=None, fused_attention: bool = True, float_casts: str = "module"):
    """The forward graph of ``module`` on ``example_inputs`` with a scalar loss.

    If the module returns a scalar, that is the loss; otherwise the loss is
    ``loss_fn(module(*example_inputs), *targets)``, captured together with the module.
    ``dtype`` is the weft dtype of the module's floating point tensors (default: the module's
    parameter dtype: "f64", "f32", "bf16", "f16"); a value the module converts to another float dtype
    (Llama's RMSNorm in f32) keeps it, through the IR's cast.
    Integer inputs (token ids, labels) become i64 / i32 inputs. Works on meta tensors.
    Raises ValueError for an op without an exact mapping (see :func:`supported_ops`).

    Values: the graph carries the module's own (parameters, buffers, and the constants folded at
    import: masks, eps, rotary tables, Python scalars) when its tensors are real; its parameters are
    never seeded (``Graph.seed_parameters`` is False). A module on the meta device imports without
    allocating anything and records none: give ``values=`` (a ``state_dict``-like mapping, or a
    ``.safetensors`` path for the parameters) — its buffers are then used for the folded constants
    too — or :func:`weft.load_values` later (for the parameters and buffers).

    ``fused_attention`` (default True): ``F.scaled_dot_product_attention`` without a mask and
    without dropout imports as the IR's fused ``attention`` op (``is_causal`` and ``scale`` kept;
    its backward saves the output and the log-sum-exp, not the s x s probabilities); with a mask or
    dropout, or with False, as scores, mask, softmax, dropout and a product with v.

    ``float_casts`` (default ``"module"``): how conversions between float dtypes are imported.
    ``"module"``: as the module writes them (an IR ``cast``; the region after it computes in its own
    dtype, as torch does). ``"ignore"``: as the identity — the whole graph, and every constant folded
    at import (rotary tables computed in float32), holds the module's float dtype; for proofs that an
    f64 model with float32 islands (Hugging Face's RMSNorm, softmax and loss upcasts) trains exactly
    like torch running it in f64 throughout."""
    if not isinstance(fused_attention, bool):
        raise TypeError(f"weft.from_torch: fused_attention must be a bool, got {type(fused_attention).__name__}")
    _check_float_casts(float_casts, "from_torch")
    state = None
    if values is not None and not isinstance(values, (str, bytes)) and hasattr(values, "items"):
        state = dict(values.items())
    g, _ = _import(module, example_inputs, loss_fn, targets, dtype, name, state, fused_attention, float_casts)
    if values is not None:
        from ..values import load_values

        load_values(g, values, strict=False)
    return g


def feeds_from_torch(module, example_inputs: Sequence[Any], targets: Sequence[Any] = (), *,
                     loss_fn: Optional[Callable] = None, dtype: Optional[str] = None,
                     fused_attention: bool = True, float_casts: str = "module") -> Dict[str, np.ndarray]:
    """Leaf name -> numpy array (float64, or int64 for integer tensors) for every leaf of the graph
    that :func:`from_torch` builds from the same arguments (``fused_attention`` included: the
    unfused causal attention folds a mask constant; ``float_casts`` too: "ignore" folds constants in
    the module's dtype): parameters (the module's weights), inputs, targets, buffers and folded
    constants, so that ``weft.interpret(graph, feeds)`` reproduces the module."""
    torch = _torch()
    _check_float_casts(float_casts, "feeds_from_torch")
    _, values = _import(module, example_inputs, loss_fn, targets, dtype, None, None, bool(fused_attention),
                        float_casts)
    out = {}
    for k, v in values.items():
        if v.device.type == "meta":
            raise ValueError(f"weft.feeds_from_torch: '{k}' is on the meta device (no values)")
        v = v.detach().cpu()
        if v.dtype == torch.bool:
            v = v.to(torch.float64)
        out[k] = v.numpy().astype(np.float64 if v.is_floating_point() else np.int64)
    return out


from . import indexing  # noqa: E402,F401 (registers the indexing handlers: index, index_select, one_hot, scatter, ...)
from . import convolution  # noqa: E402,F401 (registers conv1d / conv2d, conv_transpose2d, pooling, upsampling)
from .inplace import (_OVERWRITES, _check_no_stale_view, _view_base, _view_name,  # noqa: E402 (and its handlers)
                      _write_through_views)
