"""The torch runtime's per-step costs that are not kernels: id / label range checks without a host
sync on a GPU (deferred to the end of the step) and leaves whose value never changes (a causal
mask, a position table) worked out once, not every step — with the results unchanged."""
import copy

import pytest

torch = pytest.importorskip("torch")

import weft  # noqa: E402
from weft.runtime.kernels import KernelError, check_deferred, check_ids  # noqa: E402

OP = {"name": "lookup", "kind": "embedding"}


def test_check_ids_on_the_cpu_raises_at_once_naming_the_op_and_the_id():
    ids = torch.tensor([0, 3, 7, 2])
    assert check_ids(OP, ids, 8, {}, "id {} is not an integer in [0, 8)") is ids
    with pytest.raises(KernelError, match=r"op 'lookup': id 7 is not an integer in \[0, 7\)"):
        check_ids(OP, ids, 7, {"deferred_checks": []}, "id {} is not an integer in [0, 7)")  # CPU: never deferred


def test_deferred_checks_are_read_back_together_and_name_the_first_failure():
    checks = [("a", torch.tensor([0, 1]), 2, "id {} bad"), ("b", torch.tensor([5, -1]), 4, "label {} out of [0, 4)"),
              ("c", torch.tensor([9]), 3, "index {} bad")]
    with pytest.raises(KernelError, match=r"op 'b': label 5 out of \[0, 4\)"):
        check_deferred(checks)
    assert checks == []  # emptied: the next step starts clean
    ok = [("a", torch.tensor([0, 1]), 2, "id {} bad")]
    check_deferred(ok)
    assert ok == []
    check_deferred([])


def test_a_constant_leaf_is_worked_out_once_and_training_is_unchanged():
    """A module with a causal-mask buffer trained 3 Adam steps (f64) by a one-process Trainer equals
    torch, and the mask's tile is computed at the first step only: later steps reuse the tensor."""
    from weft.training.distributed import launch

    res = launch(_train_masked, nproc=1)[0]
    assert res["steady_cached"] >= 1 and res["same_object"], res
    assert res["flat_calls_after_first"] == res["inputs_per_step"] * 2, res
    assert res["max_rel"] < 1e-12, res


class _Masked(torch.nn.Module):
    def __init__(self, s=5, d=4):
        super().__init__()
        self.q, self.v = torch.nn.Linear(d, d), torch.nn.Linear(d, d)
        self.register_buffer("causal", torch.tril(torch.ones(s, s, dtype=torch.bool)))

    def forward(self, x, y):
        a = (self.q(x) @ x.transpose(-1, -2)).masked_fill(~self.causal, float("-inf")).softmax(-1)
        return ((a @ self.v(x) - y) ** 2).mean()


def _train_masked():
    from weft.runtime import rank as rank_mod

    torch.manual_seed(0)
    model = _Masked().double()
    ref = copy.deepcopy(model)
    x, y = torch.randn(3, 5, 4, dtype=torch.float64), torch.randn(3, 5, 4, dtype=torch.float64)
    one = weft.Cluster.from_json(weft.Cluster.preset("p3.8xlarge").to_json().replace('"num_devices":4',
                                                                                     '"num_devices":1'))
    tr = weft.Trainer(model, (x, y), cluster=one, optimizer=weft.optim.Adam(lr=1e-2), precision="f64",
                      progress=False)
    topt = torch.optim.Adam(ref.parameters(), lr=1e-2, foreach=False)
    calls = []
    real = rank_mod.T.flat_global

    def counting(*a, **k):
        calls.append(1)
        return real(*a, **k)

    for s in range(3):
        if s == 1:
            rank_mod.T.flat_global = counting
            first = dict(tr.engine._file_tiles)
        tr.step((x, y))
        topt.zero_grad()
        ref(x, y).backward()
        topt.step()
    rank_mod.T.flat_global = real
    eng = tr.engine
    same = all(eng._file_tiles[k] is v for k, v in first.items())
    inputs = sum(1 for b in eng._leaf_ids if eng.tensors[eng.buffers[b]["tensor_id"]]["role"] == "input")
    got = tr.full_state_dict()
    max_rel = max(float((got[k] - v).abs().max() / v.abs().max()) for k, v in ref.state_dict().items()
                  if v.is_floating_point())
    return {"steady_cached": len(first), "same_object": same, "flat_calls_after_first": len(calls),
            "inputs_per_step": inputs, "max_rel": max_rel}
