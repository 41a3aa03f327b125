"""weft.from_torch: advanced indexing (aten.index.Tensor), index_select, one_hot, scatter, comparisons of
integer and of floating point tensors with the masked_fill / where they drive, in-place writes into views (x[..., 1:] = y,
functionalised), slice_scatter / select_scatter and SDPA with broadcast k / v heads (issue 34) --
each checked in float64 against torch: the loss through weft.interpret (1e-10 relative) and every
parameter gradient of train_step(optimizer=None) against autograd (1e-8), as test_frontend_torch's
check does. Cases the importer still cannot do exactly are refused by name."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import weft  # noqa: E402
from test_frontend_gaps import check, f64  # noqa: E402 (forward and gradients against torch)
from test_frontend_torch import check_forward  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def kinds(g):
    return [op["kind"] for op in g.ops]


class Proj(nn.Module):
    """A parameter-bearing front: every indexed tensor below depends on parameters (gradients)."""

    def __init__(self, d=5, o=6):
        super().__init__()
        self.fc = nn.Linear(d, o)

    def forward(self, x):
        return torch.tanh(self.fc(x))


# ---- advanced indexing and index_select

@pytest.mark.parametrize("case", ["falcon_qkv", "repeated", "two_adjacent", "two_apart", "bool_mask", "scalar_index"])
def test_indexing_by_a_constant_is_slices(case):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Proj(5, 24)

        def forward(self, x):  # x [4, 5]
            h = self.p(x).view(4, 2, 3, 4)
            if case == "falcon_qkv":  # Falcon's multi-query split: fused_qkv[..., [-2]] and [..., [-1]]
                k, v = h[..., [-2]], h[..., [-1]]
                return (k * v).sum() + h[..., :-2].pow(2).sum()
            if case == "repeated":  # a position twice and out of order: both gradients summed
                return (h[:, :, [2, 0, 2, 1]] * torch.arange(4.0, dtype=torch.float64).view(4, 1)).sum()
            if case == "two_adjacent":  # dims 1 and 2 indexed together: the result's dim stays there
                i, j = torch.tensor([1, 0, 1]), torch.tensor([2, 2, 0])
                return (h[:, i, j] * torch.arange(12.0, dtype=torch.float64).view(3, 4)).sum()
            if case == "two_apart":  # dims 0 and 2: the indexed dim goes first
                i, j = torch.tensor([[3, 0]]), torch.tensor([[1], [2]])
                return (h[i, :, j] * torch.arange(8.0, dtype=torch.float64).view(2, 4)).sum()
            if case == "bool_mask":
                keep = torch.tensor([True, False, True])
                return (h[:, :, keep] ** 2).sum()
            return h[:, 1, torch.tensor(2)].pow(3).sum()

    g = check(M().double(), (f64(4, 5),))
    assert "gather" not in kinds(g)  # a constant index never gathers: the dims stay splittable


@pytest.mark.parametrize("case", ["index", "index_negative", "index_select", "parameter_rows"])
def test_indexing_by_a_graph_index_is_gather(case):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Proj(5, 6)
            self.table = nn.Parameter(torch.randn(7, 3))

        def forward(self, x, ids):  # ids [4] integers
            h = self.p(x)  # [4, 6]
            if case == "index":  # the experts picked by a router: top-2 of each row
                top = torch.topk(h, 2).indices  # [4, 2]
                w = torch.tensor([1.0, 2.0], dtype=torch.float64)
                return (h[torch.arange(4).unsqueeze(1), top] * w).sum() + self.table[top].pow(2).sum()
            if case == "index_negative":  # -1 counts from the end, as in torch
                return (self.table[ids] * h[:, :3]).sum()
            if case == "index_select":
                return (torch.index_select(h, 1, ids) ** 2).sum() + (torch.index_select(self.table, 0, ids) * 3).sum()
            return (self.table[ids].sum(-1, keepdim=True) * h).sum()

    ids = torch.tensor([-1, 2, 0, 6]) if case == "index_negative" else torch.tensor([5, 2, 0, 2])
    m = M().double()
    g = check(m, (f64(4, 5), ids))
    assert "gather" in kinds(g)
    if case == "index":  # row i's entries from row i: a gather along dim 1 of h itself (the batch stays dim 0)
        gathered = [list(g.tensor(op["inputs"][0])["shape"]) for op in g.ops if op["kind"] == "gather"]
        assert [4, 6] in gathered and [24] not in gathered


def test_the_chosen_entry_of_each_row():
    """x[arange(B)[:, None], idx] over a 3-d x with an index input holding a negative entry: a gather
    along dim 1 of x (dim 0 stays the batch), -1 counted from the end."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Proj(5, 12)

        def forward(self, x, idx):  # idx [4, 2] in [-6, 6)
            h = self.p(x).view(4, 6, 2)
            picked = h[torch.arange(4).unsqueeze(1), idx]  # [4, 2, 2]
            return (picked * torch.arange(1.0, 5.0, dtype=torch.float64).view(2, 2)).pow(2).sum()

    g = check(M().double(), (f64(4, 5), torch.tensor([[0, 5], [-1, 2], [3, 3], [1, -6]])))
    gathered = [list(g.tensor(op["inputs"][0])["shape"]) for op in g.ops if op["kind"] == "gather"]
    assert gathered == [[4, 6, 2]]


