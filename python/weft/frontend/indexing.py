"""Indexing and data-dependent selection for the torch importer: advanced indexing
(``x[:, :, idx]``, ``aten.index.Tensor``), ``index_select``, ``index_put``, ``one_hot``, ``scatter`` (overwrite),
comparisons (of integer tensors: ``labels == -100``; of floating point ones: T5's ``padding_mask == 0``) and
the ``masked_fill`` / ``where`` they drive.

Everything maps to existing IR ops, exactly:
- a constant index (Falcon's ``fused_qkv[..., [-2]]``) is slices of the indexed dim and a concat
  (the dim stays splittable); an index computed in the graph is the IR's ``gather`` (the indexed
  dim is need-replication, every other dim parallel), its gradient a ``scatter_add``;
- an integer comparison is integer arithmetic: for integers d, ``[d == 0] = relu(1 − max(d, −d))``
  and ``[d > 0] = 1 − relu(1 − relu(d))``, so ``x == c``, ``x > c``, ... are a few integer ``binary``
  / ``unary`` ops on the tensor (no rounding: the values are integers);
- a floating point comparison is read off the IR's ``topk`` (its ``i64`` indices; no gradient): with
  a and b stacked on a new last axis as ``[b, a]``, the index of the largest is ``[a > b]`` and the
  index of the smallest ``[a < b]`` (ties: the lower index, 0), so ``==``, ``!=``, ``<=``, ``>=`` are
  integer arithmetic on those two; NaN (which topk orders as the largest) is taken out by
  ``[x is NaN]`` = the index of the largest of ``[+inf, x]``, so every comparison with a NaN is false
  (``!=`` true), as torch's;
- a selection by a {0, 1} integer tensor p between a and b (``where``, ``masked_fill``, ``scatter``
  onto its base) is ``gather(concat([b, a], -1), p, -1)``: exact for every value, infinities and
  NaN included (``a·p + b·(1 − p)`` would turn ``0·inf`` into NaN), and its gradient is exact
  (``gather``'s: dy to the chosen side);
- ``one_hot(x, C)`` is ``embedding(eye(C), x)`` (int64 as torch's, or floating point where it is
  converted to a float: the IR has no dtype conversion);
- ``scatter`` (overwrite) is the selection above between the base and a ``scatter_add`` of the
  source into zeros, covered where a ``scatter_add`` of ones is ≥ 1: exact when no position is
  written twice — torch leaves the winner of a repeated position unspecified — so the source form is
  imported only where the index's positions are distinct along the dim (a constant index, checked;
  or the indices of a ``topk`` along that dim); the ``value`` form takes any index; ``index_put``
  (``x[idx] = v``) likewise, or adds (``accumulate=True``).

Handlers register into frontend/torch.py's table (this module is imported at its end)."""
from __future__ import annotations

from typing import List, Optional

import numpy as np

from .torch import (_C, _T, _broadcast, _is_float_weft, _is_graph, _Lazy, _norm, _out_shape, _reg, _slice_t,
                    _squeeze_const, _torch, _within)


# ---- integer constants of a tensor's own integer dtype (the IR's binary ops take equal dtypes)

def _int_dtype(ctx, t: _T):
    torch = _torch()
    return torch.int32 if ctx.g.tensor(t.id)["dtype"] == "i32" else torch.int64


def _int_const(ctx, value, like: _T, suffix: str) -> _T:
    torch = _torch()
    return ctx.tensor(ctx.const(torch.tensor(value, dtype=_int_dtype(ctx, like)), suffix))


def _ibin(ctx, fn, a, b, suffix):
    """A binary op on integer tensors; a Python int operand becomes a constant of the other's dtype."""
    like = a if isinstance(a, _T) else b
    a = _int_const(ctx, a, like, suffix + ".c") if isinstance(a, int) else ctx.tensor(a)
    b = _int_const(ctx, b, like, suffix + ".c") if isinstance(b, int) else ctx.tensor(b)
    return ctx.binary(fn, a, b, suffix)


def _is_zero(ctx, d: _T, suffix: str) -> _T:
    """[d == 0] for an integer tensor d: relu(1 − max(d, −d))."""
    a = ctx.binary("max", d, ctx.unary("neg", d, suffix + ".neg"), suffix + ".abs")
    return ctx.unary("relu", _ibin(ctx, "sub", 1, a, suffix + ".one_minus"), suffix)


def _is_positive(ctx, d: _T, suffix: str) -> _T:
    """[d > 0] for an integer tensor d: 1 − relu(1 − relu(d))."""
    r = ctx.unary("relu", d, suffix + ".relu")
    return _ibin(ctx, "sub", 1, ctx.unary("relu", _ibin(ctx, "sub", 1, r, suffix + ".gap"), suffix + ".under"), suffix)


