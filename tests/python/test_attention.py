"""The fused attention op (issue 37): Graph.attention forward (out, log-sum-exp) and gradients against
torch autograd in float64 on the interpreter; the torch runtime's kernels (torch's flash kernels
and the math form) against the C++ kernel; the zoo's GPT with fused_attention equal to the unfused
one; batch and heads split over 2x2 and 4 devices on the CPU executor, and a split causal query
sequence, equal to one device; weft.run on 2 gloo processes; F.scaled_dot_product_attention
imported as the op, forward and gradients equal to torch and a few Adam steps trained like torch;
the saved activations O(s), by hand."""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import weft  # noqa: E402
from weft import _weft  # noqa: E402
from test_frontend_gaps import check  # noqa: E402 (forward and gradients against torch)
from test_module_values import assert_trained_like_torch, torch_train  # noqa: E402
from weft.runtime.kernels import run_kernel  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="module")
def cluster():
    return weft.Cluster.preset("p3.8xlarge")


def kinds(g):
    return [op["kind"] for op in g.ops]


def torch_attention(q, k, v, scale, causal):
    """(out, lse) by the textbook formula in torch: causal keeps key j <= query i (torch's is_causal)."""
    s = scale * q @ k.transpose(-1, -2)
    if causal:
        s = s.masked_fill(~torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril(), -math.inf)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def op_graph(b, h, s, t, d, e, scale, causal):
    """loss = Σ out·r of Graph.attention over parameters q, k, v."""
    g = weft.Graph("attn")
    q, k, v = g.parameter("q", [b, h, s, d]), g.parameter("k", [b, h, t, d]), g.parameter("v", [b, h, t, e])
    r = g.input("r", [b, h, s, e])
    out, lse = g.attention(q, k, v, scale=scale, causal=causal, name="attn")
    g.mark_output(lse)
    g.set_loss(g.einsum("bhse,bhse->", [out, r], "loss"))
    return g


# ---- the op alone

@pytest.mark.parametrize("shape, causal", [((2, 3, 5, 7, 4, 6), False), ((2, 3, 6, 6, 4, 4), True),
                                           ((1, 2, 5, 3, 4, 2), True)])
