"""Context parallelism (issue 37): the sequence split over devices through the fused attention op, as
Llama 3 trains it — each device keeps its own queries, gathers the keys and values in the forward
and reduce-scatters their gradients in the backward (the backward's query sequence is a sum
reduction that dq carries). Equal to one device on the CPU executor (alone, with data parallelism
beside it) and on gloo processes with a causal mask over split queries; the SPMD search chooses it
by itself where the heads cannot cover the devices."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import weft  # noqa: E402
from test_attention import CausalLM, lm_example  # noqa: E402
from test_module_values import assert_trained_like_torch, torch_train  # noqa: E402

KW = dict(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8)


@pytest.fixture(scope="module")
def cluster():
    return weft.Cluster.preset("p3.8xlarge")


@pytest.fixture(scope="module")
def zoo_step():
    return weft.models.gpt(**KW, fused_attention=True).train_step(optimizer="adam")


def cp_specs(step, axes, cyclic=False):
    """Fixed specs that split the sequence on every mesh axis in `axes` ("seq", or "batch" for data
    parallelism beside it): the inputs' [b, s], every attention's q, k, v [b, h, s, d] (k and v must
    then be gathered), its results and its gradient dq (dk, dv are then partial sums to reduce). cyclic: the
    sequence dealt one position at a time (stride 1) instead of in blocks."""
    def spec(seq_dim):
        return " ".join((f"S({seq_dim},1)" if cyclic else f"S({seq_dim})") if a == "seq" else "S(0)" for a in axes)
    name = lambda i: step.tensor(i)["name"]  # noqa: E731
    fixed = {name(i): spec(1) for i in range(len(step.tensors))
             if step.tensor(i)["role"] == "input" and len(step.tensor(i)["shape"]) == 2}
    for op in step.ops:
        if op["kind"] == "attention":  # q, k, v; out [b, h, s, e] and lse [b, h, s]
            fixed.update({name(i): spec(2) for i in op["inputs"] + op["outputs"]})
        elif op["kind"] == "attention_grad":  # dq; dk and dv are the partial sums
            fixed[name(op["outputs"][0])] = spec(2)
    return fixed


def cp_program(step, cluster, dims, axes, cyclic=False):
    mesh = weft.DeviceMesh(dims, range(int(np.prod(dims))))
    result = weft.spmd_search(step, cluster, mesh, level="O2", time_limit=20,
                              fixed_specs=cp_specs(step, axes, cyclic))
    return result, weft.lower_spmd(step, cluster, mesh, result)


def attention_strategies(step, result):
    return {op["name"]: result.op_strategies[op["name"]] for op in step.ops if op["kind"].startswith("attention")}


@pytest.mark.parametrize("dims, axes, want", [([2], ["seq"], "s:x"), ([4], ["seq"], "s:x"),
                                              ([2, 2], ["batch", "seq"], "b0:x s:y")])
def test_context_parallel_equals_one_device_on_the_executor(dims, axes, want, zoo_step, cluster):
    result, program = cp_program(zoo_step, cluster, dims, axes)
    # forward and backward attention split by the queries; the keys and values gathered forward and
    # their gradients reduce-scattered backward, two per layer (dk, dv)
    strategies = attention_strategies(zoo_step, result)
    assert len(strategies) == 4 and set(strategies.values()) == {want}, strategies
    ev = weft.spmd.evaluate_plan(result, cluster)
    assert ev["collectives"].get("reduce-scatter", 0) >= 4 and ev["collectives"].get("all-gather", 0) >= 4
    assert {n.split(":")[-1] for n in ev["partial_reductions"] if "attn.core" in n} >= {"1", "2"}
    ref = weft.execute_reference(zoo_step, steps=3)
    # the partial sums of dk and dv add in another order: Adam's three steps amplify it to ~1e-11
    assert weft.execute(program, steps=3).max_relative_error(ref) < 1e-9


@pytest.fixture(scope="module")
def causal_step():
    torch.manual_seed(3)
    return weft.from_torch(CausalLM().double(), lm_example()).train_step(optimizer="sgd", lr=0.1)


def query_rows(step, program):
    layout = weft._weft.ProgramLayout(program)
    kinds = {i: o["kind"] for i, o in enumerate(step.ops)}
    return [[int(x) for x in ins["context"]["element_index"][2]] for r in range(program.num_ranks)
            for ins in layout.instructions(r) if ins["kind"] == "compute" and kinds[ins["op"]] == "attention_grad"]


@pytest.mark.parametrize("cyclic", [False, True])
def test_causal_context_parallel_on_2_gloo_processes_equals_one_device(cyclic, causal_step, cluster):
    result, program = cp_program(causal_step, cluster, [2], ["seq"], cyclic)
    assert set(attention_strategies(causal_step, result).values()) == {"s/1:x" if cyclic else "s:x"}
    # each rank's causal mask compares its queries' global positions (block: rank 1 holds queries
    # 4..7; cyclic: the odd ones)
    assert query_rows(causal_step, program) == ([[0, 2, 4, 6], [1, 3, 5, 7]] if cyclic else
                                                [[0, 1, 2, 3], [4, 5, 6, 7]])
    ref = weft.execute_reference(causal_step, steps=2)
    assert weft.execute(program, steps=2).max_relative_error(ref) < 1e-12
    got = weft.run(program, steps=2, dtype="f64")
    np.testing.assert_allclose(got.losses, ref.losses, rtol=1e-12)
    assert got.max_relative_error(ref) < 1e-12


def test_the_search_chooses_context_parallelism_when_heads_cannot_cover_the_devices():
    """A long sequence (8192) with 2 heads on 8 A100s: splitting the heads leaves 4 devices idle per
    head, so the search splits the sequence through the attention instead (no Megatron split of
    2 heads 8 ways); with 8 heads it splits the heads (the sequence elsewhere, DeepSpeed-Ulysses'
    layout). Forward and backward attention agree."""
    cluster = weft.Cluster.preset("DGX-A100")
    mesh = weft.DeviceMesh([8], range(8))
    for heads, want in ((2, "s:x"), (8, "b1:x")):
        step = weft.models.gpt(layers=2, hidden=1024, heads=heads, seq=8192, vocab=8192, batch=1, dtype="bf16",
                               fused_attention=True).train_step(optimizer="adam")
        result = weft.spmd_search(step, cluster, mesh, level="O2", time_limit=30)
        assert set(attention_strategies(step, result).values()) == {want}, heads


def test_weft_plan_picks_context_parallelism_for_a_long_sequence_with_few_heads():
    """weft.plan on that model (4 layers, 8192 tokens, 2 heads, batch 1: nothing to split by the
    batch) lays every attention out split by the queries on all 8 GPUs, weights replicated (their
    gradients all-reduced), and predicts it faster than Megatron's t=8 baseline it lists."""
    step = weft.models.gpt(layers=4, hidden=1024, heads=2, seq=8192, vocab=8192, batch=1, dtype="bf16",
                           fused_attention=True).train_step(optimizer="adam")
    plan = weft.plan(step, weft.Cluster.preset("DGX-A100"), time_limit=120)
    attention = {op["name"] for op in step.ops if op["kind"].startswith("attention")}
    s = next(op for op in step.ops if op["kind"] == "attention")
    assert s["index_map"].startswith("[b0 b1 s d]")  # factors b0, b1, s, ...: s is factor 2
    assert len(plan.stages) == 1 and plan.stages[0].mesh_shape == [8]
    assert {tuple(lay.factors) for lay in plan.stages[0].op_layouts if lay.op in attention} == {(2,)}
    megatron = [a for a in plan.alternatives if a.strategy.startswith("megatron t=8")]
    assert megatron and plan.step_time < megatron[0].step_time


