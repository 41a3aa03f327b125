import json

import numpy as np
import pytest

import weft


def mlp(batch=4, d_in=3, hidden=5, classes=4):
    g = weft.Graph("mlp")
    x = g.input("x", [batch, d_in])
    labels = g.input("labels", [batch], dtype="i32")
    w1 = g.parameter("w1", [d_in, hidden])
    b1 = g.parameter("b1", [hidden])
    w2 = g.parameter("w2", [hidden, classes])
    h = g.relu(g.add(g.matmul(x, w1), b1, name="pre"), name="h")
    logits = g.matmul(h, w2, name="logits")
    loss = g.cross_entropy(logits, labels, name="loss")
    g.set_loss(loss)
    return g


def feeds(rng, batch=4, d_in=3, hidden=5, classes=4):
    return {
        "x": rng.standard_normal((batch, d_in)),
        "labels": rng.integers(0, classes, size=batch),
        "w1": rng.standard_normal((d_in, hidden)),
        "b1": rng.standard_normal(hidden),
        "w2": rng.standard_normal((hidden, classes)),
    }


def numpy_loss(f):
    h = np.maximum(f["x"] @ f["w1"] + f["b1"], 0)
    z = h @ f["w2"]
    m = z.max(axis=1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(axis=1, keepdims=True)))[:, 0]
    return float(np.mean(lse - z[np.arange(len(z)), f["labels"]])), h, z


def test_builder_tensors_ops_and_counts():
    g = mlp()
    assert g.num_params() == 3 * 5 + 5 + 5 * 4
    names = [t["name"] for t in g.tensors]
    assert names[:5] == ["x", "labels", "w1", "b1", "w2"]
    t = g.tensor(g.find("logits"))
    assert t["shape"] == (4, 4) and t["dtype"] == "f32" and t["role"] == "activation" and t["producer"] == "logits"
    kinds = [op["kind"] for op in g.ops]
    assert kinds == ["einsum", "binary", "unary", "einsum", "cross_entropy"]
    assert g.ops[0]["attrs"]["equation"] == "ay,yz->az"
    fwd = 2 * 4 * 3 * 5 + 4 * 5 + 4 * 5 + 2 * 4 * 5 * 4 + 4 * 4 * 4
    assert g.forward_flops() == pytest.approx(fwd)
    # flops() of a forward graph = forward + backward; of a training graph = its ops as they are.
    assert g.flops() == pytest.approx(g.training_flops())
    assert g.flops() > 2 * fwd
    t = g.train_step("adam")
    assert t.flops() == pytest.approx(t.forward_flops())
    assert "Graph('mlp'" in repr(g) and "5 ops" in repr(g)
    assert "cross_entropy[loss]" in g.dump()
    g.validate()


def test_builder_errors_are_value_errors():
    g = weft.Graph()
    x = g.input("x", [2, 3])
    w = g.parameter("w", [4, 5])
    with pytest.raises(ValueError, match="index 'y' has size 3"):
        g.matmul(x, w)
    with pytest.raises(ValueError, match="unknown unary function 'swish'"):
        g.unary("swish", x)
    with pytest.raises(ValueError, match="unknown dtype"):
        g.input("z", [2], dtype="f7")
    with pytest.raises(ValueError, match="must be a scalar"):
        g.set_loss(x)
    g.relu(x, name="r")
    with pytest.raises(ValueError, match="already used"):
        g.relu(x, name="r")
    with pytest.raises(ValueError, match="no loss"):
        g.train_step()


def test_interpret_mlp_matches_numpy():
    rng = np.random.default_rng(0)
    g = mlp()
    f = feeds(rng)
    out = weft.interpret(g, f)
    loss, h, z = numpy_loss(f)
    np.testing.assert_allclose(out["h"], h, rtol=1e-12)
    np.testing.assert_allclose(out["logits"], z, rtol=1e-12)
    assert out["loss"].shape == ()
    assert float(out["loss"]) == pytest.approx(loss, rel=1e-12)
    assert out["labels"].dtype == np.int64
    with pytest.raises(ValueError, match="no feed for parameter 'w2'"):
        weft.interpret(g, {k: v for k, v in f.items() if k != "w2"})
    with pytest.raises(ValueError, match="has shape"):
        weft.interpret(g, {**f, "x": np.zeros((2, 2))})
    with pytest.raises(ValueError, match="names no tensor"):
        weft.interpret(g, {**f, "nope": np.zeros(1)})