def test_forward_and_gradients_equal_torch_autograd(shape, causal):
    b, h, s, t, d, e = shape
    g = op_graph(b, h, s, t, d, e, 0.4, causal)
    shapes = ([b, h, s, d], [b, h, t, d], [b, h, t, e], [b, h, s, e])
    q, k, v, r = (torch.randn(*x, dtype=torch.float64) for x in shapes)
    feeds = {"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), "r": r.numpy()}
    step = g.train_step(optimizer=None)
    vals = weft.interpret(step, feeds)
    qt, kt, vt = (x.clone().requires_grad_(True) for x in (q, k, v))
    out, lse = torch_attention(qt, kt, vt, 0.4, causal)
    if d == e:  # torch's own SDPA agrees with the textbook formula (its is_causal is top-left aligned)
        torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=0.4), out,
                                   rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(vals["attn:0"], out.detach().numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(vals["attn:1"], lse.detach().numpy(), rtol=1e-12, atol=1e-13)
    loss = (out * r).sum()
    loss.backward()
    assert vals["loss"] == pytest.approx(loss.item(), rel=1e-12)
    for n, x in (("q", qt), ("k", kt), ("v", vt)):
        grad = step.tensor(step.grad(step.find(n)))["name"]
        np.testing.assert_allclose(vals[grad], x.grad.numpy(), rtol=1e-11, atol=1e-12, err_msg=n)
    # One fused backward op: no softmax, nothing of size s x t in the step.
    assert kinds(step).count("attention_grad") == 1 and "softmax" not in kinds(step)
    assert [b, h, s, t] not in [list(x["shape"]) for x in step.tensors]


def test_builder_errors_and_flops():
    g = weft.Graph("e")
    q, k, v = g.input("q", [2, 4, 8, 16]), g.input("k", [2, 4, 8, 16]), g.input("v", [2, 4, 8, 16])
    out, lse = g.attention(q, k, v, name="a")
    assert isinstance(out, weft.Tensor) and lse.dtype == "f32" and list(lse.shape) == [2, 4, 8]
    op = g.ops[-1]
    assert op["attrs"]["scalar"] == pytest.approx(0.25)  # 1/sqrt(16)
    assert op["flops"] == 4 * 2 * 4 * 8 * 8 * 16  # 4·b·h·s·t·d (flash attention's count)
    g.attention(q, k, v, causal=True, name="c")
    assert g.ops[-1]["flops"] == 4 * 2 * 4 * (8 * 9 // 2) * 16  # the 36 unmasked pairs of 64
    with pytest.raises(ValueError, match="q's head dim 16 != k's 8"):
        g.attention(q, g.input("k8", [2, 4, 8, 8]), v)
    with pytest.raises(ValueError, match="leading"):
        g.attention(q, g.input("kb", [2, 2, 8, 16]), v)


def test_a_loss_through_the_log_sum_exp_is_refused():
    g = weft.Graph("lse")
    q = g.parameter("q", [1, 4, 2])
    _, lse = g.attention(q, q, q, name="a")
    g.set_loss(g.reduce("sum", lse, [0, 1]))
    with pytest.raises(ValueError, match="log-sum-exp of an attention"):
        g.train_step(optimizer=None)


# ---- the torch runtime's kernels against the C++ kernel (float64)

@pytest.mark.parametrize("shape, causal", [((2, 3, 6, 6, 4, 4), True), ((2, 3, 5, 7, 4, 4), False),
                                           ((1, 2, 5, 3, 4, 4), True), ((2, 2, 5, 7, 4, 6), True)])
def test_runtime_kernels_equal_the_cpp_kernel(shape, causal):
    """Equal head dims run torch's CPU flash kernels, unequal ones the math form: both to 1e-12."""
    b, h, s, t, d, e = shape
    g = op_graph(b, h, s, t, d, e, 0.3, causal)
    step = g.train_step(optimizer=None)
    feeds = {n: np.random.default_rng(1).standard_normal(step.tensor(step.find(n))["shape"]) for n in "qkvr"}
    vals = weft.interpret(step, feeds)
    name = lambda i: step.tensor(i)["name"]  # noqa: E731
    seen = []
    for op in step.ops:
        if not op["kind"].startswith("attention"):
            continue
        ins = [torch.from_numpy(np.asarray(vals[name(i)], dtype=np.float64)) for i in op["inputs"]]
        ctx = {"out_shapes": [list(step.tensor(i)["shape"]) for i in op["outputs"]]}
        outs = run_kernel(op, ins, ctx)
        for i, o in zip(op["outputs"], outs):
            assert o.dtype == torch.float64
            np.testing.assert_allclose(o.numpy(), vals[name(i)], rtol=1e-12, atol=1e-13, err_msg=op["name"])
        seen.append(op["kind"])
    assert seen == ["attention", "attention_grad"]


def test_runtime_kernel_on_a_causal_tile_of_later_queries():
    """Queries 4..7 of 8 on one rank: the tile's global positions (element_index) set the mask."""
    g = weft.Graph("tile")
    q, k, v = (g.input(n, [2, 8, 4]) for n in "qkv")
    g.attention(q, k, v, causal=True, name="a")
    op = g.ops[-1]
    Q, K, V = (torch.randn(2, 8, 4, dtype=torch.float64) for _ in range(3))
    whole = run_kernel(op, [Q, K, V], {"out_shapes": [[2, 8, 4], [2, 8]]})
    tile = run_kernel(op, [Q[:, 4:], K, V], {"out_shapes": [[2, 4, 4], [2, 4]],
                                           "element_index": [[0, 1], [4, 5, 6, 7], [0, 1, 2, 3]]})
    torch.testing.assert_close(tile[0], whole[0][:, 4:], rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(tile[1], whole[1][:, 4:], rtol=1e-13, atol=1e-14)
    ref = weft.interpret(g, {"q": Q.numpy(), "k": K.numpy(), "v": V.numpy()})
    np.testing.assert_allclose(whole[0].numpy(), ref["a:0"], rtol=1e-12, atol=1e-13)


# ---- the zoo's GPT

KW = dict(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8)


@pytest.fixture(scope="module")
def fused_step():
    return weft.models.gpt(**KW, fused_attention=True).train_step(optimizer="adam")


@pytest.fixture(scope="module")
def fused_reference(fused_step):
    return weft.execute_reference(fused_step, steps=3)


def test_zoo_gpt_fused_equals_unfused(fused_step, fused_reference):
    assert kinds(fused_step).count("attention") == 2 and kinds(fused_step).count("attention_grad") == 2
    assert "softmax" not in kinds(fused_step)
    plain = weft.models.gpt(**KW).train_step(optimizer="adam")
    assert fused_step.num_params() == plain.num_params()
    # the same function, the same seeded weights: three Adam steps agree (Adam divides by √v: 1e-11)
    ref = weft.execute_reference(plain, steps=3)
    np.testing.assert_allclose(fused_reference.losses, ref.losses, rtol=1e-13)
    assert fused_reference.max_relative_error(ref) < 1e-9
    with pytest.raises(TypeError, match="fused_attention must be a bool"):
        weft.models.gpt(**KW, fused_attention="yes")


def test_a_causal_zoo_gpt_masks_its_fused_attention(cluster):
    """causal=True: the fused op masks causally (about half the work), split by the heads it equals one
    device, and unfused it is refused (that form has no mask)."""
    step = weft.models.gpt(**KW, fused_attention=True, causal=True).train_step(optimizer="adam")
    attn = [op for op in step.ops if op["kind"] == "attention"]
    plain = [op for op in weft.models.gpt(**KW, fused_attention=True).ops if op["kind"] == "attention"]
    assert [op["attrs"]["ints"] for op in attn] == [[1], [1]]
    # 8 queries: 1 + ... + 8 = 36 of 64 pairs
    assert [op["flops"] for op in attn] == pytest.approx([op["flops"] * 36 / 64 for op in plain])
    mesh = weft.DeviceMesh([2], range(2))
    result = weft.spmd_search(step, cluster, mesh, level="O2", time_limit=10,
                              fixed_specs={n: "S(1)" for n in HEADS})
    got = weft.execute(weft.lower_spmd(step, cluster, mesh, result), steps=3)
    # (another summation order of the split projections; Adam's three steps amplify it to ~6e-12)
    assert got.max_relative_error(weft.execute_reference(step, steps=3)) < 1e-9
    with pytest.raises(ValueError, match="causal=True needs fused_attention=True"):
        weft.models.gpt(**KW, causal=True)
    with pytest.raises(TypeError, match="causal must be a bool"):
        weft.models.gpt(**KW, fused_attention=True, causal=1)


HEADS = ["h0.attn.q_heads", "h0.attn.k_heads", "h0.attn.v_heads", "h1.attn.q_heads", "h1.attn.k_heads",
         "h1.attn.v_heads"]


def spmd_program(step, cluster, mesh, spec, shared=False):
    result = weft.spmd_search(step, cluster, mesh, level="O2", time_limit=10,
                              fixed_specs={n: spec for n in HEADS}, shared_resharding=shared)
    return result, weft.lower_spmd(step, cluster, mesh, result)


def attention_specs(step, result):
    name = lambda i: step.tensor(i)["name"]  # noqa: E731
    return {op["name"]: [result.spec_of(name(i)) for i in op["inputs"] + op["outputs"]]
            for op in step.ops if op["kind"].startswith("attention")}


@pytest.mark.parametrize("dims, spec", [([2, 2], "S(0) S(1)"), ([4], "S(1)"), ([2], "S(0)")])
def test_executor_with_batch_and_heads_split_equals_one_device(dims, spec, fused_step, fused_reference, cluster):
    mesh = weft.DeviceMesh(dims, range(int(np.prod(dims))))
    result, program = spmd_program(fused_step, cluster, mesh, spec)
    specs = attention_specs(fused_step, result)
    assert len(specs) == 4  # two forward, two backward ops: every operand and result split as fixed
    for op, ss in specs.items():
        assert set(ss) == {spec}, (op, ss)
    assert weft.execute(program, steps=3).max_relative_error(fused_reference) < 1e-12


def test_megatron_layout_splits_the_attention_by_heads(fused_step, fused_reference, cluster):
    """Megatron's column-parallel QKV carries its head split through the fused op (its leading dims
    are parallel): out and lse split over the heads, then the row-parallel projection."""
    res = weft.megatron_specs(fused_step, 2, detail=True)["results"]
    for layer in ("h0", "h1"):
        assert res[f"{layer}.attn.q_heads"] == res[f"{layer}.attn.core:0"] == res[f"{layer}.attn.core:1"] == "S(1)"
    plan = weft.megatron_plan(fused_step, cluster, t=2, p=1, d=2, num_microbatches=2)
    assert weft.execute(plan, fused_step, cluster, steps=3).max_relative_error(fused_reference) < 1e-9


def test_weft_run_on_2_processes_with_heads_split(fused_step, fused_reference, cluster):
    _, program = spmd_program(fused_step, cluster, weft.DeviceMesh([2], range(2)), "S(1)")
    got = weft.run(program, steps=3, dtype="f64")
    np.testing.assert_allclose(got.losses, fused_reference.losses, rtol=1e-12)
    assert got.max_relative_error(fused_reference) < 1e-10


# ---- memory: O(s) saved activations, by hand

def small_model(fused, s, b=2, n=2, d=8, H=16):
    g = weft.Graph("m")
    x, r = g.input("x", [b, s, H]), g.input("r", [b, s, H])
    q, k, v = (g.einsum("bsh,hnd->bnsd", [x, g.parameter("w" + c, [H, n, d])], c) for c in "qkv")
    if fused:
        o, _ = g.attention(q, k, v, name="attn")
    else:
        scores = g.einsum("bnsd,bntd->bnst", [g.scale(q, d ** -0.5, "qs"), k], "scores")
        o = g.einsum("bnst,bntd->bnsd", [g.softmax(scores, -1, "probs"), v], "ctx")
    y = g.einsum("bnsd,ndh->bsh", [o, g.parameter("wo", [n, d, H])], "y")
    g.set_loss(g.reduce("mean", g.mul(y, r, "yr"), [0, 1, 2], "loss"))
    return g.train_step(optimizer="adam")


def test_saved_activations_are_linear_in_the_sequence(cluster):
    def saved(fused, s):
        p = weft.layout_plan(small_model(fused, s), cluster, [(0, 0, [0])], num_blocks=1, recompute="none")
        return p.stages[0].activation_memory

    # By hand (f32, b = 2, n = 2 heads, d = 8, H = 16), what the backward reads of the forward:
    # x and r [b, s, H] (the weight gradients, the product's), q, k, v, out [b, n, s, d] (the
    # attention's backward; out also wo's gradient) and the lse [b, n, s]:
    # (2·2·s·16 + 4·2·2·s·8 + 2·2·s)·4 = 784·s bytes; s = 64: 50176.
    assert saved(True, 64) == 784 * 64
    assert saved(True, 128) == 784 * 128
    # Unfused: the probabilities [b, n, s, s] too, with q and the scaled q (the scale's gradient
    # reads q): (2·2·s·16 + 6·2·2·s·8 + 2·2·s·s)·4 = 896·s + 16·s² bytes.
    assert saved(False, 64) == 896 * 64 + 16 * 64 ** 2
    assert saved(False, 128) == 896 * 128 + 16 * 128 ** 2


# ---- the importer: scaled_dot_product_attention as the op

class CausalLM(nn.Module):
    """Token embedding, one causal SDPA block (fused qkv, heads as [b, h, s, d]), a tied head."""

    def __init__(self, vocab=32, d=16, heads=2, scale=None, causal=True, dropout=0.0, mask=False):
        super().__init__()
        self.heads, self.hd, self.scale, self.causal, self.dropout = heads, d // heads, scale, causal, dropout
        self.emb = nn.Embedding(vocab, d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)
        self.mask = mask

    def forward(self, tokens, labels):
        b, s = tokens.shape
        x = self.emb(tokens)
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
        m = torch.ones(s, s, dtype=torch.bool).tril() if self.mask else None
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=m, dropout_p=self.dropout, is_causal=self.causal,
                                           scale=self.scale)
        x = self.norm(x + self.proj(y.transpose(1, 2).reshape(b, s, -1)))
        return F.cross_entropy((x @ self.emb.weight.t()).reshape(b * s, -1), labels.reshape(-1))


def lm_example(b=4, s=8, vocab=32):
    return torch.randint(0, vocab, (b, s)), torch.randint(0, vocab, (b, s))


@pytest.mark.parametrize("kw", [{}, {"scale": 0.3}, {"causal": False}])
def test_imported_sdpa_is_the_fused_op_and_equals_torch(kw):
    m = CausalLM(**kw).double()
    g = check(m, lm_example())
    assert kinds(g).count("attention") == 1 and "softmax" not in kinds(g)
    op = next(o for o in g.ops if o["kind"] == "attention")
    assert op["attrs"]["ints"] == [0 if kw.get("causal") is False else 1]
    assert op["attrs"]["scalar"] == pytest.approx(kw.get("scale", 1 / math.sqrt(8)))
    # the result's transpose back to [b, s, h, d] is one transpose op after the attention
    out = op["outputs"][0]
    assert [o["kind"] for o in g.ops if out in o["inputs"]] == ["transpose"]


def test_masks_dropout_and_fused_attention_false_import_unfused():
    ex = lm_example()
    for kw in ({"mask": True, "causal": False}, {"dropout": 0.2}):
        g = weft.from_torch(CausalLM(**kw).double(), ex)
        assert "attention" not in kinds(g) and "softmax" in kinds(g), kw
    m = CausalLM().double()
    plain = weft.from_torch(m, ex, fused_attention=False)
    assert "attention" not in kinds(plain) and "softmax" in kinds(plain)
    fused = weft.from_torch(m, ex)
    loss = lambda g, f: weft.interpret(g, weft.feeds_from_torch(m, ex, fused_attention=f))[  # noqa: E731
        g.tensor(g.loss)["name"]]
    assert loss(fused, True) == pytest.approx(loss(plain, False), rel=1e-13)
    with pytest.raises(TypeError, match="fused_attention must be a bool"):
        weft.from_torch(m, ex, fused_attention=1)


@pytest.fixture(scope="module")
def imported():
    torch.manual_seed(3)
    module = CausalLM().double()
    ex = lm_example()
    step = weft.from_torch(module, ex).train_step(optimizer="adam", lr=1e-2)
    return module, ex, step


def test_imported_sdpa_trains_like_torch_on_the_executor(imported, cluster):
    module, ex, step = imported
    want = torch_train(module, step, ex)
    assert_trained_like_torch(weft.execute_reference(step, steps=3), *want)
    # the query sequence split over 2 devices (the op's s is parallel; keys and values whole):
    # each tile masks by its rows' global positions
    att = next(o for o in step.ops if o["kind"] == "attention")
    name = lambda i: step.tensor(i)["name"]  # noqa: E731
    fixed = {name(att["inputs"][0]): "S(2)", name(att["outputs"][0]): "S(2)", name(att["outputs"][1]): "S(2)"}
    mesh = weft.DeviceMesh([2], range(2))
    result = weft.spmd_search(step, cluster, mesh, level="O2", time_limit=10, fixed_specs=fixed)
    assert result.spec_of(name(att["outputs"][0])) == "S(2)"
    assert result.spec_of(name(att["inputs"][1])) == "R"  # the keys stay whole
    program = weft.lower_spmd(step, cluster, mesh, result)
    assert_trained_like_torch(weft.execute(program, steps=3), *want)
    plan = weft.plan(step, cluster)
    assert_trained_like_torch(weft.execute(plan, step, cluster, steps=3), *want)


def test_imported_sdpa_weft_run_on_2_processes_trains_like_torch(imported, cluster):
    module, ex, step = imported
    att = next(o for o in step.ops if o["kind"] == "attention")
    name = lambda i: step.tensor(i)["name"]  # noqa: E731
    fixed = {name(att["inputs"][0]): "S(2)", name(att["outputs"][0]): "S(2)", name(att["outputs"][1]): "S(2)"}
    mesh = weft.DeviceMesh([2], range(2))
    result = weft.spmd_search(step, cluster, mesh, level="O2", time_limit=10, fixed_specs=fixed)
    got = weft.run(weft.lower_spmd(step, cluster, mesh, result), steps=3, dtype="f64")
    assert_trained_like_torch(got, *torch_train(module, step, ex))


# ---- random layouts: every strategy of the index maps, the causal queries split 2 and 4 ways

def query_rows(step, program):
    """Per rank, the global query positions of its attention tile (the causal mask's element index)."""
    layout = _weft.ProgramLayout(program)
    kinds_of = {i: o["kind"] for i, o in enumerate(step.ops)}
    return [[int(x) for x in ins["context"]["element_index"][2]] for r in range(program.num_ranks)
            for ins in layout.instructions(r) if ins["kind"] == "compute" and kinds_of[ins["op"]] == "attention"]


@pytest.fixture(scope="module")
def imported_sgd():
    torch.manual_seed(3)
    return weft.from_torch(CausalLM().double(), lm_example()).train_step(optimizer="sgd", lr=0.1)


@pytest.mark.parametrize("dims", [[2, 2], [4], [2]])
def test_random_layouts_equal_one_device(dims, imported_sgd, cluster):
    ref = weft.execute_reference(imported_sgd, steps=2)
    mesh = weft.DeviceMesh(dims, range(int(np.prod(dims))))
    split = 0
    for seed in range(8):
        program = weft.lower_random(imported_sgd, cluster, mesh, seed)
        split += any(rows != list(range(8)) for rows in query_rows(imported_sgd, program))
        assert weft.execute(program, steps=2).max_relative_error(ref) < 1e-13, seed
    assert split >= 1  # some layouts split the causal query sequence (tiles starting past 0)


def test_weft_run_random_layout_with_split_queries(imported_sgd, cluster):
    mesh = weft.DeviceMesh([2], range(2))
    program = next(p for p in (weft.lower_random(imported_sgd, cluster, mesh, s) for s in range(16))
                   if [4, 5, 6, 7] in query_rows(imported_sgd, p))
    got = weft.run(program, steps=2, dtype="f64")
    assert got.max_relative_error(weft.execute_reference(imported_sgd, steps=2)) < 1e-12


# ---- attention written out (nanoGPT / minGPT): recognised as the fused op

class WrittenOut(nn.Module):
    """One causal attention block written out: q @ kᵀ, a scale, masked_fill of a causal buffer with
    -inf, softmax, @ v. ``form``: "not_tril" (masked_fill(~tril)), "eq0" (nanoGPT: the buffer
    [1, 1, S, S] sliced to the sequence, == 0), "mul" (a multiplied scale), "triu" (an anti-causal
    mask: not fused), "used" (the probabilities also feed the loss: not fused)."""

    def __init__(self, vocab=32, d=16, heads=2, seq=8, form="not_tril"):
        super().__init__()
        self.heads, self.hd, self.form = heads, d // heads, form
        self.emb = nn.Embedding(vocab, d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.proj = nn.Linear(d, d)
        tril = torch.tril(torch.ones(seq + 2, seq + 2, dtype=torch.bool))
        self.register_buffer("bias", tril.view(1, 1, seq + 2, seq + 2) if form == "eq0" else tril[:seq, :seq])

    def forward(self, tokens, labels):
        b, s = tokens.shape
        x = self.emb(tokens)
        q, k, v = (f(x).view(b, s, self.heads, self.hd).transpose(1, 2) for f in (self.q, self.k, self.v))
        att = q @ k.transpose(-2, -1)
        att = att * (1.0 / math.sqrt(self.hd)) if self.form == "mul" else att / math.sqrt(self.hd)
        if self.form == "eq0":
            att = att.masked_fill(self.bias[:, :, :s, :s] == 0, float("-inf"))
        elif self.form == "triu":
            att = att.masked_fill(~self.bias.t(), float("-inf"))  # keeps the future: not causal
        else:
            att = att.masked_fill(~self.bias, float("-inf"))
        att = att.softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, -1)
        loss = F.cross_entropy((x + self.proj(y)).reshape(b * s, -1) @ self.emb.weight.t(), labels.reshape(-1))
        return loss + att.mean() if self.form == "used" else loss


@pytest.mark.parametrize("form", ["not_tril", "eq0", "mul"])
def test_written_out_causal_attention_imports_as_the_fused_op(form):
    torch.manual_seed(0)
    m = WrittenOut(form=form).double()
    g = check(m, lm_example())  # forward and gradients equal torch's
    assert kinds(g).count("attention") == 1 and "softmax" not in kinds(g), kinds(g)
    op = next(o for o in g.ops if o["kind"] == "attention")
    assert op["attrs"]["ints"] == [1]  # causal
    assert op["attrs"]["scalar"] == pytest.approx(1 / math.sqrt(8), rel=1e-15)
    plain = weft.from_torch(m, lm_example(), fused_attention=False)
    assert "attention" not in kinds(plain) and "softmax" in kinds(plain)


@pytest.mark.parametrize("form", ["triu", "used"])
def test_written_out_attention_that_is_not_causal_or_is_reused_stays_unfused(form):
    torch.manual_seed(0)
    m = WrittenOut(form=form).double()
    g = check(m, lm_example())
    assert "attention" not in kinds(g) and "softmax" in kinds(g)


def test_written_out_attention_trains_like_torch_on_the_executor():
    torch.manual_seed(1)
    module = WrittenOut().double()
    ex = lm_example()
    step = weft.from_torch(module, ex).train_step(optimizer="adam", lr=1e-2)
    assert "attention" in kinds(step)
    assert_trained_like_torch(weft.execute_reference(step, steps=3), *torch_train(module, step, ex))
