"""weft.from_torch: the ops MoE routers use (issue 34) -- torch.topk (values and indices),
torch.argmax / argmin, max / min over a dim, torch.gather, Tensor.scatter_add and scatter_add_ --
each checked in float64 against torch (the loss through weft.interpret, every parameter gradient of
train_step(optimizer=None) against autograd); a tiny MoE router planned and run by weft.execute
equals weft.execute_reference, and trains like torch (Adam) on the CPU executor and on 4 gloo
processes; the torch runtime's routing kernels equal the interpreter's.

Ties: torch.argmax / max(dim) document the first maximal index, and weft's topk takes the lower
index first among equal values; torch.topk leaves the order of ties unspecified, so the top-k tests
use random (tie-free) values."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import weft  # noqa: E402
from test_frontend_gaps import check, f64  # noqa: E402 (forward and gradients against torch)
from test_frontend_torch import check_forward  # noqa: E402
from test_module_values import assert_trained_like_torch, data, torch_train  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def kinds(g):
    return [op["kind"] for op in g.ops]


# ---- the single ops

@pytest.mark.parametrize("kw", [{}, {"largest": False}, {"sorted": False}, {"dim": 0}])
def test_topk_values_and_indices(kw):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 6)
            self.emb = nn.Parameter(torch.randn(4, 6))

        def forward(self, x):  # [4, 5]
            s = torch.tanh(self.fc(x))  # [4, 6]
            dim = kw.get("dim", 1)
            v, i = torch.topk(s, 3, dim=dim, largest=kw.get("largest", True), sorted=kw.get("sorted", True))
            # the values weighted by their rank (sorted=False: torch's order is unspecified, so a
            # loss that does not depend on it), and the indices used (a gather of a parameter)
            w = torch.arange(1.0, 4.0, dtype=torch.float64) if kw.get("sorted", True) else 1.0
            w = w.view(-1, 1) if dim == 0 else w
            return (v * w).sum() + (torch.gather(self.emb, dim, i) * v).sum()

    g = check(M().double(), (f64(4, 5),))
    assert "topk" in kinds(g)


def test_topk_indices_equal_torchs():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 7)

        def forward(self, x):
            return torch.topk(self.fc(x), 3)

    m, x = M().double(), f64(6, 5)
    loss = lambda o: o[0].sum()  # noqa: E731 (the indices are computed by the same op)
    g = weft.from_torch(m, (x,), loss_fn=loss)
    out = weft.interpret(g, weft.feeds_from_torch(m, (x,), loss_fn=loss))
    topk = next(op for op in g.ops if op["kind"] == "topk")
    v, i = torch.topk(m.fc(x), 3)
    np.testing.assert_allclose(out[g.tensor(topk["outputs"][0])["name"]], v.detach().numpy(), rtol=1e-14)
    np.testing.assert_array_equal(out[g.tensor(topk["outputs"][1])["name"]], i.numpy())
    assert g.tensor(topk["outputs"][1])["dtype"] == "i64"


def test_argmax_argmin_max_min_dim_first_of_ties():
    """A row that relu zeroes has ties everywhere: torch documents the first maximal index, and so
    does weft; max(dim)'s values' gradient goes to that one element, as torch's."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 6)
            self.table = nn.Parameter(torch.randn(4, 6))

        def forward(self, x):  # [4, 5]
            h = torch.relu(self.fc(x))
            i = h.argmax(-1)  # [4]
            j = torch.argmin(h, dim=1, keepdim=True)  # [4, 1]
            mv, mi = h.max(dim=1)
            nv, _ = torch.min(h, 1, keepdim=True)
            a = torch.gather(self.table, 1, i.unsqueeze(1)).sum()
            b = torch.gather(self.table, 1, j).square().sum()
            flat = torch.gather(self.table.flatten(), 0, h.argmax().reshape(1)).sum()  # over every element
            return a + b + flat + (mv * mv).sum() + torch.gather(self.table, 1, mi.unsqueeze(1)).sum() + nv.sum()

    m = M().double()
    x = f64(4, 5)
    x[2] = 0
    with torch.no_grad():  # row 2 of h: relu(bias) with negative biases -> all zeros (ties)
        m.fc.bias.copy_(-torch.rand(6, dtype=torch.float64) - 0.1)
    with torch.no_grad():
        assert (torch.relu(m.fc(x))[2] == 0).all()
    g = check(m, (x,))
    assert kinds(g).count("topk") == 5


