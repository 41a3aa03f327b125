"""Training-mode dropout: the IR's counter-based mask, exact in the interpreter, and every distributed
program (batch, micro-batch, replica and tensor splits, strided or uneven, pipelines) draws the mask
the one-device reference draws, on the CPU executor and on torch.distributed processes."""
import math

import numpy as np
import pytest

import weft

M32 = 0xFFFFFFFF


def mix32(x):  # the documented hash, written out independently of weft (numpy uint64)
    x = np.asarray(x, dtype=np.uint64)
    c = np.uint64(0x45D9F3B)
    x = (((x >> np.uint64(16)) ^ x) * c) & np.uint64(M32)
    x = (((x >> np.uint64(16)) ^ x) * c) & np.uint64(M32)
    return (x >> np.uint64(16)) ^ x


def keep_mask(seed, step, shape, p):
    idx = np.arange(int(np.prod(shape)), dtype=np.uint64)
    key = mix32(np.uint64(seed) ^ mix32(np.uint64(step)))
    h = mix32((idx & np.uint64(M32)) ^ mix32((idx >> np.uint64(32)) ^ key))
    return (h.astype(np.float64) >= math.floor(p * 2.0**32)).reshape(shape)


def mlp(batch=16, p=0.3):
    """x[b, 12] -> fc1 -> relu -> dropout -> fc2 -> dropout (on the logits) -> cross-entropy."""
    g = weft.Graph("mlp_dropout")
    x = g.input("x", [batch, 12])
    labels = g.input("labels", [batch], "i64")
    w1, w2 = g.parameter("fc1.w", [12, 24]), g.parameter("fc2.w", [24, 10])
    h = g.dropout(g.unary("relu", g.matmul(x, w1, "fc1"), "act"), p, 1, "drop1")
    y = g.dropout(g.matmul(h, w2, "fc2"), p / 2, 2, "drop2")
    g.set_loss(g.cross_entropy(y, labels, "loss"))
    return g


def test_interpreter_mask_is_the_documented_hash():
    g = weft.Graph("d")
    x = g.input("x", [40, 50], "f64")
    g.dropout(x, 0.25, 7, "drop")
    xv = np.random.default_rng(0).standard_normal((40, 50))
    got = weft.interpret(g, {"x": xv})["drop"]
    keep = keep_mask(7, 1, (40, 50), 0.25)
    np.testing.assert_array_equal(got, np.where(keep, xv * (1 / 0.75), 0.0))
    assert abs((~keep).mean() - 0.25) < 4 * math.sqrt(0.25 * 0.75 / 2000)
    op = next(o for o in g.ops if o["kind"] == "dropout")
    assert op["attrs"] == {"ints": [7], "scalar": 0.25}
    with pytest.raises(ValueError, match="dropout probability"):
        g.dropout(x, 1.0, 1)


def test_gradient_is_the_same_mask():
    g = mlp()
    step = g.train_step(optimizer="none")
    grads = [o for o in step.ops if o["kind"] == "dropout"]
    assert len(grads) == 4  # two forward, two on the gradients, same attributes pairwise
    assert sorted(o["attrs"]["ints"][0] for o in grads) == [1, 1, 2, 2]
    # d loss / d fc2.w through the masked logits equals the hand formula with the numpy mask.
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((16, 12)), "labels": rng.integers(0, 10, 16),
             "fc1.w": rng.standard_normal((12, 24)), "fc2.w": rng.standard_normal((24, 10))}
    v = weft.interpret(step, feeds)
    h = np.maximum(feeds["x"] @ feeds["fc1.w"], 0) * keep_mask(1, 1, (16, 24), 0.3) / 0.7
    k2 = keep_mask(2, 1, (16, 10), 0.15) / 0.85
    y = (h @ feeds["fc2.w"]) * k2
    sm = np.exp(y - y.max(1, keepdims=True))
    sm /= sm.sum(1, keepdims=True)
    dy = (sm - np.eye(10)[feeds["labels"]]) / 16
    w2 = next(t["id"] for t in step.tensors if t["name"] == "fc2.w")
    grad = next(t["name"] for t in step.tensors if t["grad_of"] == w2)
    got, dw2 = v[grad], h.T @ (dy * k2)
    np.testing.assert_allclose(got, dw2, rtol=1e-12, atol=1e-14)
    loss = -np.mean(np.log(sm[np.arange(16), feeds["labels"]]))
    assert abs(v[step.tensor(step.loss)["name"]] - loss) < 1e-12