class _Cmp(_Lazy):
    """A comparison: a bool tensor in torch, here a {0, 1} integer tensor (`pick`) read by a selection
    (masked_fill / where), a sum, or a conversion to floating point (`materialise`)."""

    name = ""

    def pick(self, ctx) -> _T:
        raise NotImplementedError

    def materialise(self, ctx, floating: bool) -> _T:
        p = self.pick(ctx)
        if not floating:
            return p
        return _float_of_pick(ctx, p, self.name + ".float")


class _IntCmp(_Cmp):
    """``x <op> c`` for an integer graph tensor x and an integer c, made when something reads it."""

    def __init__(self, x: _T, op: str, c: int, name: str):
        self.x, self.op, self.c, self.name = x, op, int(c), name
        self.shape = tuple(x.shape)
        self._pick: Optional[_T] = None

    def pick(self, ctx) -> _T:
        if self._pick is None:
            x, c, s = self.x, self.c, self.name
            if self.op in ("eq", "ne"):
                d = _ibin(ctx, "sub", x, c, s + ".diff") if c else x
                eq = _is_zero(ctx, d, s + (".eq" if self.op == "ne" else ""))
                self._pick = eq if self.op == "eq" else _ibin(ctx, "sub", 1, eq, s)
            else:  # integers: x > c ⟺ x − c > 0, x >= c ⟺ x − (c − 1) > 0, x < c ⟺ c − x > 0,
                # x <= c ⟺ c + 1 − x > 0
                d = {"gt": lambda: _ibin(ctx, "sub", x, c, s + ".diff"),
                     "ge": lambda: _ibin(ctx, "sub", x, c - 1, s + ".diff"),
                     "lt": lambda: _ibin(ctx, "sub", c, x, s + ".diff"),
                     "le": lambda: _ibin(ctx, "sub", c + 1, x, s + ".diff")}[self.op]()
                self._pick = _is_positive(ctx, d, s)
        return self._pick

    def reshaped(self, ctx, shape) -> "_IntCmp":
        """A view of the comparison (mask.unsqueeze(-1), ...): the comparison of the view."""
        return _IntCmp(ctx.tensor(ctx.reshape(self.x, shape, self.name + ".view")), self.op, self.c, self.name + "v")


class _FloatCmp(_Cmp):
    """A comparison of floating point values, its {0, 1} i64 tensor already made (see _float_compare)."""

    def __init__(self, p: _T, name: str):
        self.p, self.name = p, name
        self.shape = tuple(p.shape)

    def pick(self, ctx) -> _T:
        return self.p

    def reshaped(self, ctx, shape) -> "_FloatCmp":
        return _FloatCmp(ctx.tensor(ctx.reshape(self.p, shape, self.name + ".view")), self.name + "v")


def _float_of_pick(ctx, p: _T, name: str) -> _T:
    """A {0, 1} integer tensor as floating point: embedding([[0], [1]], p) (the IR has no cast)."""
    torch = _torch()
    table = ctx.tensor(ctx.const(torch.tensor([[0.0], [1.0]], dtype=torch.float64), "zero_one"))
    y = ctx._t(ctx.g.embedding(table.id, p.id, ctx.name(name)))
    return ctx.tensor(ctx.reshape(y, list(p.shape), name + ".squeeze"))


class _OneHot(_Lazy):
    """one_hot(x, C): embedding(eye(C), x) — int64 (torch's dtype), or floating point where it is
    converted to floating point or combined with a float tensor."""

    def __init__(self, x: _T, classes: int, name: str):
        self.x, self.classes, self.name = x, int(classes), name
        self.shape = tuple(x.shape) + (self.classes,)
        self._done = {}

    def materialise(self, ctx, floating: bool) -> _T:
        if floating not in self._done:
            torch = _torch()
            eye = torch.eye(self.classes, dtype=torch.float64 if floating else torch.int64)
            table = ctx.tensor(ctx.const(eye, f"eye{self.classes}" + (".float" if floating else "")))
            self._done[floating] = ctx._t(ctx.g.embedding(table.id, self.x.id,
                                                          ctx.name(self.name + (".float" if floating else ""))))
        return self._done[floating]


def lazy_mask(ctx, m) -> Optional[_T]:
    """The {0, 1} integer tensor of a data-dependent mask (a comparison of integer tensors), or None. An
    integer graph tensor as a mask is one already made (a bool in torch, which refuses other masks: only
    comparisons make them here)."""
    if isinstance(m, _Cmp):
        return m.pick(ctx)
    if _is_graph(m) and not isinstance(m, _Lazy) and not _is_float_weft(ctx.g, ctx.tensor(m).id):
        return ctx.tensor(m)
    return None


# ---- comparisons

