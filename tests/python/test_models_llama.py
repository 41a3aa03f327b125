"""The zoo's Llama (weft.models.llama): the presets' parameter counts by hand, the model FLOPs against
the 6N + attention formula, the strongest oracle — Hugging Face's LlamaForCausalLM of the same small
config, in float64 with its float32 islands lifted (f64_torch.Float64Throughout), given the zoo's
weights: the same loss and gradients to 1e-10 —, Megatron's roles on it, a Megatron plan of a tiny
Llama equal to one device on the CPU executor, and bad arguments."""
import numpy as np
import pytest

import weft
from f64_torch import Float64Throughout, FloatDtypesSeen
from test_execute import assert_same

torch = pytest.importorskip("torch")

SMALL = dict(layers=2, hidden=16, heads=4, kv_heads=2, ffn=24, seq=8, vocab=32)


def params_by_hand(L, h, n, kv, f, V):
    """Llama's parameters, d = h / n: per block q h·n·d + k, v 2·h·kv·d + o n·d·h + gate, up, down 3·h·f
    + two RMSNorm scales 2h; the token table V·h, the final norm h and the untied head h·V."""
    d = h // n
    return L * (h * n * d + 2 * h * kv * d + n * d * h + 3 * h * f + 2 * h) + V * h + h + h * V


def test_preset_parameter_counts_by_hand():
    # Llama 3 8B: V·h = 128256·4096 = 525,336,576 (x2: table and head = 1,050,673,152); per layer q + o
    # 2·4096² = 33,554,432, k + v 2·4096·1024 = 8,388,608, MLP 3·4096·14336 = 176,160,768, norms 8,192:
    # 218,112,000, x32 = 6,979,584,000; + the final norm 4,096 -> 8,030,261,248.
    assert params_by_hand(32, 4096, 32, 8, 14336, 128256) == 8_030_261_248
    # Llama 3 70B: 2·128256·8192 = 2,101,346,304; per layer 2·8192² + 2·8192·1024 + 3·8192·28672 + 16,384
    # = 855,654,400, x80 = 68,452,352,000; + 8,192 -> 70,553,706,496.
    assert params_by_hand(80, 8192, 64, 8, 28672, 128256) == 70_553_706_496
    # (and the figures Meta / Hugging Face publish for the others: Llama 2 7B 6,738,415,616, 13B
    # 13,015,864,320, 70B 68,976,648,192; Llama 3.1 405B 405,853,388,800)
    want = {"llama2-7b": 6_738_415_616, "llama2-13b": 13_015_864_320, "llama2-70b": 68_976_648_192,
            "llama3-8b": 8_030_261_248, "llama3-70b": 70_553_706_496, "llama3-405b": 405_853_388_800}
    for name, n in want.items():
        c = weft.models.preset_config(name)
        assert c["family"] == "llama"
        assert params_by_hand(c["layers"], c["hidden"], c["heads"], c["kv_heads"], c["ffn"], c["vocab"]) == n
        assert weft.models.llama(name, seq=16).num_params() == n, name  # seq changes no parameter
    c = weft.models.preset_config("llama3-405b")
    assert (c["layers"], c["hidden"], c["heads"], c["kv_heads"], c["ffn"], c["vocab"], c["seq"], c["rope_theta"]) == \
        (126, 16384, 128, 8, 53248, 128256, 8192, 500000.0)
    assert weft.models.preset_config("llama2-7b")["rope_theta"] == 10000.0
    assert weft.models.preset_config("llama3.1-8b")["name"] == "llama3-8b"
    assert {p["name"] for p in weft.models.presets() if p["family"] == "llama"} == set(want)


def forward_matmul_flops(g):
    return sum(o["flops"] for o in g.ops if o["kind"] == "einsum")


