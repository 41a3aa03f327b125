"""Cross entropy with ignore_index, class weights and label smoothing, end to end (issue 34).

torch's mean divides by D = Σ_t w[y_t]·[y_t ≠ ignore_index] over the WHOLE batch; weft runs the loss
per micro-batch and replica and averages the parts by samples, so each part divides by its share of
the step's D (exec::CeValidFractions: the executor and every torch rank count the step's labels).
Oracles, all in float64: torch autograd + torch.optim.Adam on the same module and batch, whose -100
padding differs between micro-batches and replicas (one part has no valid label at all); the kernels
by hand on 2 tokens x 3 classes (also tests/cpp/ir/test_interpreter.cpp); torch's nan for a batch
with every label ignored."""
import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import weft  # noqa: E402
from test_frontend_gaps import check  # noqa: E402 (forward and gradients against torch)

RTOL = 1e-9
V = 12  # classes (divisible by 2 and 4: a vocab-parallel split)


class PaddedLM(nn.Module):
    """A causal LM head on a padded batch, as Hugging Face computes it: the labels shifted inside,
    -100 (or a pad id) where there is no target."""

    def __init__(self, loss="ignore", h=8):
        super().__init__()
        self.loss = loss
        self.emb = nn.Embedding(V, h)
        self.fc = nn.Linear(h, h)
        self.head = nn.Linear(h, V)
        self.register_buffer("class_weight", torch.linspace(0.5, 2.0, V, dtype=torch.float64))

    def forward(self, ids, labels):
        logits = self.head(torch.tanh(self.fc(self.emb(ids))))[:, :-1]
        y = labels[:, 1:]
        w = self.class_weight
        flat = logits.reshape(-1, V), y.reshape(-1)
        if self.loss == "ignore":
            return F.cross_entropy(*flat)
        if self.loss == "weighted":
            return F.cross_entropy(*flat, weight=w)
        if self.loss == "weighted_smoothed":
            return F.cross_entropy(*flat, weight=w, label_smoothing=0.1)
        if self.loss == "smoothed":
            return F.cross_entropy(*flat, label_smoothing=0.2)
        if self.loss == "sum":  # each ignored token 0, no normaliser
            return F.cross_entropy(*flat, weight=w, label_smoothing=0.1, reduction="sum")
        if self.loss == "pad_id":  # an in-range ignore_index: the pad id 0
            return F.cross_entropy(*flat, ignore_index=0)
        if self.loss == "nll":
            return F.nll_loss(F.log_softmax(logits, -1).reshape(-1, V), y.reshape(-1), weight=w)
        if self.loss == "class_dim_1":  # [N, C, d] logits
            return F.cross_entropy(logits.transpose(1, 2), y, weight=w, label_smoothing=0.1)
        if self.loss == "literal_weight":  # a constant folded at import
            return F.cross_entropy(*flat, weight=torch.arange(1.0, V + 1.0, dtype=torch.float64))
        raise ValueError(self.loss)


LOSSES = ["ignore", "weighted", "weighted_smoothed", "smoothed", "sum", "pad_id", "nll", "class_dim_1",
          "literal_weight"]
# per sample, how many of its 6 shifted labels are padding: with 2 samples per part (4 parts of 8) the
# parts hold 10, 0, 8 and 2 valid labels -- the second none at all
PADS = (0, 2, 6, 6, 1, 3, 4, 6)


def padded_batch(pad=-100, pads=PADS):
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, V, (len(pads), 7), generator=g)
    labels = torch.randint(1, V, (len(pads), 7), generator=g)  # never the pad id 0
    for i, n in enumerate(pads):
        if n:
            labels[i, 7 - n:] = pad
    return ids, labels


def build(loss, lr=1e-2):
    torch.manual_seed(7)
    module = PaddedLM(loss).double()
    ids, labels = padded_batch(0 if loss == "pad_id" else -100)
    step = weft.from_torch(module, (ids, labels)).train_step(optimizer="adam", lr=lr)
    return module, (ids, labels), step