def _float_operand(ctx, v, shape, tag: str):
    """A comparison's operand on the result's shape with a new last axis of 1 (a constant or a Python
    number: a Constant, without the leading dims it is broadcast along), and [v is NaN] for a constant
    (a torch bool tensor) or None for a graph tensor."""
    torch = _torch()
    nan = None
    if not _is_graph(v):
        c = _C((v.value if isinstance(v, _C) else torch.as_tensor(v)).to(torch.float64),
               v.name if isinstance(v, _C) else None)
        c = _squeeze_const(c, shape)
        nan = torch.isnan(c.value) if c.value.device.type != "meta" else torch.zeros(c.value.shape, dtype=torch.bool)
        v = c if c.name is not None else ctx.const(c.value, tag)
    t = ctx.tensor(v)
    if list(t.shape) != shape:
        t = _broadcast(ctx, ctx.node, t, shape, tag + ".broadcast")
    return ctx.tensor(ctx.reshape(t, shape + [1], tag + ".last")), nan


def _index_of_best(ctx, first: _T, second: _T, largest: bool, suffix: str) -> _T:
    """The index (0 or 1, i64) of the largest (smallest) of [first, second] per element: 1 iff second
    is strictly larger (smaller), ties the lower index 0, NaN the largest (the IR's topk)."""
    r = len(first.shape) - 1
    both = ctx._t(ctx.g.concat([first.id, second.id], r, ctx.name(suffix + ".pair")))
    _, i = ctx.g.topk(both.id, 1, r, bool(largest), ctx.name(suffix))
    return ctx.tensor(ctx.reshape(ctx._t(i), list(first.shape[:-1]), suffix + ".squeeze"))


def _float_compare(ctx, op: str, a, b, shape, name: str) -> _T:
    """[a <op> b] as a {0, 1} i64 tensor of `shape`, for floating point a, b (graph tensors, constants or
    Python numbers), exactly — infinities included, and every comparison with a NaN false (!= true)."""
    torch = _torch()
    shape = [int(s) for s in shape]
    # constants take the graph operands' float dtype (both have it: harmonised to the wider), so that
    # the pairs concatenate in one dtype (a comparison inside an f32 region of an f64 model)
    ctx.cur_float = next(ctx.dtype_of(v) for v in (a, b) if _is_graph(v)) or ctx.float_dtype
    ta, nan_a = _float_operand(ctx, a, shape, "a")
    tb, nan_b = _float_operand(ctx, b, shape, "b")

    def is_nan(t, nan, tag):
        if nan is None:  # a graph tensor: the largest of [+inf, x] is x only when x is NaN
            inf = ctx.tensor(ctx.const(torch.tensor(float("inf"), dtype=torch.float64), "inf"))
            inf = ctx.tensor(ctx.reshape(_broadcast(ctx, ctx.node, inf, shape, tag + ".inf.broadcast"),
                                         shape + [1], tag + ".inf.last"))
            return _index_of_best(ctx, inf, t, True, tag)
        if not bool(nan.any()):
            return None
        c = ctx.tensor(ctx.const(nan.to(torch.int64), tag))
        return c if list(c.shape) == shape else ctx.tensor(_broadcast(ctx, ctx.node, c, shape, tag + ".broadcast"))

    gt = lt = None
    if op in ("gt", "le", "eq", "ne"):
        gt = _index_of_best(ctx, tb, ta, True, name + ".gt")  # [a > b], or a NaN a
    if op in ("lt", "ge", "eq", "ne"):
        lt = _index_of_best(ctx, tb, ta, False, name + ".lt")  # [a < b], or a NaN b
    # NaN is topk's largest: [a > b] reads 1 for a NaN a (b not NaN), [a < b] for a NaN b. So gt and ge
    # (1 - [a < b]) are wrong only for a NaN a, lt and le only for a NaN b, and eq (1 - [a > b] - [a < b])
    # only when both are NaN (a tie): each takes that one term out
    na = is_nan(ta, nan_a, "a_nan") if op in ("gt", "ge", "eq", "ne") else None
    nb = is_nan(tb, nan_b, "b_nan") if op in ("lt", "le") else None

    def minus(x, *ys):
        for i, y in enumerate(ys):
            if y is not None:
                x = _ibin(ctx, "sub", x, y, f"{name}.minus{i}")
        return x

    relu = lambda x, tag: ctx.unary("relu", x, name + tag)  # noqa: E731
    if op == "gt":  # a NaN makes the largest index 1: taken out
        return relu(minus(gt, na), ".gt.clean") if na is not None else gt
    if op == "lt":
        return relu(minus(lt, nb), ".lt.clean") if nb is not None else lt
    if op == "ge":  # not (a < b), and a not NaN
        return relu(minus(_ibin(ctx, "sub", 1, lt, name + ".not_lt"), na, nb), ".ge")
    if op == "le":
        return relu(minus(_ibin(ctx, "sub", 1, gt, name + ".not_gt"), na, nb), ".le")
    eq = relu(minus(_ibin(ctx, "sub", 1, gt, name + ".not_gt"), lt, na, nb), ".eq")
    return eq if op == "eq" else _ibin(ctx, "sub", 1, eq, name + ".ne")