def test_flops_per_token_against_6n_plus_attention():
    """3 x the forward einsums equals 6·N'·T + 12·L·h·s·T exactly (N' every parameter a token multiplies:
    all but the table and the norms' scales); llama_flops counts the norms' scales in N as torchtitan
    does (6·(2L + 1)·h·T more). The fused causal op counts the s(s+1)/2 pairs it computes."""
    L, h, n, kv, f, V, s, b = 3, 64, 8, 2, 96, 200, 32, 2
    T = b * s
    N_all = params_by_hand(L, h, n, kv, f, V) - V * h
    N_mm = N_all - (2 * L + 1) * h
    cfg = dict(layers=L, hidden=h, heads=n, kv_heads=kv, ffn=f, seq=s, vocab=V)
    g = weft.models.llama(**cfg, batch=b)
    assert 3 * forward_matmul_flops(g) == pytest.approx(6 * N_mm * T + 12 * L * h * s * T, rel=1e-12)
    assert weft.models.llama_flops(**cfg, batch=b) == pytest.approx(6 * N_all * T + 12 * L * h * s * T, rel=1e-12)
    # the whole training step (autodiff, no recomputation) exceeds the matmuls by the element-wise work only
    step = g.train_step(optimizer=None)
    assert 1 < step.flops() / (6 * N_mm * T + 12 * L * h * s * T) < 1.1
    fused = weft.models.llama(**cfg, batch=b, fused_attention=True)
    core = [o for o in fused.ops if o["kind"] == "attention"]
    assert len(core) == L
    # per layer, forward: 2·(d + d) FLOPs per (query, key) pair kept, b·n·s(s+1)/2 pairs
    d = h // n
    assert sum(o["flops"] for o in core) == pytest.approx(L * 4 * d * b * n * s * (s + 1) / 2, rel=1e-12)
    assert forward_matmul_flops(fused) == pytest.approx(2 * N_mm * T, rel=1e-12)
    # Llama 3 8B at 8192 tokens: 6·7,504,924,672 + 12·32·4096·8192 = 57.91 GFLOP per token
    per_token = weft.models.llama_flops("llama3-8b") / 8192
    assert per_token == pytest.approx(6 * (8_030_261_248 - 525_336_576) + 12 * 32 * 4096 * 8192, rel=1e-12)


def hf_model(transformers, cfg):
    hc = transformers.LlamaConfig(
        vocab_size=cfg["vocab"], hidden_size=cfg["hidden"], intermediate_size=cfg["ffn"],
        num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"], num_key_value_heads=cfg["kv_heads"],
        max_position_embeddings=cfg["seq"], rope_theta=cfg["rope_theta"], rms_norm_eps=1e-5, attention_bias=False,
        mlp_bias=False, tie_word_embeddings=False)
    hc._attn_implementation = "eager"
    m = transformers.LlamaForCausalLM(hc).double().eval()
    # Its inverse frequencies are a buffer computed in float32 when the module is made (.double()
    # converts the rounded values): 1e-8 off, p·1e-8 on the angles. Recomputed in float64, as the
    # float32 casts inside the forward are lifted by Float64Throughout.
    d = cfg["hidden"] // cfg["heads"]
    exact = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    rot = m.model.rotary_emb
    assert rot.inv_freq.shape == exact.shape
    rot.inv_freq = exact
    if hasattr(rot, "original_inv_freq"):
        rot.original_inv_freq = exact
    return m


def to_hf(m, values, layers):
    """The zoo's [in, out] weights into Hugging Face's modules ([out, in] Linear weights)."""
    sd = {"model.embed_tokens.weight": values["wte"], "model.norm.weight": values["norm_f.gamma"],
          "lm_head.weight": values["lm_head.w"].T}
    for l in range(layers):
        p, q = f"h{l}.", f"model.layers.{l}."
        sd[q + "input_layernorm.weight"] = values[p + "attn_norm.gamma"]
        sd[q + "post_attention_layernorm.weight"] = values[p + "mlp_norm.gamma"]
        for a in "qkvo":
            sd[q + f"self_attn.{a}_proj.weight"] = values[p + f"attn.{a}.w"].T
        for a in ("gate", "up", "down"):
            sd[q + f"mlp.{a}_proj.weight"] = values[p + f"mlp.{a}.w"].T
    state = {k: torch.tensor(np.ascontiguousarray(v), dtype=torch.float64) for k, v in sd.items()}
    missing, unexpected = m.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary" in k for k in missing), (missing, unexpected)


def hf_loss_and_grads(m, ids, labels, layers):
    m.zero_grad()
    seen = FloatDtypesSeen()
    with Float64Throughout(), seen:
        logits = m(input_ids=torch.tensor(ids, dtype=torch.long)).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 torch.tensor(labels, dtype=torch.long).reshape(-1))
        loss.backward()
    assert seen.dtypes == {torch.float64}  # no float32 island left
    params = dict(m.named_parameters())
    g = {"wte": params["model.embed_tokens.weight"].grad, "norm_f.gamma": params["model.norm.weight"].grad,
         "lm_head.w": params["lm_head.weight"].grad.T}
    for l in range(layers):
        p, q = f"h{l}.", f"model.layers.{l}."
        g[p + "attn_norm.gamma"] = params[q + "input_layernorm.weight"].grad
        g[p + "mlp_norm.gamma"] = params[q + "post_attention_layernorm.weight"].grad
        for a in "qkvo":
            g[p + f"attn.{a}.w"] = params[q + f"self_attn.{a}_proj.weight"].grad.T
        for a in ("gate", "up", "down"):
            g[p + f"mlp.{a}.w"] = params[q + f"mlp.{a}_proj.weight"].grad.T
    return float(loss.detach()), {k: v.detach().numpy() for k, v in g.items()}