def test_index_select_of_a_negative_constant_is_refused_as_torch_does():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Proj()

        def forward(self, x):
            return torch.index_select(self.p(x), 1, torch.tensor([-1])).sum()

    with pytest.raises((IndexError, RuntimeError), match="out of"):  # torch refuses it too
        M().double()(f64(4, 5))
    with pytest.raises(ValueError, match="index_select: index out of range for a dim of size 6"):
        weft.from_torch(M().double(), (f64(4, 5),))


def test_indexing_by_a_data_dependent_mask_is_refused():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Proj()

        def forward(self, x, ids):
            return self.p(x)[ids == 2].sum()  # a data-dependent shape

    with pytest.raises(ValueError, match="indexing by a mask computed in the graph"):
        weft.from_torch(M().double(), (f64(4, 5), torch.tensor([2, 1, 2, 0])))


# ---- one_hot

@pytest.mark.parametrize("form", ["float", "type_as", "times_float", "int_sum"])
def test_one_hot(form):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Proj(5, 4)
            if form == "int_sum":
                self.count_emb = nn.Embedding(5, 2)

        def forward(self, x, y):  # y [4] classes in [0, 4)
            logp = F.log_softmax(self.p(x), -1)
            oh = F.one_hot(y, 4)
            if form == "float":  # a hand-written NLL: -(one_hot · log p)
                return -(oh.float().double() * logp).sum() / 4
            if form == "type_as":
                return -(oh.type_as(logp) * logp).sum()
            if form == "times_float":  # int64 · float64 promotes to float64, in torch and here
                return -(oh * logp).mean()
            # the int64 counts of each class (an integer reduction) as an embedding's ids
            counts = oh.sum(0)
            return (logp.sum(0) * self.count_emb(counts).sum(-1)).sum()

    g = check(M().double(), (f64(4, 5), torch.tensor([3, 0, 3, 1])))
    assert "embedding" in kinds(g)  # one_hot(y, C) = embedding(eye(C), y)
    if form == "int_sum":
        assert any(t["dtype"] == "i64" and list(t["shape"]) == [4, 4] for t in g.tensors)


# ---- comparisons of integer tensors, masked_fill / where by them

