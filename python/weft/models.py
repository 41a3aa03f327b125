"""weft's model zoo: the papers' models as weft.Graph forward graphs (with a scalar loss).

Every builder takes either a preset name (see :func:`presets`) or an explicit config; with a
name, explicitly given fields override the preset's (``gpt("GPT-2.7B", seq=2048)``).

    >>> g = weft.models.gpt("GPT-2.7B", batch=8)
    >>> g.num_params(), g.flops()
    >>> g = weft.models.gpt(layers=24, hidden=1024, heads=16, batch=2, dtype="bf16")

Architectures, conventions and each preset's parameter count: docs/modules/models.md.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from . import _weft
from ._checks import integer

_m = _weft.models

__all__ = [
    "presets",
    "preset_config",
    "build",
    "gpt",
    "moe",
    "wide_resnet",
    "unet",
    "vgg19",
    "bert",
    "llama",
    "megatron_flops",
    "llama_flops",
]


def presets() -> List[Dict[str, Any]]:
    """The papers' named configurations: name, family, named_params, source and config."""
    out = []
    for p in _m.presets():
        p = dict(p)
        p["config"] = dict(_m.preset_config(p["name"]))
        out.append(p)
    return out


def preset_config(name: str) -> Dict[str, Any]:
    """The config fields of a preset (aliases such as "GPT-3" accepted)."""
    return dict(_m.preset_config(name))


def build(name: str, batch: int = 1, dtype: str = "f32"):
    """Any preset of any family by name."""
    return _m.build_preset(name, batch, dtype)


def _config(family: str, name: Optional[str], given: Dict[str, Any], defaults: Dict[str, Any],
            required: tuple = ()) -> Dict[str, Any]:
    """Merges preset (if named), defaults and explicitly given fields; None means 'not given'."""
    cfg = dict(defaults)
    if name is not None:
        if not isinstance(name, str):
            raise ValueError(f"{family}: name must be a preset name string, got {name!r}")
        pc = _m.preset_config(name)
        if pc["family"] != family:
            raise ValueError(f"preset '{name}' is a {pc['family']} model, not {family}")
        cfg.update({k: v for k, v in pc.items() if k in cfg})
        cfg["name"] = pc["name"]
    else:
        cfg["name"] = family
    for k, v in given.items():
        if v is not None:
            cfg[k] = v
    missing = [k for k in required if cfg.get(k) is None]
    if missing:
        raise ValueError(f"{family}: give a preset name or {', '.join(missing)}")
    return cfg


