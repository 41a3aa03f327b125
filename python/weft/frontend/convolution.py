"""Convolution, pooling and upsampling for the torch importer: ``conv1d`` / ``conv2d`` (strided, padded,
dilated, grouped, depthwise), ``conv_transpose2d``, max / average / adaptive-average pooling and nearest
upsampling, each mapped exactly onto the IR's ``conv2d`` / ``pool2d`` where their attributes fit and onto
one einsum per kernel tap (or slices and concats) where they do not.

The handlers register themselves in torch.py's registry (``_reg``) when this module is imported (at the
end of torch.py)."""
from .torch import _Unusable, _broadcast, _device, _out_shape, _reg, _slice_t, _torch


def _same(ctx, vals, what):
    vals = list(vals) if isinstance(vals, (list, tuple)) else [vals]
    if len(set(vals)) != 1:
        ctx.fail(f"non-square {what} {vals} is not supported")
    return int(vals[0])


def _per_dim(ctx, vals, nd, what):
    vals = [int(v) for v in vals] if isinstance(vals, (list, tuple)) else [int(vals)]
    if len(vals) == 1:
        vals = vals * nd
    if len(vals) != nd:
        ctx.fail(f"{what} {vals} does not have {nd} entries")
    return vals


def _conv(ctx, node, x, w, b, stride, padding, dilation, groups):
    """conv1d / conv2d, exactly. The IR's conv2d takes one stride and one symmetric padding for
    both dims, no dilation, no groups; so: 2-D with square stride and padding -> conv2d; 1-D
    (groups 1, no dilation) -> explicit zero padding + conv2d on [N, C, 1, L]; anything else
    (grouped, depthwise, dilated, non-square stride) -> one einsum per kernel tap (_conv_taps)."""
    x, w = ctx.tensor(x), ctx.tensor(w)
    nd = len(w.shape) - 2
    if nd not in (1, 2):
        ctx.fail(f"{nd}-D convolution is not supported (conv1d and conv2d are)")
    if len(x.shape) != nd + 2:
        ctx.fail(f"unbatched convolution (input {list(x.shape)} without the batch dim) is not supported")
    stride = _per_dim(ctx, stride, nd, "stride")
    dilation = _per_dim(ctx, dilation, nd, "dilation")
    ks = list(w.shape[2:])
    if isinstance(padding, str):
        if padding == "valid":
            pads = [(0, 0)] * nd
        elif padding == "same":  # torch: total d·(k − 1), the odd one on the right (stride 1 only)
            pads = [(d * (k - 1) // 2, d * (k - 1) - d * (k - 1) // 2) for d, k in zip(dilation, ks)]
        else:
            ctx.fail(f"padding={padding!r} is not supported")
    else:
        pads = [(p, p) for p in _per_dim(ctx, padding, nd, "padding")]
    if groups < 1 or x.shape[1] % groups or w.shape[0] % groups or w.shape[1] * groups != x.shape[1]:
        ctx.fail(f"groups={groups} does not fit input channels {x.shape[1]} and weight {list(w.shape)}")
    out = list(_out_shape(node))
    plain = groups == 1 and all(d == 1 for d in dilation)
    named = "conv" if b is not None else ""
    if plain and nd == 2 and len(set(stride)) == 1 and len({p for pr in pads for p in pr}) == 1:
        y = ctx._t(ctx.g.conv2d(x.id, w.id, stride[0], pads[0][0], ctx.name(named)))
    elif plain and nd == 1:
        xp = _zero_pad(ctx, x, 2, pads[0][0], pads[0][1], "pad")
        x4 = ctx.tensor(ctx.reshape(xp, [x.shape[0], x.shape[1], 1, xp.shape[2]], "as2d"))
        w4 = ctx.tensor(ctx.reshape(w, [w.shape[0], w.shape[1], 1, ks[0]], "w.as2d"))
        y = ctx._t(ctx.g.conv2d(x4.id, w4.id, stride[0], 0, ctx.name("conv2d")))
        y = ctx.reshape(y, out, "conv" if b is not None else "")
    else:
        y = _conv_taps(ctx, x, w, stride, pads, dilation, groups, out)
    if b is not None:
        b = ctx.reshape(ctx.tensor(b), [w.shape[0]] + [1] * nd, "bias.reshape")
        y = ctx.binary("add", y, b)
    return y


def _zero_pad(ctx, x, axis, before, after, suffix):
    """x with zeros added along `axis`, exactly (gradient included): the zeros are 0·(an edge slice
    of x) broadcast against a small zeros constant, so they follow x's batch (no batch-sized
    constant; the IR's Pad op is the gradient of a slice, not a forward op). An inf/NaN in that
    edge slice would make the zeros NaN (0·inf)."""
    torch = _torch()
    x = ctx.tensor(x)
    if before == 0 and after == 0:
        return x
    r = len(x.shape)
    zero = ctx.unary("scale", _slice_t(ctx, x, axis, 0, 1, suffix + ".edge"), suffix + ".zero", 0.0)
    parts = []
    for n, tag in ((before, "before"), (after, "after")):
        if n > 0:
            z = ctx.const(torch.zeros([n] + [1] * (r - axis - 1), dtype=torch.float64, device=_device(ctx.node)),
                          f"{suffix}.{tag}")
            parts.append(ctx.binary("add", zero, z, f"{suffix}.{tag}"))
    parts.insert(1 if before > 0 else 0, x)
    return ctx._t(ctx.g.concat([p.id for p in parts], axis, ctx.name(suffix)))


def _conv_taps(ctx, x, w, stride, pads, dilation, groups, out):
    """A convolution as Σ over kernel taps of einsum(a shifted, strided window of x, the tap's
    weights), per group: y[n,g,o,p..] = Σ_tap Σ_c x[n,g,c,p·s + tap·d ..]·w[g,o,c,tap..]. Exact
    (grouped, depthwise, dilated, any stride and padding); the taps are slices, a stride > 1 a
    reshape [.., L, s] + slice of the first of each s."""
    nd = len(out) - 2
    N, C = x.shape[:2]
    O, cg = w.shape[:2]
    G, og = groups, w.shape[0] // groups
    ks, osz = list(w.shape[2:]), out[2:]
    xg = ctx.tensor(ctx.reshape(x, [N, G, cg] + list(x.shape[2:]), "groups"))
    wg = ctx.tensor(ctx.reshape(w, [G, og, cg] + ks, "w.groups"))
    for i in range(nd):  # pad; extra zeros on the right so that every strided window is a whole reshape
        lp = xg.shape[3 + i] + pads[i][0] + pads[i][1]
        need = dilation[i] * (ks[i] - 1) + stride[i] * osz[i]
        xg = _zero_pad(ctx, xg, 3 + i, pads[i][0], pads[i][1] + max(0, need - lp), f"pad{i}")
    sp = "hw"[:nd] if nd == 2 else "l"
    eq = f"ngc{sp},goc->ngo{sp}"
    y = None
    taps = [(i,) for i in range(ks[0])] if nd == 1 else [(i, j) for i in range(ks[0]) for j in range(ks[1])]
    for tap in taps:
        tag = "tap" + "_".join(str(t) for t in tap)
        win = xg
        for a, t in enumerate(tap):
            axis, s, start = 3 + a, stride[a], t * dilation[a]
            win = _slice_t(ctx, ctx.tensor(win), axis, start, start + s * osz[a], f"{tag}.win{a}")
            if s > 1:
                shp = list(win.shape)
                split = ctx.tensor(ctx.reshape(win, shp[:axis] + [osz[a], s] + shp[axis + 1:], f"{tag}.stride{a}"))
                first = _slice_t(ctx, split, axis + 1, 0, 1, f"{tag}.first{a}")
                win = ctx.tensor(ctx.reshape(first, shp[:axis] + [osz[a]] + shp[axis + 1:], f"{tag}.strided{a}"))
        wt = wg
        for a, t in enumerate(tap):
            wt = _slice_t(ctx, wt, 3 + a, t, t + 1, f"{tag}.w{a}")
        wt = ctx.reshape(wt, [G, og, cg], f"{tag}.w")
        yt = ctx.einsum(eq, [win, wt], tag)
        y = yt if y is None else ctx.binary("add", y, yt, f"{tag}.acc")
    return ctx.reshape(y, out, "taps")


@_reg("conv2d.default", "conv2d.padding", "conv1d.default", "conv1d.padding")
def _conv2d(ctx, node, x, w, b=None, stride=1, padding=0, dilation=1, groups=1):
    return _conv(ctx, node, x, w, b, stride, padding, dilation, groups)


@_reg("convolution.default")
def _convolution(ctx, node, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    if transposed:
        return _conv_t(ctx, node, x, w, b, stride, padding, output_padding, groups, dilation)
    return _conv(ctx, node, x, w, b, stride, padding, dilation, groups)


def _pool_args(ctx, kernel, stride, padding, ceil_mode):
    k = _same(ctx, kernel, "kernel")
    s = _same(ctx, stride, "stride") if stride not in (None, [], ()) else k
    if ceil_mode:
        ctx.fail("ceil_mode=True is not supported")
    return k, s, _same(ctx, padding, "padding")


@_reg("max_pool2d.default")
def _max_pool2d(ctx, node, x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    if _same(ctx, dilation, "dilation") != 1:
        ctx.fail("dilated pooling is not supported")
    k, s, p = _pool_args(ctx, kernel, stride, padding, ceil_mode)
    return ctx._t(ctx.g.pool2d("max", ctx.tensor(x).id, k, s, p, ctx.name()))


@_reg("max_pool2d_with_indices.default")
def _max_pool2d_idx(ctx, node, *args, **kwargs):
    return (_max_pool2d(ctx, node, *args, **kwargs), _Unusable("max pooling's indices"))


@_reg("avg_pool2d.default")
def _avg_pool2d(ctx, node, x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True,
                divisor_override=None):
    k, s, p = _pool_args(ctx, kernel, stride, padding, ceil_mode)
    if divisor_override is not None:
        ctx.fail("divisor_override is not supported")
    if p != 0 and not count_include_pad:
        ctx.fail("count_include_pad=False with padding is not supported (weft's mean pool divides by k²)")
    return ctx._t(ctx.g.pool2d("mean", ctx.tensor(x).id, k, s, p, ctx.name()))


@_reg("adaptive_avg_pool2d.default", "_adaptive_avg_pool2d.default")
def _adaptive_avg_pool2d(ctx, node, x, output_size):
    x = ctx.tensor(x)
    H, W = x.shape[-2:]
    oh, ow = (list(output_size) + list(output_size))[:2] if isinstance(output_size, (list, tuple)) else \
        (output_size, output_size)
    oh, ow = oh or H, ow or W
    if (oh, ow) == (1, 1):
        return ctx.reshape(ctx.reduce("mean", x, [len(x.shape) - 2, len(x.shape) - 1], "mean"),
                           _out_shape(node))
    if H % oh or W % ow or H // oh != W // ow:
        ctx.fail(f"adaptive pooling of {H}x{W} to {oh}x{ow} has uneven windows; not supported")
    k = H // oh
    return ctx._t(ctx.g.pool2d("mean", x.id, k, k, 0, ctx.name()))


@_reg("conv_transpose2d.input")
def _conv_transpose2d(ctx, node, x, w, b=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    return _conv_t(ctx, node, x, w, b, stride, padding, output_padding, groups, dilation)


def _conv_t(ctx, node, x, w, b, stride, padding, output_padding, groups, dilation):
    # Only the non-overlapping case (kernel == stride, no padding): an einsum and a reshape, exactly.
    x, w = ctx.tensor(x), ctx.tensor(w)
    k = _same(ctx, w.shape[2:], "kernel")
    if (_same(ctx, stride, "stride") != k or _same(ctx, padding, "padding") != 0 or
            _same(ctx, output_padding, "output_padding") != 0 or groups != 1 or _same(ctx, dilation, "dilation") != 1):
        ctx.fail("transposed convolution is supported only with kernel == stride, no padding, no "
                 "output_padding, groups=1, dilation=1 (the non-overlapping up-convolution)")
    n, c, H, W = x.shape
    y = ctx.einsum("nchw,coij->nohiwj", [x, w], "einsum")
    y = ctx.reshape(y, [n, w.shape[1], H * k, W * k], "reshape" if b is not None else "")
    if b is not None:
        y = ctx.binary("add", y, ctx.reshape(ctx.tensor(b), [w.shape[1], 1, 1], "bias.reshape"))
    return y


@_reg("upsample_nearest2d.vec", "upsample_nearest2d.default")
def _upsample_nearest2d(ctx, node, x, *args, **kwargs):
    x = ctx.tensor(x)
    n, c, H, W = x.shape
    oh, ow = _out_shape(node)[2:]
    if oh % H or ow % W:
        ctx.fail(f"nearest upsampling {H}x{W} -> {oh}x{ow} by a non-integer factor is not supported")
    sh, sw = oh // H, ow // W
    y = ctx.reshape(x, [n, c, H, 1, W, 1], "unsqueeze")
    y = _broadcast(ctx, node, y, [n, c, H, sh, W, sw], "repeat")
    return ctx.reshape(y, [n, c, oh, ow])
