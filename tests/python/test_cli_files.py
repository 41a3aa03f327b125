"""CLI outputs are written safely: the destination is checked before the work (a directory, a missing
folder: one line, exit 2, at once), files are replaced atomically (a full disk — RLIMIT_FSIZE here —
leaves the old file intact and prints one line), `weft run` writes exactly --out, and a missing input
file is one line, not a traceback."""
import os
import resource
import signal
import subprocess
import sys
import time

import numpy as np

from weft_env import subprocess_env


def weft(*args, limit=None, cwd=None):
    def small_files():  # a "full disk": writes past `limit` bytes fail (EFBIG) instead of killing the process
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return subprocess.run([sys.executable, "-m", "weft.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=subprocess_env(), preexec_fn=small_files if limit else None, timeout=300)


PLAN = ["plan", "--model", "GPT-350M", "--cluster", "p3.8xlarge", "--nodes", "1"]


def one_line(err: str) -> str:
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_outputs_are_checked_before_the_work(tmp_path):
    for dest, why in [(str(tmp_path), "is a directory"), (str(tmp_path / "no" / "plan.json"), "does not exist")]:
        t0 = time.time()
        r = weft(*PLAN, "--json", dest)
        assert r.returncode == 2 and why in one_line(r.stderr), r.stderr
        assert time.time() - t0 < 30  # refused before planning
    r = weft("calibrate", "--out", str(tmp_path))
    assert r.returncode == 2 and "--out" in one_line(r.stderr) and "is a directory" in r.stderr


def test_a_full_disk_leaves_the_old_file(tmp_path):
    old = tmp_path / "plan.json"
    old.write_text("the old plan\n")
    r = weft(*PLAN, "--json", str(old), limit=2000, cwd=tmp_path)  # the plan's JSON is larger than 2000 bytes
    assert r.returncode == 1, r.stdout + r.stderr
    line = one_line(r.stderr)
    assert "could not write" in line and "the old file is unchanged" in line
    assert old.read_text() == "the old plan\n"
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary file left
    r = weft(*PLAN, "--json", str(old), cwd=tmp_path)
    assert r.returncode == 0 and old.read_text().startswith("{")


def test_run_writes_exactly_out_and_a_missing_file_is_one_line(tmp_path):
    r = weft("run", "nope.json", "--cluster", "p3.8xlarge", cwd=tmp_path)
    assert r.returncode == 2 and "nope.json: no such file" in one_line(r.stderr)
    import weft as w  # a small graph and its plan, run for one step, written to a name without .npz

    step = w.models.gpt(layers=1, hidden=32, heads=2, seq=4, vocab=32, batch=4).train_step()
    step.save(str(tmp_path / "step.json"))
    plan = w.plan(step, w.Cluster.preset("p3.8xlarge"))
    (tmp_path / "plan.json").write_text(plan.to_json())
    r = weft("run", "plan.json", "--model", "step.json", "--cluster", "p3.8xlarge", "--steps", "1", "--init", "seed",
             "--out", "result", cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "result").exists() and not (tmp_path / "result.npz").exists()
    assert "losses" in np.load(tmp_path / "result")