def gpt(name: Optional[str] = None, *, layers: Optional[int] = None, hidden: Optional[int] = None,
        heads: Optional[int] = None, ffn: Optional[int] = None, seq: Optional[int] = None,
        vocab: Optional[int] = None, batch: int = 1, dtype: str = "f32", fused_attention: bool = False,
        hidden_dropout: Optional[float] = None, attention_dropout: Optional[float] = None, causal: bool = False):
    """GPT (pre-LN, fused QKV, FFN 4h GeLU, tied logits). Presets GPT-Medium ... GPT-175B.

    ``fused_attention``: each block's softmax(q kᵀ/√d)·v as the IR's fused ``attention`` op (flash
    attention: its backward keeps the output and the log-sum-exp, not the s x s probabilities)
    instead of einsum, softmax, einsum; the same function.

    ``causal``: the fused op masks causally (a query sees the keys up to its own position, as a
    GPT trains; flash attention then does about half the work). Needs ``fused_attention`` (the
    unfused zoo GPT has no mask); off by default, so that the two forms are the same function.

    ``hidden_dropout`` / ``attention_dropout``: training-mode dropout where Megatron-LM puts it (the
    embedding's output and each branch's output before its residual add; the attention
    probabilities). The presets carry the papers' 0.1, other configs 0. The fused op has no dropout:
    with ``fused_attention`` the attention dropout defaults to 0 and a positive one is refused."""
    if not isinstance(fused_attention, bool):
        raise TypeError(f"fused_attention must be a bool, got {type(fused_attention).__name__}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    if causal and not fused_attention:
        raise ValueError("gpt: causal=True needs fused_attention=True (the unfused zoo GPT has no mask)")
    if fused_attention and attention_dropout is None:
        attention_dropout = 0.0
    c = _config("gpt", name, dict(layers=layers, hidden=hidden, heads=heads, ffn=ffn, seq=seq, vocab=vocab,
                                  hidden_dropout=hidden_dropout, attention_dropout=attention_dropout),
                dict(layers=None, hidden=None, heads=None, ffn=0, seq=1024, vocab=51200, hidden_dropout=0.0,
                     attention_dropout=0.0),
                ("layers", "hidden", "heads"))
    return _m.gpt(c["name"], c["layers"], c["hidden"], c["heads"], c["ffn"], c["seq"], c["vocab"], batch, dtype,
                  fused_attention, _probability(c, "hidden_dropout"), _probability(c, "attention_dropout"), causal)


def _probability(cfg: Dict[str, Any], field: str) -> float:
    v = cfg[field]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{field} must be a number, got {type(v).__name__}")
    return float(v)


def moe(name: Optional[str] = None, *, layers: Optional[int] = None, hidden: Optional[int] = None,
        heads: Optional[int] = None, experts: Optional[int] = None, ffn: Optional[int] = None,
        moe_every: Optional[int] = None, capacity_factor: Optional[float] = None,
        seq: Optional[int] = None, vocab: Optional[int] = None, batch: int = 1, dtype: str = "f32"):
    """GShard MoE (FFN 8h, every other block MoE, top-2 gating). Presets MoE-8E-380M ... MoE-32E-10B."""
    c = _config("moe", name,
                dict(layers=layers, hidden=hidden, heads=heads, experts=experts, ffn=ffn, moe_every=moe_every,
                     capacity_factor=capacity_factor, seq=seq, vocab=vocab),
                dict(layers=None, hidden=None, heads=None, experts=None, ffn=0, moe_every=2,
                     capacity_factor=1.0, seq=1024, vocab=32000),
                ("layers", "hidden", "heads", "experts"))
    return _m.moe(c["name"], c["layers"], c["hidden"], c["heads"], c["ffn"], c["experts"], c["moe_every"],
                  float(c["capacity_factor"]), c["seq"], c["vocab"], batch, dtype)


def wide_resnet(name: Optional[str] = None, *, layers: Optional[int] = None, channels: Optional[int] = None,
                width_factor: Optional[int] = None, classes: Optional[int] = None, image: Optional[int] = None,
                batch: int = 1, dtype: str = "f32"):
    """Wide-ResNet 50/101 (Alpa's model). Presets WR-1.3B, WR-2.6B, WR-6B, WR-12B."""
    c = _config("wide_resnet", name,
                dict(layers=layers, channels=channels, width_factor=width_factor, classes=classes, image=image),
                dict(layers=50, channels=None, width_factor=None, classes=1024, image=224),
                ("channels", "width_factor"))
    return _m.wide_resnet(c["name"], c["layers"], c["channels"], c["width_factor"], c["classes"], c["image"],
                          batch, dtype)


def unet(name: Optional[str] = None, *, base_channels: Optional[int] = None, depth: Optional[int] = None,
         in_channels: Optional[int] = None, classes: Optional[int] = None, image: Optional[int] = None,
         batch: int = 1, dtype: str = "f32"):
    """U-Net with long skip connections. Presets UNet-33M, UNet-768M; default the classic base 64."""
    c = _config("unet", name,
                dict(base_channels=base_channels, depth=depth, in_channels=in_channels, classes=classes,
                     image=image),
                dict(base_channels=64, depth=4, in_channels=3, classes=2, image=256))
    return _m.unet(c["name"], c["base_channels"], c["depth"], c["in_channels"], c["classes"], c["image"], batch,
                   dtype)


def vgg19(name: Optional[str] = None, *, classes: Optional[int] = None, image: Optional[int] = None,
          batch: int = 1, dtype: str = "f32"):
    """VGG19 with a configurable classifier (classes=1_000_000: Rhino's VGG19-4.2B)."""
    c = _config("vgg19", name, dict(classes=classes, image=image), dict(classes=1000, image=224))
    return _m.vgg19(c["name"], c["classes"], c["image"], batch, dtype)


def bert(name: Optional[str] = None, *, layers: Optional[int] = None, hidden: Optional[int] = None,
         heads: Optional[int] = None, ffn: Optional[int] = None, seq: Optional[int] = None,
         vocab: Optional[int] = None, type_vocab: Optional[int] = None, batch: int = 1, dtype: str = "f32",
         hidden_dropout: Optional[float] = None, attention_dropout: Optional[float] = None):
    """BERT with the masked-LM head; the defaults are BERT-large's shape (L24 h1024 a16, seq 512).

    Dropout at BERT's sites (``hidden_dropout``: after the embeddings' LN and on each branch's output;
    ``attention_dropout``: the attention probabilities): the preset ``"BERT-large"`` carries BERT's
    0.1, other configs 0."""
    c = _config("bert", name,
                dict(layers=layers, hidden=hidden, heads=heads, ffn=ffn, seq=seq, vocab=vocab,
                     type_vocab=type_vocab, hidden_dropout=hidden_dropout, attention_dropout=attention_dropout),
                dict(layers=24, hidden=1024, heads=16, ffn=0, seq=512, vocab=30522, type_vocab=2,
                     hidden_dropout=0.0, attention_dropout=0.0))
    return _m.bert(c["name"], c["layers"], c["hidden"], c["heads"], c["ffn"], c["seq"], c["vocab"],
                   c["type_vocab"], batch, dtype, _probability(c, "hidden_dropout"),
                   _probability(c, "attention_dropout"))


_LLAMA_INTS = ("layers", "hidden", "heads", "kv_heads", "ffn", "seq", "vocab")


def _llama_config(name, given: Dict[str, Any]) -> Dict[str, Any]:
    c = _config("llama", name, given,
                dict(layers=None, hidden=None, heads=None, kv_heads=None, ffn=None, seq=2048, vocab=32000,
                     rope_theta=10000.0, norm_eps=1e-5),
                ("layers", "hidden", "heads", "ffn"))
    if c["kv_heads"] is None:
        c["kv_heads"] = c["heads"]  # multi-head attention
    for k in _LLAMA_INTS:
        c[k] = integer(f"llama: {k}", c[k], 1)
    for k in ("rope_theta", "norm_eps"):
        v = c[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"llama: {k} must be a number, got {type(v).__name__}")
        c[k] = float(v)
    return c


def llama(name: Optional[str] = None, *, layers: Optional[int] = None, hidden: Optional[int] = None,
          heads: Optional[int] = None, kv_heads: Optional[int] = None, ffn: Optional[int] = None,
          seq: Optional[int] = None, vocab: Optional[int] = None, batch: int = 1, dtype: str = "f32",
          fused_attention: bool = False, rope_theta: Optional[float] = None, norm_eps: Optional[float] = None):
    """Llama (Llama 2 / Llama 3): pre-norm RMSNorm, grouped-query attention (``kv_heads`` key/value heads,
    repeated to the ``heads`` query heads), rotary position embedding (θ = ``rope_theta``), SwiGLU MLP of
    hidden size ``ffn``, untied LM head, no biases, causal attention. Presets ``llama2-7b``,
    ``llama2-13b``, ``llama2-70b``, ``llama3-8b``, ``llama3-70b``, ``llama3-405b`` (the published
    shapes; docs/modules/models.md); without a preset ``layers``, ``hidden``, ``heads`` and ``ffn`` are
    required and ``kv_heads`` defaults to ``heads``, ``seq`` 2048, ``vocab`` 32000, ``rope_theta`` 10000
    (Llama 2's; Llama 3's is 500000), ``norm_eps`` 1e-5.

    ``fused_attention``: each block's causal softmax(q kᵀ/√d)·v as the IR's fused ``attention`` op
    (causal = true; flash attention: its backward keeps the output and the log-sum-exp) instead of
    einsum, a causal mask, softmax, einsum; the same function."""
    if not isinstance(fused_attention, bool):
        raise TypeError(f"llama: fused_attention must be a bool, got {type(fused_attention).__name__}")
    batch = integer("llama: batch", batch, 1)
    c = _llama_config(name, dict(layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, ffn=ffn, seq=seq,
                                 vocab=vocab, rope_theta=rope_theta, norm_eps=norm_eps))
    return _m.llama(c["name"], c["layers"], c["hidden"], c["heads"], c["kv_heads"], c["ffn"], c["seq"], c["vocab"],
                    batch, dtype, fused_attention, c["rope_theta"], c["norm_eps"])


def llama_flops(name: Optional[str] = None, *, batch: int = 1, **fields) -> float:
    """A Llama training step's model FLOPs as torchtitan counts them: 6·N·T + 12·L·h·s·T for T = batch·seq
    tokens, N every parameter but the embedding table (the attention's causal mask not discounted).
    ``name`` / ``fields`` as :func:`llama`."""
    unknown = set(fields) - set(_LLAMA_INTS) - {"rope_theta", "norm_eps"}
    if unknown:
        raise TypeError(f"llama_flops: unknown field(s) {', '.join(sorted(unknown))}")
    batch = integer("llama_flops: batch", batch, 1)
    c = _llama_config(name, fields)
    return _m.llama_flops(c["name"], c["layers"], c["hidden"], c["heads"], c["kv_heads"], c["ffn"], c["seq"],
                          c["vocab"], batch, c["rope_theta"], c["norm_eps"])


def megatron_flops(*, layers: int, hidden: int, seq: int = 1024, vocab: int = 51200, batch: int = 1) -> float:
    """Megatron-LM's model FLOPs of a GPT step: 72·B·S·L·h²·(1 + S/(6h) + V/(12·L·h))."""
    return _m.megatron_flops(layers, hidden, seq, vocab, batch)