def test_gather_with_an_index_input_and_a_smaller_index():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(5, 7))

        def forward(self, x, idx, rows):  # x [3, 5], idx [3, 4] in [0, 7), rows [2, 3] in [0, 3)
            h = x @ self.w  # [3, 7]
            a = torch.gather(h, 1, idx)  # [3, 4]
            b = torch.gather(h, 0, rows)  # an index smaller than h off dim 0: h cut to [.., :3]
            return a.square().sum() + torch.tanh(b).sum()

    idx, rows = torch.randint(0, 7, (3, 4)), torch.tensor([[2, 0, 1], [2, 2, 0]])
    g = check(M().double(), (f64(3, 5), idx, rows))
    assert kinds(g).count("gather") == 2 and "slice" in kinds(g)


@pytest.mark.parametrize("inplace", [False, True])
def test_scatter_add_and_in_place(inplace):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 4)
            self.base = nn.Parameter(torch.randn(3, 6))

        def forward(self, x, idx):  # x [3, 5], idx [3, 4] in [0, 6)
            src = torch.sigmoid(self.fc(x))  # [3, 4]
            if inplace:
                out = self.base * 1.5
                out.scatter_add_(1, idx, src)
            else:
                out = self.base.scatter_add(1, idx, src)
            z = torch.zeros(3, 6, dtype=torch.float64).scatter_add(1, idx[:, :2], src[:, :2])
            return (out * out).sum() + (z * torch.arange(6.0, dtype=torch.float64)).sum()

    idx = torch.tensor([[0, 2, 2, 5], [1, 1, 1, 1], [5, 4, 3, 0]])  # repeated positions sum
    g = check(M().double(), (f64(3, 5), idx))
    assert kinds(g).count("scatter_add") == 2


