"""The Trainer's optimizer updates run at once in multi-tensor ops (issue 36: per-instruction cost).

``Optimizer.update_many`` must do, element by element, exactly what one ``update`` per tile does
(torch.optim's foreach path is the same arithmetic): checked bit for bit against the per-tile rule
and against torch.optim itself. ``batch_updates`` may merge a step's updates only where nothing
between them reads what an update writes or writes what a later update reads: checked on
instruction lists built by hand.
"""
import copy

import pytest

torch = pytest.importorskip("torch")

import weft  # noqa: E402
from weft.training.engine import batch_updates  # noqa: E402


def tiles(seed, shapes, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=dtype) for s in shapes]


@pytest.mark.parametrize("opt", [weft.optim.Adam(lr=1e-2, betas=(0.8, 0.95), eps=1e-6),
                                 weft.optim.Adam(lr=1e-2, weight_decay=0.1),
                                 weft.optim.AdamW(lr=3e-3, weight_decay=0.05)])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_update_many_equals_one_update_per_tile(opt, dtype):
    shapes = [(3, 5), (7,), (2, 2, 4), (1,)]
    hps = [{"lr": opt.lr, "weight_decay": wd} for wd in (opt.weight_decay, 0.0, opt.weight_decay, 0.25)]
    lrs = [0.5 * hp["lr"] for hp in hps]  # the schedule's factor
    w0, m0, v0 = tiles(0, shapes, dtype), tiles(1, shapes, dtype), [t.abs() for t in tiles(2, shapes, dtype)]
    for step in (1, 2, 7):
        gs = tiles(10 + step, shapes, dtype)
        one = [w.clone() for w in w0]
        one_states = [opt.update(w, g, [m.clone(), v.clone()], hp, lr, step)
                      for w, g, m, v, hp, lr in zip(one, gs, m0, v0, hps, lrs)]
        many = [w.clone() for w in w0]
        many_states = opt.update_many(many, gs, [[m.clone(), v.clone()] for m, v in zip(m0, v0)], hps, lrs, step)
        for a, b in zip(one, many):
            assert torch.equal(a, b)
        for sa, sb in zip(one_states, many_states):
            assert all(torch.equal(x, y) for x, y in zip(sa, sb))


def test_update_many_equals_torch_optim():
    """Three steps of AdamW on three tensors: update_many against torch.optim.AdamW (foreach=False),
    one parameter group with decay and one without."""
    params = tiles(3, [(4, 3), (5,), (2, 6)])
    ref = [torch.nn.Parameter(p.clone()) for p in params]
    topt = torch.optim.AdamW([{"params": ref[:2], "weight_decay": 0.1}, {"params": ref[2:], "weight_decay": 0.0}],
                             lr=1e-2, betas=(0.9, 0.99), eps=1e-8, foreach=False)
    opt = weft.optim.AdamW(lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    hps = [{"lr": 1e-2, "weight_decay": 0.1}] * 2 + [{"lr": 1e-2, "weight_decay": 0.0}]
    ws = [p.clone() for p in params]
    states = [[torch.zeros_like(p), torch.zeros_like(p)] for p in params]
    for step in (1, 2, 3):
        gs = tiles(20 + step, [tuple(p.shape) for p in params])
        for p, g in zip(ref, gs):
            p.grad = g.clone()
        topt.step()
        states = opt.update_many(ws, gs, states, hps, [h["lr"] for h in hps], step)
    for w, p in zip(ws, ref):
        assert torch.allclose(w, p.detach(), rtol=1e-14, atol=1e-15)


def instr(pc, kind, inputs, outputs, op=None):
    return {"pc": pc, "kind": kind, "inputs": inputs, "outputs": outputs, "op": op}


def test_batch_updates_merges_only_when_nothing_in_between_depends():
    # updates: (p, g, m, v) -> (p', m', v'); buffers 1.. by hand
    u1 = instr(10, "compute", [1, 2, 3, 4], [1, 3, 4], op=7)
    u2 = instr(13, "compute", [5, 6, 7, 8], [5, 7, 8], op=8)
    free = instr(11, "free", [2], [])
    gather = instr(12, "all-gather", [1], [20])  # reads u1's result: fine after the batch
    after = [u1, free, gather, u2, instr(14, "free", [6], [])]
    merged = batch_updates(after, [u1, u2])
    assert [i["kind"] for i in merged] == ["optimizer-updates", "free", "all-gather", "free"]
    assert merged[0]["pc"] == 10 and merged[0]["updates"] == [u1, u2]
    # an instruction in between that writes what a later update reads (its gradient): unchanged
    clash = instr(12, "copy", [20], [6])
    assert batch_updates([u1, clash, u2], [u1, u2]) == [u1, clash, u2]
    # ... or reads (not to free it) what a later update writes (its parameter's old value): unchanged
    old_read = instr(12, "send", [5], [])
    assert batch_updates([u1, old_read, u2], [u1, u2]) == [u1, old_read, u2]
    # a free of it does not count as a read
    assert [i["kind"] for i in batch_updates([u1, instr(12, "free", [5], []), u2], [u1, u2])][0] == "optimizer-updates"
    # one update: nothing to merge
    assert batch_updates([u1, free], [u1]) == [u1, free]


def test_trainer_runs_its_updates_at_once():
    """A Trainer on one process merges its step's updates into one instruction, and trains the
    module as torch does (Adam, f64, 3 steps)."""
    from weft.training.distributed import launch

    res = launch(_train_one, nproc=1)[0]
    assert res["merged"] == 1 and res["updates"] == res["params"]
    assert res["max_rel"] < 1e-12, res


def _train_one():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3)).double()
    ref = copy.deepcopy(model)
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)

    def loss_fn(out, target):
        return ((out - target) ** 2).mean()

    one = weft.Cluster.from_json(weft.Cluster.preset("p3.8xlarge").to_json().replace('"num_devices":4',
                                                                                     '"num_devices":1'))
    tr = weft.Trainer(model, (x,), targets=(y,), loss_fn=loss_fn, cluster=one,
                      optimizer=weft.optim.Adam(lr=1e-2), precision="f64", progress=False)
    topt = torch.optim.Adam(ref.parameters(), lr=1e-2, foreach=False)
    for _ in range(3):
        tr.step((x, y))
        topt.zero_grad()
        loss_fn(ref(x), y).backward()
        topt.step()
    got = tr.full_state_dict()
    max_rel = max(float((got[k] - v).abs().max() / v.abs().max()) for k, v in ref.state_dict().items())
    merged = sum(1 for i in tr.engine.after if i["kind"] == "optimizer-updates")
    return {"merged": merged, "updates": len(tr.engine.updates), "params": len(list(ref.parameters())),
            "max_rel": max_rel}
