"""weft.from_torch: the importer gaps met on real models (issue 34), each checked in float64
against torch -- the loss through weft.interpret and every parameter gradient of
train_step(optimizer=None) against autograd (helpers of test_frontend_torch)."""
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import weft  # noqa: E402
from test_frontend_torch import check_forward, check_gradients  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def f64(*shape):
    return torch.randn(*shape, dtype=torch.float64)


def check(m, inputs, loss_fn=None, targets=()):
    """Forward and gradients equal torch's; returns the graph."""
    g, _ = check_forward(m, inputs, loss_fn=loss_fn, targets=targets)
    check_gradients(m, inputs, loss_fn=loss_fn, targets=targets)
    return g


class Reg(nn.Module):
    def __init__(self, d=5, o=3):
        super().__init__()
        self.fc1 = nn.Linear(d, 8)
        self.fc2 = nn.Linear(8, o)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)))


# ---- 1. regression losses

@pytest.mark.parametrize("loss", ["mse", "mse_sum", "MSELoss", "l1", "l1_sum", "L1Loss", "smooth_l1",
                                  "smooth_l1_beta0.3", "smooth_l1_beta0", "huber_delta0.7", "SmoothL1Loss"])
def test_regression_losses(loss):
    fns = {
        "mse": lambda o, t: F.mse_loss(o, t), "mse_sum": lambda o, t: F.mse_loss(o, t, reduction="sum"),
        "MSELoss": nn.MSELoss(), "l1": lambda o, t: F.l1_loss(o, t),
        "l1_sum": lambda o, t: F.l1_loss(o, t, reduction="sum"), "L1Loss": nn.L1Loss(),
        "smooth_l1": lambda o, t: F.smooth_l1_loss(o, t),
        "smooth_l1_beta0.3": lambda o, t: F.smooth_l1_loss(o, t, beta=0.3, reduction="sum"),
        "smooth_l1_beta0": lambda o, t: F.smooth_l1_loss(o, t, beta=0.0),
        "huber_delta0.7": lambda o, t: F.huber_loss(o, t, delta=0.7), "SmoothL1Loss": nn.SmoothL1Loss(beta=0.5),
    }
    m = Reg().double()
    x, y = f64(6, 5), f64(6, 3) * 2  # spread so that both branches of the smooth losses are hit
    check(m, (x,), loss_fn=fns[loss], targets=(y,))


def test_loss_module_inside_the_model_and_reduction_none():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = Reg()
            self.crit = nn.MSELoss(reduction="none")

        def forward(self, x, y):
            return (self.crit(self.net(x), y) * torch.arange(3.0, dtype=torch.float64)).mean()

    check(M().double(), (f64(4, 5), f64(4, 3)))


def test_loss_against_a_broadcast_constant():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = Reg()
            self.register_buffer("goal", torch.randn(3, dtype=torch.float64))

        def forward(self, x):
            return F.l1_loss(self.net(x), self.goal.expand(4, 3)) + F.mse_loss(self.net(x)[:, :1], self.goal[:1])

    check(M().double(), (f64(4, 5),))


def test_unsupported_loss_variant_names_the_users_module():
    class Crit(nn.Module):
        def forward(self, o, t):
            return F.cross_entropy(o, t, reduction="none").sum()

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = Reg()
            self.crit = Crit()

        def forward(self, x, t):
            return self.crit(self.net(x), t)

    with pytest.raises(ValueError) as e:
        weft.from_torch(M().double(), (f64(4, 5), torch.randint(0, 3, (4,))))
    msg = str(e.value)
    assert "'crit'" in msg and "reduction" in msg and "_WithLoss" not in msg and "model." not in msg
    # the same loss given as loss_fn: no wrapper names either
    with pytest.raises(ValueError) as e:
        weft.from_torch(Reg().double(), (f64(4, 5),), loss_fn=Crit(), targets=(torch.randint(0, 3, (4,)),))
    assert "in loss_fn" in str(e.value) and "_WithLoss" not in str(e.value) and "model." not in str(e.value)


# ---- 2. transposes, addmm family, maximum / minimum

def test_transposes_T_t_mT():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 5))
            self.v = nn.Parameter(torch.randn(3, 6, 4))

        def forward(self, x):  # x [2, 4, 5]
            a = x @ self.w.T  # [2, 4, 4]
            b = (x.mT @ self.w).square().sum()  # [2, 5, 4] @ [4, 5]
            c = (x.reshape(8, 5) @ self.w.t()).pow(3).sum()
            d = torch.einsum("bij,kjl->bil", a, self.v.mT).square().sum()  # v.mT [3, 4, 6]
            return a.sum() + b + c + d + (x.mT * 1.5).permute(2, 1, 0).T.square().sum()

    check(M().double(), (f64(2, 4, 5),))