def _is_float_value(ctx, v) -> bool:
    if _is_graph(v):
        return not isinstance(v, _Lazy) and _is_float_weft(ctx.g, ctx.tensor(v).id)
    if isinstance(v, _C):
        return v.value.is_floating_point()
    return isinstance(v, float)


def _compare(op):
    def h(ctx, node, x, other):
        if isinstance(other, _C) and other.value.dim() == 0 and not other.value.is_floating_point():
            other = int(other.value.item())  # a 0-d integer constant (a lifted literal)
        if (_is_graph(x) or _is_graph(other)) and (_is_float_value(ctx, x) or _is_float_value(ctx, other)):
            for v in (x, other):
                if _is_graph(v) and not _is_float_value(ctx, v):
                    ctx.fail("a comparison of an integer tensor with a floating point one is not supported (the IR "
                             "converts no integer tensor to floating point)")
            return _FloatCmp(_float_compare(ctx, op, x, other, list(_out_shape(node)), node.name), node.name)
        if not _is_graph(x) or not isinstance(other, int):
            ctx.fail("a comparison of an integer tensor computed from the inputs with another tensor is not "
                     "supported; comparisons of an integer tensor (ids, labels) with an integer, and of floating "
                     "point tensors with each other or with numbers, are")
        return _IntCmp(ctx.tensor(x), op, int(other), node.name)
    return h


for _op in ("eq", "ne", "gt", "ge", "lt", "le"):
    _reg(f"{_op}.Scalar", f"{_op}.Tensor")(_compare(_op))


# ---- selection by a {0, 1} integer tensor

def choose(ctx, pick: _T, on_true, on_false, shape, suffix: str = "") -> _T:
    """on_true where pick == 1 else on_false (pick broadcast to `shape`): gather(concat([f, t], -1),
    pick, -1), exact for every value; a scalar or constant side is broadcast (no constant of the
    result's size)."""
    pre = suffix + "." if suffix else ""
    shape = [int(s) for s in shape]
    r = len(shape)
    ref = next((v for v in (on_true, on_false) if _is_graph(v)), None)
    floating = ref is None or _is_float_weft(ctx.g, ctx.tensor(ref).id)
    if ref is not None and floating:  # a constant side takes the graph side's float dtype (one concat)
        ctx.cur_float = ctx.g.tensor(ctx.tensor(ref).id)["dtype"]

    def side(v, tag):
        torch = _torch()
        if isinstance(v, _Lazy):
            v = v.materialise(ctx, floating)
        if not _is_graph(v):  # a Python scalar or a constant: the IR dtype of the other side
            val = v.value if isinstance(v, _C) else v
            val = torch.as_tensor(val, dtype=torch.float64 if floating else _int_dtype(ctx, ctx.tensor(ref)))
            v = ctx.const(val, pre + tag)
        v = ctx.tensor(v)
        if list(v.shape) != shape:
            v = _broadcast(ctx, ctx.node, v, shape, pre + tag + ".broadcast")
        return ctx.reshape(v, shape + [1], pre + tag + ".last")

    stacked = ctx._t(ctx.g.concat([ctx.tensor(side(on_false, "false")).id, ctx.tensor(side(on_true, "true")).id], r,
                                  ctx.name(pre + "sides")))
    p = ctx.tensor(pick)
    if list(p.shape) != shape:
        p = _broadcast(ctx, ctx.node, p, shape, pre + "pick.broadcast")
    p = ctx.tensor(ctx.reshape(p, shape + [1], pre + "pick.last"))
    y = ctx._t(ctx.g.gather(stacked.id, p.id, r, ctx.name(pre + "choose")))
    return ctx.reshape(y, shape, suffix)


# ---- one_hot

@_reg("one_hot.default")
def _one_hot(ctx, node, x, num_classes=-1):
    if isinstance(x, _Lazy):
        x = ctx.tensor(x)
    x = ctx.tensor(x)
    if _is_float_weft(ctx.g, x.id):
        ctx.fail("one_hot of a floating point tensor")
    return _OneHot(x, _out_shape(node)[-1], node.name)


# ---- taking positions along one dim: advanced indexing, index_select

def _norm_const_index(ctx, idx, n: int, what: str):
    """A constant integer index with negative entries wrapped, every entry checked to be in [0, n)."""
    torch = _torch()
    if idx.device.type == "meta":
        ctx.fail(f"{what}: the index is a constant on the meta device (its values are unknown)")
    idx = idx.to(torch.int64)
    idx = torch.where(idx < 0, idx + n, idx)
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= n):
        ctx.fail(f"{what}: index out of range for a dim of size {n}")
    return idx