@pytest.mark.parametrize("cyclic", [False, True])
def test_context_parallel_trains_the_users_module_like_torch(cyclic, cluster):
    """The user's causal SDPA module, imported with its own weights, trained 3 Adam steps under context
    parallelism (its sequence split over 2 gloo processes, in blocks or cyclically) equals the same module
    trained by plain torch autograd + torch.optim.Adam."""
    torch.manual_seed(3)
    module, ex = CausalLM().double(), lm_example()
    step = weft.from_torch(module, ex).train_step(optimizer="adam", lr=1e-2)
    result, program = cp_program(step, cluster, [2], ["seq"], cyclic)
    assert set(attention_strategies(step, result).values()) == {"s/1:x" if cyclic else "s:x"}
    assert_trained_like_torch(weft.run(program, steps=3, dtype="f64"), *torch_train(module, step, ex))


def causal_stack(s, layers=2, n=2, d=128, h=256):
    """x [1, s, h] through `layers` causal attention blocks with 2 heads (q, k, v and out projections,
    residual adds), loss mean(x · r): nothing to split but the sequence or the 2 heads."""
    g = weft.Graph("causal")
    x, r = g.input("x", [1, s, h]), g.input("r", [1, s, h])
    for i in range(layers):
        q, k, v = (g.einsum("bsh,hnd->bnsd", [x, g.parameter(f"w{i}{c}", [h, n, d])], f"{c}{i}") for c in "qkv")
        o, _ = g.attention(q, k, v, causal=True, name=f"attn{i}")
        x = g.add(x, g.einsum("bnsd,ndh->bsh", [o, g.parameter(f"wo{i}", [n, d, h])], f"y{i}"), f"res{i}")
    g.set_loss(g.reduce("mean", g.mul(x, r, "xr"), [0, 1, 2], "loss"))
    return g.train_step(optimizer="adam")


