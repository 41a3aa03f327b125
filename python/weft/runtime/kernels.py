"""The op kernels of the torch runtime: one function per IR op kind, on a rank's local tiles.

The semantics are those of the C++ kernels (include/weft/ir/interpreter.hpp, src/ir/kernels.cpp),
which the CPU reference executor runs; each function here computes the same thing with torch on
the tensors' own dtype (f32 accumulation inside matmuls and reductions where torch does it for
f16 / bf16). A tile needs what a whole tensor does not, and the instruction's ``context`` carries it
(exec::ProgramLayout::kernel_context): the local result shapes, the GLOBAL normalisers (Reduce
Mean's count, cross-entropy's token count), and the global index of each local row of a
vocabulary dim (a vocab-sharded embedding is a masked lookup whose other rows contribute zeros to
a partial sum).

Vocab-parallel cross-entropy runs as four steps with all-reduces of per-token statistics between
them (ce_row_max, ce_row_sum_target, ce_loss, ce_grad); the unsharded kernel is the same four steps.
"""
from __future__ import annotations

import math
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715

# Mixed precision (weft.Trainer's "bf16-mixed" / "f16-mixed": the instruction context's
# "f32_inside", set by the Trainer): the numerically sensitive kernels (softmax, layer norm,
# reductions and means, cross-entropy's steps, exp / log / rsqrt, the embedding's and
# scatter_add's sums) compute on f16 / bf16 operands in f32, as torch autocast's fp32 ops do; the
# runtime stores their result in the buffer's dtype. Without it (weft.run's dtype="bf16": a model
# held in bf16, as `module.to(torch.bfloat16)`) they run torch's own half-precision kernels. Matmuls run in the operands'
# dtype (torch accumulates them in f32). A kernel given operands of several float dtypes computes
# in their promoted dtype (run_kernel). On f32 / f64 operands every kernel is unchanged.
_HALF = (torch.float16, torch.bfloat16)


def _hi(ctx: Optional[dict], x: torch.Tensor) -> torch.Tensor:
    """x in f32 when it is f16 / bf16 and the context asks for f32 inside (mixed precision), else x."""
    return x.float() if x.dtype in _HALF and ctx and ctx.get("f32_inside") else x


def _promoted(xs: Sequence[torch.Tensor]) -> List[torch.Tensor]:
    """The float operands in their promoted dtype when they differ (integer operands unchanged)."""
    if len(xs) < 2:
        return list(xs)
    d0 = xs[0].dtype
    if all(x.dtype == d0 for x in xs):  # the common case, decided without a set
        return list(xs)
    floats = {x.dtype for x in xs if x.is_floating_point()}
    if len(floats) < 2:
        return list(xs)
    dt = None
    for d in floats:
        dt = d if dt is None else torch.promote_types(dt, d)
    return [x.to(dt) if x.is_floating_point() and x.dtype != dt else x for x in xs]


_F32_UNARY = ("exp", "log", "rsqrt", "sqrt")  # autocast's fp32 list (exp, log, rsqrt; sqrt with them)


class KernelError(ValueError):
    """An op the runtime cannot run on these values (an opaque op, an id or label out of range)."""


def _axis(a: int, rank: int) -> int:
    return a + rank if a < 0 else a


def _out_shape(ctx: dict, i: int = 0) -> List[int]:
    return list(ctx["out_shapes"][i])


# ---- unary functions and their derivatives (UnaryFn)

def _unary(fn: str, x: torch.Tensor, scalar: float) -> torch.Tensor:
    if fn == "identity":
        return x
    if fn == "neg":
        return -x
    if fn == "relu":
        return torch.relu(x)
    if fn == "gelu":  # the tanh approximation, as the C++ kernel
        return F.gelu(x, approximate="tanh")
    if fn == "gelu_erf":
        return F.gelu(x)
    if fn == "tanh":
        return torch.tanh(x)
    if fn == "exp":
        return torch.exp(x)
    if fn == "log":
        return torch.log(x)
    if fn == "sigmoid":
        return torch.sigmoid(x)
    if fn == "sqrt":
        return torch.sqrt(x)
    if fn == "rsqrt":
        return torch.rsqrt(x)
    if fn == "square":
        return x * x
    if fn == "scale":
        return x * scalar
    raise KernelError(f"unknown unary function {fn!r}")


def _unary_derivative(fn: str, x: torch.Tensor, scalar: float) -> torch.Tensor:
    if fn == "identity":
        return torch.ones_like(x)
    if fn == "neg":
        return -torch.ones_like(x)
    if fn == "relu":
        return (x > 0).to(x.dtype)
    if fn == "gelu":
        u = _GELU_C * (x + _GELU_A * x * x * x)
        th = torch.tanh(u)
        du = _GELU_C * (1 + 3 * _GELU_A * x * x)
        return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * du
    if fn == "gelu_erf":  # Φ(x) + x·φ(x)
        return 0.5 * (1 + torch.erf(x * math.sqrt(0.5))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)
    if fn == "tanh":
        t = torch.tanh(x)
        return 1 - t * t
    if fn == "exp":
        return torch.exp(x)
    if fn == "log":
        return 1 / x
    if fn == "sigmoid":
        s = torch.sigmoid(x)
        return s * (1 - s)
    if fn == "sqrt":
        return 0.5 / torch.sqrt(x)
    if fn == "rsqrt":
        return -0.5 / (x * torch.sqrt(x))
    if fn == "square":
        return 2 * x
    if fn == "scale":
        return torch.full_like(x, scalar)
    raise KernelError(f"unknown unary function {fn!r}")


# ---- integer ids checked against their range