def assert_close(got, want, rtol, what):
    scale = float(np.max(np.abs(want)))
    err = float(np.max(np.abs(np.asarray(got) - np.asarray(want)))) / scale
    assert err < rtol, f"{what}: relative error {err:.3g}"
    return err


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("weights", ["seeded", "wide"])
def test_equals_hugging_face_llama_in_f64(fused, weights):
    """The zoo's Llama and Hugging Face's LlamaForCausalLM of the same config (GQA 4 query heads on 2 kv
    heads, θ 500000, SwiGLU 24, untied head) given the same weights: the same loss and the same
    gradient of every parameter to 1e-10. "seeded": the zoo's own initialisation (norm scales 1,
    weights 0.02·N(0,1)); "wide": weights of std 0.3 and random norm scales, so that the attention is
    far from uniform and the rotary tables, the GQA grouping and the causal mask all move the result."""
    transformers = pytest.importorskip("transformers")
    cfg = dict(SMALL, rope_theta=500000.0)
    b = 3
    g = weft.models.llama(**cfg, batch=b, dtype="f64", fused_attention=fused)
    rng = np.random.default_rng(7)
    ids = rng.integers(0, cfg["vocab"], (b, cfg["seq"]))
    labels = rng.integers(0, cfg["vocab"], (b, cfg["seq"]))
    feeds = {"tokens": ids, "labels": labels}
    names = [t["name"] for t in g.tensors if t["role"] == "parameter" and t["producer"] is None]
    if weights == "wide":
        values = {}
        for t in g.tensors:
            if t["name"] in names:
                shape = tuple(t["shape"])
                values[t["name"]] = (1 + 0.5 * rng.standard_normal(shape)) if t["name"].endswith(".gamma") else \
                    0.3 * rng.standard_normal(shape)
        weft.load_values(g, values)
        step = g.train_step(optimizer="adam")
        ref = weft.execute_reference(step, steps=1, inputs=feeds)
    else:
        # The zoo's seeded weights: one SGD step of lr 2^-20 from them; p0 = p1 + lr·g to rounding.
        lr = 2.0 ** -20
        step = g.train_step(optimizer="sgd", lr=lr)
        ref = weft.execute_reference(step, steps=1, inputs=feeds)
        values = {n: ref.parameters[n] + lr * ref.gradients[n] for n in names}
        assert np.allclose(values["h0.attn_norm.gamma"], 1.0, rtol=0, atol=1e-12)
        assert 0.015 < float(np.std(values["h0.attn.q.w"])) < 0.025
    assert set(ref.gradients) == set(names)
    m = hf_model(transformers, cfg)
    to_hf(m, values, cfg["layers"])
    loss, grads = hf_loss_and_grads(m, ids, labels, cfg["layers"])
    assert abs(ref.losses[0] - loss) / abs(loss) < 1e-10
    assert set(grads) == set(names)
    worst = max(assert_close(ref.gradients[n], grads[n], 1e-10, n) for n in names)
    assert worst < 1e-10
    # and the graph's interpreter on the forward graph: the same loss
    got = weft.interpret(g, {**feeds, **values, **{t["name"]: g.value(t["id"]) for t in g.tensors
                                                   if t["role"] == "constant" and t["producer"] is None}})
    assert abs(float(got["loss"]) - loss) / abs(loss) < 1e-10


def test_megatron_roles_on_the_zoo_llama():
    step = weft.models.llama(**SMALL, batch=4).train_step(optimizer="adam")
    d = weft.megatron_specs(step, 2, detail=True)
    assert d["recognised"]
    roles = {n: (p["role"], p["spec"]) for n, p in d["params"].items()}
    for l in range(2):
        p = f"h{l}."
        for w in ("attn.q.w", "attn.k.w", "attn.v.w", "mlp.gate.w", "mlp.up.w"):
            assert roles[p + w] == ("column", "S(1)"), w  # [in, out]: output features dim 1, heads by block
        for w in ("attn.o.w", "mlp.down.w"):
            assert roles[p + w] == ("row", "S(0)"), w
        assert roles[p + "attn_norm.gamma"] == roles[p + "mlp_norm.gamma"] == ("replicated", "R")
    assert roles["wte"] == ("vocab_embedding", "S(0)")
    assert roles["lm_head.w"] == ("vocab_head", "S(1)")  # untied: [h, V] split along the vocabulary
    assert roles["norm_f.gamma"] == ("replicated", "R")
    assert "10 column" in d["summary"] and "4 row" in d["summary"]


