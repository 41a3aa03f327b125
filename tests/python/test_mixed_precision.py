"""Mixed-precision training steps: f32 master weights and f32 optimizer states for f16/bf16
parameters (18 bytes per parameter for Adam: ZeRO's 16 with the gradient held in f32, as weft.Trainer
and Megatron-LM keep it), SGD momentum, the Python options, the memory
the planner charges and a model refused that the old 8-byte count let through."""
import json

import numpy as np
import pytest

import weft


def gpt(dtype="f16", layers=1, batch=2):
    return weft.models.gpt(layers=layers, hidden=64, heads=4, seq=16, vocab=128, batch=batch, dtype=dtype)


def n_params(layers=1, h=64, seq=16, vocab=128):
    # GPT's closed form (src/models/transformers.cpp): L·(12h² + 13h) + V·h + S·h + 2h.
    return layers * (12 * h * h + 13 * h) + (vocab + seq) * h + 2 * h


def state_bytes(step):
    return weft._weft.model_state_bytes(step)


def test_static_bytes_per_parameter_by_hand():
    n = n_params()
    assert gpt().num_params() == n
    assert state_bytes(gpt("f16").train_step()) == 18 * n  # 2 + grad in f32 4 + master 4 + m 4 + v 4
    assert state_bytes(gpt("bf16").train_step(master_weights=True)) == 18 * n
    assert state_bytes(gpt("f32").train_step()) == 16 * n  # 4 + 4 + 4 + 4
    assert state_bytes(gpt("f16").train_step(master_weights=False)) == 8 * n  # pure f16: the old count
    assert state_bytes(gpt("f32").train_step(optimizer="sgd")) == 2 * 4 * n  # param + grad
    assert state_bytes(gpt("f16").train_step(optimizer="sgd", master_weights=False)) == 2 * 2 * n
    assert state_bytes(gpt("f16").train_step(optimizer="sgd")) == (2 + 4 + 4) * n
    assert state_bytes(gpt("f32").train_step(optimizer="sgd", momentum=0.9)) == 3 * 4 * n
    assert state_bytes(gpt("f16").train_step(optimizer="sgd", momentum=0.9)) == (2 + 4 + 4 + 4) * n


def test_master_copies_and_states_in_the_graph():
    step = gpt("f16").train_step()
    t = {x["name"]: x for x in step.tensors}
    for p in ("wte", "h0.attn.qkv.w"):
        for prefix in ("master:", "adam_m:", "adam_v:"):
            s = t[prefix + p]
            assert s["dtype"] == "f32" and s["role"] == "optimizer_state" and s["producer"] is None
    adam = next(o for o in step.ops if o["kind"] == "adam_update" and o["name"] == "adam:wte")
    names = [step.tensors[i]["name"] for i in adam["inputs"]]
    assert names == ["wte", "d:wte", "master:wte", "adam_m:wte", "adam_v:wte"]
    assert [step.tensors[i]["dtype"] for i in adam["outputs"]] == ["f16", "f32", "f32", "f32"]
    # The JSON round trip keeps the new form.
    assert weft.Graph.from_json(step.to_json()) == step
    # The defaults and positional arguments of before still work: an f32 model is unchanged.
    f32 = gpt("f32")
    assert f32.train_step("adam", 1e-3) == f32.train_step(master_weights=False)
    assert not any(x["name"].startswith("master:") for x in f32.train_step().tensors)


def test_bad_options():
    g = gpt("f16")
    for bad in ("yes", 1, 0.5):
        with pytest.raises(TypeError, match="master_weights"):
            g.train_step(master_weights=bad)
    with pytest.raises(ValueError, match="momentum must be >= 0"):
        g.train_step(optimizer="sgd", momentum=-0.1)
    with pytest.raises(ValueError, match="sgd option"):
        g.train_step(optimizer="adam", momentum=0.9)


def test_master_weights_train_like_f32_in_f64_storage():
    # The master copy starts as its parameter (exec::LeafValues) and carries the update, so in f64
    # storage the mixed-precision step is the f32 step, for Adam and SGD with momentum.
    for kw in ({}, {"optimizer": "sgd", "lr": 0.1, "momentum": 0.9}):
        mixed = weft.execute_reference(gpt("f16", layers=2).train_step(**kw), steps=3)
        plain = weft.execute_reference(gpt("f32", layers=2).train_step(**kw), steps=3)
        np.testing.assert_allclose(mixed.losses, plain.losses, rtol=1e-12)
        for n, v in plain.parameters.items():
            np.testing.assert_allclose(mixed.parameters[n], v, rtol=1e-12, atol=1e-14, err_msg=n)
        assert mixed.losses[2] != mixed.losses[0]  # the parameters moved (fresh data every step too)


def _one_device(preset="M8"):
    d = json.loads(weft.Cluster.preset(preset, nodes=1).to_json())
    d["nodes"][0]["num_devices"] = 1
    return weft.Cluster.from_json(json.dumps(d))


def test_a_model_that_fitted_under_the_old_count_is_refused():
    # The device's memory is the peak of the pure-f16 plan (8 bytes per parameter + activations):
    # that plan fits by construction; the mixed-precision step's 18 bytes per parameter do not.
    fwd = gpt("f16", layers=2, batch=1)
    old, new = fwd.train_step(master_weights=False), fwd.train_step()
    c = _one_device()
    free = weft.plan(old, c, memory_fraction=1.0, compare_megatron=False)
    limit = free.peak_memory
    assert state_bytes(old) < limit < state_bytes(new)
    assert weft.plan(old, c, memory_limit=limit, memory_fraction=1.0, compare_megatron=False).feasible
    with pytest.raises(ValueError, match="cannot fit"):
        weft.plan(new, c, memory_limit=limit, memory_fraction=1.0, compare_megatron=False)
    # The Megatron baseline (one device: t = p = d = 1) is refused too, for the same memory.
    weft.megatron_plan(old, c, t=1, p=1, d=1, memory_limit=limit, memory_fraction=1.0)
    with pytest.raises(ValueError, match="does not fit|cannot fit"):
        weft.megatron_plan(new, c, t=1, p=1, d=1, memory_limit=limit, memory_fraction=1.0)