@pytest.mark.parametrize("op", ["eq", "ne", "gt", "ge", "lt", "le"])
def test_integer_comparisons_equal_torchs(op):
    """Every comparison on every integer in [-6, 6] against c = 2 and c = -100 (brute force through the
    interpreter): [x op c] as 0 / 1, then used as a float weight."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(14, dtype=torch.float64))

        def forward(self, ids):
            a = getattr(ids, op)(2).to(torch.float64)
            b = getattr(ids, op)(-100).to(torch.float64)
            return (self.w * a).sum() + (self.w * b).sum() * 3

    ids = torch.tensor(list(range(-6, 7)) + [-100])
    check(M().double(), (ids,))


def test_masked_fill_and_where_by_an_integer_comparison():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(9, 4)
            self.p = Proj(4, 4)

        def forward(self, ids, labels):  # labels with -100 (ignored positions), ids with pad 0
            safe = labels.masked_fill(labels == -100, 0)  # an integer masked_fill: an embedding id
            h = self.p(self.emb(ids)) + self.emb(safe)
            pad = ids == 0
            h = torch.where(pad.unsqueeze(-1), torch.zeros((), dtype=torch.float64), h)  # float where
            s = h.sum(-1).masked_fill(pad, float("-inf"))  # -inf: exact (a selection, not a product)
            keep = (ids != 0).to(torch.float64)  # a mask as float: mean over the kept positions
            return (torch.softmax(s, -1) * keep).sum() + (h.sum(-1) * keep).sum() / keep.sum()

    ids = torch.tensor([[3, 4, 0, 0], [1, 2, 5, 0]])
    labels = torch.tensor([[8, -100, 1, -100], [-100, 2, 3, 7]])
    g = check(M().double(), (ids, labels))
    assert "gather" in kinds(g)


# ---- comparisons of floating point tensors (T5's padding_mask == 0), masked_fill / where by them

SPECIAL = [-float("inf"), -2.0, -0.0, 0.0, 1.0, 2.0, 2.5, float("inf"), float("nan")]


@pytest.mark.parametrize("op", ["eq", "ne", "gt", "ge", "lt", "le"])
def test_float_comparisons_equal_torchs(op):
    """Every pair of ±inf, ±0, finite values and NaN (brute force through the interpreter): two inputs
    broadcast against each other, an input against numbers (0, an int, inf, NaN), a number on the left
    and a constant with a NaN. Each mask weighs a parameter: its gradient is the mask itself, so every
    element is checked against torch's, not only their sum."""
    n = len(SPECIAL)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(8, n, n, dtype=torch.float64))
            self.register_buffer("c", torch.tensor(SPECIAL[::-1], dtype=torch.float64))

        def forward(self, x, y):
            cmp = getattr(torch, op)
            masks = [cmp(x[:, None], y[None, :]), cmp(x[:, None], 0.0), cmp(x[:, None], 2), cmp(x[:, None], float("inf")),
                     cmp(x[:, None], float("nan")), cmp(x[:, None], self.c[None, :]), cmp(self.c[:, None], y[None, :]),
                     cmp(torch.tensor(-0.0, dtype=torch.float64), y[None, :].expand(n, n))]  # a 0-d tensor left
            return sum((self.w[i] * m.to(torch.float64)).sum() for i, m in enumerate(masks))

    x = torch.tensor(SPECIAL, dtype=torch.float64)
    g = check(M().double(), (x, x.flip(0)))
    assert "topk" in kinds(g) and "cast" not in kinds(g)


