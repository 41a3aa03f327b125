"""Bad arguments get a clear error naming them (issue 38's smaller items): no silent truncation
(steps=2.7), no binding's "incompatible function arguments" (seed=-1, lower(plan, None, c)), no
AttributeError (schedule=None), no accepted nonsense (threads=-1, compute_efficiency=50); a weft run
whose loss is not finite exits 1 saying so."""
import subprocess
import sys

import pytest

import weft
from weft_env import subprocess_env


@pytest.fixture(scope="module")
def small():
    step = weft.models.gpt(layers=1, hidden=32, heads=2, seq=4, vocab=32, batch=4).train_step()
    return step, weft.Cluster.preset("p3.8xlarge")


@pytest.mark.parametrize("call,err,msg", [
    (lambda s, c: weft.execute_reference(s, steps=2.7), ValueError, "steps must be an integer >= 1, got 2.7"),
    (lambda s, c: weft.execute_reference(s, seed=-1), ValueError, "seed must be an integer >= 0, got -1"),
    (lambda s, c: weft.execute(weft.plan(s, c), s, c, steps=0), ValueError, "steps must be an integer >= 1"),
    (lambda s, c: weft.plan(s, c, schedule=None), TypeError, "schedule must be a name"),
    (lambda s, c: weft.plan(s, c, threads=-1), ValueError, "threads must be an integer >= 0, got -1"),
    (lambda s, c: weft.plan(s, c, compute_efficiency=50), ValueError, r"compute_efficiency must be a number in \(0, 1\]"),
    (lambda s, c: weft.lower(weft.plan(s, c), None, c), TypeError, "lower: step: expected a weft.Graph"),
    (lambda s, c: weft.lower(weft.plan(s, c), s, "p3.8xlarge"), TypeError, "lower: cluster: expected a weft.Cluster"),
    (lambda s, c: weft.run(weft.plan(s, c), s, c, steps=2.7), ValueError, "steps must be an integer >= 1, got 2.7"),
    (lambda s, c: weft.run(weft.plan(s, c), s, c, seed=-1), ValueError, "seed must be an integer >= 0"),
])
def test_bad_arguments_are_named(small, call, err, msg):
    with pytest.raises(err, match=msg):
        call(*small)


def test_weft_run_fails_on_a_loss_that_is_not_finite(tmp_path, small):
    step, c = small
    step.set_value(step.find("wte"), __import__("numpy").full(step.tensors[step.find("wte")]["shape"], float("nan")))
    step.save(str(tmp_path / "step.json"))
    (tmp_path / "plan.json").write_text(weft.plan(step, c).to_json())
    r = subprocess.run([sys.executable, "-m", "weft.cli", "run", "plan.json", "--model", "step.json", "--cluster",
                        "p3.8xlarge", "--steps", "2", "--init", "seed"], cwd=tmp_path, capture_output=True, text=True,
                       env=subprocess_env(), timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "weft run: the loss is nan at step 1" in r.stderr