def assert_same(got, ref, rtol=1e-10):
    np.testing.assert_allclose(got.losses, ref.losses, rtol=rtol, atol=0)
    assert ref.parameters and set(got.parameters) == set(ref.parameters)
    for n, w in ref.parameters.items():
        np.testing.assert_allclose(got.parameters[n], w, rtol=rtol, atol=rtol * np.max(np.abs(w)), err_msg=n)
    assert got.max_relative_error(ref) < rtol


@pytest.fixture(scope="module")
def step():
    return mlp().train_step(optimizer="adam")


@pytest.fixture(scope="module")
def reference(step):
    return weft.execute_reference(step, steps=2)


def test_the_mask_matters(step, reference):
    # Without dropout the same model trains to other values: the equivalences below are not vacuous.
    plain = weft.execute_reference(mlp(p=0.0).train_step(optimizer="adam"), steps=2)
    assert abs(plain.losses[0] - reference.losses[0]) > 1e-3
    # and another step draws another mask (step 2's loss is not step 1's recomputed on new weights
    # with the old mask): masks differ between steps 1 and 2
    assert (keep_mask(1, 1, (16, 24), 0.3) != keep_mask(1, 2, (16, 24), 0.3)).mean() > 0.2


def test_data_parallel_micro_batches_and_uneven_shares_equal_the_reference(step, reference):
    c4 = weft.Cluster.preset("p3.8xlarge")
    for shares, m in [([2, 2, 2, 2], 2), ([1, 1, 1, 1], 4), ([5, 2, 1, 0], 2)]:
        plan = weft.data_parallel_plan(step, c4, shares, num_microbatches=m)
        prog = weft.lower(plan, step, c4)
        kinds = {o["name"]: o["kind"] for o in step.ops}
        drops = [i for r in range(prog.num_ranks) for i in prog.instructions(r)
                 if i["kind"] == "compute" and kinds[i["op"]] == "dropout"]
        assert len(drops) == 4 * m * prog.num_ranks and {i["microbatch"] for i in drops} == set(range(m))
        assert_same(weft.execute(prog, steps=2), reference)


@pytest.mark.parametrize("shape,seed", [([4], 0), ([2, 2], 1), ([2, 2], 2), ([4], 3)])
def test_random_layouts_equal_the_reference(step, reference, shape, seed):
    # Every op a random strategy of its index map (dropout's tensors split on any dim, strided too).
    prog = weft.lower_random(step, weft.Cluster.preset("p3.8xlarge"), weft.DeviceMesh(shape, range(4)), seed)
    assert_same(weft.execute(prog, steps=2), reference)


def _torch():
    return pytest.importorskip("torch")