def _wrap_graph_index(ctx, idx: _T, n: int, suffix: str) -> _T:
    """torch's negative indices counted from the end, for an index computed in the graph:
    idx + n·[idx < 0] (integer ops: exact)."""
    neg = _is_positive(ctx, ctx.unary("neg", idx, suffix + ".neg"), suffix + ".is_neg")
    return ctx.binary("add", idx, _ibin(ctx, "mul", neg, n, suffix + ".wrap"), suffix)


def take(ctx, x, dim: int, idx, suffix: str = ""):
    """x with dim `dim` replaced by idx's dims, x[..., idx, ...] (idx: a constant or graph integer tensor,
    already in [0, n))."""
    pre = suffix + "." if suffix else ""
    x = ctx.tensor(x)
    shape = list(x.shape)
    ishape = [int(s) for s in (idx.value.shape if isinstance(idx, _C) else idx.shape)]
    out = shape[:dim] + ishape + shape[dim + 1:]
    k = int(np.prod(ishape)) if ishape else 1
    if isinstance(idx, _C):  # slices of runs of consecutive positions, concatenated
        flat = [int(i) for i in idx.value.reshape(-1).tolist()]
        if not flat:
            ctx.fail("indexing by an empty index is not supported")
        parts, b = [], 0
        while b < len(flat):
            e = b + 1
            while e < len(flat) and flat[e] == flat[e - 1] + 1:
                e += 1
            parts.append(_slice_t(ctx, x, dim, flat[b], flat[e - 1] + 1, f"{pre}take{len(parts)}"))
            b = e
        y = parts[0] if len(parts) == 1 else ctx._t(ctx.g.concat([p.id for p in parts], dim, ctx.name(pre + "take")))
        return ctx.reshape(y, out, suffix)
    # an index computed in the graph: the IR's gather, the index broadcast over x's other dims
    i = ctx.tensor(ctx.reshape(ctx.tensor(idx), [1] * dim + [k] + [1] * (len(shape) - dim - 1), pre + "index.shape"))
    gshape = shape[:dim] + [k] + shape[dim + 1:]
    if list(i.shape) != gshape:
        i = _broadcast(ctx, ctx.node, i, gshape, pre + "index.broadcast")
    y = ctx._t(ctx.g.gather(x.id, ctx.tensor(i).id, dim, ctx.name(pre + "gather")))
    return ctx.reshape(y, out, suffix)


def _index_of(ctx, idx, n: int, what: str, suffix: str, wrap: bool = True):
    """An index operand (constant or graph, integer) with negatives counted from the end (`wrap`, as
    advanced indexing does; index_select refuses them, as torch does)."""
    if isinstance(idx, _Lazy):
        ctx.fail(f"{what} by a mask computed in the graph (a data-dependent shape) is not supported")
    if isinstance(idx, _C):
        if idx.value.dtype == _torch().bool:
            ctx.fail(f"{what}: internal: a constant bool index should have been converted")
        if not wrap and idx.value.device.type != "meta" and idx.value.numel() and int(idx.value.min()) < 0:
            ctx.fail(f"{what}: index out of range for a dim of size {n}")
        return ctx.const(_norm_const_index(ctx, idx.value, n, what), suffix)  # a new leaf: its values may differ
    idx = ctx.tensor(idx)
    if _is_float_weft(ctx.g, idx.id):
        ctx.fail(f"{what}: the index must be an integer tensor")
    if not wrap or _source_op(ctx, idx.id, ("slice", "reshape", "transpose", "broadcast_to"))[0] == "topk":
        return idx  # (a topk's indices are never negative)
    return _wrap_graph_index(ctx, idx, n, suffix)


@_reg("index_select.default")
def _index_select(ctx, node, x, dim, index):
    x = ctx.tensor(x)
    d = _norm(dim, len(x.shape))
    idx = _index_of(ctx, index, x.shape[d], "index_select", "index", wrap=False)
    return take(ctx, x, d, idx)


class _Positions:
    """Advanced indexing's positions in x: x (transposed so that the indexed dims are adjacent, `perm`,
    or None), the indexed dims `dims`, the index operands `ops` (negatives counted from the end) and
    their broadcast shape `ishape`."""

    def __init__(self, x, perm, dims, ops, ishape):
        self.x, self.perm, self.dims, self.ops, self.ishape = x, perm, dims, ops, ishape

    def linear(self, ctx):
        """x with the indexed dims merged into one (dim dims[0]) and the linear index into it (a constant,
        or a graph tensor of shape ishape)."""
        x, dims, ops, ishape = self.x, self.dims, self.ops, self.ishape
        sizes = [x.shape[d] for d in dims]
        strides = [int(np.prod(sizes[j + 1:])) for j in range(len(sizes))]
        if all(isinstance(o, _C) for o in ops):
            lin = ctx.const(sum(o.value * s for o, s in zip(ops, strides)), "linear")
        else:  # Σ idx_j · stride_j in integer ops, each index broadcast to their common shape
            lin = None
            for j, (o, s) in enumerate(zip(ops, strides)):
                t = ctx.tensor(o)
                if list(t.shape) != ishape:
                    t = _broadcast(ctx, ctx.node, t, ishape, f"index{j}.broadcast")
                t = _ibin(ctx, "mul", t, s, f"index{j}.stride") if s != 1 else t
                lin = t if lin is None else ctx.binary("add", lin, t, f"index{j}.linear")
        d0 = dims[0]
        merged = list(x.shape[:d0]) + [int(np.prod(sizes))] + list(x.shape[dims[-1] + 1:])
        xm = ctx.tensor(ctx.reshape(x, merged, "indexed_merged")) if len(dims) > 1 else x
        return xm, lin