@pytest.mark.parametrize("fused,recompute", [(False, "none"), (True, "none"), (False, "selective")])
def test_megatron_plan_t2_d2_equals_one_device(fused, recompute):
    """Megatron's splits on 2 x 2 devices compute what one device does; with selective recomputation
    the unfused attention core (scores, the causal mask's add, softmax) runs again in the backward."""
    cluster = weft.Cluster.preset("p3.8xlarge")
    step = weft.models.llama(**SMALL, batch=4, fused_attention=fused).train_step(optimizer="adam")
    plan = weft.megatron_plan(step, cluster, t=2, p=1, d=2, recompute=recompute)
    assert plan.strategy == "megatron t=2 p=1 d=2"
    assert set(plan.recompute) == {recompute}
    assert_same(weft.execute(plan, step, cluster), weft.execute_reference(step), 1e-10)


def test_selective_recomputation_drops_the_masked_probabilities():
    """The causal mask is made from the positions table in each layer (constants only), so the attention
    core's region reaches through its add: selective keeps b·n·s² probabilities fewer per layer, as on
    the zoo GPT: P = 2 samples per replica x 4 heads x 512² x 2 bytes = 4 MiB a layer; 3 layers drop 3P
    and re-make one core's P at a time in the backward (plan.md's transient): 2P off the peak."""
    cluster = weft.Cluster.preset("H100", nodes=1)
    step = weft.models.llama(layers=3, hidden=256, heads=4, kv_heads=2, ffn=512, seq=512, vocab=1000, batch=16,
                             dtype="bf16").train_step(optimizer="adam")
    peak = {r: weft.megatron_plan(step, cluster, t=1, p=1, d=8, recompute=r, num_microbatches=1, zero=0).peak_memory
            for r in ("none", "selective")}
    assert peak["none"] - peak["selective"] == 2 * (2 * 4 * 512 * 512 * 2)


def test_structure_and_bad_arguments():
    g = weft.models.llama(**SMALL, batch=2)
    kinds = [o["kind"] for o in g.ops]
    assert "layer_norm" not in kinds and kinds.count("softmax") == 2 and "attention" not in kinds
    params = {t["name"]: list(t["shape"]) for t in g.tensors if t["role"] == "parameter"}
    assert not any(n.endswith(".b") for n in params)  # no biases
    assert params["h0.attn.k.w"] == [16, 8] and params["h0.attn.q.w"] == [16, 16]  # 2 kv heads of d 4
    assert params["lm_head.w"] == [16, 32] and params["wte"] == [32, 16]  # untied
    consts = {t["name"]: t for t in g.tensors if t["role"] == "constant"}
    assert list(consts["rope.cos"]["shape"]) == [8, 1, 4]
    # cos(p·θ^(-2j/d)) for j = i mod d/2: position 3, rotary dim 1 (j 1) and 3 (j 1 again)
    cos = g.value(consts["rope.cos"]["id"])
    assert cos[3, 0, 1] == pytest.approx(np.cos(3 * 10000.0 ** (-2 / 4)), rel=1e-15) and cos[3, 0, 3] == cos[3, 0, 1]
    fused = weft.models.llama(**SMALL, fused_attention=True)
    att = [o for o in fused.ops if o["kind"] == "attention"]
    assert len(att) == 2 and "causal" not in {t["name"] for t in fused.tensors}
    with pytest.raises(ValueError, match="kv_heads"):
        weft.models.llama(**{**SMALL, "kv_heads": 3})
    with pytest.raises(ValueError, match="ffn"):
        weft.models.llama(layers=2, hidden=16, heads=4)
    with pytest.raises(ValueError, match="layers"):
        weft.models.llama(**{**SMALL, "layers": 0})
    with pytest.raises(ValueError, match="heads"):
        weft.models.llama(**{**SMALL, "heads": 5})
    with pytest.raises(ValueError, match="even"):
        weft.models.llama(**{**SMALL, "hidden": 12, "heads": 4, "kv_heads": 4})
    with pytest.raises(ValueError, match="rope_theta"):
        weft.models.llama(**SMALL, rope_theta=-1.0)
    with pytest.raises(TypeError, match="rope_theta"):
        weft.models.llama(**SMALL, rope_theta="big")
    with pytest.raises(TypeError, match="fused_attention"):
        weft.models.llama(**SMALL, fused_attention=1)
    with pytest.raises(ValueError, match="seq"):
        weft.models.llama(**{**SMALL, "seq": 2.5})
    with pytest.raises(ValueError, match="not llama"):
        weft.models.llama("GPT-2.7B")
    with pytest.raises(ValueError, match="unknown model preset"):
        weft.models.llama("llama4-1t")
    assert weft.models.llama("llama3-8b", layers=2, seq=16).num_params() == \
        params_by_hand(2, 4096, 32, 8, 14336, 128256)
