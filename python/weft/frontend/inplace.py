"""In-place writes into views, functionalised, for the torch importer: `x[..., 1:] = y`, `x[:, 0] += y`,
`copy_` / `fill_` / the in-place forms of the supported ops through slice, select, reshape, transpose
and the parts of split / chunk / unbind rebuild the base tensor from its untouched parts and the new
region; slice_scatter and select_scatter likewise. Writes that cannot be made exact (through a strided
slice or another view, a view read after a later write) are refused by name.

Handlers register into frontend/torch.py's table, and _import reads the view helpers from here (this
module is imported at that module's end)."""
from __future__ import annotations

import operator
from typing import Optional

from .torch import (_C, _T, _VIEW_OPS, _broadcast, _is_float_weft, _is_graph, _Lazy, _norm, _out_shape, _perm_of,
                    _reg, _slice_t, _torch)


_PARTS = ("split", "split_with_sizes", "chunk", "unbind")  # views returned as a tuple (read by getitem)


def _view_name(n) -> Optional[str]:
    """The view op an fx node applies ('slice', 'transpose', ...; 'part' for the getitem of a split /
    chunk / unbind), or None when it is not a view."""
    torch = _torch()
    if not isinstance(n, torch.fx.Node) or n.op != "call_function":
        return None
    if n.target is operator.getitem:
        src = n.args[0]
        return "part" if _view_name(src) in _PARTS else None
    parts = str(n.target).split(".")
    return parts[1] if len(parts) == 3 and parts[0] == "aten" and parts[1] in _VIEW_OPS else None


def _view_base(n):
    """The tensor a chain of view ops (slice, select, view, transpose, a split's part, ...) starts from
    (n itself if not a view)."""
    while _view_name(n) is not None:
        n = n.args[0].args[0] if _view_name(n) == "part" else n.args[0]
    return n


def _check_no_stale_view(ctx, node, base, order, live):
    """An in-place op changes `base` (and every view of it). A view of base taken before the op and read
    after it would need the new values too (torch's views share memory): refused, never stale."""
    i = order[node]
    stack, seen = list(base.users), set()
    while stack:
        v = stack.pop()
        if v in seen or v is node:
            continue
        seen.add(v)
        if _view_base(v) is not base or order[v] > i:
            continue
        stack.extend(v.users)
        # (an overwrite of the whole view -- copy_, fill_ -- reads none of its values: not stale)
        late = [u for u in v.users if order[u] > i and u in live
                and not (str(u.target) in _OVERWRITES and u.args[0] is v)]
        if late:
            late = late[0]
            ctx.fail(f"an in-place write changes '{base.name}', and its view '{v.name}' taken before the write is "
                     f"read after it (by '{late.name}'): not supported (torch's views share memory; take the view "
                     "after the write)")


_OVERWRITES = ("aten.copy_.default", "aten.fill_.Scalar", "aten.fill_.Tensor")
_WRITABLE_VIEWS = ("slice", "select", "part", "alias", "view", "reshape", "_unsafe_view", "unsqueeze", "squeeze",
                   "flatten", "unflatten", "view_as", "transpose", "permute", "t", "numpy_T", "mT")