def test_importer_maps_training_dropout_and_sdpa_dropout():
    t = _torch()
    nn, F = t.nn, t.nn.functional

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.d, self.b = nn.Linear(8, 16), nn.Dropout(0.3), nn.Linear(16, 4)

        def forward(self, x):
            h = self.d(t.relu(self.a(x)))
            q = h.view(2, 4, 2, 8)
            o = F.scaled_dot_product_attention(q, q, q, dropout_p=0.2)
            return self.b(o.reshape(8, 16)).square().mean()

    m = Net().double().train()
    x = t.randn(8, 8, dtype=t.float64)
    g = weft.from_torch(m, (x,))
    drops = [o for o in g.ops if o["kind"] == "dropout"]
    assert [(o["attrs"]["ints"], o["attrs"]["scalar"]) for o in drops] == [([1], 0.3), ([2], 0.2)]
    got = weft.interpret(g, weft.feeds_from_torch(m, (x,)))[g.tensor(g.loss)["name"]]
    # The same module with weft's masks in place of torch's RNG (the documented hash, by hand).
    k1 = t.from_numpy(keep_mask(1, 1, (8, 16), 0.3))
    k2 = t.from_numpy(keep_mask(2, 1, (2, 4, 2, 2), 0.2))
    with t.no_grad():
        h = t.relu(m.a(x)) * k1 / 0.7
        q = h.view(2, 4, 2, 8)
        probs = t.softmax(q @ q.transpose(-1, -2) / math.sqrt(8), -1) * k2 / 0.8
        want = m.b((probs @ q).reshape(8, 16)).square().mean()
    assert abs(got - float(want)) <= 1e-10 * abs(float(want))
    # eval(): nn.Dropout is the identity (SDPA's dropout_p is an argument: it stays, as in torch);
    # channel dropout in training mode: a clear error.
    evald = [o["attrs"]["scalar"] for o in weft.from_torch(m.eval(), (x,)).ops if o["kind"] == "dropout"]
    assert evald == [0.2]
    with pytest.raises(ValueError, match="channel dropout"):
        weft.from_torch(nn.Sequential(nn.Dropout2d(0.5), nn.Flatten()).train(), (t.randn(2, 3, 4, 4),),
                        loss_fn=lambda y: y.sum())


def test_an_imported_gpt_with_dropout_runs_on_4_gloo_processes_like_the_reference():
    t = _torch()
    from weft.runtime.torch_models import TorchGPT

    zoo = weft.models.gpt(layers=2, hidden=32, heads=2, seq=8, vocab=64, batch=8)
    params = {x["name"]: t.zeros(x["shape"], dtype=t.float64) for x in zoo.tensors
              if x["role"] == "parameter" and x["producer"] is None}
    module = TorchGPT(params, layers=2, heads=2, dropout=0.1).train()
    tokens, labels = t.randint(0, 64, (8, 8)), t.randint(0, 64, (8, 8))
    g = weft.from_torch(module, (tokens, labels))
    assert sum(o["kind"] == "dropout" for o in g.ops) == 1 + 3 * 2  # embeddings + 3 per block
    step = g.train_step(optimizer="adam")
    c4 = weft.Cluster.preset("p3.8xlarge")
    ref = weft.execute_reference(step, steps=2)
    # 2 stages x 2-way tensor parallel, 2 micro-batches; and 2 replicas x 2 stages with kFkB.
    for t_, p_, d_ in [(2, 2, 1), (1, 2, 2)]:
        plan = weft.megatron_plan(step, c4, t=t_, p=p_, d=d_, num_microbatches=2)
        assert_same(weft.execute(plan, step, c4, steps=2), ref)
        assert_same(weft.run(plan, step, c4, steps=2, dtype="f64"), ref)


def test_torch_kernel_equals_the_cpu_kernel_on_a_strided_tile():
    t = _torch()
    from weft.runtime.kernels import run_kernel

    g = weft.Graph("d")
    x = g.input("x", [6, 8], "f64")
    g.dropout(x, 0.5, 9, "drop")
    xv = np.random.default_rng(2).standard_normal((6, 8))
    whole = weft.interpret(g, {"x": xv})["drop"]
    op = next(o for o in g.ops if o["kind"] == "dropout")
    rows, cols = [1, 3, 5], [2, 3, 6, 7]
    tile = t.from_numpy(xv[np.ix_(rows, cols)].copy())
    got = run_kernel(op, [tile], {"out_shapes": [[3, 4]], "element_index": [rows, cols],
                                  "element_shape": [6, 8]})[0]
    np.testing.assert_array_equal(got.numpy(), whole[np.ix_(rows, cols)])
    np.testing.assert_array_equal(run_kernel(op, [t.from_numpy(xv)], {})[0].numpy(), whole)