def test_finite_difference_gradients_from_python():
    rng = np.random.default_rng(1)
    g = mlp()
    f = feeds(rng)
    t = g.train_step(optimizer=None)
    out = weft.interpret(t, f)
    eps = 1e-6
    for p in ["w1", "b1", "w2"]:
        grad = out[t.tensor(t.grad(g.find(p)))["name"]]
        assert grad.shape == f[p].shape
        fd = np.zeros_like(f[p])
        for i in np.ndindex(f[p].shape):
            up = {**f, p: f[p].copy()}
            up[p][i] += eps
            dn = {**f, p: f[p].copy()}
            dn[p][i] -= eps
            fd[i] = (numpy_loss(up)[0] - numpy_loss(dn)[0]) / (2 * eps)
        np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-7)


def test_sgd_step_from_python():
    rng = np.random.default_rng(2)
    g = mlp()
    f = feeds(rng)
    grads = weft.interpret(g.train_step(None), f)
    t = g.train_step("sgd", lr=0.5)
    out = weft.interpret(t, f)
    for p in ["w1", "b1", "w2"]:
        upd = [x for x in t.tensors if x["producer"] == f"sgd:{p}"][0]
        assert upd["role"] == "parameter" and upd["grad_of"] == g.find(p)
        gname = t.tensor(t.grad(g.find(p)))["name"]
        np.testing.assert_allclose(out[upd["name"]], f[p] - 0.5 * grads[gname], rtol=1e-12)
    adam = g.train_step("adam")
    states = [x for x in adam.tensors if x["role"] == "optimizer_state" and x["producer"] is None]
    assert len(states) == 6
    with pytest.raises(ValueError, match="unknown optimizer"):
        g.train_step("lion")


def test_json_round_trip_and_malformed_json():
    g = mlp()
    for graph in [g, g.train_step("adam")]:
        s = graph.to_json()
        back = weft.Graph.from_json(s)
        assert back == graph
        assert back.to_json() == s
    doc = json.loads(g.to_json(indent=2))
    assert doc["format"] == "weft.ir.graph" and doc["ops"][0]["kind"] == "einsum"
    with pytest.raises(ValueError, match="not valid JSON"):
        weft.Graph.from_json("{")
    bad = json.loads(g.to_json())
    bad["tensors"][0]["dtype"] = "q8"
    with pytest.raises(ValueError, match=r"\$\.tensors\[0\]\.dtype"):
        weft.Graph.from_json(json.dumps(bad))
    bad = json.loads(g.to_json())
    bad["ops"][0]["kind"] = "conv3d"
    with pytest.raises(ValueError, match="unknown op kind 'conv3d'"):
        weft.Graph.from_json(json.dumps(bad))
    bad = json.loads(g.to_json())
    bad["tensors"][g.find("logits")]["shape"] = [4, 5]  # wrong shape
    with pytest.raises(ValueError, match="but the op makes"):
        weft.Graph.from_json(json.dumps(bad))
    bad = json.loads(g.to_json())
    bad["ops"][0]["inputs"] = [g.find("h"), g.find("w1")]  # x@w1 now reads h, which it feeds: a cycle
    bad["tensors"][g.find("h")]["shape"] = [4, 3]
    with pytest.raises(ValueError):
        weft.Graph.from_json(json.dumps(bad))
    c = weft.Graph("c")
    x = c.input("x", [2])
    a = c.relu(x, name="a")
    b = c.exp(a, name="b")
    bad = json.loads(c.to_json())
    bad["ops"][0]["inputs"] = [b]
    with pytest.raises(ValueError, match="cycle"):
        weft.Graph.from_json(json.dumps(bad))
    bad["ops"][0]["inputs"] = [17]
    with pytest.raises(ValueError, match="dangling"):
        weft.Graph.from_json(json.dumps(bad))