def test_scatter_add_of_a_larger_src_forward():
    """torch reads src only where the index is (its own backward refuses such a src, so forward only)."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(5, 4)

        def forward(self, x, idx):
            return torch.zeros(3, 6, dtype=torch.float64).scatter_add(1, idx, torch.tanh(self.fc(x))).square().sum()

    g, _ = check_forward(M().double(), (f64(3, 5), torch.tensor([[0, 0], [5, 1], [2, 3]])))
    assert "slice" in kinds(g)


def test_routing_errors_are_clear():
    class FloatIndex(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, 4))

        def forward(self, i):
            return torch.gather(self.w, 1, i).sum()

    with pytest.raises(ValueError, match="gather.*index"):  # torch refuses a float index itself
        weft.from_torch(FloatIndex().double(), (torch.zeros(3, 2),))

    class Narrow(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, 4))

        def forward(self, i):  # i [2, 2]: smaller than w off dim 1
            return torch.zeros(3, 4, dtype=torch.float64).scatter_add(1, i, self.w[:2, :2]).sum()

    with pytest.raises(ValueError, match=r"scatter_add with an index \[2, 2\] smaller than the input \[3, 4\]"):
        weft.from_torch(Narrow().double(), (torch.zeros(2, 2, dtype=torch.int64),))

    g = weft.Graph("e")
    x = g.input("x", [4, 6])
    with pytest.raises(ValueError, match=r"k = 7 is not in \[1, 6\]"):
        g.topk(x, 7, 1)
    with pytest.raises(ValueError, match="gather index must be i32 or i64"):
        g.gather(x, g.input("i", [4, 2]), 1)


# ---- a tiny MoE router, end to end

class Router(nn.Module):
    """Softmax gate -> top-k experts (renormalised) -> gather of the experts' outputs, plus a
    scatter_add combine of the same weights into per-expert gates. The experts run densely (an
    einsum over all of them) so the routed axis is the expert axis, never the batch."""

    def __init__(self, d=6, experts=4, k=2, h=5, out=3):
        super().__init__()
        self.k = k
        self.gate = nn.Linear(d, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, d, h) * 0.4)
        self.head = nn.Linear(h, out)

    def forward(self, x, y):  # x [B, d], y [B, out]
        probs = torch.softmax(self.gate(x), dim=-1)  # [B, E]
        top_p, top_i = torch.topk(probs, self.k, dim=-1)  # [B, k]
        top_p = top_p / top_p.sum(-1, keepdim=True)
        experts = torch.tanh(torch.einsum("bd,edh->beh", x, self.w1))  # [B, E, h]
        picked = torch.gather(experts, 1, top_i.unsqueeze(-1).expand(-1, -1, experts.shape[-1]))  # [B, k, h]
        y1 = (top_p.unsqueeze(-1) * picked).sum(1)
        gates = torch.zeros_like(probs).scatter_add_(1, top_i, top_p)  # [B, E]
        y2 = torch.einsum("be,beh->bh", gates, experts)
        return F.mse_loss(self.head(y1 + 0.5 * y2), y)


def router_example(batch=8):
    g = torch.Generator().manual_seed(3)
    return torch.randn(batch, 6, generator=g, dtype=torch.float64), torch.randn(batch, 3, generator=g,
                                                                               dtype=torch.float64)


def test_router_imports_exactly():
    torch.manual_seed(1)
    g = check(Router().double(), router_example())
    ks = kinds(g)
    assert {"topk", "gather", "scatter_add"} <= set(ks)
    step = g.train_step(optimizer=None)
    # gather's and top-k's adjoints are scatter_adds into zeros, scatter_add's src gradient a gather
    assert sum(op["kind"] == "scatter_add" and len(op["inputs"]) == 2 for op in step.ops) == 2
    assert weft._weft.rebatch(step, 2).tensor(step.find("x"))["shape"] == (2, 6)  # the batch still splits


@pytest.fixture(scope="module")
def cluster():
    return weft.Cluster.preset("p3.8xlarge")


@pytest.fixture(scope="module")
def router_step():
    torch.manual_seed(1)
    module = Router().double()
    ex = router_example()
    step = weft.from_torch(module, ex).train_step(optimizer="adam", lr=1e-2)
    return module, ex, step


def test_router_plan_execute_equals_reference(router_step, cluster):
    module, ex, step = router_step
    plan = weft.plan(step, cluster)
    got = weft.execute(plan, step, cluster)
    ref = weft.execute_reference(step)
    assert got.max_relative_error(ref) < 1e-9
    # and the step is the module's own, trained by torch's Adam
    assert_trained_like_torch(got, *torch_train(module, step, ex))


def test_router_megatron_layouts_equal_reference(router_step, cluster):
    """Layouts that split the batch over replicas and micro-batches and the experts' hidden dim
    over a tensor-parallel axis: the routed (expert) axis stays whole where it is routed."""
    module, ex, step = router_step
    ref = weft.execute_reference(step)
    for t, p, d, mb in [(2, 1, 2, 2), (4, 1, 1, 1), (1, 2, 2, 2)]:
        plan = weft.megatron_plan(step, cluster, t=t, p=p, d=d, num_microbatches=mb)
        assert weft.execute(plan, step, cluster).max_relative_error(ref) < 1e-9, (t, p, d, mb)


@pytest.mark.parametrize("fixed", [{"x": "S(0)", "w1": "S(0)"}, {"w1": "S(0)", "gate.weight": "S(0)"}])
def test_router_with_the_expert_axis_sharded_equals_reference(fixed, router_step, cluster):
    """The experts' weights (and gate) split over 4 devices, the batch too: the expert axis is
    all-gathered before the routed ops (it needs replication there), the rest stays split."""
    module, ex, step = router_step
    mesh = weft.DeviceMesh([4], range(4))
    result = weft.spmd_search(step, cluster, mesh, level="O2", time_limit=10, fixed_specs=fixed,
                              shared_resharding=False)
    program = weft.lower_spmd(step, cluster, mesh, result)
    assert any(i["kind"] == "all-gather" for i in program.instructions(0))
    assert weft.execute(program).max_relative_error(weft.execute_reference(step)) < 1e-9


def test_router_weft_run_on_4_processes_trains_like_torch(router_step, cluster):
    module, ex, step = router_step
    want = torch_train(module, step, ex)
    for plan in (weft.plan(step, cluster), weft.megatron_plan(step, cluster, t=2, p=1, d=2, num_microbatches=2)):
        assert_trained_like_torch(weft.run(plan, step, cluster, steps=3, dtype="f64"), *want)


def test_runtime_kernels_equal_the_interpreter():
    """The torch runtime's gather / scatter_add / topk kernels (whole tensors) against weft.interpret."""
    from weft.runtime.kernels import run_kernel

    torch.manual_seed(1)
    module = Router().double()
    ex = router_example()
    step = weft.from_torch(module, ex).train_step(optimizer=None)
    feeds = weft.feeds_from_torch(module, ex)
    vals = weft.interpret(step, feeds)
    name = lambda t: step.tensor(t)["name"]  # noqa: E731
    seen = set()
    for op in step.ops:
        if op["kind"] not in ("gather", "scatter_add", "topk"):
            continue
        ins = [torch.from_numpy(np.asarray(vals[name(t)])) for t in op["inputs"]]
        ins = [v.to(torch.int64) if step.tensor(t)["dtype"].startswith("i") else v for v, t in zip(ins, op["inputs"])]
        ctx = {"out_shapes": [list(step.tensor(t)["shape"]) for t in op["outputs"]]}
        outs = run_kernel(op, ins, ctx)
        for t, o in zip(op["outputs"], outs):
            np.testing.assert_allclose(o.double().numpy(), vals[name(t)], rtol=1e-13, atol=1e-15, err_msg=op["name"])
        seen.add((op["kind"], len(op["inputs"])))
    assert seen == {("topk", 1), ("gather", 2), ("scatter_add", 3), ("scatter_add", 2)}