def test_a_causal_split_is_dealt_cyclically_to_balance_the_tiles():
    """A causal mask gives the last block of queries the most keys (on 8 tiles of 32,768 queries the
    busiest does 1.875x the even share); dealt one query at a time every tile does about the same.
    The search takes the cyclic split through both attention ops and the residual stream (S(1,1)),
    and prices it below the block split forced on the same mesh."""
    step = causal_stack(32768)
    cl, mesh = weft.Cluster.preset("DGX-A100"), weft.DeviceMesh([8], range(8))
    free = weft.spmd_search(step, cl, mesh, level="O2", time_limit=60)
    assert set(attention_strategies(step, free).values()) == {"s/1:x"}
    assert free.specs["res0"] == "S(1,1)"
    block = weft.spmd_search(step, cl, mesh, level="O2", time_limit=60, fixed_specs=cp_specs(step, ["seq"]))
    assert set(attention_strategies(step, block).values()) == {"s:x"}
    # attention is most of the work at this length: the imbalance shows in the compute time
    assert free.compute_time < 0.7 * block.compute_time


def test_a_cyclic_causal_split_equals_one_device_on_4_devices(cluster):
    step = causal_stack(16, d=4, h=8)
    ref = weft.execute_reference(step, steps=3)
    result, program = cp_program(step, cluster, [4], ["seq"], cyclic=True)
    assert set(attention_strategies(step, result).values()) == {"s/1:x"}
    # per rank, its two layers' backward attention: queries r, r + 4, r + 8, r + 12
    assert query_rows(step, program) == [[r, r + 4, r + 8, r + 12] for r in range(4) for _ in range(2)]
    assert weft.execute(program, steps=3).max_relative_error(ref) < 1e-9


@pytest.mark.parametrize("rows", [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [1, 4, 7, 10], [0, 3, 6, 9],
                                  [3, 7, 11], [0, 2, 4, 6, 8, 10]])
def test_the_runtime_runs_a_split_causal_tile_in_fused_pieces(rows):
    """The torch runtime's kernels on a causal tile of split queries (a block, or dealt cyclically over
    n tiles) run torch's fused kernels on pieces — never the tile's s x t mask — and combine them by
    log-sum-exp: the forward equals the whole attention's rows, the backward (torch's CPU flash backward
    per piece, given the tile's own out and lse) the math form's."""
    from weft.runtime.kernels import run_kernel
    g = weft.Graph("tile")
    q, k, v = (g.parameter(n, [2, 3, 12, 4]) for n in "qkv")
    o, _ = g.attention(q, k, v, causal=True, name="a")
    g.set_loss(g.reduce("sum", g.mul(o, g.input("r", [2, 3, 12, 4])), [0, 1, 2, 3]))
    step = g.train_step(optimizer=None)
    fwd, bwd = (next(op for op in step.ops if op["kind"] == kind) for kind in ("attention", "attention_grad"))
    torch.manual_seed(0)
    Q, K, V, dO = (torch.randn(2, 3, 12, 4, dtype=torch.float64) for _ in range(4))
    out, lse = run_kernel(fwd, [Q, K, V], {"out_shapes": [[2, 3, 12, 4], [2, 3, 12]]})
    i, s = torch.tensor(rows), len(rows)
    index = [[0, 1], [0, 1, 2], rows, [0, 1, 2, 3]]
    ctx = {"out_shapes": [[2, 3, s, 4], [2, 3, s]], "element_index": index}
    tile = run_kernel(fwd, [Q[:, :, i], K, V], ctx)
    assert ctx["_attn_pieces"] is not None and "_attn_keep" not in ctx  # pieces, no mask made
    torch.testing.assert_close(tile[0], out[:, :, i], rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(tile[1], lse[:, :, i], rtol=1e-13, atol=1e-14)
    args = [Q[:, :, i], K, V, out[:, :, i], lse[:, :, i], dO[:, :, i]]
    shapes = {"out_shapes": [[2, 3, s, 4], [2, 3, 12, 4], [2, 3, 12, 4]], "element_index": index}
    pieces = run_kernel(bwd, args, dict(shapes))
    math_form = run_kernel(bwd, args, {**shapes, "_attn_pieces": None})  # the pieces turned off
    for a, b in zip(pieces, math_form):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)