def check_ids(op: dict, ids: torch.Tensor, n: int, ctx: dict, message: str) -> torch.Tensor:
    """``ids`` (int64) when every one is in [0, n), else a KernelError naming the op and the first bad
    id (``message`` formats it). On the CPU, at once. On a GPU the check is not read back here (a host
    sync per embedding and loss would drain the launch queue every time): the ids go on clamped into
    range (so no kernel reads out of bounds) and ``ctx["deferred_checks"]`` (the runtime's list)
    gets them, to be checked by :func:`check_deferred` when the step finishes, one sync for all."""
    if not ids.numel():
        return ids
    deferred = ctx.get("deferred_checks") if ids.device.type != "cpu" else None
    if deferred is None:
        if int(ids.min()) < 0 or int(ids.max()) >= n:
            _raise_bad_id(op["name"], ids, n, message)
        return ids
    deferred.append((op["name"], ids, n, message))
    return ids.clamp(0, n - 1)


def _raise_bad_id(name: str, ids: torch.Tensor, n: int, message: str):
    bad = ids[(ids < 0) | (ids >= n)][0].item()
    raise KernelError(f"op '{name}': " + message.format(bad))


def check_deferred(checks: list) -> None:
    """The range checks :func:`check_ids` deferred on a GPU during a step, read back at once (one
    host sync); empties the list. Raises the first failure's KernelError."""
    if not checks:
        return
    pending = list(checks)
    checks.clear()
    flags = torch.stack([((ids < 0) | (ids >= n)).any() for _, ids, n, _ in pending]).cpu()
    for (name, ids, n, message), bad in zip(pending, flags.tolist()):
        if bad:
            _raise_bad_id(name, ids, n, message)


# ---- vocabulary rows of a sharded dim

def _vocab_rows(op: dict, ids: torch.Tensor, ctx: dict, n_local: int, what: str):
    """(local row of each id or -1, mask of the ids held here); ids checked against the global vocabulary."""
    index = ctx.get("vocab_index")
    n_global = int(ctx.get("vocab_size") or 0) or n_local
    ids = check_ids(op, ids.to(torch.int64), n_global, ctx, f"{what} {{}} is not an integer in [0, {n_global})")
    if index is None:
        return ids, None
    lookup = ctx.get("_vocab_lookup")  # cached per instruction by the runtime
    if lookup is None or lookup.device != ids.device:
        lookup = torch.full((n_global,), -1, dtype=torch.int64, device=ids.device)
        lookup[torch.as_tensor(index, dtype=torch.int64, device=ids.device)] = torch.arange(
            len(index), dtype=torch.int64, device=ids.device)
        ctx["_vocab_lookup"] = lookup
    rows = lookup[ids]
    return rows, rows >= 0


# ---- cross-entropy in steps (ir/kernels.hpp)

def ce_row_max(logits: torch.Tensor) -> torch.Tensor:
    if logits.shape[-1] == 0:
        return torch.full(logits.shape[:-1], -math.inf, dtype=logits.dtype, device=logits.device)
    return torch.amax(logits, dim=-1)


def _ce_attrs(op: dict) -> tuple:
    """(ignore_index, label smoothing ε, token_mean, weighted) of a cross-entropy op (ir::CrossEntropyAttrs),
    cached in the op's dict."""
    a = op.get("_ce")
    if a is None:
        ints = op["attrs"].get("ints") or [-100, 0]
        weighted = len(op["inputs"]) == (4 if op["kind"] == "cross_entropy_grad" else 3)
        a = op["_ce"] = (int(ints[0]), float(op["attrs"].get("scalar", 0.0)), bool(ints[1]), weighted)
    return a


def ce_stat_width(op: dict) -> int:
    """Statistics per token (ir::ce_stat_width): 2 for a plain op, 5 with class weights or label smoothing."""
    _, eps, _, weighted = _ce_attrs(op)
    return 5 if weighted or eps else 2


def _ce_labels(op: dict, labels: torch.Tensor, ctx: dict, n_local: int):
    """(counted: label != ignore_index, local row of each counted label, mask of the counted labels held here)."""
    labels = labels.to(torch.int64)
    counted = labels != _ce_attrs(op)[0]
    rows, held = _vocab_rows(op, torch.where(counted, labels, torch.zeros_like(labels)), ctx, n_local, "label")
    return counted, rows, counted if held is None else held & counted


def _ce_denominator(op: dict, ctx: dict, local_tokens: int, local_weighted: Callable[[], torch.Tensor]):
    """D (ir::CrossEntropyAttrs): the tokens with token_mean, else tokens · the step's valid fraction
    (ctx["ce_valid_fraction"], exec::CeValidFractions), or on whole tensors their own weighted count."""
    tokens = ctx.get("tokens") or float(local_tokens)
    if _ce_attrs(op)[2]:
        return tokens
    rho = ctx.get("ce_valid_fraction")
    if rho is not None and rho >= 0:
        return tokens * rho
    if ctx.get("tokens") and float(ctx["tokens"]) != float(local_tokens):
        raise KernelError(f"cross entropy '{op['name']}': a tile of {local_tokens} of the op's {ctx['tokens']} "
                          "tokens needs the step's valid fraction (ce_valid_fraction) to divide by the weighted "
                          "count of valid labels")
    return local_weighted()