@pytest.mark.parametrize("op", ["eq", "ne", "gt", "ge", "lt", "le"])
def test_masked_fill_and_where_by_a_float_comparison(op):
    """Comparisons of activations that depend on parameters (with ties: relu's zeros, and positions where
    the two sides are the same value) drive a where, masked_fills (of -inf before a softmax) and a float
    mask; no gradient flows through the comparison itself, only through the selected sides."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p, self.q = Proj(5, 6), Proj(5, 6)
            self.register_buffer("same", torch.rand(4, 6) < 0.5)

        def forward(self, x):
            h, k = self.p(x), self.q(x)
            k = torch.where(self.same, h, k)  # equal to h where `same`: ties for eq / ne / ge / le
            r = torch.relu(h)  # exact zeros
            cmp = getattr(torch, op)
            y = torch.where(cmp(h, k), h * 3, k)
            z = r.masked_fill(cmp(r, 0), -1.5) + h.masked_fill(cmp(k, 0.25), -4.0)
            keep = cmp(torch.full((), 0.1, dtype=torch.float64), h).to(torch.float64)
            s = torch.cat([h[:, :1], h[:, 1:].masked_fill(cmp(h[:, 1:], -0.2), float("-inf"))], -1)  # (column 0 kept)
            return (y * z).sum() + (h * keep).sum() + (torch.softmax(s, -1) * k).sum()

    m = M().double()
    x = f64(4, 5)
    with torch.no_grad():  # (both sides of each comparison occur)
        h = m.p(x)
        assert (h > -0.2).any() and (h < -0.2).any() and (torch.relu(h) == 0).any() and m.same.any() and not m.same.all()
    check(m, (x,))


def test_a_comparison_of_an_integer_with_a_float_tensor_is_refused():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Proj()

        def forward(self, x, ids):
            h = self.p(x)
            return h.masked_fill(ids > h, 0.0).sum()

    with pytest.raises(ValueError, match="comparison of an integer tensor with a floating point one"):
        weft.from_torch(M().double(), (f64(4, 5), torch.randint(0, 3, (4, 6))))


# ---- scatter (overwrite)

@pytest.mark.parametrize("case", ["topk_src", "inf_base", "value_repeated", "constant_index", "in_place"])
def test_scatter(case):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Proj(5, 6)
            self.q = Proj(5, 6)

        def forward(self, x):
            h, u = self.p(x), self.q(x)  # [4, 6]
            if case == "topk_src":  # a sparse routing weight: the top-2 scores, zeros elsewhere
                v, i = torch.topk(h, 2)
                return (torch.zeros_like(h).scatter(1, i, v) * u).sum()
            if case == "inf_base":  # top-k masking: -inf everywhere but the top-2 (softmax over them)
                v, i = torch.topk(h, 2)
                return (torch.softmax(torch.full_like(h, float("-inf")).scatter(-1, i, v), -1) * u).sum()
            if case == "value_repeated":  # a value at argmax positions: a row may repeat, the value is one
                i = torch.cat([h.argmax(-1, keepdim=True), h.argmax(-1, keepdim=True), u.argmax(-1, keepdim=True)], 1)
                return (u.scatter(1, i, 0.5) * h).sum()
            if case == "constant_index":
                i = torch.tensor([[0, 5], [1, 4], [2, 3], [3, 2]])
                return (u.scatter(1, i, h[:, :2]) ** 2).sum()
            i = torch.topk(h, 3).indices
            w = u.clone()
            w.scatter_(1, i, 1.0)
            return (w * h).sum()

    g = check(M().double(), (f64(4, 5),))
    assert "scatter_add" in kinds(g)


def test_scatter_with_repeated_positions_is_refused():
    class Const(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Proj(5, 6)

        def forward(self, x):
            h = self.p(x)
            return h.scatter(1, torch.tensor([[0, 0]] * 4), h[:, :2]).sum()

    with pytest.raises(ValueError, match="repeated position"):
        weft.from_torch(Const().double(), (f64(4, 5),))

    class Graph(Const):
        def forward(self, x):  # argmax twice: positions may repeat, the sources differ
            h = self.p(x)
            i = torch.cat([h.argmax(-1, keepdim=True)] * 2, 1)
            return h.scatter(1, i, h[:, :2] * 2).sum()

    with pytest.raises(ValueError, match="distinct"):
        weft.from_torch(Graph().double(), (f64(4, 5),))


# ---- in-place writes into views, functionalised

class ShiftRight(nn.Module):
    """Hugging Face's _shift_right (T5, BART-style): a fresh tensor written through its views."""

    def __init__(self, start=1):
        super().__init__()
        self.emb = nn.Embedding(32, 4)
        self.fc = nn.Linear(4, 4)
        self.start = start

    def forward(self, labels):
        shifted = labels.new_zeros(labels.shape)
        shifted[..., 1:] = labels[..., :-1].clone()
        shifted[..., 0] = self.start
        shifted.masked_fill_(shifted == -100, 0)
        return self.fc(self.emb(shifted)).pow(2).mean()