@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2.0), (0, 1.5)])
def test_addmm_baddbmm_addbmm(beta, alpha):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(5, 4))
            self.b = nn.Parameter(torch.randn(4))
            self.wb = nn.Parameter(torch.randn(3, 5, 4))
            self.c = nn.Parameter(torch.randn(6, 4))

        def forward(self, x):  # x [3, 6, 5]
            y1 = torch.addmm(self.b, x.reshape(-1, 5), self.w, beta=beta, alpha=alpha)  # [18, 4]
            y2 = torch.baddbmm(self.c, x, self.wb, beta=beta, alpha=alpha)  # [3, 6, 4]
            y3 = torch.addbmm(self.c, x, self.wb, beta=beta, alpha=alpha)  # [6, 4]
            return y1.square().sum() + y2.square().mean() + y3.pow(3).sum()

    check(M().double(), (f64(3, 6, 5),))


def test_maximum_minimum_max_min_binary():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

        def forward(self, x):
            p, q = self.a(x), self.b(x)
            return (torch.maximum(p, q).sum() + torch.minimum(p, q).square().sum()
                    + torch.max(p, q).pow(3).sum() + torch.min(p, 0.1 * q).sum()
                    + torch.minimum(p, torch.tensor(0.2, dtype=torch.float64)).sum() + p.abs().sum())

    check(M().double(), (f64(5, 4),))


# ---- 3. cross entropy variants

class Cls(nn.Module):
    def __init__(self, d=6, c=5):
        super().__init__()
        self.fc = nn.Linear(d, c)

    def forward(self, x):
        return self.fc(x)


@pytest.mark.parametrize("kw", [dict(label_smoothing=0.1), dict(reduction="sum"),
                                dict(label_smoothing=0.25, reduction="sum"), dict(ignore_index=-1)])
def test_cross_entropy_label_smoothing_and_sum(kw):
    m = Cls().double()
    x, y = f64(2, 4, 6), torch.randint(0, 5, (2, 4))
    ce = lambda o, t: F.cross_entropy(o.view(-1, 5), t.view(-1), **kw)  # noqa: E731
    check(m, (x,), loss_fn=ce, targets=(y,))
    # the class dim in dim 1 ([N, C, d]) too
    ce1 = lambda o, t: F.cross_entropy(o.transpose(1, 2), t, **kw)  # noqa: E731
    check(m, (x,), loss_fn=ce1, targets=(y,))


def test_nll_loss_sum():
    m = Cls().double()
    x, y = f64(7, 6), torch.randint(0, 5, (7,))
    check(m, (x,), loss_fn=lambda o, t: F.nll_loss(F.log_softmax(o, -1), t, reduction="sum"), targets=(y,))


def test_cross_entropy_without_a_scalar_is_refused():
    m = Cls().double()
    x, y = f64(8, 6), torch.randint(0, 5, (8,))
    with pytest.raises(ValueError, match="reduction"):
        weft.from_torch(m, (x,), loss_fn=lambda o, t: F.cross_entropy(o, t, reduction="none").sum(), targets=(y,))


@pytest.mark.parametrize("kw", [dict(ignore_index=0), dict(weight=torch.linspace(0.5, 2, 5, dtype=torch.float64)),
                                dict(ignore_index=3, weight=torch.ones(5, dtype=torch.float64), reduction="sum")])
def test_cross_entropy_ignore_index_and_class_weights_match_torch(kw):
    """(Refused before issue 34's ignore_index work; tests/python/test_cross_entropy_ignore.py runs them
    under plans.)"""
    m = Cls().double()
    x, y = f64(8, 6), torch.randint(0, 5, (8,))
    y[3] = 0
    check(m, (x,), loss_fn=lambda o, t: F.cross_entropy(o, t, **kw), targets=(y,))


def test_cross_entropy_ignored_label_is_torchs_and_a_stray_one_an_error():
    m = Cls().double()
    x, y = f64(8, 6), torch.randint(0, 5, (8,))
    y[3] = -100
    check(m, (x,), loss_fn=F.cross_entropy, targets=(y,))  # torch's default ignore_index
    y[3] = -5  # neither a class nor the ignore_index: an error when the graph runs, never silent
    g = weft.from_torch(m, (x,), loss_fn=F.cross_entropy, targets=(y,))
    feeds = weft.feeds_from_torch(m, (x,), (y,), loss_fn=F.cross_entropy)
    with pytest.raises(ValueError, match="label -5"):
        weft.interpret(g, feeds)


# ---- 4. convolutions

