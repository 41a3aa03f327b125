"""Builder ergonomics: every Graph builder call returns a weft.Tensor handle (id, name, shape,
dtype) and takes one; bare int ids keep working with a DeprecationWarning that points at the caller."""
import json
import pickle
import warnings

import pytest

import weft
from weft.tensor import _TENSOR_PARAMS


def _mlp():
    g = weft.Graph("mlp")
    x = g.input("x", [8, 16])
    w = g.parameter("w", [16, 4], "f32")
    y = g.relu(g.matmul(x, w, name="xw"))
    g.set_loss(g.reduce("mean", y, [0, 1]))
    return g, x, w, y


def test_handles_carry_name_shape_dtype_and_stay_ints():
    g, x, w, y = _mlp()
    for t in (x, w, y):
        info = g.tensor(t)  # the graph's own record is the truth
        assert isinstance(t, weft.Tensor) and isinstance(t, int)
        assert (t.id, t.name, t.shape, t.dtype) == (info["id"], info["name"], tuple(info["shape"]), info["dtype"])
    assert (x.name, x.shape, x.dtype, x.ndim) == ("x", (8, 16), "f32", 2)
    assert y.shape == (8, 4) and type(y.id) is int
    assert repr(w) == "Tensor(1, 'w', shape=[16, 4], dtype=f32)" and str(w) == "1" and f"{w}" == "1"
    assert json.dumps([x, w]) == "[0, 1]" and {x: "a"}[0] == "a" and w == 1 and hash(w) == hash(1)
    assert pickle.loads(pickle.dumps(y)) == y and repr(pickle.loads(pickle.dumps(y))) == repr(y)
    with pytest.raises(AttributeError, match="immutable"):
        x.name = "other"
    assert isinstance(g.loss, weft.Tensor) and g.loss.shape == ()
    g.mark_output(y)
    assert g.outputs == [y] and isinstance(g.outputs[0], weft.Tensor)
    assert g.find("x") == x and isinstance(g.find("x"), weft.Tensor) and g.find("nope") is None
    step = g.train_step()
    gw = step.grad(step.find("w"))
    assert isinstance(gw, weft.Tensor) and gw.shape == (16, 4) and step.grad_of(gw) == step.find("w")


def test_every_builder_call_takes_and_returns_handles_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)  # handles never warn
        g = weft.Graph("all")
        img = g.input("img", [2, 3, 8, 8])
        k = g.parameter("k", [4, 3, 3, 3])
        conv = g.conv2d(img, k, stride=1, pad=1)
        pooled = g.pool2d("max", conv, 2, 2)
        flat = g.reshape(pooled, [2, 64])
        c = g.constant("c", [2, 64])
        h = g.add(g.mul(flat, c), g.scale(flat, 0.5))
        h = g.maximum(g.sub(h, c), g.div(h, c))
        for fn in ("relu", "gelu", "tanh", "sigmoid", "square", "neg", "exp"):
            h = getattr(g, fn)(h)
        h = g.unary("identity", g.binary("add", h, h))
        gamma, beta = g.parameter("gamma", [64]), g.parameter("beta", [64])
        h = g.layer_norm(h, gamma, beta)
        h = g.dropout(h, 0.1, 7)
        parts = [g.slice(h, 1, 0, 32), g.slice(h, 1, 32, 64)]
        h = g.concat(parts, 1)
        h = g.transpose(g.transpose(h, [1, 0]), [1, 0])
        wout = g.parameter("wout", [64, 10])
        logits = g.softmax(g.einsum("bh,hc->bc", [h, wout]))
        table = g.parameter("table", [10, 10])
        ids = g.input("ids", [2], "i32")
        emb = g.embedding(table, ids)
        o = g.opaque([emb], [2, 10], 100.0)
        loss = g.cross_entropy(g.add(logits, o), ids)
        g.set_loss(loss)
    made = [img, k, conv, pooled, flat, c, h, gamma, beta, wout, logits, table, ids, emb, o, loss] + parts
    assert all(isinstance(t, weft.Tensor) and t.shape == tuple(g.tensor(t)["shape"]) for t in made)
    assert conv.shape == (2, 4, 8, 8) and pooled.shape == (2, 4, 4, 4) and logits.shape == (2, 10)
    assert ids.dtype == "i32" and loss.shape == ()
    g.validate()
    # every wrapped builder call has been exercised above (the list is the one the wrapper knows)
    assert set(_TENSOR_PARAMS) >= {"conv2d", "pool2d", "einsum", "opaque", "concat", "dropout", "layer_norm"}


def test_bare_ints_still_work_with_a_deprecation_warning_at_the_caller():
    g, x, w, _ = _mlp()
    with pytest.warns(DeprecationWarning, match=r"Graph.matmul: 'a', 'b' got a bare int") as rec:
        y = g.matmul(0, 1)
    assert len(rec) == 1 and rec[0].filename == __file__  # points at this line, not inside weft
    assert isinstance(y, weft.Tensor) and y.shape == (8, 4)
    with pytest.warns(DeprecationWarning, match="'operands'"):
        g.einsum("ab,bc->ac", [int(x), w])
    with pytest.warns(DeprecationWarning, match="'x'"):
        g.unary("relu", int(x))
    with pytest.warns(DeprecationWarning, match="'t'"):
        g.mark_output(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        g.reduce("sum", x, [0])  # ints that are not tensors (axes, sizes) never warn
        g.slice(x, 1, 0, 4)
    # the result of bare ids equals the result of handles
    g2, _, _, _ = _mlp()
    with pytest.warns(DeprecationWarning):
        g2.matmul(0, 1)
    assert g.tensor(y)["shape"] == g2.tensor(g2.tensors[-1]["id"])["shape"]


def test_library_code_does_not_warn():
    torch = pytest.importorskip("torch")

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(4, 3)

        def forward(self, x):
            return torch.relu(self.fc(x)).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        g = weft.from_torch(M(), (torch.ones(2, 4),))
        weft.models.gpt(layers=1, hidden=32, heads=2, seq=4, vocab=16, batch=2).train_step()
    assert isinstance(g.loss, weft.Tensor) and g.loss.shape == ()