def test_shift_right_with_ignored_labels_imports_exactly():
    labels = torch.tensor([[5, 7, -100, -100, 3], [1, -100, 2, 31, 4]])
    g = check(ShiftRight().double(), (labels,))
    assert "concat" in kinds(g) and g.tensor(g.find("labels"))["dtype"] == "i64"
    # the shifted ids as the graph computes them equal torch's
    feeds = weft.feeds_from_torch(ShiftRight().double(), (labels,))
    out = weft.interpret(g, feeds)
    emb = next(op for op in g.ops if op["kind"] == "embedding")
    want = torch.tensor([[1, 5, 7, 0, 0], [1, 1, 0, 2, 31]])
    np.testing.assert_array_equal(out[g.tensor(emb["inputs"][1])["name"]], want.numpy())


@pytest.mark.parametrize("case", ["add_into_select", "copy_into_transpose", "fill_graph_value", "nested",
                                  "slice_scatter", "select_scatter"])
def test_in_place_writes_into_views_of_activations(case):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Proj(5, 6)
            self.q = Proj(5, 6)

        def forward(self, x):
            h, u = self.p(x), self.q(x)  # [4, 6]
            if case == "add_into_select":  # x[:, 0] += y: the gradient of both reaches the parameters
                h = h * 1.0
                h[:, 0] += u[:, 1]
                return (h * u).sum()
            if case == "copy_into_transpose":
                w = h * 2
                w.t()[1:3] = u[:, :2].t()
                return (w ** 2).sum()
            if case == "fill_graph_value":  # fill_ with a 0-d tensor computed from parameters
                w = h + 0
                w[1:3, 2].fill_(u.sum())
                return (w * u).sum()
            if case == "nested":  # a view of a view: x[:, 1:][:2, 0] = y
                w = h.clone()
                w[:, 1:][:2, 0] = u[:2, 5]
                return (w.pow(2) * u).sum()
            if case == "slice_scatter":
                return (torch.slice_scatter(h, u[:, :3], dim=1, start=2, end=5) ** 2).sum()
            return (torch.select_scatter(h, u[:, 0], 1, -1) * u).sum()

    check(M().double(), (f64(4, 5),))


def test_in_place_writes_it_cannot_do_exactly_are_refused():
    class Strided(nn.Module):  # a write into a strided slice (step 2)
        def __init__(self):
            super().__init__()
            self.p = Proj(5, 6)

        def forward(self, x):
            h = self.p(x) * 1.0
            h[:, ::2] = 0.0
            return h.sum()

    with pytest.raises(ValueError, match="step"):
        weft.from_torch(Strided().double(), (f64(4, 5),))

    class Stale(Strided):  # a view taken before the write, read after it: it would need the new values
        def forward(self, x):
            h = self.p(x) * 1.0
            v = h[:, 1:]
            h[:, 1:3] = 0.0
            return (v * 2).sum()

    with pytest.raises(ValueError, match="taken before the write is read after it"):
        weft.from_torch(Stale().double(), (f64(4, 5),))


# ---- scaled_dot_product_attention with one k / v head for all query heads (multi-query, Falcon)

def test_sdpa_broadcasts_a_single_kv_head():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.kv = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):  # [2, 5, 8]: 2 query heads of 4, one k / v head
            q = self.q(x).view(2, 5, 2, 4).transpose(1, 2)
            k, v = self.kv(x).view(2, 5, 1, 8).transpose(1, 2).split(4, -1)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True).pow(2).sum()

    g = check(M().double(), (f64(2, 5, 8),))
    assert "attention" in kinds(g) and "broadcast_to" in kinds(g)


def test_new_ops_are_listed():
    ops = weft.frontend.supported_ops()
    for op in ("aten.index.Tensor", "aten.index_select.default", "aten.one_hot.default", "aten.scatter.src",
               "aten.scatter.value", "aten.eq.Scalar", "aten.copy.default", "aten.fill.Scalar",
               "aten.slice_scatter.default", "aten.select_scatter.default", "aten.index_put.default",
               "aten.stack.default"):
        assert op in ops, op