def _write_through_views(ctx, env, node, view, new, view_base):
    """`node` wrote `new` into `view`, a chain of views of a tensor: that tensor becomes itself with the
    view's region replaced — through a slice (or select): concat(the part before, new, the part after);
    through a reshape or transpose: new reshaped or transposed back — exactly (values and gradients)."""
    base = view_base(view)
    chain = []
    n = view
    while n is not base:
        op = _view_name(n)
        if op not in _WRITABLE_VIEWS:
            ctx.fail(f"an in-place write into a view made by {op} ('{n.name}') is not supported")
        if op == "slice" and len(n.args) > 4 and n.args[4] != 1:
            ctx.fail(f"an in-place write into a slice with a step != 1 ('{n.name}') is not supported")
        chain.append(n)
        n = n.args[0].args[0] if op == "part" else n.args[0]
    chain.reverse()
    cur = [ctx.tensor(env[base])]  # the values along the chain (all but the written view) from the base's current one
    for j, v in enumerate(chain[:-1]):
        cur.append(_apply_view(ctx, v, cur[-1], f"view{j}"))
    new = ctx.tensor(new, cur[0])
    dt = ctx.g.tensor(cur[0].id)["dtype"]
    if ctx.g.tensor(new.id)["dtype"] != dt:
        ctx.fail(f"an in-place write of a {ctx.g.tensor(new.id)['dtype']} value into a view of a {dt} tensor is not "
                 "supported")
    shape = list(_out_shape(chain[-1]))
    if list(new.shape) != shape:
        new = _broadcast(ctx, node, new, shape, "written.broadcast")
    for j in reversed(range(len(chain))):
        new = _unview(ctx, chain[j], cur[j], new, f"unview{j}")
    env[base] = new


