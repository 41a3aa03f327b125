"""weft.megatron_specs and weft.megatron_plan: Megatron's column / row / vocabulary splits recognised
from a graph's structure (not its names) and forced on megatron_plan's stages, checked by hand on the
zoo GPT and on GPTs imported from torch; the plans still compute what one device computes."""
import pytest

import weft
from test_execute import assert_same


@pytest.fixture(scope="module")
def cluster():
    return weft.Cluster.preset("p3.8xlarge")


def zoo_step(batch=8):
    return weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=batch).train_step(optimizer="adam")


def stage_specs(plan):
    """{parameter: spec} over the plan's stages (the replica axis' "R " dropped), each once."""
    out = {}
    for st in plan.stages:
        for p in st.params:
            spec = p.spec[2:] if plan.data_parallel > 1 else p.spec
            assert out.setdefault(p.name, spec) == spec, p.name
    return out


def test_zoo_gpt_specs_by_hand():
    step = zoo_step()
    for t in (2, 4):
        s = weft.megatron_specs(step, t)
        c = 64 // t  # a fused QKV [h, 3h] is split per part: stride h / t on its output features
        for l in range(2):
            p = f"h{l}."
            assert s[p + "attn.qkv.w"] == ("column", f"S(1,{c})")
            assert s[p + "attn.qkv.b"] == ("column_bias", f"S(0,{c})")
            assert s[p + "mlp.fc1.w"] == ("column", "S(1)")  # [h, 4h]: output features dim 1
            assert s[p + "mlp.fc1.b"] == ("column_bias", "S(0)")
            assert s[p + "attn.proj.w"] == ("row", "S(0)")  # [h, h]: input features dim 0
            assert s[p + "attn.proj.b"] == ("row_bias", "R")
            assert s[p + "mlp.fc2.w"] == ("row", "S(0)")
            assert s[p + "mlp.fc2.b"] == ("row_bias", "R")
            for n in ("ln1.gamma", "ln1.beta", "ln2.gamma", "ln2.beta"):
                assert s[p + n] == ("replicated", "R")
        assert s["wte"] == ("vocab_embedding", "S(0)")  # tied with the logits
        assert s["wpe"] == ("replicated", "R") and s["ln_f.gamma"] == ("replicated", "R")
        assert set(s) == {t["name"] for t in step.tensors if t["role"] == "parameter" and t["producer"] is None}
    d = weft.megatron_specs(step, 2, detail=True)
    assert d["recognised"] and d["t"] == 2 and "4 column" in d["summary"] and "4 row" in d["summary"]
    assert d["params"]["h0.attn.qkv.w"]["dim"] == 1 and d["params"]["h0.attn.qkv.w"]["stride"] == 32
    # Adam's moments are fixed beside their parameter.
    moments = [t["name"] for t in step.tensors if t["role"] == "optimizer_state" and t["producer"] is None]
    assert moments and all(n in d["fixed"] for n in moments)
    upd = next(o for o in step.ops if o["kind"] == "adam_update" and step.tensor(o["inputs"][0])["name"] == "wte")
    assert {d["fixed"][step.tensor(i)["name"]] for i in upd["inputs"][2:]} == {"S(0)"}
    # The forward graph answers the same; bad input is refused.
    assert weft.megatron_specs(weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128), 4) == \
        weft.megatron_specs(step, 4)
    with pytest.raises(ValueError):
        weft.megatron_specs(step, 0)
    with pytest.raises(TypeError):
        weft.megatron_specs("gpt", 2)


def test_zoo_gpt_megatron_plan_carries_the_specs_and_equals_one_device(cluster):
    step = zoo_step()
    ref = weft.execute_reference(step)
    for t, p, d in [(2, 2, 1), (4, 1, 1), (2, 1, 2)]:
        plan = weft.megatron_plan(step, cluster, t=t, p=p, d=d, num_microbatches=2)
        assert plan.strategy == f"megatron t={t} p={p} d={d}"
        want = {n: spec for n, (_, spec) in weft.megatron_specs(step, t).items()}
        assert stage_specs(plan) == want
        # the optimizer states follow their parameter on every stage
        fixed = weft.megatron_specs(step, t, detail=True)["fixed"]
        for st in plan.stages:
            for name, spec in st.leaf_specs.items():
                if name in fixed:
                    assert spec == fixed[name], name
        assert_same(weft.execute(plan, step, cluster), ref, 1e-10)


def reduced_partials(prog):
    """{tensor: collective kind} of rank 0's collectives that resolve partial sums, and the leaves
    (parameters, optimizer states) any collective of rank 0 moves."""
    reduced, moved = {}, set()
    for i in prog.instructions(0):
        if i["kind"] in ("all-reduce", "reduce-scatter", "all-gather", "all-to-all"):
            name, spec = i["inputs"][0].split("@", 1)
            if spec.startswith("P("):
                reduced[name] = i["kind"]
            moved.add(name)
    return reduced, moved