# ---- a router written with the new ops, trained by weft.run on 4 gloo processes (the batch split too)

class SwitchRouter(nn.Module):
    """A Switch / Mixtral-style router as practitioners write it: top-2 gates scattered into a dense
    [B, E] gate matrix (scatter), the chosen experts' outputs picked by advanced indexing, the first
    expert's bias by index_select and the second's through a one_hot. (No load-balancing loss: that is
    a statistic of the whole batch, which a split batch does not compute.)"""

    def __init__(self, d=6, experts=4, h=5, out=3):
        super().__init__()
        self.gate = nn.Linear(d, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, d, h) * 0.4)
        self.bias = nn.Parameter(torch.randn(experts, h) * 0.1)
        self.bias2 = nn.Parameter(torch.randn(experts, h) * 0.1)
        self.head = nn.Linear(h, out)

    def forward(self, x, y):  # x [B, d], y [B, out]
        B, E = x.shape[0], self.bias.shape[0]
        probs = torch.softmax(self.gate(x), dim=-1)  # [B, E]
        top_p, top_i = torch.topk(probs, 2, dim=-1)
        gates = torch.zeros_like(probs).scatter(1, top_i, top_p / top_p.sum(-1, keepdim=True))
        experts = torch.tanh(torch.einsum("bd,edh->beh", x, self.w1))  # [B, E, h]
        picked = experts[torch.arange(B).unsqueeze(1), top_i]  # [B, 2, h]
        first = torch.index_select(self.bias, 0, top_i[:, 0])  # [B, h]
        second = F.one_hot(top_i[:, 1], E).to(x.dtype) @ self.bias2  # [B, h]
        mixed = torch.einsum("be,beh->bh", gates, experts) + 0.3 * picked.sum(1) + first + second
        return F.mse_loss(self.head(mixed), y)


def test_switch_router_trains_like_torch_on_4_processes():
    from test_module_values import assert_trained_like_torch, torch_train

    torch.manual_seed(1)
    module = SwitchRouter().double()
    g = torch.Generator().manual_seed(3)
    ex = (torch.randn(8, 6, generator=g, dtype=torch.float64), torch.randn(8, 3, generator=g, dtype=torch.float64))
    gr = check(module, ex)
    assert {"topk", "gather", "scatter_add", "embedding"} <= set(kinds(gr))
    step = gr.train_step(optimizer="adam", lr=1e-2)
    assert weft._weft.rebatch(step, 2).tensor(step.find("x"))["shape"] == (2, 6)  # the batch still splits
    cluster = weft.Cluster.preset("p3.8xlarge")
    want = torch_train(module, step, ex)
    for plan in (weft.plan(step, cluster), weft.data_parallel_plan(step, cluster, [1, 1, 1, 1], num_microbatches=2)):
        assert_trained_like_torch(weft.run(plan, step, cluster, steps=3, dtype="f64"), *want)


def test_in_place_writes_into_parts_of_a_split_and_into_constants():
    # (torch refuses writes into the parts of a split of a tensor that requires grad: integer ids here)
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(32, 6)
            self.q = Proj(5, 6)

        def forward(self, labels, x):  # labels [4, 5]
            u = self.q(x)
            shifted = labels.new_zeros(labels.shape)
            first, rest = shifted.split([1, 4], dim=-1)
            rest.copy_(labels[:, :-1])  # into part 1 of a split
            first.fill_(7)
            r0, r1, r2, r3 = shifted.unbind(0)
            r2.add_(1)  # into a row of an unbind (a view of a view of the same tensor)
            m = torch.zeros(6, dtype=torch.float64)
            m[2:4] = 1.5  # a constant written with a constant: folded in torch
            k = torch.zeros(4, 6, dtype=torch.float64)
            k[:, :3] = u[:, 3:]  # a constant written with a graph value
            h = self.emb(shifted).sum(1)  # [4, 6]
            return (h * u).sum() + (h * m).sum() + (k * h).sum()

    labels = torch.tensor([[5, 7, 1, 9, 3], [1, 0, 2, 31, 4], [8, 8, 8, 8, 8], [0, 1, 2, 3, 4]])
    check(M().double(), (labels, f64(4, 5)))