def _positions(ctx, x, indices, what) -> Optional[_Positions]:
    """The positions x[indices] reads (None: no index tensor)."""
    torch = _torch()
    x = ctx.tensor(x)
    r = len(x.shape)
    idx: List = []
    for i in indices:  # a bool mask over k dims is k integer indices (its positions: constant only)
        if isinstance(i, _C) and i.value.dtype in (torch.bool, torch.uint8):
            if i.value.device.type == "meta":
                ctx.fail(f"{what} by a bool mask on the meta device (its positions are unknown)")
            idx.extend(ctx.const(p, f"mask{len(idx)}.{k}")
                       for k, p in enumerate(torch.nonzero(i.value.to(torch.bool), as_tuple=True)))
        else:
            idx.append(i)
    if len(idx) > r:
        ctx.fail(f"too many indices ({len(idx)}) for a tensor of rank {r}")
    idx += [None] * (r - len(idx))
    dims = [d for d, i in enumerate(idx) if i is not None]
    if not dims:
        return None
    perm = None
    if dims != list(range(dims[0], dims[-1] + 1)):  # the indexed dims first, in order (where torch puts them)
        perm = dims + [d for d in range(r) if d not in dims]
        x = ctx._t(ctx.g.transpose(x.id, perm, ctx.name("indexed_first")))
        idx = [idx[d] for d in dims] + [None] * (r - len(dims))
        dims = list(range(len(dims)))
    ops = [_index_of(ctx, idx[d], x.shape[d], what, f"index{j}") for j, d in enumerate(dims)]
    ishape = list(torch.broadcast_shapes(*[tuple(o.value.shape) if isinstance(o, _C) else tuple(o.shape)
                                           for o in ops]))
    return _Positions(x, perm, dims, ops, ishape)


@_reg("index.Tensor")
def _index(ctx, node, x, indices):
    """x[i0, i1, ...] with tensors (advanced indexing): the indexed dims (after every constant bool
    mask is turned into its positions) are merged into one, the indices into one linear index, and
    that dim taken (`take`). Adjacent indexed dims keep their place in the result, others go first,
    as torch does."""
    pos = _positions(ctx, x, indices, "indexing")
    if pos is None:
        return x
    x, dims, ishape = pos.x, pos.dims, pos.ishape
    rows = _rows_then_index(ctx, x, dims, pos.ops, ishape)
    if rows is not None:
        return rows
    xm, lin = pos.linear(ctx)
    y = take(ctx, xm, dims[0], lin if isinstance(lin, _C) else ctx.tensor(lin), "take")
    # (the shape from the operands: a bool mask's count is symbolic in the export's metadata)
    return ctx.reshape(y, list(x.shape[:dims[0]]) + ishape + list(x.shape[dims[-1] + 1:]))


def _one_per_row(pos: _Positions) -> bool:
    """x[arange(n), idx] with idx of shape [n]: one position in each row, so no position twice."""
    torch = _torch()
    if len(pos.dims) != 2 or not isinstance(pos.ops[0], _C) or pos.ishape != [pos.x.shape[pos.dims[0]]]:
        return False
    return torch.equal(pos.ops[0].value.expand(pos.ishape), torch.arange(pos.ishape[0]))