def ce_row_sum_target(op: dict, logits: torch.Tensor, labels: torch.Tensor, row_max: torch.Tensor,
                      ctx: dict, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    logits, row_max = _hi(ctx, logits), _hi(ctx, row_max)
    s = torch.exp(logits - row_max.unsqueeze(-1)).sum(dim=-1)
    _, rows, hit = _ce_labels(op, labels, ctx, logits.shape[-1])
    z = torch.gather(logits, -1, rows.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    z = torch.where(hit, z, torch.zeros_like(z))
    if ce_stat_width(op) == 2:
        return torch.stack([s, z], dim=-1)
    # [S, w_y·z, w_y, Σ_c w_c·x_c, Σ_c w_c] over the local classes (w ≡ 1 without weights)
    if weight is None:
        wy = hit.to(logits.dtype)
        wx = logits.sum(dim=-1)
        wsum = torch.full_like(s, float(logits.shape[-1]))
    else:
        w = weight.to(logits.dtype)
        wy = torch.where(hit, w[rows.clamp(min=0)], torch.zeros_like(s))
        wx = (logits * w).sum(dim=-1)
        wsum = w.sum().expand_as(s)
    return torch.stack([s, wy * z, wy, wx, wsum], dim=-1)


def ce_loss(op: dict, labels: torch.Tensor, row_max: torch.Tensor, stats: torch.Tensor, ctx: dict,
            contribute: bool) -> torch.Tensor:
    if not contribute:
        return torch.zeros((), dtype=_hi(ctx, row_max).dtype, device=row_max.device)
    row_max, stats = _hi(ctx, row_max), _hi(ctx, stats)
    counted = labels.to(torch.int64) != _ce_attrs(op)[0]
    lse = row_max + torch.log(stats[..., 0])
    eps = _ce_attrs(op)[1]
    if stats.shape[-1] == 2:
        per = lse - stats[..., 1]
    else:
        per = (1 - eps) * (stats[..., 2] * lse - stats[..., 1])
        if eps:
            per = per + eps / float(ctx.get("vocab_size") or 0) * (stats[..., 4] * lse - stats[..., 3])
    per = torch.where(counted, per, torch.zeros_like(per))
    d = _ce_denominator(op, ctx, row_max.numel(),
                        lambda: counted.sum() if stats.shape[-1] == 2 else stats[..., 2].sum())
    return per.sum() / d


def ce_grad(op: dict, logits: torch.Tensor, labels: torch.Tensor, dloss: torch.Tensor, row_max: torch.Tensor,
            stats: torch.Tensor, ctx: dict, weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    logits, row_max, stats = _hi(ctx, logits), _hi(ctx, row_max), _hi(ctx, stats)
    counted, rows, hit = _ce_labels(op, labels, ctx, logits.shape[-1])
    d = _ce_denominator(op, ctx, row_max.numel(),
                        lambda: counted.sum() if stats.shape[-1] == 2 else stats[..., 2].sum())
    scale = dloss.reshape(()).to(logits.dtype) / d
    p = torch.sub(logits, row_max.unsqueeze(-1)).exp_().div_(stats[..., 0].unsqueeze(-1))
    if stats.shape[-1] == 2:
        p.scatter_add_(-1, rows.clamp(min=0).unsqueeze(-1), -hit.to(p.dtype).unsqueeze(-1))  # − [class = label]
    else:  # (1 − ε)·w_y·(p − [class = label]) + ε/C·(W·p − w_c)
        eps = _ce_attrs(op)[1]
        a = (1 - eps) * stats[..., 2]
        g = p * a.unsqueeze(-1)
        g.scatter_add_(-1, rows.clamp(min=0).unsqueeze(-1), -(a * hit.to(p.dtype)).unsqueeze(-1))
        if eps:
            n_classes = float(ctx.get("vocab_size") or logits.shape[-1])
            w = 1.0 if weight is None else weight.to(p.dtype)
            g.add_(eps / n_classes * (stats[..., 4].unsqueeze(-1) * p - w))
        p = g
    # ignored labels get no gradient (torch's zeros, also where D = 0)
    factor = torch.where(counted, scale.expand(counted.shape), torch.zeros((), dtype=p.dtype, device=p.device))
    return p.mul_(factor.unsqueeze(-1))


# ---- one function per op kind: (op, inputs, ctx) -> list of outputs

def _einsum(op, x, ctx):
    return [torch.einsum(op["attrs"]["equation"], *x)]


def _unary_op(op, x, ctx):
    a = op["attrs"]
    fn = a.get("unary", "identity")
    return [_unary(fn, _hi(ctx, x[0]) if fn in _F32_UNARY else x[0], a.get("scalar", 0.0))]


_BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum}


def _binary(op, x, ctx):
    fn = op["attrs"].get("binary", "add")
    return [_BINARY[fn](x[0], x[1])]


def _reduce(op, x, ctx):
    a = op["attrs"]
    fn = a.get("reduce", "sum")
    dims = sorted({_axis(d, x[0].dim()) for d in a.get("axes", [])})
    if fn == "max":
        y = torch.amax(x[0], dim=dims) if dims else x[0]
    else:
        xv = _hi(ctx, x[0])  # sums and means of f16 / bf16 in f32
        y = torch.sum(xv, dim=dims) if dims else xv
        if fn == "mean":
            count = ctx.get("mean_count") or math.prod(x[0].shape[d] for d in dims)
            y = y / count
    return [y.reshape(_out_shape(ctx))]


def _softmax(op, x, ctx):
    return [torch.softmax(_hi(ctx, x[0]), dim=_axis(op["attrs"]["axes"][0], x[0].dim()))]


def _softmax_grad(op, x, ctx):
    y, dy = _hi(ctx, x[0]), _hi(ctx, x[1])
    ax = _axis(op["attrs"]["axes"][0], y.dim())
    return [torch._softmax_backward_data(dy, y, ax, y.dtype)]  # y·(dy − Σ dy·y)


def _layer_norm(op, x, ctx):
    eps = op["attrs"].get("scalar", 0.0)
    return [F.layer_norm(_hi(ctx, x[0]), [x[0].shape[-1]], _hi(ctx, x[1]), _hi(ctx, x[2]), eps)]


def _ln_backward(xv, gamma, dy, eps, mask):
    """torch's fused layer-norm backward (the statistics recomputed from x, as weft's graph does)."""
    h = [xv.shape[-1]]
    ones = torch.ones(h, dtype=xv.dtype, device=xv.device)
    _, mean, rstd = torch.ops.aten.native_layer_norm(xv, h, ones, None, eps)
    return torch.ops.aten.native_layer_norm_backward(dy, xv, h, mean, rstd, gamma if gamma is not None else ones,
                                                     torch.zeros_like(ones), mask)


def _layer_norm_grad(op, x, ctx):
    # dx = rstd·(g − mean(g) − x̂·mean(g·x̂)), g = dy·γ
    xv, gamma, dy = (_hi(ctx, v) for v in x)
    return [_ln_backward(xv, gamma, dy, op["attrs"].get("scalar", 0.0), [True, False, False])[0]]


def _layer_norm_param_grad(op, x, ctx):
    # dγ = Σ dy·x̂, dβ = Σ dy over the leading dims
    xv, dy = _hi(ctx, x[0]), _hi(ctx, x[1])
    _, dg, db = _ln_backward(xv, None, dy, op["attrs"].get("scalar", 0.0), [False, True, True])
    return [dg, db]


def _embedding(op, x, ctx):
    table, ids = x
    rows, held = _vocab_rows(op, ids, ctx, table.shape[0], "id")
    y = F.embedding(rows.clamp(min=0), table)
    if held is not None:
        y = y * held.unsqueeze(-1).to(y.dtype)
    return [y]


def _embedding_grad(op, x, ctx):
    ids, dy = x
    shape = _out_shape(ctx)
    rows, held = _vocab_rows(op, ids, ctx, shape[0], "id")
    h = shape[1]
    rows, dyf = rows.reshape(-1), _hi(ctx, dy).reshape(-1, h)
    ints = op["attrs"].get("ints") or []
    keep = held.reshape(-1) if held is not None else None
    if len(ints) > 2:  # padding_idx: its row gets no gradient from the lookup
        not_pad = ids.reshape(-1) != int(ints[2])
        keep = not_pad if keep is None else keep & not_pad
    if keep is not None:
        rows, dyf = rows[keep], dyf[keep]
    out = torch.zeros(shape, dtype=dyf.dtype, device=dy.device)
    out.index_add_(0, rows, dyf)
    return [out]


def _whole_vocabulary(ctx: dict, n_local: int) -> bool:
    """Whether this tile holds every class in order (no vocab_index, or the identity one), cached in
    the instruction's context."""
    whole = ctx.get("_vocab_whole")
    if whole is None:
        index = ctx.get("vocab_index")
        whole = index is None or (len(index) == n_local == int(ctx.get("vocab_size") or n_local)
                                  and all(int(i) == k for k, i in enumerate(index)))
        ctx["_vocab_whole"] = whole
    return whole


def _cross_entropy(op, x, ctx):
    lg, lab = x[0], x[1]
    grad = op["kind"] == "cross_entropy_grad"
    _, _, _, weighted = _ce_attrs(op)
    weight = x[3 if grad else 2] if weighted else None
    if "vocab_size" not in ctx or not ctx.get("vocab_size"):
        ctx["vocab_size"] = lg.shape[-1]  # C of label smoothing, on whole tensors
    if ce_stat_width(op) == 2 and _whole_vocabulary(ctx, lg.shape[-1]) and lg.shape[-1]:
        # The whole vocabulary here: torch's fused kernels, one pass each way (logsumexp; softmax),
        # where the steps below take three over the logits (the backward recomputed the forward's
        # max and sum). The same formulas: log Σ exp(x - max) + max, and exp(x - max) / Σ; under
        # mixed precision on the logits in f32, as autocast's cross entropy.
        lg = _hi(ctx, lg)
        counted, rows, _ = _ce_labels(op, lab, ctx, lg.shape[-1])
        d = _ce_denominator(op, ctx, lab.numel(), counted.sum)
        if not grad:
            z = torch.gather(lg, -1, rows.unsqueeze(-1)).squeeze(-1)
            per = torch.logsumexp(lg, dim=-1) - z
            return [torch.where(counted, per, torch.zeros_like(per)).sum() / d]
        p = torch.softmax(lg, dim=-1)
        p.scatter_add_(-1, rows.unsqueeze(-1), -counted.to(p.dtype).unsqueeze(-1))
        scale = x[2].reshape(()).to(p.dtype) / d
        factor = torch.where(counted, scale.expand(counted.shape), torch.zeros((), dtype=p.dtype, device=p.device))
        return [p.mul_(factor.unsqueeze(-1))]
    m = ce_row_max(lg)
    st = ce_row_sum_target(op, lg, lab, m, ctx, weight)
    if not grad:
        return [ce_loss(op, lab, m, st, ctx, True)]
    return [ce_grad(op, lg, lab, x[2], m, st, ctx, weight)]


def _transpose(op, x, ctx):
    return [x[0].permute(*op["attrs"]["axes"]).contiguous()]


def _reshape(op, x, ctx):
    return [x[0].reshape(_out_shape(ctx))]


def _concat(op, x, ctx):
    return [torch.cat(list(x), dim=_axis(op["attrs"]["axes"][0], x[0].dim()))]


def _slice(op, x, ctx):
    shape = _out_shape(ctx)
    ax = _axis(op["attrs"]["axes"][0], len(shape))
    return [x[0].narrow(ax, int(op["attrs"]["ints"][0]), shape[ax]).contiguous()]


def _pad(op, x, ctx):
    shape = _out_shape(ctx)
    ax = _axis(op["attrs"]["axes"][0], len(shape))
    y = torch.zeros(shape, dtype=x[0].dtype, device=x[0].device)
    y.narrow(ax, int(op["attrs"]["ints"][0]), x[0].shape[ax]).copy_(x[0])
    return [y]


def _conv2d(op, x, ctx):
    s, pad = (int(v) for v in op["attrs"]["ints"][:2])
    return [F.conv2d(x[0], x[1], stride=s, padding=pad)]


def _conv2d_grad_input(op, x, ctx):
    dy, w = x
    s, pad, H, W = (int(v) for v in op["attrs"]["ints"][:4])
    return [torch.nn.grad.conv2d_input((dy.shape[0], w.shape[1], H, W), w, dy, stride=s, padding=pad)]


def _conv2d_grad_weight(op, x, ctx):
    xv, dy = x
    s, pad, r, t = (int(v) for v in op["attrs"]["ints"][:4])
    return [torch.nn.grad.conv2d_weight(xv, (dy.shape[1], xv.shape[1], r, t), dy, stride=s, padding=pad)]


def _pool(x, a):
    k, s, pad = (int(v) for v in a["ints"][:3])
    if a.get("reduce", "sum") == "max":
        return F.max_pool2d(x, k, s, pad)
    return F.avg_pool2d(x, k, s, pad, count_include_pad=True)


def _pool2d(op, x, ctx):
    return [_pool(x[0], op["attrs"])]


def _pool2d_grad(op, x, ctx):
    # The adjoint of the pool: autograd of torch's own pool (max: dy to the window's argmax).
    with torch.enable_grad():
        xr = x[0].detach().requires_grad_(True)
        (g,) = torch.autograd.grad(_pool(xr, op["attrs"]), xr, x[2])
    return [g]


def _unary_grad(op, x, ctx):
    a = op["attrs"]
    fn = a.get("unary", "identity")
    if fn in ("gelu", "gelu_erf"):  # torch's fused backward of the same form
        return [torch.ops.aten.gelu_backward(x[1], x[0], approximate="tanh" if fn == "gelu" else "none")]
    if fn == "scale":
        return [x[1] * a.get("scalar", 0.0)]
    if fn in _F32_UNARY:
        return [_hi(ctx, x[1]) * _unary_derivative(fn, _hi(ctx, x[0]), a.get("scalar", 0.0))]
    return [x[1] * _unary_derivative(fn, x[0], a.get("scalar", 0.0))]


def _broadcast_to(op, x, ctx):
    shape = _out_shape(ctx)
    y = x[0]
    for ax in sorted(_axis(a, len(shape)) for a in op["attrs"].get("axes", [])):
        y = y.unsqueeze(ax)
    return [y.expand(*shape).contiguous()]


def _update_out(x, plain: int, w, states):
    """An update's results: the new parameter (the master's value when there is a master copy,
    cast to the parameter's dtype when stored), the new master copy, the new states."""
    return ([w, w.clone()] if len(x) == plain + 1 else [w]) + states


def _sgd(op, x, ctx):
    a = op["attrs"]["scalars"]
    plain = 1 + len(a)  # operands without a master copy: (p, g[, buf])
    w = x[2] if len(x) == plain + 1 else x[0]  # the weights the rule updates
    g = x[1].to(w.dtype)
    states = []
    if len(a) == 2:  # momentum: buf' = μ·buf + g
        g = torch.mul(x[-1], a[1]).add_(g)
        states = [g]
    return _update_out(x, plain, w - a[0] * g, states)


def _adam(op, x, ctx):
    lr, b1, b2, eps = op["attrs"]["scalars"][:4]
    step = ctx.get("step") or op["attrs"]["scalars"][4]
    w = x[2] if len(x) == 5 else x[0]  # the f32 master copy, when the update has one
    g, m, v = x[1].to(w.dtype), x[-2], x[-1]
    c1, c2 = 1 - b1 ** step, 1 - b2 ** step
    m = torch.mul(m, b1).add_(g, alpha=1 - b1)  # new tensors: the inputs may be shared buffers
    v = torch.mul(v, b2).addcmul_(g, g, value=1 - b2)
    denom = torch.div(v, c2).sqrt_().add_(eps)
    return _update_out(x, 4, torch.addcdiv(w, m, denom, value=-lr / c1), [m, v])


_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """ir::kernels' mix32 on int64 tensors holding uint32 values (products stay below 2^59)."""
    x = ((x >> 16) ^ x) * 0x45D9F3B & _M32
    x = ((x >> 16) ^ x) * 0x45D9F3B & _M32
    return (x >> 16) ^ x


def dropout_hash(seed: int, step: int, index: torch.Tensor) -> torch.Tensor:
    """ir::dropout_hash for every element of an int64 tensor of global flat indices."""
    dev = index.device
    key = _mix32(torch.tensor(seed & _M32, dtype=torch.int64, device=dev)
                 ^ _mix32(torch.tensor(step & _M32, dtype=torch.int64, device=dev)))
    lo, hi = index & _M32, (index >> 32) & _M32
    return _mix32(lo ^ _mix32(hi ^ key))


def _dropout(op, x, ctx):
    a = op["attrs"]
    p, seed = float(a.get("scalar", 0.0)), int(a["ints"][0])
    step = int(ctx.get("step") or 1)
    v = x[0]
    shape = list(v.shape)
    index = ctx.get("element_index")
    gshape = list(ctx.get("element_shape") or shape)
    stride, flat = 1, torch.zeros(shape, dtype=torch.int64, device=v.device)
    for d in reversed(range(len(shape))):
        idx = (torch.as_tensor(index[d], dtype=torch.int64) if index is not None
               else torch.arange(shape[d], dtype=torch.int64)).to(v.device)
        view = [1] * len(shape)
        view[d] = shape[d]
        flat += idx.view(view) * stride
        stride *= gshape[d]
    keep = dropout_hash(seed, step, flat) >= math.floor(p * 4294967296.0)
    return [torch.where(keep, v * (1.0 / (1.0 - p)), torch.zeros((), dtype=v.dtype, device=v.device))]


# ---- routing (gather, scatter_add, topk): the routed axis is need-replication, so a local tile
# holds it whole and torch's op on the tile is the global op on it; indices arrive as int64.

def _routed_axis(op, rank: int) -> int:
    return _axis(int(op["attrs"]["axes"][0]), rank)


def _index(op, index: torch.Tensor, n: int, ctx: dict) -> torch.Tensor:
    """The index tile as int64, checked against the axis size (as the C++ kernel does)."""
    return check_ids(op, index.to(torch.int64), n, ctx,
                     f"index {{}} is not an integer in [0, {n}) (the size of the {op['kind']} axis)")


def _gather(op, x, ctx):
    xv, index = x
    ax = _routed_axis(op, xv.dim())
    return [torch.gather(xv, ax, _index(op, index, xv.shape[ax], ctx))]


def _scatter_add(op, x, ctx):
    if len(x) == 2:  # a zero base of the result's shape (gather's adjoint)
        index, src = x[0], _hi(ctx, x[1])
        base = torch.zeros(_out_shape(ctx), dtype=src.dtype, device=src.device)
    else:
        base, index, src = _hi(ctx, x[0]), x[1], _hi(ctx, x[2])
    ax = _routed_axis(op, src.dim())
    return [torch.scatter_add(base, ax, _index(op, index, base.shape[ax], ctx), src)]


def _topk(op, x, ctx):
    # A stable sort, not torch.topk: among equal values the lower index first, as the C++ kernel
    # (torch.topk leaves the order of ties unspecified; torch.argmax takes the first maximum).
    xv = x[0]
    k, largest = (int(v) for v in op["attrs"]["ints"][:2])
    ax = _routed_axis(op, xv.dim())
    values, indices = torch.sort(xv, dim=ax, descending=bool(largest), stable=True)
    return [values.narrow(ax, 0, k).contiguous(), indices.narrow(ax, 0, k).contiguous()]


# ---- fused attention (attention, attention_grad): a tile holds the keys, values and head dims
# whole (need-replication) and any share of the leading (batch, head) dims and of the queries (the
# backward's query split leaves dk, dv partial sums: context parallelism). A causal tile of split
# queries in blocks or dealt cyclically runs in pieces (_causal_pieces: the forward on CPU and CUDA,
# the backward on CPU). torch's fused kernels where they run the tile, else the math form (the probabilities
# recomputed from q, k and the log-sum-exp, the s x t matrix alive only inside the kernel). On CPU:
# the flash kernels (_scaled_dot_product_flash_attention_for_cpu and its backward; any float dtype,
# equal head dims). On CUDA: the forward by the flash kernel (f16 / bf16) or the memory-efficient one
# (f32), which return the log-sum-exp; the backward by autograd through F.scaled_dot_product_attention
# (its forward runs again: torch's flash backward wants the forward's RNG state and sequence
# offsets, which the IR does not carry). The CUDA paths have not been run (no GPU was lent).

def _attn_attrs(op, q: torch.Tensor, t: int, ctx: dict):
    """(scale, causal, keep): keep is the [s, t] causal mask where the tile's queries are not the
    positions 0..s-1 (a split query sequence: element_index gives their global positions), else None
    (torch's is_causal is then the same mask); worked out once per instruction."""
    a = op["attrs"]
    scale, causal = float(a.get("scalar", 0.0)), bool(int(a["ints"][0]))
    keep = ctx.get("_attn_keep")
    if keep is None:
        keep = False
        index = ctx.get("element_index") if causal else None
        if index is not None:
            pos = torch.as_tensor(index[len(index) - 2], dtype=torch.int64)
            if pos.numel() and not torch.equal(pos, torch.arange(pos.numel(), dtype=torch.int64)):
                keep = torch.arange(t, dtype=torch.int64).unsqueeze(0) <= pos.unsqueeze(1)
        ctx["_attn_keep"] = keep
    if keep is not False and keep.device != q.device:
        keep = ctx["_attn_keep"] = keep.to(q.device)
    return scale, causal, None if keep is False else keep


def _attn_mask(causal: bool, keep, s: int, t: int, device) -> Optional[torch.Tensor]:
    if keep is not None:
        return keep
    return torch.ones(s, t, dtype=torch.bool, device=device).tril() if causal else None


def _fused_dims_ok(q: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether torch's fused kernels take these operands: equal head dims, a non-empty tile; on CPU
    any float dtype, on CUDA head dims a multiple of 8 up to 256."""
    if q.shape[-1] != v.shape[-1] or q.numel() == 0 or v.numel() == 0:
        return False
    return q.device.type == "cpu" or (q.device.type == "cuda" and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256)


def _flash_ok(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep, causal: bool) -> bool:
    """Whether torch's fused kernels run this tile whole: _fused_dims_ok, no query offset, and on CUDA,
    causal, as many queries as keys (FlashAttention's own causal mask is aligned bottom-right when they
    differ)."""
    if keep is not None or not _fused_dims_ok(q, v):
        return False
    return q.device.type == "cpu" or not (causal and q.shape[-2] != k.shape[-2])


def _as4(x: torch.Tensor) -> torch.Tensor:
    """[..., n, d] as [1, Π leading, n, d] (the flash kernels' [batch, heads, seq, dim])."""
    return x.reshape(1, -1, x.shape[-2], x.shape[-1])


# ---- a causal tile of split queries (context parallelism) in pieces the fused kernels run: each piece
# is (query rows, key rows, causal) with as many queries as keys when causal (top-left aligned, as the
# kernels mask), and the tile's (out, lse) is the log-sum-exp combine of the pieces' — so no s x t
# matrix is made, as the planner prices the fused op.

def _causal_pieces(ctx: dict, s: int, t: int):
    """The pieces of a causal tile whose s queries sit at the global positions the instruction's
    element_index gives, among t keys, or None where the positions have no such form (the math form then
    runs). A block of queries o..o+s-1: keys 0..o-1 all visible, keys o..o+s-1 causal. Queries r, r+n, ...
    (the cyclic split over n tiles, t = n·s): the keys of residue m mod n in order — causal for m <= r; for
    m > r query k sees that residue's keys before its k-th: queries 1.. against keys ..-1, causal. Worked
    out once per instruction."""
    if "_attn_pieces" in ctx:
        return ctx["_attn_pieces"]
    pieces = None
    index = ctx.get("element_index")
    if index is not None and s >= 1:
        pos = [int(x) for x in index[len(index) - 2]]
        o = pos[0]
        if pos == list(range(o, o + s)) and o + s <= t:
            pieces = ([(slice(0, s), slice(0, o), False)] if o > 0 else []) + [(slice(0, s), slice(o, o + s), True)]
        elif s >= 2:
            n, r = pos[1] - pos[0], pos[0]
            if 0 <= r < n and t == n * s and pos == [r + n * i for i in range(s)]:
                pieces = [(slice(0, s), slice(m, t, n), True) if m <= r else (slice(1, s), slice(m, t - n, n), True)
                          for m in range(n)]
    ctx["_attn_pieces"] = pieces
    return pieces


def _fused_forward(q4: torch.Tensor, k4: torch.Tensor, v4: torch.Tensor, causal: bool, scale: float):
    """(out, lse) of torch's fused kernels on [1, n, s, d] operands (lse [1, n, s])."""
    if q4.device.type == "cpu":
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q4, k4, v4, 0.0, causal, scale=scale)
    if q4.dtype in _HALF:
        return torch.ops.aten._scaled_dot_product_flash_attention(q4, k4, v4, 0.0, causal, False, scale=scale)[:2]
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(q4, k4, v4, None, True, 0.0, causal,
                                                                      scale=scale)[:2]
    return out, lse[..., :q4.shape[-2]]  # its log-sum-exp may be padded along the queries


def _pieces_forward(q, k, v, pieces, scale: float):
    """The tile's (out, lse) from its pieces' by the log-sum-exp combine (a row a piece leaves out adds
    nothing: its lse there is -inf)."""
    q4, k4, v4 = _as4(q), _as4(k), _as4(v)
    s = q4.shape[-2]
    lse = None
    out = torch.zeros(q4.shape[:-1] + (v4.shape[-1],), dtype=q4.dtype, device=q4.device)
    for rows, keys, causal in pieces:
        o_p, l_p = _fused_forward(q4[..., rows, :].contiguous(), k4[..., keys, :].contiguous(),
                                  v4[..., keys, :].contiguous(), causal, scale)
        l_full = torch.full(q4.shape[:-1], -math.inf, dtype=l_p.dtype, device=q4.device)
        l_full[..., rows] = l_p
        o_full = torch.zeros_like(out)
        o_full[..., rows, :] = o_p.to(out.dtype)
        if lse is None:
            lse, out = l_full, o_full
            continue
        new = torch.logaddexp(lse, l_full)
        seen = torch.isfinite(new)
        w_old = torch.where(seen, torch.exp(lse - new), torch.zeros_like(new)).unsqueeze(-1)
        w_new = torch.where(seen, torch.exp(l_full - new), torch.zeros_like(new)).unsqueeze(-1)
        out = out * w_old.to(out.dtype) + o_full * w_new.to(out.dtype)
        lse = new
    lead = list(q.shape[:-2])
    return [out.reshape(lead + [s, v.shape[-1]]), lse.reshape(lead + [s]).contiguous()]


def _pieces_backward(q, k, v, out, lse, dout, pieces, scale: float):
    """(dq, dk, dv) of a causal tile from its pieces: the CPU flash backward of each piece given the
    tile's own out and lse (its probabilities exp(scale·q·kᵀ − lse) and rowsum(dout ∘ out) are the
    whole softmax's), dq summed over the pieces, dk and dv written at each piece's keys."""
    q4, k4, v4 = _as4(q), _as4(k), _as4(v)
    o4, do4 = _as4(out.to(q.dtype)), _as4(dout.to(q.dtype))
    l4 = lse.reshape(q4.shape[:-1]).to(torch.float32 if q.dtype in _HALF else q.dtype)
    dq, dk, dv = torch.zeros_like(q4), torch.zeros_like(k4), torch.zeros_like(v4)
    for rows, keys, causal in pieces:
        g = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            do4[..., rows, :].contiguous(), q4[..., rows, :].contiguous(), k4[..., keys, :].contiguous(),
            v4[..., keys, :].contiguous(), o4[..., rows, :].contiguous(), l4[..., rows].contiguous(), 0.0, causal,
            scale=scale)
        dq[..., rows, :] += g[0]
        dk[..., keys, :] += g[1]
        dv[..., keys, :] += g[2]
    return [dq.reshape(q.shape), dk.reshape(k.shape), dv.reshape(v.shape)]


def _split_causal_pieces(op, q, v, t: int, ctx: dict):
    """The pieces of a causal tile with its queries' global positions given (a split query sequence), or
    None (then no positions, not causal, or the math form); decided before any s x t mask is made."""
    if not int(op["attrs"]["ints"][0]) or ctx.get("element_index") is None or not _fused_dims_ok(q, v):
        return None
    return _causal_pieces(ctx, q.shape[-2], t)


def _attention(op, x, ctx):
    q, k, v = x
    pieces = _split_causal_pieces(op, q, v, k.shape[-2], ctx)
    if pieces is not None:
        return _pieces_forward(q, k, v, pieces, float(op["attrs"].get("scalar", 0.0)))
    scale, causal, keep = _attn_attrs(op, q, k.shape[-2], ctx)
    lead, s = list(q.shape[:-2]), q.shape[-2]
    if _flash_ok(q, k, v, keep, causal):
        out, lse = _fused_forward(_as4(q), _as4(k), _as4(v), causal, scale)
        return [out.reshape(lead + [s, v.shape[-1]]), lse.reshape(lead + [s]).contiguous()]
    qh, kh, vh = _hi(ctx, q), _hi(ctx, k), _hi(ctx, v)
    scores = torch.matmul(qh, kh.transpose(-1, -2)).mul_(scale)
    mask = _attn_mask(causal, keep, s, k.shape[-2], q.device)
    if mask is not None:
        scores.masked_fill_(~mask, -math.inf)
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(scores.sub_(lse.unsqueeze(-1)).exp_(), vh)
    return [out, lse]


def _attention_grad(op, x, ctx):
    q, k, v, out, lse, dout = x
    if q.dtype != k.dtype or q.dtype != v.dtype:  # (the runtime does not promote this kernel's operands)
        q, k, v, out, dout = _promoted([q, k, v, out, dout])
    pieces = _split_causal_pieces(op, q, v, k.shape[-2], ctx) if q.device.type == "cpu" else None
    if pieces is not None:
        return _pieces_backward(q, k, v, out, lse, dout, pieces, float(op["attrs"].get("scalar", 0.0)))
    scale, causal, keep = _attn_attrs(op, q, k.shape[-2], ctx)
    s, t = q.shape[-2], k.shape[-2]
    if _flash_ok(q, k, v, keep, causal):
        q4, k4, v4, o4, do4 = _as4(q), _as4(k), _as4(v), _as4(out.to(q.dtype)), _as4(dout.to(q.dtype))
        # the log-sum-exp as the CPU kernels keep it: f32 for f16 / bf16 operands, else q's dtype
        l4 = lse.reshape(1, -1, s).to(torch.float32 if q.dtype in _HALF else q.dtype)
        if q.device.type == "cpu":
            g = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                do4, q4, k4, v4, o4, l4, 0.0, causal, scale=scale)
        else:
            with torch.enable_grad():
                qkv = [y.detach().requires_grad_(True) for y in (q4, k4, v4)]
                o = F.scaled_dot_product_attention(*qkv, is_causal=causal, scale=scale)
                g = torch.autograd.grad(o, qkv, do4)
        return [g[0].reshape(q.shape), g[1].reshape(k.shape), g[2].reshape(v.shape)]
    qh, kh, vh, oh, doh = (_hi(ctx, y) for y in (q, k, v, out, dout))
    p = torch.matmul(qh, kh.transpose(-1, -2)).mul_(scale).sub_(lse.to(qh.dtype).unsqueeze(-1)).exp_()
    mask = _attn_mask(causal, keep, s, t, q.device)
    if mask is not None:
        p.masked_fill_(~mask, 0.0)
    dv = torch.matmul(p.transpose(-1, -2), doh)
    ds = torch.matmul(doh, vh.transpose(-1, -2)).sub_((doh * oh).sum(dim=-1, keepdim=True)).mul_(p)
    dq = torch.matmul(ds, kh).mul_(scale)
    dk = torch.matmul(ds.transpose(-1, -2), qh).mul_(scale)
    return [dq, dk, dv]


def _opaque(op, x, ctx):
    raise KernelError(f"op '{op['name']}' is opaque: the runtime cannot execute it")


KERNELS: Dict[str, Callable[[dict, Sequence[torch.Tensor], dict], List[torch.Tensor]]] = {
    "einsum": _einsum,
    "unary": _unary_op,
    "binary": _binary,
    "reduce": _reduce,
    "softmax": _softmax,
    "layer_norm": _layer_norm,
    "embedding": _embedding,
    "cross_entropy": _cross_entropy,
    "transpose": _transpose,
    "reshape": _reshape,
    "concat": _concat,
    "slice": _slice,
    "conv2d": _conv2d,
    "pool2d": _pool2d,
    "opaque": _opaque,
    "dropout": _dropout,
    # The values as they are: the rank stores the result in the buffer's dtype (held_dtype in rank.py),
    # which is the conversion (torch's .to, round to nearest even).
    "cast": lambda op, xs, ctx: [xs[0]],
    "gather": _gather,
    "scatter_add": _scatter_add,
    "topk": _topk,
    "attention": _attention,
    "unary_grad": _unary_grad,
    "broadcast_to": _broadcast_to,
    "softmax_grad": _softmax_grad,
    "layer_norm_grad": _layer_norm_grad,
    "layer_norm_param_grad": _layer_norm_param_grad,
    "embedding_grad": _embedding_grad,
    "cross_entropy_grad": _cross_entropy,
    "pad": _pad,
    "conv2d_grad_input": _conv2d_grad_input,
    "conv2d_grad_weight": _conv2d_grad_weight,
    "pool2d_grad": _pool2d_grad,
    "attention_grad": _attention_grad,
    "sgd_update": _sgd,
    "adam_update": _adam,
}


def run_kernel(op: dict, inputs: Sequence[torch.Tensor], ctx: Optional[dict] = None) -> List[torch.Tensor]:
    """Runs one op (a dict of ``Graph.ops``: kind, name, attrs) on its operand tiles."""
    fn = KERNELS.get(op["kind"])
    if fn is None:
        raise KernelError(f"op '{op['name']}': no torch kernel for op kind {op['kind']!r}")
    # An update reads its f32 master and states as they are; attention's backward its f32 log-sum-exp
    # beside f16 / bf16 operands (promoting them all to f32 would leave torch's half-precision kernels).
    if op["kind"] not in ("sgd_update", "adam_update", "attention_grad"):
        inputs = _promoted(inputs)
    return fn(op, inputs, ctx or {})
