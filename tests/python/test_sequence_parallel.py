"""Megatron's sequence parallelism (Korthikanti et al., MLSys 2023; issue 37): the residual stream
between a row-parallel (partial) result and the next weight matmul — bias adds, dropout, residual adds,
layer norms — split along the tokens over the tensor-parallel group, so each partial sum is
reduce-scattered instead of all-reduced and each column-parallel matmul all-gathers its input."""

import numpy as np
import pytest

import weft
import weft.models as wm


def tiny(dtype="f64", layers=2, batch=8):
    return wm.gpt(layers=layers, hidden=32, heads=4, seq=16, vocab=64, batch=batch, dtype=dtype,
                  hidden_dropout=0.1).train_step(optimizer="adam")


def test_the_sequence_parallel_specs_by_hand():
    step = tiny()
    plain = weft.megatron_specs(step, 2, detail=True)
    sp = weft.megatron_specs(step, 2, detail=True, sequence_parallel=True)
    assert plain["sequence"] == {}
    forward = {k: v for k, v in sp["sequence"].items() if not k.startswith("d:")}
    # Megatron's sequence-parallel region, layer by layer ([b, s, h] tensors, split along s = dim 1):
    # the embedding sum and its dropout; per block the attention's output after its bias, its dropout,
    # the residual add, the second norm, the MLP's output after its bias, its dropout, the residual add
    # and the next block's first norm; the final norm. Not the matmuls' own results.
    want = {"embed", "embed.dropout", "ln_f"}
    for l in range(2):
        want |= {f"h{l}.{n}" for n in ("ln1", "attn.proj", "attn.dropout", "res1", "ln2", "mlp.fc2",
                                       "mlp.dropout", "res2")}
    assert set(forward) == want and set(forward.values()) == {"S(1)"}
    # the row results stay partial sums (their reduce-scatter happens on the way into the region) ...
    for l in range(2):
        for row in (f"h{l}.attn.proj.matmul", f"h{l}.mlp.fc2.matmul"):
            assert sp["results"][row] == plain["results"][row] == "P(sum)"
    # the region's gradients keep the split; a column matmul's input gradient is left to the search
    # (made as partial sums and reduce-scattered)
    assert sp["results"]["d:h0.res1"] == "S(1)" and "d:h0.attn.qkv.matmul/in0" not in sp["sequence"]
    for name, spec in forward.items():
        assert sp["fixed"][name] == spec and sp["boundaries"][name] == spec
    # parameters keep Megatron's roles
    assert {n: p["spec"] for n, p in sp["params"].items()} == {n: p["spec"] for n, p in plain["params"].items()}
    with pytest.raises(TypeError, match="sequence_parallel must be a bool"):
        weft.megatron_specs(step, 2, sequence_parallel=1)


def collectives(prog, rank=0):
    return [(i["kind"], i["inputs"][0]) for i in prog.instructions(rank)
            if i["kind"] in ("all-reduce", "reduce-scatter", "all-gather", "all-to-all") and not i["internal"]]


def test_megatrons_collectives_and_less_memory_on_a_wide_gpt():
    # 2 layers of GPT-2.7B's width at seq 2048 on 8 A100 (t=8): large enough that the search takes
    # Megatron's own collectives (on a tiny model gathering a weight can be cheaper, and it does).
    step = wm.gpt(layers=2, hidden=2560, heads=32, seq=2048, vocab=51200, batch=1,
                  dtype="f16").train_step(optimizer="adam")
    cl = weft.Cluster.preset("DGX-A100", nodes=1)
    plans = {sp: weft.megatron_plan(step, cl, t=8, p=1, d=1, sequence_parallel=sp, recompute="none", zero=0)
             for sp in (False, True)}
    got = collectives(weft.lower(plans[True], step, cl))
    rs = [t for k, t in got if k == "reduce-scatter"]
    ag = [t for k, t in got if k == "all-gather"]
    ar = [t for k, t in got if k == "all-reduce"]
    # forward: each partial sum (the embedding's, two rows per layer) reduce-scattered, each column
    # input (two norms per layer, the final norm before the head) all-gathered; backward: each column
    # input gradient (two per layer, the head's) reduce-scattered, each row output gradient (and the
    # embedding's) all-gathered; only the norms' parameter gradients are all-reduced.
    assert sorted(rs[:5]) == sorted(["embed.tokens@P(sum)"] + [f"h{l}.{r}.matmul@P(sum)" for l in (0, 1)
                                                                for r in ("attn.proj", "mlp.fc2")])
    assert sorted(ag[:5]) == sorted(["ln_f@S(1)"] + [f"h{l}.ln{i}@S(1)" for l in (0, 1) for i in (1, 2)])
    assert len(rs) == 10 and len(ag) == 10
    assert all("/params:" in t for t in ar) and len(ar) == 10  # gamma and beta of 5 norms
    assert not any(k == "all-to-all" for k, _ in got)
    plain = collectives(weft.lower(plans[False], step, cl))
    assert sum(k == "all-reduce" and "/params:" not in t for k, t in plain) > 0
    # the region's saved activations are split t ways: less memory per micro-batch; its element-wise
    # ops run on 1/t of the tokens
    assert plans[True].stages[0].activation_memory < 0.8 * plans[False].stages[0].activation_memory
    assert plans[True].step_time < plans[False].step_time


def test_the_free_search_finds_sequence_parallelism_itself():
    """Sequence parallelism is in make_plan's search space without the option: an SPMD stage's search
    (no fixed specs) on 8 A100s of a wide GPT with dropout keeps the residual stream and the norms
    split along the tokens ([b, s, h]: S(1)) and resolves the row matmuls' partial sums by
    reduce-scatters, with no all-reduce at all."""
    step = wm.gpt(layers=2, hidden=2560, heads=32, seq=2048, vocab=51200, batch=4, dtype="bf16",
                  hidden_dropout=0.1, attention_dropout=0.1).train_step(optimizer="adam")
    cl = weft.Cluster.preset("DGX-A100", nodes=1)
    result = weft.spmd_search(step, cl, weft.DeviceMesh([8], range(8)), level="O2", time_limit=60)
    for layer in ("h0", "h1"):
        assert result.specs[f"{layer}.res1"] == result.specs[f"{layer}.ln2"] == "S(1)"
        assert result.specs[f"{layer}.mlp.fc2.matmul"] == "P(sum)"
    counts = weft.spmd.evaluate_plan(result, cl)["collectives"]
    assert counts.get("reduce-scatter", 0) > 0 and "all-reduce" not in counts, counts


@pytest.mark.parametrize("t,p,d", [(2, 1, 2), (4, 1, 1), (2, 2, 1)])
def test_sequence_parallel_plans_equal_one_device_on_the_cpu_executor(t, p, d):
    step = tiny()
    c4 = weft.Cluster.preset("p3.8xlarge")
    plan = weft.megatron_plan(step, c4, t=t, p=p, d=d, sequence_parallel=True, num_microbatches=2)
    got = weft.execute(plan, step, c4, steps=2)
    assert got.max_relative_error(weft.execute_reference(step, steps=2)) < 1e-10


def test_sequence_parallel_on_4_gloo_processes_trains_like_one_device():
    step = tiny()
    c4 = weft.Cluster.preset("p3.8xlarge")
    plan = weft.megatron_plan(step, c4, t=4, p=1, d=1, sequence_parallel=True)
    got = weft.run(plan, step, c4, steps=2, dtype="f64")
    ref = weft.execute_reference(step, steps=2)
    np.testing.assert_allclose(got.losses, ref.losses, rtol=1e-10)
    assert got.max_relative_error(ref) < 1e-10