class Conv1dNet(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.conv = nn.Conv1d(4, 6, 3, **kw)

    def forward(self, x):
        return self.conv(x)


@pytest.mark.parametrize("kw", [dict(), dict(padding=1), dict(stride=2, padding=2), dict(padding="same"),
                                dict(dilation=2, padding=1), dict(groups=2, padding=1),
                                dict(groups=2, stride=2, dilation=2, bias=False)])
def test_conv1d(kw):
    m = Conv1dNet(**kw).double()
    x = f64(2, 4, 11)
    check(m, (x,), loss_fn=lambda o, t: F.mse_loss(o, t), targets=(f64(*m(x).shape),))


def test_depthwise_conv1d_mamba_style():
    class M(nn.Module):  # Mamba's causal depthwise conv: padding k-1, then the first L outputs
        def __init__(self, d=6, k=4):
            super().__init__()
            self.conv = nn.Conv1d(d, d, k, groups=d, padding=k - 1)

        def forward(self, x):  # x [B, L, d]
            L = x.shape[1]
            return F.silu(self.conv(x.transpose(1, 2))[..., :L]).transpose(1, 2)

    m = M().double()
    x = f64(2, 7, 6)
    check(m, (x,), loss_fn=lambda o, t: F.mse_loss(o, t), targets=(f64(2, 7, 6),))


@pytest.mark.parametrize("kw", [dict(groups=2, padding=1), dict(groups=4, padding=1),  # depthwise
                                dict(dilation=2, padding=2), dict(stride=(1, 2), padding=1),
                                dict(padding=(1, 0)), dict(stride=2, dilation=(2, 1), padding=(1, 2), groups=2)])
def test_conv2d_grouped_dilated_strided(kw):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(4, 8, 3, **kw)

        def forward(self, x):
            return self.conv(x)

    m = M().double()
    x = f64(2, 4, 7, 8)
    check(m, (x,), loss_fn=lambda o, t: F.mse_loss(o, t), targets=(f64(*m(x).shape),))


def test_plain_conv_keeps_the_conv_op():
    m = Conv1dNet(padding=1).double()
    g = weft.from_torch(m, (f64(2, 4, 9),), loss_fn=lambda o, t: F.mse_loss(o, t), targets=(f64(2, 6, 9),))
    assert sum(o["kind"] == "conv2d" for o in g.ops) == 1


# ---- 6. training-mode LayerDrop

def test_layerdrop_export_failure_is_explained():
    from weft.frontend.torch import _export_hint

    class LayerDrop(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])

        def forward(self, x):
            for layer in self.layers:
                if self.training and torch.rand(()) < 0.2:
                    continue
                x = layer(x)
            return x.sum()

    m = LayerDrop()
    with pytest.raises(ValueError, match="torch.export could not capture") as e:
        weft.from_torch(m, (torch.randn(2, 4),))
    hint = _export_hint(e.value.__cause__)
    assert "random" in hint and "LayerDrop" in hint and "eval()" in hint
    assert hint in str(e.value)  # the user sees it
    m.eval()
    weft.from_torch(m, (torch.randn(2, 4),))  # eval mode: no branch on a random number


def test_new_constructs_stay_rebatchable():
    """Zero padding, conv taps, the regression losses and label smoothing add no batch-sized
    constant: the planner can change the batch of the graph."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv1d(4, 4, 3, padding=2, dilation=2, groups=2)
            self.c2 = nn.Conv1d(4, 6, 3, stride=2, padding=1)
            self.fc = nn.Linear(6, 5)

        def forward(self, x):  # [B, 4, 10]
            h = self.c2(F.relu(self.c1(x)))  # [B, 6, 5]
            return self.fc(h.mT)  # [B, 5, 5]

    m = M().double()
    x, y = f64(6, 4, 10), torch.randint(0, 5, (6, 5))
    ce = lambda o, t: (F.cross_entropy(o.reshape(-1, 5), t.reshape(-1), label_smoothing=0.1)  # noqa: E731
                       + F.smooth_l1_loss(o, torch.tanh(o)))
    g, _ = check_forward(m, (x,), loss_fn=ce, targets=(y,))
    small = weft._weft.rebatch(g.train_step(optimizer=None), 2)  # raises if the batch is pinned
    assert small.tensor(small.find("x"))["shape"] == (2, 4, 10)
    assert all(6 not in t["shape"] for t in g.tensors if t["role"] == "constant")


class PromotedMask(nn.Module):
    # An integer mask added to float scores without a conversion: torch promotes it (Hugging Face T5's
    # `causal_mask + attention_mask[:, None, None, :]`); the input is then declared floating point.
    def __init__(self):
        super().__init__()
        self.fc = Reg(5, 4)

    def forward(self, x, mask):
        scores = self.fc(x) + (1 - mask[:, None, :]) * -1e4
        return torch.softmax(scores, -1).sum(-1).mean() + (scores * mask[:, None, :]).pow(2).mean()


def test_an_integer_input_promoted_by_arithmetic_is_a_float_input():
    torch.manual_seed(0)
    mask = torch.ones(6, 4, dtype=torch.long)
    mask[1, 2:] = 0
    g = check(PromotedMask().double(), (f64(6, 3, 5), mask))
    assert {t["name"]: t["dtype"] for t in g.tensors if t["role"] == "input"}["mask"] == "f64"