@_reg("index_put.default")
def _index_put(ctx, node, x, indices, values, accumulate=False):
    """x[i0, i1, ...] = values (index_put; `x[idx] = v`, `x.index_put_(idx, v, accumulate=True)`): with
    the positions merged as for indexing, `scatter_add(0, index, values)` added to x (accumulate) or
    selected where a position is written (the selection of `scatter`: exact where no position is written
    twice — a constant index, checked; torch keeps one of the values at a repeated position, which one
    unspecified); a graph index without accumulate: ValueError."""
    torch = _torch()
    pos = _positions(ctx, x, indices, "index_put")
    if pos is None:
        ctx.fail("index_put without an index tensor")
    xm, lin = pos.linear(ctx)
    d0 = pos.dims[0]
    pre, post = list(xm.shape[:d0]), list(xm.shape[d0 + 1:])
    k = int(np.prod(pos.ishape)) if pos.ishape else 1
    if isinstance(lin, _C):
        flat = lin.value.reshape(-1)
        if not accumulate and flat.numel() != torch.unique(flat).numel():
            ctx.fail("index_put with a repeated position: torch keeps one of the values (which one is unspecified); "
                     "use accumulate=True or distinct positions")
        lin = ctx.tensor(ctx.const(flat.to(torch.int64), "positions"))
    elif not accumulate and not _one_per_row(pos):
        ctx.fail("index_put at positions computed in the graph is supported with accumulate=True, or one position "
                 "per row (x[arange(n), idx] = v), only: a position written twice keeps one of the values in torch, "
                 "which one unspecified")
    gshape = pre + [k] + post
    index = ctx.tensor(ctx.reshape(ctx.tensor(lin), [1] * len(pre) + [k] + [1] * len(post), "positions.shape"))
    if list(index.shape) != gshape:
        index = _broadcast(ctx, node, index, gshape, "positions.broadcast")
    floating = _is_float_weft(ctx.g, xm.id)
    vshape = pre + list(pos.ishape) + post  # what x[indices] reads: values broadcast to it
    if isinstance(values, _Lazy):
        values = values.materialise(ctx, floating)
    if not _is_graph(values):
        val = values.value if isinstance(values, _C) else values
        values = ctx.const(torch.as_tensor(val).to(torch.float64 if floating else _int_dtype(ctx, xm)), "values")
    v = ctx.tensor(values)
    if _is_float_weft(ctx.g, v.id) != floating:
        ctx.fail("index_put of values whose dtype kind (integer / floating point) differs from the input's")
    if list(v.shape) != vshape:
        v = _broadcast(ctx, node, v, vshape, "values.broadcast")
    v = ctx.tensor(ctx.reshape(v, gshape, "values.flat"))
    zero = ctx.tensor(ctx.const(torch.zeros((), dtype=torch.float64 if floating else _int_dtype(ctx, xm)), "zero"))
    written = ctx._t(ctx.g.scatter_add(_broadcast(ctx, node, zero, list(xm.shape), "zeros").id, index.id, v.id, d0,
                                       ctx.name("written")))
    if accumulate:
        y = ctx.binary("add", xm, written, "accumulated")
    else:
        ones = _broadcast(ctx, node, _int_const(ctx, 1, index, "one"), gshape, "ones")
        izero = _broadcast(ctx, node, _int_const(ctx, 0, index, "izero"), list(xm.shape), "izeros")
        hits = ctx._t(ctx.g.scatter_add(izero.id, index.id, ones.id, d0, ctx.name("hits")))
        y = choose(ctx, _is_positive(ctx, hits, "covered"), written, xm, list(xm.shape), "put")
    y = ctx.tensor(ctx.reshape(y, list(pos.x.shape), "unmerged"))
    if pos.perm is not None:  # back to x's order
        inv = [pos.perm.index(i) for i in range(len(pos.perm))]
        y = ctx._t(ctx.g.transpose(y.id, inv, ctx.name("indexed_back")))
    return y


def _rows_then_index(ctx, x: _T, dims, ops, ishape):
    """x[arange(n)[:, None], idx] (a router's or a loss's "the chosen entry of each row"): the entry
    idx[i, ...] of row i is a gather along the second indexed dim, row i of the index reading row i of
    x -- the first dim stays parallel (the batch splittable), where merging the two dims would fold it.
    None when the indices are not of that form."""
    torch = _torch()
    if len(dims) != 2 or not isinstance(ops[0], _C) or isinstance(ops[1], _C) or not ishape:
        return None
    n = x.shape[dims[0]]
    rows = torch.arange(n).view([n] + [1] * (len(ishape) - 1))
    if ishape[0] != n or not torch.equal(ops[0].value.expand(ishape), rows.expand(ishape)):
        return None
    d0, d1 = dims
    idx = ctx.tensor(ops[1])
    if list(idx.shape) != ishape:
        idx = _broadcast(ctx, ctx.node, idx, ishape, "rows.index.broadcast")
    m = int(np.prod(ishape[1:])) if len(ishape) > 1 else 1
    shape = list(x.shape)
    pre, post = shape[:d0], shape[d1 + 1:]
    i = ctx.tensor(ctx.reshape(idx, [1] * len(pre) + [n, m] + [1] * len(post), "rows.index"))
    gshape = pre + [n, m] + post
    if list(i.shape) != gshape:
        i = _broadcast(ctx, ctx.node, i, gshape, "rows.index.over")
    y = ctx._t(ctx.g.gather(x.id, i.id, d1, ctx.name("rows.gather")))
    return ctx.reshape(y, pre + list(ishape) + post)


# ---- scatter (overwrite)

