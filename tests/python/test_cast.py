"""The IR's cast (a floating dtype conversion) against torch: a module in f64 that computes part of
itself in f32, as Hugging Face's Llama does in its RMSNorm (include/weft/ir/precision.hpp)."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import weft  # noqa: E402
from weft.runtime.rank import held_dtype  # noqa: E402

B, H = 8, 6


class Island(torch.nn.Module):
    """f64 around an f32 region of products and sums only: IEEE rounds each correctly, and f64
    arithmetic followed by one rounding to f32 is f32 arithmetic exactly (53 >= 2·24 + 2 bits), so
    weft's forward must equal torch's to f64 rounding -- while the same module without the casts
    differs at f32 rounding (the control below)."""

    def __init__(self, island=True):
        super().__init__()
        self.lin = torch.nn.Linear(H, H)
        self.w = torch.nn.Parameter(torch.randn(H))
        self.island = island

    def forward(self, x, target):
        h = self.lin(x)
        w = self.w
        if self.island:
            h, w = h.float(), w.to(torch.float32)
        h = h * h + h * w  # in f32 when island
        y = h.type_as(x)  # back to f64
        return ((y - target) ** 2).mean()


@pytest.fixture
def case():
    torch.manual_seed(0)
    m = Island().double()
    x, target = torch.randn(B, H, dtype=torch.float64), torch.randn(B, H, dtype=torch.float64)
    return m, x, target


def _loss(g, feeds):
    return float(weft.interpret(g, feeds)[g.tensor(g.loss)["name"]])


def test_the_importer_maps_float_conversions_to_casts(case):
    m, x, target = case
    g = weft.from_torch(m, (x, target))
    casts = [o for o in g.ops if o["kind"] == "cast"]
    # h.float(), w.to(f32), type_as back; torch's x.double() of an f64 tensor stays free
    assert len(casts) == 3
    assert g.base_dtype == "f64"
    assert {g.tensor(o["outputs"][0])["dtype"] for o in casts} == {"f32", "f64"}
    assert g.tensor(g.find("lin.weight"))["dtype"] == "f64"
    assert weft.Graph.from_json(g.to_json()) == g
    # an f64 module without conversions has no cast, every float tensor f64
    plain = weft.from_torch(Island(island=False).double(), (x, target))
    assert not [o for o in plain.ops if o["kind"] == "cast"]
    assert {t["dtype"] for t in plain.tensors if not t["dtype"].startswith("i")} == {"f64"}


def test_forward_equals_torch_and_the_region_is_rounded(case):
    m, x, target = case
    g = weft.from_torch(m, (x, target))
    feeds = weft.feeds_from_torch(m, (x, target))
    with torch.no_grad():
        want = float(m(x, target))
        plain = copy.deepcopy(m)
        plain.island = False
        f64 = float(plain(x, target))
    got = _loss(g, feeds)
    assert abs(got - want) <= 1e-14 * abs(want)
    assert abs(f64 - want) > 1e-10 * abs(want)  # the control: without the f32 region it differs


def test_gradients_match_torch(case):
    """The backward runs in f32 inside the region in both (torch's grad of .float() is the gradient
    converted back to f64); sums of several f32 terms may be added in another order: f32 rounding."""
    m, x, target = case
    g = weft.from_torch(m, (x, target))
    step = g.train_step(optimizer=None)
    assert sum(o["kind"] == "cast" for o in step.ops) == 6  # three forward, three backward
    out = weft.interpret(step, weft.feeds_from_torch(m, (x, target)))
    m.zero_grad()
    m(x, target).backward()
    for n, p in m.named_parameters():
        gid = step.grad(step.find(n))
        t = step.tensor(gid)
        assert t["dtype"] == "f64"
        v = out[t["name"]] if t["name"] in out else out[f"{t['name']}@{gid}"]
        ref = p.grad.numpy()
        assert np.abs(v - ref).max() <= 1e-6 * np.abs(ref).max(), n


def _torch_adam(m, x, target, steps, lr=1e-2):
    tm = copy.deepcopy(m)
    opt = torch.optim.Adam(tm.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = tm(x, target)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {n: p.detach().numpy() for n, p in tm.named_parameters()}


@pytest.fixture(scope="module")
def cluster():
    return weft.Cluster.preset("p3.8xlarge")


def _inputs(x, target):
    return {"x": x.numpy(), "target": target.numpy()}


def _check_run(got, m, x, target):
    losses, params = _torch_adam(m, x, target, steps=2)
    # step 1 is the forward from the module's own weights: exact; step 2 follows one Adam update,
    # whose gradient agrees to f32 rounding (test_gradients_match_torch)
    assert abs(got.losses[0] - losses[0]) <= 1e-14 * abs(losses[0])
    np.testing.assert_allclose(got.losses[1], losses[1], rtol=1e-6)
    for n, want in params.items():
        np.testing.assert_allclose(got.parameters[n], want, rtol=1e-6, atol=1e-6 * np.abs(want).max(), err_msg=n)


def test_execute_with_a_split_layout_trains_like_torch(case, cluster):
    m, x, target = case
    step = weft.from_torch(m, (x, target)).train_step(optimizer="adam", lr=1e-2)
    plan = weft.megatron_plan(step, cluster, t=2, p=1, d=2, num_microbatches=2)
    got = weft.execute(plan, step, cluster, steps=2, inputs=_inputs(x, target))
    _check_run(got, m, x, target)
    # The region is held in f32 under the split too: the one-device reference's values, but for the
    # f32 gradient of w summed over the batch, which the split adds up by parts (each part rounded to
    # f32, as torch's f32 accumulation would): f32 rounding, where an f64 region would give ~1e-15.
    ref = weft.execute_reference(step, steps=2, inputs=_inputs(x, target))
    assert ref.losses[0] == pytest.approx(got.losses[0], rel=1e-14)
    assert got.max_relative_error(ref) < 1e-6


def test_weft_run_on_4_gloo_processes_trains_like_torch(case, cluster):
    m, x, target = case
    step = weft.from_torch(m, (x, target)).train_step(optimizer="adam", lr=1e-2)
    plan = weft.data_parallel_plan(step, cluster, [2, 2, 2, 2])
    got = weft.run(plan, step, cluster, steps=2, dtype="f64", inputs=_inputs(x, target))
    _check_run(got, m, x, target)


def test_held_dtype_rule():
    """The runtime's storage rule (rank.held_dtype) is ir::held_dtype's: the base at the run's dtype,
    a region narrower than the base at most its own, one wider at least its own."""
    assert held_dtype("f64", "f64", "f64") == "f64"
    assert held_dtype("f32", "f64", "f64") == "f32"  # an f64 run keeps the f32 region f32
    assert held_dtype("f32", "f64", "bf16") == "bf16"  # a narrower run narrows everything
    assert held_dtype("f32", "f32", "f64") == "f64"  # single-dtype graphs: the run's dtype
    assert held_dtype("f32", "bf16", "bf16") == "f32"  # a bf16 model's upcast stays f32
    assert held_dtype("f32", "bf16", "f64") == "f64"


def test_a_bf16_model_keeps_its_f32_region():
    """module.to(bfloat16) upcasting inside (RMSNorm's .float()): the graph's base is bf16 and the
    region f32, which a bf16 run (weft.run(dtype="bf16"), the Trainer's own dtypes) holds in f32."""
    torch.manual_seed(0)
    m = Island().to(torch.bfloat16)
    x, target = torch.randn(B, H, dtype=torch.bfloat16), torch.randn(B, H, dtype=torch.bfloat16)
    g = weft.from_torch(m, (x, target))
    assert g.base_dtype == "bf16"
    region = [g.tensor(o["outputs"][0]) for o in g.ops
              if o["kind"] == "binary" and o["name"] in ("mul", "mul_1", "add")]
    assert region and {t["dtype"] for t in region} == {"f32"}
    assert {held_dtype(t["dtype"], g.base_dtype, "bf16") for t in region} == {"f32"}