def test_zoo_gpt_megatron_program_communicates_as_megatron(cluster):
    """Megatron's collectives and no other: per layer one reduction of partial sums after the
    attention and one after the MLP (forward), one per column-parallel input gradient (backward);
    the vocabulary-parallel embedding's and the LM head's input gradient; no weight moves."""
    step = zoo_step()
    plan = weft.megatron_plan(step, cluster, t=4, p=1, d=1, num_microbatches=1)
    reduced, moved = reduced_partials(weft.lower(plan, step, cluster))
    want = {"embed.tokens", "d:logits/in0"}
    for l in range(2):
        want |= {f"h{l}.attn.proj.matmul", f"h{l}.mlp.fc2.matmul",  # row-parallel outputs
                 f"d:h{l}.attn.qkv.matmul/in0", f"d:h{l}.mlp.fc1.matmul/in0"}  # column-parallel dX
    assert set(reduced) == want
    leaves = {t["name"] for t in step.tensors if t["producer"] is None and t["role"] in ("parameter", "optimizer_state")}
    assert not moved & leaves, moved & leaves


torch = pytest.importorskip("torch")
from test_frontend_torch import Gpt, LlamaBlock, gpt_inputs, mse  # noqa: E402


def imported_gpt(tied=True, batch=8):
    torch.manual_seed(0)
    m = Gpt(layers=2, h=32, heads=4, seq=8, vocab=64).double()
    if not tied:
        m.lm_head.weight = torch.nn.Parameter(torch.randn(64, 32, dtype=torch.float64) * 0.1)
    return weft.from_torch(m, gpt_inputs(batch, 8, 64))


def test_imported_gpt_specs_by_hand():
    for tied in (True, False):
        g = imported_gpt(tied)
        s = weft.megatron_specs(g, 2)
        for l in range(2):
            p = f"h.{l}."
            # torch's Linear weights are [out, in]: output features dim 0, input features dim 1
            assert s[p + "attn.c_attn.weight"] == ("column", "S(0,16)")  # [3h, h], split per part
            assert s[p + "attn.c_attn.bias"] == ("column_bias", "S(0,16)")
            assert s[p + "attn.c_proj.weight"] == ("row", "S(1)")
            assert s[p + "attn.c_proj.bias"] == ("row_bias", "R")
            assert s[p + "mlp.0.weight"] == ("column", "S(0)")
            assert s[p + "mlp.0.bias"] == ("column_bias", "S(0)")
            assert s[p + "mlp.2.weight"] == ("row", "S(1)")
            assert s[p + "mlp.2.bias"] == ("row_bias", "R")
            for n in ("ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias"):
                assert s[p + n] == ("replicated", "R")
        assert s["wte.weight"] == ("vocab_embedding", "S(0)")
        assert s["wpe"] == ("replicated", "R") and s["ln_f.weight"] == ("replicated", "R")
        if tied:
            assert "lm_head.weight" not in s
        else:
            assert s["lm_head.weight"] == ("vocab_head", "S(0)")  # [V, h]


def test_imported_llama_block_and_mlp_specs():
    # Separate q / k / v and a SwiGLU MLP, RMS norms written by hand (no norm op cuts the chain).
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    g = weft.from_torch(LlamaBlock().double(), (x,), loss_fn=mse, targets=(torch.randn(2, 6, 16),))
    s = weft.megatron_specs(g, 2)
    for n in ("wq", "wk", "wv", "w1", "w3"):
        assert s[n + ".weight"] == ("column", "S(0)"), n
    for n in ("wo", "w2"):
        assert s[n + ".weight"] == ("row", "S(1)"), n
    assert s["attention_norm.weight"] == ("replicated", "R") and s["ffn_norm.weight"] == ("replicated", "R")
    # A two-linear MLP is Megatron's MLP: column, then row.
    mlp = torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(12, 6))
    s = weft.megatron_specs(weft.from_torch(mlp, (torch.randn(4, 6),), loss_fn=mse, targets=(torch.randn(4, 6),)), 2)
    assert s == {"0.weight": ("column", "S(0)"), "0.bias": ("column_bias", "S(0)"), "2.weight": ("row", "S(1)"),
                 "2.bias": ("row_bias", "R")}


def test_imported_gpt_megatron_plan_carries_the_specs_and_equals_one_device(cluster):
    step = imported_gpt().train_step(optimizer="adam")
    ref = weft.execute_reference(step)
    want = {n: spec for n, (_, spec) in weft.megatron_specs(step, 2).items()}
    for t, p, d in [(2, 1, 2), (2, 2, 1)]:
        plan = weft.megatron_plan(step, cluster, t=t, p=p, d=d, num_microbatches=2)
        assert stage_specs(plan) == want
        assert_same(weft.execute(plan, step, cluster), ref, 1e-10)
    # Megatron's collectives, as on the zoo GPT: 2 forward + 2 backward reductions per layer, the
    # embedding's and the LM head's input gradient; no weight moves.
    plan = weft.megatron_plan(step, cluster, t=4, p=1, d=1, num_microbatches=1)
    reduced, moved = reduced_partials(weft.lower(plan, step, cluster))
    assert len(reduced) == 2 + 4 * 2, reduced
    assert not moved & {t["name"] for t in step.tensors if t["producer"] is None and t["role"] == "parameter"}


def test_a_conv_net_plans_freely_and_says_so(cluster):
    step = weft.models.unet(base_channels=4, depth=1, image=8, batch=4).train_step(optimizer="adam")
    d = weft.megatron_specs(step, 2, detail=True)
    assert not d["recognised"] and "no Megatron roles" in d["summary"]
    assert {r for r, _ in weft.megatron_specs(step, 2).values()} == {"replicated"}
    plan = weft.megatron_plan(step, cluster, t=2, p=1, d=2)
    assert "no Megatron roles recognised" in plan.strategy
    assert weft.execute(plan, step, cluster).max_relative_error(weft.execute_reference(step)) < 1e-9
