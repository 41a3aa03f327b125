"""The written-out attention of a captured module, recognised: a rewrite of the exported graph
(torch.export's ATen graph, before weft.from_torch imports it) that turns nanoGPT / minGPT's
``softmax(masked_fill(q @ kᵀ {/,*} c, causal mask, -inf)) @ v`` into one
``scaled_dot_product_attention`` node, which imports as the IR's fused attention op. Kept apart
from the importer's op handlers (frontend/torch.py): it reads and edits the FX graph, not weft's."""
from __future__ import annotations


def fuse_written_attention(ep, root_state, real_buffer=lambda target, obj: obj) -> int:
    """Rewrites, in the exported graph, attention written out as
    ``softmax(masked_fill(q @ k.transpose(-1, -2) {/ c | * c}, ~causal, -inf), -1) @ v`` — the
    nanoGPT / minGPT form, a causal mask from a buffer or constant (``~tril``, ``tril == 0``,
    sliced to the sequence) — into ``scaled_dot_product_attention(q, k, v, is_causal=True,
    scale=...)``, which imports as the IR's fused attention op (O(s) saved memory, torch's flash
    kernels in the runtime). The same function exactly; only when every intermediate has no other
    use, the mask is the top-left causal one at the scores' shape and q, k, v share their leading
    dims. ``real_buffer(target, obj)``: a buffer's real value (a meta module's, from ``values=``), so
    that a meta import fuses as the real one does; a mask that stays unknown is not fused. Returns
    the number of attentions fused."""
    import torch

    aten = torch.ops.aten
    gm = ep.graph_module
    consts = {}
    for spec in ep.graph_signature.input_specs:
        kind = spec.kind.name
        if kind == "BUFFER":
            obj = root_state.get(spec.target)
            obj = obj if obj is not None else ep.constants.get(spec.target)
            consts[spec.arg.name] = real_buffer(spec.target, obj) if obj is not None else None
        elif kind == "CONSTANT_TENSOR":
            consts[spec.arg.name] = ep.constants.get(spec.target)

    def value(n, depth=0):
        """The constant value of node n (placeholders of buffers / constants and ops over them), or None."""
        if not isinstance(n, torch.fx.Node):
            return n
        if n.op == "placeholder":
            v = consts.get(n.name)
            return None if v is None or getattr(v, "is_meta", False) else v
        if n.op != "call_function" or depth > 8 or str(n.target).split(".")[1].endswith("_"):
            return None  # (an in-place op would write into the module's own buffer)
        args = [value(a, depth + 1) for a in n.args]
        if any(a is None and isinstance(b, torch.fx.Node) for a, b in zip(args, n.args)):
            return None
        try:
            with torch.no_grad():
                return n.target(*args, **n.kwargs)
        except Exception:  # noqa: BLE001 - not a foldable constant
            return None

    def only_user(n, user):
        return list(n.users) == [user]

    def shape(n):
        v = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
        return tuple(int(d) for d in v.shape) if v is not None and hasattr(v, "shape") else None

    fused = 0
    for out in list(gm.graph.nodes):
        if out.op != "call_function" or out.target != aten.matmul.default:
            continue
        sm, v = out.args[0], out.args[1]
        if not (isinstance(sm, torch.fx.Node) and sm.target in (aten.softmax.int, aten._softmax.default)
                and only_user(sm, out) and sm.args[1] in (-1, len(shape(sm) or ()) - 1)):
            continue
        mf = sm.args[0]
        if not (isinstance(mf, torch.fx.Node) and mf.target == aten.masked_fill.Scalar and only_user(mf, sm)
                and mf.args[2] == float("-inf")):
            continue
        sc, mask = mf.args[0], mf.args[1]
        scale = 1.0
        if (isinstance(sc, torch.fx.Node) and sc.target in (aten.div.Tensor, aten.div.Scalar, aten.mul.Tensor,
                                                            aten.mul.Scalar)
                and isinstance(sc.args[1], (int, float)) and only_user(sc, mf)):
            scale = 1.0 / float(sc.args[1]) if sc.target in (aten.div.Tensor, aten.div.Scalar) else float(sc.args[1])
            mm = sc.args[0]
        else:
            mm = sc
        if not (isinstance(mm, torch.fx.Node) and mm.target == aten.matmul.default and only_user(mm, sc if mm is not sc
                                                                                                 else mf)):
            continue
        q, kt = mm.args
        if not (isinstance(kt, torch.fx.Node) and kt.target == aten.transpose.int and len(kt.users) == 1
                and sorted(int(d) % len(shape(kt) or (0, 0)) for d in kt.args[1:]) == [len(shape(kt)) - 2,
                                                                                       len(shape(kt)) - 1]):
            continue
        k = kt.args[0]
        qs, ks, vs, ss = shape(q), shape(k), shape(v), shape(mm)
        if None in (qs, ks, vs, ss) or not (len(qs) == len(ks) == len(vs) >= 3 and qs[:-2] == ks[:-2] == vs[:-2]
                                             and ks[-1] == qs[-1] and vs[-2] == ks[-2]):
            continue
        m = value(mask)
        if not isinstance(m, torch.Tensor) or m.dtype != torch.bool:
            continue
        L, S = ss[-2], ss[-1]
        try:
            full = m.expand(ss)
        except RuntimeError:
            continue
        causal = ~torch.ones(L, S, dtype=torch.bool).tril()
        if not bool((full == causal).all()):
            continue
        with gm.graph.inserting_before(out):
            new = gm.graph.call_function(aten.scaled_dot_product_attention.default, (q, k, v),
                                         {"is_causal": True, "scale": scale})
        new.meta.update(out.meta)
        out.replace_all_uses_with(new)
        fused += 1  # the written-out chain is left without a user: the import's liveness drops it
    return fused