@pytest.mark.parametrize("case", ["constant", "add_into", "accumulate_repeated", "graph_accumulate", "one_per_row",
                                  "bool_mask", "two_apart", "int_labels"])
def test_index_put(case):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Proj(5, 6)
            self.q = Proj(5, 6)
            if case == "int_labels":
                self.emb = nn.Embedding(10, 6)

        def forward(self, x, ids):  # ids [4] in [0, 10)
            h, u = self.p(x) * 1.0, self.q(x)  # [4, 6]
            if case == "constant":  # x[:, idx] = v
                h[:, torch.tensor([0, 3])] = u[:, :2]
            elif case == "add_into":  # x[:, idx] += v: index, add, index_put
                h[:, torch.tensor([5, 1, 2])] += u[:, 3:]
            elif case == "accumulate_repeated":
                h.index_put_((torch.tensor([1, 1, 3]),), u[:3], accumulate=True)
            elif case == "graph_accumulate":  # the top-1 of each row gets a bonus (positions from the graph)
                top = torch.topk(u, 1).indices.squeeze(1)
                h.index_put_((torch.arange(4), top), u.sum(-1), accumulate=True)
            elif case == "one_per_row":  # the chosen entry of each row overwritten (positions from the graph)
                h[torch.arange(4), torch.topk(u, 1).indices.squeeze(1)] = u[:, 0]
            elif case == "bool_mask":
                h[:, torch.tensor([True, False, True, False, False, True])] = 0.25
            elif case == "two_apart":  # x[i, :, j] = v on a 3-d view
                w = h.view(4, 2, 3)
                w[torch.tensor([0, 2]), :, torch.tensor([1, 2])] = u[:2, :2]
            else:  # an integer tensor written at constant positions, then used as ids
                ids2 = ids.clone()
                ids2[torch.tensor([0, 2])] = torch.tensor([9, 8])
                h = h + self.emb(ids2)
            return (h * u).sum() + h.pow(2).sum()

    check(M().double(), (f64(4, 5), torch.tensor([3, 1, 4, 1])))


def test_index_put_it_cannot_do_exactly_is_refused():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Proj(5, 6)

        def forward(self, x):
            h = self.p(x) * 1.0
            h[:, torch.tensor([1, 1])] = 0.5  # a repeated position
            return h.sum()

    with pytest.raises(ValueError, match="index_put with a repeated position"):
        weft.from_torch(M().double(), (f64(4, 5),))

    class G(M):
        def forward(self, x):
            h = self.p(x) * 1.0
            i = torch.topk(h, 2).indices  # two positions per row from the graph, overwritten
            h[torch.arange(4).unsqueeze(1), i] = 0.0
            return h.sum()

    with pytest.raises(ValueError, match="accumulate=True, or one position per row"):
        weft.from_torch(G().double(), (f64(4, 5),))


@pytest.mark.parametrize("sl", [(None, None, 2), (1, None, 2), (0, 5, 3), (1, 6, 4), (2, 3, 5), (-5, None, 3)])
def test_strided_slices(sl):
    """x[..., a:b:k] (GPT-J's rotate_every_two: x[..., ::2] and x[..., 1::2]) against torch, including a
    last stride cut short by the end of the dim or by b."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Proj(5, 12)

        def forward(self, x):
            h = self.p(x).view(4, 2, 6)
            y = h[..., slice(*sl)]
            return (y * torch.arange(1.0, y.shape[-1] + 1, dtype=torch.float64)).pow(2).sum()

    check(M().double(), (f64(4, 5),))


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_stack(dim):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = Proj(5, 6)
            self.q = Proj(5, 6)

        def forward(self, x):
            h, u = self.p(x), self.q(x)
            y = torch.stack([h, u * 2, h * u], dim=dim)
            return (y * torch.arange(1.0, y.shape[-1] + 1, dtype=torch.float64)).pow(2).sum()

    check(M().double(), (f64(4, 5),))