def _slice_bounds(v, shape):
    """(dim, begin, end[, step]) of a slice.Tensor / select.int node, or of part k of a split / chunk /
    unbind (its getitem), on a tensor of `shape`."""
    op = _view_name(v)
    r = len(shape)
    if op == "part":
        src, k = v.args[0], v.args[1]
        kind = _view_name(src)
        args = list(src.args) + [None] * 3
        d = _norm((args[1] if kind == "unbind" else args[2]) or 0, r)
        n = shape[d]
        if kind == "unbind":
            return d, k, k + 1
        if kind == "split_with_sizes":
            sizes = list(args[1])
        else:
            size = args[1] if kind == "split" else -(-n // args[1])
            sizes = [min(size, n - b) for b in range(0, n, size)]
        return d, sum(sizes[:k]), sum(sizes[:k + 1])
    if op == "select":
        d = _norm(v.args[1], r)
        i = v.args[2] + shape[d] if v.args[2] < 0 else v.args[2]
        return d, i, i + 1
    args = list(v.args) + [None] * (5 - len(v.args))
    d = _norm(args[1] if args[1] is not None else 0, r)
    start, end, step = args[2], args[3], args[4] if args[4] is not None else 1
    n = shape[d]
    s = 0 if start is None else (start + n if start < 0 else start)
    e = n if end is None else (end + n if end < 0 else end)
    return d, max(0, min(s, n)), max(0, min(e, n)), step


def _selects(v) -> bool:
    """A view that drops its dim (select, a part of unbind)."""
    return _view_name(v) == "select" or (_view_name(v) == "part" and _view_name(v.args[0]) == "unbind")


def _apply_view(ctx, v, x: _T, suffix) -> _T:
    op = _view_name(v)
    if op in ("slice", "select", "part"):
        d, b, e, *step = _slice_bounds(v, x.shape)
        if step and step[0] != 1:
            ctx.fail("an in-place write into a slice with a step != 1 is not supported")
        y = _slice_t(ctx, x, d, b, e, suffix)
        return ctx.tensor(ctx.reshape(y, _out_shape(v), suffix + ".squeeze")) if _selects(v) else y
    if op in ("transpose", "permute", "t", "numpy_T", "mT"):
        perm = _perm_of(v, len(x.shape))
        return x if perm == list(range(len(perm))) else ctx._t(ctx.g.transpose(x.id, perm, ctx.name(suffix)))
    return ctx.tensor(ctx.reshape(x, _out_shape(v), suffix))  # alias, view, reshape, (un)squeeze, ...


def _unview(ctx, v, parent: _T, new: _T, suffix) -> _T:
    """`parent` with its view `v` replaced by `new`."""
    op = _view_name(v)
    if op in ("slice", "select", "part"):
        d, b, e, *_ = _slice_bounds(v, parent.shape)
        if _selects(v):
            new = ctx.tensor(ctx.reshape(new, [1 if k == d else s for k, s in enumerate(parent.shape)],
                                         suffix + ".unsqueeze"))
        parts = ([_slice_t(ctx, parent, d, 0, b, suffix + ".before")] if b > 0 else []) + [new] + \
            ([_slice_t(ctx, parent, d, e, parent.shape[d], suffix + ".after")] if e < parent.shape[d] else [])
        return parts[0] if len(parts) == 1 else ctx._t(ctx.g.concat([p.id for p in parts], d, ctx.name(suffix)))
    if op in ("transpose", "permute", "t", "numpy_T", "mT"):
        perm = _perm_of(v, len(parent.shape))
        inv = [perm.index(i) for i in range(len(perm))]
        return new if perm == inv == list(range(len(perm))) else ctx._t(ctx.g.transpose(new.id, inv, ctx.name(suffix)))
    return ctx.tensor(ctx.reshape(new, list(parent.shape), suffix))


@_reg("copy.default")
def _copy(ctx, node, x, src, non_blocking=False):
    """x.copy_(src) (an assignment x[...] = src): src, broadcast to x's shape, in x's dtype kind."""
    torch = _torch()
    out = node.meta["val"]
    if isinstance(src, _Lazy):
        src = src.materialise(ctx, out.is_floating_point())
    if isinstance(src, _C):
        src = _C(src.value.to(torch.float64 if out.is_floating_point() else out.dtype), src.name)
    elif isinstance(src, (bool, int, float)):
        return _fill(ctx, node, x, src)
    s = ctx.tensor(src)
    if _is_float_weft(ctx.g, s.id) != out.is_floating_point():
        ctx.fail("a copy between integer and floating point tensors is not supported")
    shape = [int(d) for d in out.shape]
    return s if list(s.shape) == shape else _broadcast(ctx, node, s, shape, "broadcast")


@_reg("fill.Scalar", "fill.Tensor")
def _fill(ctx, node, x, value):
    """x.fill_(v) (x[..., 0] = v): v broadcast to x's shape (no constant of x's size)."""
    torch = _torch()
    out = node.meta["val"]
    shape = [int(d) for d in out.shape]
    if _is_graph(value):
        v = ctx.tensor(value)
        if _is_float_weft(ctx.g, v.id) != out.is_floating_point():
            ctx.fail("a fill of an integer tensor with a float (or the converse) is not supported")
    else:
        val = value.value if isinstance(value, _C) else value
        v = ctx.tensor(ctx.const(torch.as_tensor(val).to(torch.float64 if out.is_floating_point() else out.dtype)
                                 .reshape(()), "value"))
    return v if list(v.shape) == shape else _broadcast(ctx, node, v, shape, "broadcast")


@_reg("slice_scatter.default", "select_scatter.default")
def _slice_scatter(ctx, node, x, src, dim=0, *args):
    """torch.slice_scatter(x, src, dim, start, end, step) / select_scatter(x, src, dim, index): x with the
    slice replaced by src (the functional form of x[..., a:b] = src)."""
    x, src = ctx.tensor(x), ctx.tensor(src)
    r = len(x.shape)
    d = _norm(dim, r)
    n = x.shape[d]
    if "select" in str(node.target):
        i = args[0] + n if args[0] < 0 else args[0]
        b, e = i, i + 1
        src = ctx.tensor(ctx.reshape(src, [1 if k == d else s for k, s in enumerate(x.shape)], "unsqueeze"))
    else:
        start, end, step = (list(args) + [None, None, 1])[:3]
        if step not in (None, 1):
            ctx.fail("slice_scatter with a step != 1 is not supported")
        b = 0 if start is None else (start + n if start < 0 else start)
        e = n if end is None else (end + n if end < 0 else end)
        b, e = max(0, min(b, n)), max(0, min(e, n))
    parts = ([_slice_t(ctx, x, d, 0, b, "before")] if b > 0 else []) + [src] + \
        ([_slice_t(ctx, x, d, e, n, "after")] if e < n else [])
    return parts[0] if len(parts) == 1 else ctx._t(ctx.g.concat([p.id for p in parts], d, ctx.name()))