def torch_train(module, batch, steps=3, lr=1e-2):
    m = copy.deepcopy(module)
    opt = torch.optim.Adam(m.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = m(*batch)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses, {n: p.detach().numpy() for n, p in m.named_parameters()}


def feeds(batch):
    return {"ids": batch[0].numpy(), "labels": batch[1].numpy()}


def assert_trained_like_torch(got, want):
    losses, params = want
    np.testing.assert_allclose(got.losses, losses, rtol=RTOL, atol=0)
    assert set(got.parameters) == set(params)
    for n, p in params.items():
        np.testing.assert_allclose(got.parameters[n], p, rtol=RTOL, atol=RTOL * np.max(np.abs(p)), err_msg=n)


@pytest.fixture(scope="module")
def cluster():
    return weft.Cluster.preset("p3.8xlarge")


# ---- the data makes the normaliser matter

def test_the_mean_of_part_means_is_not_torchs():
    """The oracle can tell: the mean over the 4 parts' own means (or a count per part) is far from
    torch's whole-batch mean on this batch, so a plan that divided per part would fail the tests."""
    module, batch, _ = build("weighted")
    with torch.no_grad():
        whole = float(module(*batch))
        parts = [float(module(batch[0][k:k + 2], batch[1][k:k + 2])) for k in range(0, 8, 2)]
    assert np.isnan(parts[1])  # a part without a valid label divides 0 by 0
    valid = [p for p in parts if not np.isnan(p)]
    assert abs(np.mean(valid) - whole) > 1e-3 * abs(whole)  # 10^6 times the tests' tolerance


# ---- the importer

@pytest.mark.parametrize("loss", LOSSES)
def test_imports_like_torch(loss):
    """Forward and every parameter gradient equal torch's (weft.interpret, f64)."""
    torch.manual_seed(7)
    module = PaddedLM(loss).double()
    g = check(module, padded_batch(0 if loss == "pad_id" else -100))
    ces = [op for op in g.ops if op["kind"] == "cross_entropy"]
    assert len(ces) == 1  # ignore_index, weights and smoothing inside the one op
    weighted = loss in ("weighted", "weighted_smoothed", "sum", "nll", "class_dim_1", "literal_weight")
    assert len(ces[0]["inputs"]) == (3 if weighted else 2)
    if loss == "pad_id":
        assert list(ces[0]["attrs"]["ints"]) == [0, 0]


def test_a_batch_with_every_label_ignored_is_torchs_nan():
    torch.manual_seed(7)
    module = PaddedLM("weighted").double()
    ids, labels = padded_batch(pads=(6,) * 8)
    want = module(ids, labels)
    assert torch.isnan(want)
    want.backward()
    g = weft.from_torch(module, (ids, labels))
    step = g.train_step(optimizer=None)
    fd = weft.feeds_from_torch(module, (ids, labels))
    out = weft.interpret(step, fd)
    assert np.isnan(out[step.tensor(step.loss)["name"]])
    # no label, no gradient (torch's zeros), not nan
    for name, p in module.named_parameters():
        got = out[step.tensor(step.grad(step.find(name)))["name"]]
        np.testing.assert_array_equal(got, p.grad.numpy())


def test_class_weights_a_parameter_reaches_are_refused():
    """torch does not differentiate the weights (torch.export itself refuses a Parameter there); a graph
    built in code with weights computed from a parameter is refused by autodiff, by name."""
    g = weft.Graph("ce")
    x = g.input("x", [2, 3], "f32")
    y = g.input("y", [2], "i64")
    w = g.exp(g.parameter("w", [3], "f32"))
    g.set_loss(g.cross_entropy(x, y, weight=w))
    with pytest.raises(ValueError, match="class weights 'unary_0' depend on a parameter"):
        g.train_step(optimizer="adam")


def _graph():
    g = weft.Graph("ce")
    return g, g.input("x", [2, 3], "f32"), g.input("y", [2], "i64")


def test_bad_labels_and_weights_are_clear_errors():
    g, x, y = _graph()
    with pytest.raises(ValueError, match=r"class weights must have shape \[3\]"):
        g.cross_entropy(x, y, weight=g.constant("w4", [4], "f32"))
    g, x, y = _graph()
    with pytest.raises(ValueError, match="label smoothing 1.5 is not in"):
        g.cross_entropy(x, y, label_smoothing=1.5)
    with pytest.raises(ValueError, match="normalize must be"):
        g.cross_entropy(x, y, normalize="mean")
    g, x, y = _graph()
    g.set_loss(g.cross_entropy(x, y, ignore_index=-1))
    xs = np.zeros((2, 3))
    with pytest.raises(ValueError, match=r"label -100 is not an integer in \[0, 3\)"):
        weft.interpret(g, {"x": xs, "y": np.array([-100, 1])})  # -100 is not this op's ignore_index
    got = weft.interpret(g, {"x": xs, "y": np.array([-1, 1])})[g.tensor(g.loss)["name"]]
    assert got == pytest.approx(np.log(3))  # the one counted token: uniform over 3 classes


def test_default_cross_entropy_keeps_its_json_and_fingerprint():
    """Graphs made before (no attributes) are unchanged: the defaults are stored as nothing."""
    g = weft.Graph("ce")
    x = g.input("x", [2, 3], "f32")
    y = g.input("y", [2], "i64")
    g.set_loss(g.cross_entropy(x, y))
    assert g.ops[0]["attrs"] == {}
    h = weft.Graph("ce")
    x = h.input("x", [2, 3], "f32")
    y = h.input("y", [2], "i64")
    h.set_loss(h.cross_entropy(x, y, ignore_index=-100, label_smoothing=0.0, normalize="valid"))
    assert h.fingerprint() == g.fingerprint()
    k = weft.Graph("ce")
    x = k.input("x", [2, 3], "f32")
    y = k.input("y", [2], "i64")
    k.set_loss(k.cross_entropy(x, y, ignore_index=0, label_smoothing=0.25, weight=k.constant("w", [3], "f32")))
    back = weft.Graph.from_json(k.to_json())
    assert list(back.ops[0]["attrs"]["ints"]) == [0, 0] and back.ops[0]["attrs"]["scalar"] == 0.25 and len(back.ops[0]["inputs"]) == 3
    assert back.fingerprint() == k.fingerprint() != g.fingerprint()


# ---- the runtime's torch kernels, by hand (the same cases as the C++ doctest)

L2, L3 = np.log(2.0), np.log(3.0)
HAND = [  # (labels, ignore_index, smoothing, token mean, weighted, loss, dlogits); w = [1, 2, 3]
    ([1, -100], -100, 0.0, False, True, L2, [0.25, -0.5, 0.25, 0, 0, 0]),
    ([1, 0], -100, 0.0, False, True, (2 * L2 + L3) / 3, [1 / 6, -1 / 3, 1 / 6, -2 / 9, 1 / 9, 1 / 9]),
    ([1, -100], -100, 0.3, False, False, 1.2 * L2, [0.15, -0.3, 0.15, 0, 0, 0]),
    ([1, 0], 0, 0.0, False, False, L2, [0.25, -0.5, 0.25, 0, 0, 0]),
    ([1, 2], -100, 0.0, True, True, (2 * L2 + 3 * L3) / 2, [0.25, -0.5, 0.25, 0.5, 0.5, -1]),
]


@pytest.mark.parametrize("case", HAND)
def test_torch_kernels_by_hand(case):
    """Logits [[0, ln 2, 0], [0, 0, 0]] (p = [1/4, 1/2, 1/4] and 1/3 each): the whole-vocabulary kernel
    and the four vocab-parallel steps over classes {0, 1} | {2} with the statistics summed by hand."""
    from weft.runtime.kernels import ce_grad, ce_loss, ce_row_max, ce_row_sum_target, run_kernel

    labels, ii, eps, token_mean, weighted, loss, grad = case
    x = torch.tensor([[0.0, L2, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    y = torch.tensor(labels)
    w = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    attrs = {"ints": [ii, int(token_mean)]} if (ii != -100 or token_mean) else {}
    if eps:
        attrs["scalar"] = eps
    fwd = {"kind": "cross_entropy", "name": "ce", "inputs": [0, 1, 2][:3 if weighted else 2], "attrs": attrs}
    bwd = {"kind": "cross_entropy_grad", "name": "ce", "inputs": [0, 1, 2, 3][:4 if weighted else 3],
           "attrs": attrs}
    one = torch.ones((), dtype=torch.float64)
    got = run_kernel(fwd, [x, y] + ([w] if weighted else []), {})[0]
    assert float(got) == pytest.approx(loss, rel=1e-14)
    dx = run_kernel(bwd, [x, y, one] + ([w] if weighted else []), {})[0]
    np.testing.assert_allclose(dx.numpy().reshape(-1), grad, rtol=1e-14, atol=1e-15)
    ctx_a = {"vocab_index": np.array([0, 1]), "vocab_size": 3}
    ctx_b = {"vocab_index": np.array([2]), "vocab_size": 3}
    m = ce_row_max(x)
    sa = ce_row_sum_target(fwd, x[:, :2], y, m, dict(ctx_a), w[:2] if weighted else None)
    sb = ce_row_sum_target(fwd, x[:, 2:], y, m, dict(ctx_b), w[2:] if weighted else None)
    s = sa + sb
    assert float(ce_loss(fwd, y, m, s, dict(ctx_a), True)) == pytest.approx(loss, rel=1e-14)
    assert float(ce_loss(fwd, y, m, s, dict(ctx_b), False)) == 0.0
    ga = ce_grad(bwd, x[:, :2], y, one, m, s, dict(ctx_a), w[:2] if weighted else None)
    gb = ce_grad(bwd, x[:, 2:], y, one, m, s, dict(ctx_b), w[2:] if weighted else None)
    np.testing.assert_allclose(torch.cat([ga, gb], 1).numpy().reshape(-1), grad, rtol=1e-14, atol=1e-15)


# ---- trained 3 Adam steps like torch: the CPU executor and 4 gloo processes

LAYOUTS = [(1, 1, 4, 2), (1, 2, 2, 2), (2, 1, 2, 2), (1, 4, 1, 4)]  # Megatron t, p, d, micro-batches


@pytest.mark.parametrize("loss", ["ignore", "weighted_smoothed", "sum", "pad_id"])
def test_execute_trains_like_torch(loss, cluster):
    """weft.execute (CPU threads) under data-parallel, pipelined (M >= 2) and tensor-parallel layouts,
    and the reference interpreter on the whole batch, each equal to torch's Adam on the module."""
    module, batch, step = build(loss)
    want = torch_train(module, batch)
    assert_trained_like_torch(weft.execute_reference(step, inputs=feeds(batch)), want)
    for t, p, d, mb in LAYOUTS:
        plan = weft.megatron_plan(step, cluster, t=t, p=p, d=d, num_microbatches=mb)
        assert_trained_like_torch(weft.execute(plan, step, cluster, inputs=feeds(batch)), want)


def _parameter_specs(step, cluster, t, p, d, mb):
    program = weft.lower(weft.megatron_plan(step, cluster, t=t, p=p, d=d, num_microbatches=mb), step, cluster)
    params = {"emb.weight", "fc.weight", "fc.bias", "head.weight", "head.bias"}
    return sorted((b["tensor"], b["spec"], b["stage"]) for b in program.buffers if b["tensor"] in params)


def test_a_summed_loss_gets_the_mean_losss_megatron_layout(cluster):
    """reduction="sum" imports as the op times the token count: a block of one scalar `scale` op (and
    its gradient) that no mesh splits. It runs replicated; the layers keep Megatron's splits (before,
    the planner refused every t > 1 layout)."""
    for t, p, d, mb in [lay for lay in LAYOUTS if lay[0] > 1] + [(2, 1, 2, 2), (4, 1, 1, 1)]:
        got = _parameter_specs(build("sum")[2], cluster, t, p, d, mb)
        assert got == _parameter_specs(build("ignore")[2], cluster, t, p, d, mb)
        assert any("S(" in spec for _, spec, _ in got)  # split over the tensor-parallel devices


def _vocab_parallel(step, cluster, n=4):
    """The LM head's classes (and the class weights) split over n devices: the loss runs as the four
    vocab-parallel steps with all-reduced statistics."""
    mesh = weft.DeviceMesh([n], range(n))
    fixed = {"head.weight": "S(0)"}
    if step.find("class_weight") is not None:
        fixed["class_weight"] = "S(0)"
    result = weft.spmd_search(step, cluster, mesh, level="O2", time_limit=10, fixed_specs=fixed,
                              shared_resharding=False)
    program = weft.lower_spmd(step, cluster, mesh, result)
    kinds = [i["kind"] for r in range(n) for i in program.instructions(r)]
    assert "ce-sum-target" in kinds and "ce-grad" in kinds
    return program


@pytest.mark.parametrize("loss", ["weighted_smoothed", "ignore"])
def test_vocab_parallel_loss_trains_like_torch(loss, cluster):
    module, batch, step = build(loss)
    want = torch_train(module, batch)
    assert_trained_like_torch(weft.execute(_vocab_parallel(step, cluster), inputs=feeds(batch)), want)


@pytest.mark.parametrize("loss", ["ignore", "weighted_smoothed"])
def test_weft_run_on_4_processes_trains_like_torch(loss, cluster):
    """4 gloo processes: 2 stages x 2 replicas with 2 micro-batches, 4 replicas, and the
    vocab-parallel loss."""
    module, batch, step = build(loss)
    want = torch_train(module, batch)
    for t, p, d, mb in [(1, 2, 2, 2), (1, 1, 4, 2)]:
        plan = weft.megatron_plan(step, cluster, t=t, p=p, d=d, num_microbatches=mb)
        assert_trained_like_torch(weft.run(plan, step, cluster, steps=3, dtype="f64", inputs=feeds(batch)), want)
    assert_trained_like_torch(weft.run(_vocab_parallel(step, cluster), steps=3, dtype="f64", inputs=feeds(batch)),
                              want)


def test_a_step_with_every_label_ignored_is_nan_everywhere(cluster):
    """torch: nan loss and zero gradients (Adam then leaves the weights); a plan: the same."""
    module, _, step = build("weighted")
    batch = padded_batch(pads=(6,) * 8)
    want = torch_train(module, batch)
    assert all(np.isnan(want[0]))
    plan = weft.megatron_plan(step, cluster, t=1, p=2, d=2, num_microbatches=2)
    got = weft.execute(plan, step, cluster, inputs=feeds(batch))
    assert all(np.isnan(got.losses))
    for n, p in want[1].items():
        np.testing.assert_array_equal(got.parameters[n], p)


# ---- weft.Trainer: the global batch, and local batches (each rank holds only its rows)

TRAINER_LAYOUTS = [(1, 2, 2, 2), (2, 1, 2, 2)]  # Megatron t, p, d, micro-batches on 4 processes


class _CountingDist:
    """torch.distributed with every all-reduce's element count recorded."""

    def __init__(self, dist):
        self._dist, self.sizes = dist, []

    def __getattr__(self, name):
        return getattr(self._dist, name)

    def all_reduce(self, t, *args, **kwargs):
        self.sizes.append(t.numel())
        return self._dist.all_reduce(t, *args, **kwargs)


def _trainer_run(local, layout):
    import torch.distributed as dist

    from weft.training import trainer as trainer_mod

    module, batch, _ = build("weighted_smoothed")
    world = dist.get_world_size()
    cluster = weft.Cluster.preset("p3.8xlarge")
    opt = weft.optim.Adam(lr=1e-2)
    graph = weft.Trainer.training_graph(module, batch, opt)
    t, p, d, mb = layout
    plan = weft.megatron_plan(graph, cluster, t=t, p=p, d=d, num_microbatches=mb)
    tr = weft.Trainer(module, batch, plan=plan, cluster=cluster, optimizer=opt, precision="f64")
    assert world == 4
    losses = []
    for _ in range(3):
        if local:
            rows = tr.local_indices()
            losses.append(tr.step(tr.local_batch((batch[0][rows], batch[1][rows])))["loss"])
        else:
            losses.append(tr.step(batch)["loss"])
    counted = None
    if local:  # the local count's collectives, against the fractions of the whole batch
        rows = tr.local_indices()
        local_inputs = tr._inputs(tr.local_batch((batch[0][rows], batch[1][rows])), ())
        real, counting = trainer_mod._dist, _CountingDist(dist)
        trainer_mod._dist = lambda: counting
        try:
            got = tr._local_ce_fractions(local_inputs, 4)
        finally:
            trainer_mod._dist = real
        want = tr.layout.ce_valid_fractions(tr.engine.leaves.leaf_values, feeds(batch), 4)
        counted = (got, want, counting.sizes)
    return losses, {k: v.numpy() for k, v in tr.full_state_dict().items()}, len(tr.local_indices()), counted


@pytest.mark.parametrize("layout", TRAINER_LAYOUTS)
@pytest.mark.parametrize("local", [False, True])
def test_trainer_trains_like_torch(local, layout):
    module, batch, _ = build("weighted_smoothed")
    losses, params = torch_train(module, batch)
    results = weft.launch(_trainer_run, local, layout, nproc=4)
    got_losses, state, read, _ = results[0]
    np.testing.assert_allclose(got_losses, losses, rtol=RTOL, atol=0)
    for n, p in params.items():
        np.testing.assert_allclose(state[n], p, rtol=RTOL, atol=RTOL * np.max(np.abs(p)), err_msg=n)
    if local:  # the ranks of one replica read half of the batch
        assert min(r[2] for r in results) < 8
        for _, _, _, (got, want, sizes) in results:
            # one loss: one all-reduce of [weighted count, labels] on every rank, whatever the batch
            # (the old max-reduce of the whole batch's ids and labels sent 2 x 8 x 7 numbers)
            assert sizes == [2]
            assert want and got.keys() == want.keys()  # the loss and its gradient op
            for o in want:
                assert got[o] == pytest.approx(want[o], rel=1e-15)


@pytest.mark.parametrize("layout", LAYOUTS + [(2, 2, 1, 2), (4, 1, 1, 1)])
def test_each_part_is_counted_once(layout, cluster):
    """Every rank's counts from only the rows it reads (zeros elsewhere), summed over the ranks, are
    the whole batch's: each (micro-batch, replica) part counted by one rank that holds its rows, also
    where tensor-parallel ranks read the same rows. The truth: torch's weighted count of the batch."""
    module, batch, step = build("weighted")
    ids, labels = batch
    y = labels[:, 1:].reshape(-1)
    w = module.class_weight
    valid = y != -100
    weighted = float(w[y[valid]].sum())  # torch's normaliser D
    t, p, d, mb = layout
    program = weft.lower(weft.megatron_plan(step, cluster, t=t, p=p, d=d, num_microbatches=mb), step, cluster)
    lay = weft._weft.ProgramLayout(program)
    leaves = weft._weft.LeafValues(program.graph, 0, True)
    assert list(lay.ce_unheld_rows()) == []
    total = np.zeros(2)
    readers = np.zeros(8, dtype=int)
    for r in range(program.num_ranks):
        rows = list(lay.rows_read(r))
        readers[rows] += 1
        local = {k: np.zeros_like(v) for k, v in feeds(batch).items()}
        for k, v in feeds(batch).items():
            local[k][rows] = v[rows]
        total += np.asarray(lay.ce_valid_counts(leaves, local, 1, r))
    assert total[0] == pytest.approx(weighted, rel=1e-14)
    assert total[1] == y.numel()
    if t > 1:  # rows several ranks read (the tensor-parallel ranks of a replica)
        assert readers.max() >= 2
    rho = lay.ce_fractions_from_counts(list(total))  # the loss's op and its gradient's
    assert len(rho) == 2 and all(v == pytest.approx(weighted / y.numel(), rel=1e-14) for v in rho.values())


def _batch_split_program(step, cluster):
    """One replica whose 2 devices each load half of the batch (the batch split inside the stage
    mesh): no single rank holds a part's rows."""
    mesh = weft.DeviceMesh([2], range(2))
    fixed = {"ids": "S(0)", "labels": "S(0)"}
    result = weft.spmd_search(step, cluster, mesh, level="O2", time_limit=10, fixed_specs=fixed,
                              shared_resharding=False)
    return weft.lower_spmd(step, cluster, mesh, result)


def test_a_part_no_rank_holds_is_counted_by_rank_0_from_gathered_rows(cluster):
    module, batch, step = build("weighted")
    program = _batch_split_program(step, cluster)
    lay = weft._weft.ProgramLayout(program)
    leaves = weft._weft.LeafValues(program.graph, 0, True)
    assert [list(lay.rows_read(r)) for r in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert list(lay.ce_unheld_rows()) == list(range(8))
    y = batch[1][:, 1:].reshape(-1)
    weighted = float(module.class_weight[y[y != -100]].sum())
    whole = feeds(batch)
    assert lay.ce_valid_counts(leaves, whole, 1, 0) == pytest.approx([weighted, y.numel()], rel=1e-14)
    assert lay.ce_valid_counts(leaves, whole, 1, 1) == [0, 0]


def _trainer_batch_split_run():
    module, batch, step = build("weighted_smoothed")
    cluster = weft.Cluster.preset("p3.8xlarge")
    opt = weft.optim.Adam(lr=1e-2)
    program = _batch_split_program(weft.Trainer.training_graph(module, batch, opt), cluster)
    tr = weft.Trainer(module, batch, plan=program, cluster=cluster, optimizer=opt, precision="f64")
    rows = tr.local_indices()
    losses = [tr.step(tr.local_batch((batch[0][rows], batch[1][rows])))["loss"] for _ in range(3)]
    return losses, {k: v.numpy() for k, v in tr.full_state_dict().items()}, rows


def test_trainer_local_batches_split_inside_a_replica_train_like_torch():
    """The fallback: the rows of the parts no rank holds are gathered, rank 0 counts them."""
    module, batch, _ = build("weighted_smoothed")
    losses, params = torch_train(module, batch)
    results = weft.launch(_trainer_batch_split_run, nproc=2)
    got_losses, state, _ = results[0]
    assert [r[2] for r in results] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    np.testing.assert_allclose(got_losses, losses, rtol=RTOL, atol=0)
    for n, p in params.items():
        np.testing.assert_allclose(state[n], p, rtol=RTOL, atol=RTOL * np.max(np.abs(p)), err_msg=n)