def _source_op(ctx, t: int, through):
    """(kind, op, its output) of the op that made tensor t, looking through ops of the kinds `through`;
    (None, None, t) for a leaf."""
    by_output = {o: op for op in ctx.g.ops for o in op["outputs"]}
    while True:
        op = by_output.get(t)
        if op is None:
            return None, None, t
        if op["kind"] not in through:
            return op["kind"], op, t
        t = op["inputs"][0]


def _distinct_along(ctx, index: _T, dim: int) -> bool:
    """Whether the graph index's positions are distinct along `dim` for every other coordinate: the
    indices output of a topk along that dim (or a slice of it: a subset of distinct positions)."""
    kind, op, t = _source_op(ctx, index.id, ("slice",))
    return (kind == "topk" and op["outputs"][1] == t
            and _norm(op["attrs"]["axes"][0], len(ctx.g.tensor(t)["shape"])) == dim)


def _scatter(ctx, node, base, dim, index, src=None, value=None, reduce=None):
    torch = _torch()
    if reduce is not None:
        if reduce == "add" and src is not None:
            from .torch import _scatter_add
            return _scatter_add(ctx, node, base, dim, index, src)
        ctx.fail(f"scatter with reduce={reduce!r} is not supported (reduce='add' of a source tensor is scatter_add)")
    base = ctx.tensor(base)
    r = len(base.shape)
    d = _norm(dim, r)
    if isinstance(index, _C):
        iv = _norm_const_index(ctx, index.value, base.shape[d], "scatter")
        if src is not None:  # distinct positions along the dim, for every other coordinate
            srt = torch.sort(iv, dim=d).values
            if iv.shape[d] > 1 and bool((srt.narrow(d, 1, iv.shape[d] - 1) == srt.narrow(d, 0, iv.shape[d] - 1)).any()):
                ctx.fail("scatter with a repeated position along the dim: torch keeps one of the sources (which one "
                         "is unspecified); use scatter_add or distinct positions")
        index = ctx.tensor(ctx.const(iv.to(torch.int64), "index"))
    else:
        index = ctx.tensor(index)
        if _is_float_weft(ctx.g, index.id):
            ctx.fail("scatter's index must be an integer tensor")
        if src is not None and not _distinct_along(ctx, index, d):
            ctx.fail("scatter of a source at an index computed in the graph is supported only where the positions "
                     "are distinct along the dim (the indices of a topk along it): torch keeps one of the sources "
                     "at a repeated position, which one unspecified; use scatter_add, or scatter a value")
    if len(index.shape) != r:
        ctx.fail(f"scatter index of rank {len(index.shape)} for an input of rank {r}")
    if any(index.shape[i] != base.shape[i] for i in range(r) if i != d):
        ctx.fail(f"scatter with an index {list(index.shape)} smaller than the input {list(base.shape)} off dim {d} "
                 "is not supported (weft's index covers the input off the scattered dim)")
    floating = _is_float_weft(ctx.g, base.id)
    # covered positions: a scatter_add of integer ones into integer zeros, ≥ 1 where written
    ione = _int_const(ctx, 1, index, "one")
    izero = _int_const(ctx, 0, index, "zero")
    ones = _broadcast(ctx, node, ione, list(index.shape), "ones")
    zeros_i = _broadcast(ctx, node, izero, list(base.shape), "zeros")
    hits = ctx._t(ctx.g.scatter_add(zeros_i.id, index.id, ones.id, d, ctx.name("hits")))
    covered = _is_positive(ctx, hits, "covered")
    if src is not None:
        src = _within(ctx, src, index.shape, -1, "src.cut")
        if _is_float_weft(ctx.g, src.id) != floating:
            ctx.fail("scatter of a source whose dtype kind (integer / floating point) differs from the input's")
        zero = ctx.tensor(ctx.const(torch.zeros((), dtype=torch.float64 if floating else _int_dtype(ctx, base)),
                                    "src.zero"))
        into = _broadcast(ctx, node, zero, list(base.shape), "src.zeros")
        written = ctx._t(ctx.g.scatter_add(into.id, index.id, src.id, d, ctx.name("written")))
        return choose(ctx, covered, written, base, base.shape)
    if isinstance(value, _C):
        value = value.value.item()
    if not isinstance(value, (int, float, bool)):
        ctx.fail("scatter of a value that is not a number")
    return choose(ctx, covered, value, base, base.shape)


@_reg("scatter.src", "scatter.value", "scatter.reduce", "scatter.value_reduce")
def _scatter_h(ctx, node, base, dim, index, src_or_value, reduce=None):
    if "value" in str(node.target) or not _is_graph(src_or_value) and not isinstance(src_or_value, _C):
        return _scatter(ctx, node, base, dim, index, value=src_or_value, reduce=reduce)
    return _scatter(ctx, node, base, dim, index, src=src_or_value, reduce=reduce)
