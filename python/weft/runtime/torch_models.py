"""Zoo models written as plain PyTorch modules, trained with torch autograd and torch.optim: the
independent baselines the runtime is checked and benchmarked against (weft's own autodiff and
Adam on one side, torch's on the other, from the same initial values and data).

``train_plain_pytorch(step, layers, heads, steps)`` trains :class:`TorchGPT` (``weft.models.gpt``)
from weft's counter-based initial parameters on weft's counter-based tokens, with the Adam (or SGD)
hyper-parameters of ``step``'s update ops, and returns the parameters after the steps.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import numpy as np
import torch
import torch.nn.functional as F

from .. import _weft


class TorchGPT(torch.nn.Module):
    """weft.models.gpt as a PyTorch module: learned positions, pre-LN blocks, fused QKV, softmax
    attention without a mask (as weft's graph), tanh-GeLU MLP, final LN, logits tied to wte.
    ``dropout`` > 0: GPT-2's dropouts (embeddings, attention probabilities, both residual branches)
    in training mode (weft.from_torch imports them as the IR's dropout op). ``sdpa``: attention
    through ``F.scaled_dot_product_attention`` (the same function; torch's fused flash / memory-
    efficient kernels, the baseline a torch user would run on a GPU)."""

    def __init__(self, params: Dict[str, torch.Tensor], layers: int, heads: int, dropout: float = 0.0,
                 sdpa: bool = False):
        super().__init__()
        self.names = {k.replace(".", "_"): k for k in params}
        self.p = torch.nn.ParameterDict({k.replace(".", "_"): torch.nn.Parameter(v) for k, v in params.items()})
        self.layers, self.heads, self.dropout, self.sdpa = layers, heads, float(dropout), bool(sdpa)

    def drop(self, x: torch.Tensor) -> torch.Tensor:
        return F.dropout(x, self.dropout, self.training) if self.dropout else x

    def w(self, name: str) -> torch.Tensor:
        return self.p[name.replace(".", "_")]

    def parameters_by_name(self) -> Dict[str, torch.Tensor]:
        return {self.names[k]: v.detach() for k, v in self.p.items()}

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        b, s = tokens.shape
        x = self.drop(F.embedding(tokens, self.w("wte")) + self.w("wpe"))
        h = x.shape[-1]
        d = h // self.heads
        for i in range(self.layers):
            p = f"h{i}"
            y = F.layer_norm(x, [h], self.w(p + ".ln1.gamma"), self.w(p + ".ln1.beta"), 1e-5)
            qkv = (y @ self.w(p + ".attn.qkv.w") + self.w(p + ".attn.qkv.b")).reshape(b, s, 3, self.heads, d)
            if self.sdpa:
                q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
                p_drop = self.dropout if self.training else 0.0
                ctx = F.scaled_dot_product_attention(q, k, v, dropout_p=p_drop).transpose(1, 2).reshape(b, s, h)
            else:
                q, k, v = qkv[:, :, 0] * (1.0 / d ** 0.5), qkv[:, :, 1], qkv[:, :, 2]
                probs = self.drop(torch.softmax(torch.einsum("bsnd,btnd->bnst", q, k), dim=-1))
                ctx = torch.einsum("bnst,btnd->bsnd", probs, v).reshape(b, s, h)
            x = x + self.drop(ctx @ self.w(p + ".attn.proj.w") + self.w(p + ".attn.proj.b"))
            y = F.layer_norm(x, [h], self.w(p + ".ln2.gamma"), self.w(p + ".ln2.beta"), 1e-5)
            y = F.gelu(y @ self.w(p + ".mlp.fc1.w") + self.w(p + ".mlp.fc1.b"), approximate="tanh")
            x = x + self.drop(y @ self.w(p + ".mlp.fc2.w") + self.w(p + ".mlp.fc2.b"))
        x = F.layer_norm(x, [h], self.w("ln_f.gamma"), self.w("ln_f.beta"), 1e-5)
        logits = (x @ self.w("wte").t()).reshape(b * s, -1)
        if logits.dtype in (torch.float16, torch.bfloat16):  # the loss in f32, as mixed precision does
            logits = logits.float()
        return F.cross_entropy(logits, labels.reshape(-1))


def leaf_value(values, graph, name: str, step: int, device, dtype) -> torch.Tensor:
    """The global value of leaf ``name`` at ``step`` (weft's counter-based values)."""
    t = next((x for x in graph.tensors if x["name"] == name), None)
    if t is None:
        raise ValueError(f"the graph has no tensor '{name}'")
    n = int(np.prod(t["shape"])) if t["shape"] else 1
    v = values.values(t["id"], step, np.arange(n, dtype=np.int64)).reshape(t["shape"])
    return torch.from_numpy(v).to(device=device, dtype=dtype)


def train_plain_pytorch(step, layers: int, heads: int, steps: int, *, seed: int = 0, device="cpu",
                        dtype=torch.float64, around_step: Optional[Callable] = None, sdpa: bool = False,
                        fused: bool = False) -> Dict[str, torch.Tensor]:
    """Trains TorchGPT (weft.models.gpt's structure, its parameter names) with torch autograd and
    torch.optim for ``steps`` steps from ``step``'s initial parameters and data; returns the
    parameters by name. ``around_step(s, fn)`` (optional) wraps each step (fn runs it and returns
    the loss), e.g. to time it. ``sdpa`` / ``fused``: torch's fastest eager form (attention through
    scaled_dot_product_attention, the fused Adam kernel) instead of the op-for-op twin of weft's graph."""
    values = _weft.LeafValues(step, int(seed))
    params = {t["name"]: leaf_value(values, step, t["name"], 1, device, dtype) for t in step.tensors
              if t["role"] == "parameter" and t["producer"] is None}
    model = TorchGPT(params, layers, heads, sdpa=sdpa)
    trained = train_module(model, step, steps, seed=seed, device=device, around_step=around_step,
                           load_initial=False, fused=fused)
    return {model.names[k.split(".", 1)[1]]: v for k, v in trained.items()}


def train_module(module: torch.nn.Module, step, steps: int, *, seed: int = 0, device="cpu",
                 inputs=("tokens", "labels"), around_step: Optional[Callable] = None,
                 load_initial: Optional[bool] = None, fused: bool = False) -> Dict[str, torch.Tensor]:
    """Trains ``module`` (its forward returns the scalar loss of ``inputs``) with torch autograd and
    torch.optim, as weft's training step ``step`` would: each step's data from weft's counter-based
    values of ``step``, the optimizer and its hyper-parameters from ``step``'s update ops. The
    initial parameters are the module's own when ``step`` is its import (weft.from_torch records
    them; ``load_initial=None`` decides by ``step.seed_parameters``), else weft's seeded values
    (matched by name). ``fused``: torch's fused Adam kernel instead of the foreach one. Returns the
    parameters (state_dict names) after ``steps`` steps."""
    if load_initial is None:
        load_initial = bool(step.seed_parameters)
    values = _weft.LeafValues(step, int(seed), bool(load_initial))
    names = {t["name"] for t in step.tensors if t["role"] == "parameter" and t["producer"] is None}
    own = dict(module.named_parameters())
    if load_initial:
        missing = sorted(set(own) ^ names)
        if missing:
            raise ValueError(f"the module's parameters and the graph's differ: {missing[:5]}")
        with torch.no_grad():
            for n, p in own.items():
                p.copy_(leaf_value(values, step, n, 1, device, p.dtype))
    update = next((o for o in step.ops if o["kind"] in ("adam_update", "sgd_update")), None)
    if update is None:
        raise ValueError("the graph has no optimizer update (give a training step)")
    a = update["attrs"]["scalars"]
    if update["kind"] == "adam_update":
        kind = {"fused": True} if fused else {"foreach": True}
        opt = torch.optim.Adam(module.parameters(), lr=a[0], betas=(a[1], a[2]), eps=a[3], **kind)
    else:
        opt = torch.optim.SGD(module.parameters(), lr=a[0], momentum=a[1] if len(a) > 1 else 0.0)
    for s in range(1, steps + 1):
        data = [leaf_value(values, step, n, s, device, torch.int64) for n in inputs]

        def one():
            opt.zero_grad(set_to_none=True)
            loss = module(*data)
            loss.backward()
            opt.step()
            return float(loss.detach())

        if around_step is not None:
            around_step(s, one)
        else:
            one()
    return {n: p.detach() for n, p in module.named_parameters()}
