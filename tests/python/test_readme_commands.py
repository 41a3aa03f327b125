"""The README's commands, run as a new user would (issue 39): each command the README shows that runs
in reasonable time, taken verbatim from README.md (the test fails when the README changes it), run
as `python -m weft.cli ...` in a fresh folder, with the output it claims checked.

Not run here (minutes, or covered elsewhere): `bash scripts/main_job.sh` and `bash scripts/test_all.sh`
(the whole job), `weft plan --model GPT-2.7B --cluster M8 --nodes 2` (about a minute of planning),
`python examples/train_char_lm.py` (test_example_char_lm.py), `weft calibrate` (test_calibrate.py),
torchrun (test_runtime.py)."""
import os
import re
import shlex
import subprocess
import sys

import pytest

import weft
from weft_env import subprocess_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = " ".join(open(os.path.join(ROOT, "README.md")).read().split())  # markdown wraps lines


def readme(command: str) -> list:
    """``command`` as the README spells it (inside backticks), split as a shell would."""
    assert f"`{command}`" in README, f"the README no longer shows `{command}`"
    return shlex.split(command)


def run(argv: list, cwd, timeout=300) -> subprocess.CompletedProcess:
    assert argv[0] == "weft"
    r = subprocess.run([sys.executable, "-m", "weft.cli", *argv[1:]], cwd=cwd, capture_output=True, text=True,
                       env=subprocess_env(), timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def test_version_and_zoo(tmp_path):
    for cmd in ("weft --version", "weft version"):
        r = run(readme(cmd), tmp_path)
        assert r.returncode == 0 and r.stdout == f"weft {weft.__version__}\n", r.stdout  # one line, the same
    r = run(readme("weft zoo"), tmp_path)
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["preset", "family", "parameters", "config"]
    names = [p["name"] for p in weft.models.presets()]
    assert [line.split()[0] for line in lines[1:]] == names
    assert all(re.match(r"\S+\s+\S+\s+\d+(\.\d+)? [kMB]\s", line) for line in lines[1:]), lines  # 33 M, 1.3 B


@pytest.fixture(scope="module")
def step_json(tmp_path_factory):
    """`step.json` as the README's Python writes it (`step.save("step.json")`): a small GPT's training
    step (the zoo's builder, parameters drawn from the seed), saved with Graph.save."""
    d = tmp_path_factory.mktemp("readme")
    step = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8).train_step(optimizer="adam")
    step.save(str(d / "step.json"))
    return d


def test_plan_then_run_with_the_same_cluster_spec_and_the_defaults(step_json):
    """The flow that failed ("the plan uses device 4, the cluster has 4 devices": weft plan took 2
    nodes by default, weft run 1): plan, then run the saved plan with the same spec and --check."""
    pytest.importorskip("torch")
    d = step_json
    r = run(readme("weft plan --model step.json --cluster p3.8xlarge --json plan.json"), d)
    assert r.returncode == 0, r.stderr
    assert "Plan for gpt.train on Cluster(1x p3.8xlarge[4x V100-SXM2-16GB])" in r.stdout
    assert "plan written to plan.json" in r.stdout
    plan = weft.Plan.from_json((d / "plan.json").read_text())
    assert max(plan.devices_used) < 4
    r = run(readme("weft run plan.json --model step.json --cluster p3.8xlarge --check"), d, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert f"on {len(plan.devices_used)} local processes (gloo, f64)" in out  # f64 under --check
    assert re.search(r"^losses( \d+\.\d{6}){3}$", out, flags=re.M), out
    # step times with their unit ("412.5 ms"), never "1.59e+03 ms"
    assert re.search(r"^rank 0: \d+(\.\d+)? (µs|ms|s|min)(, \d+(\.\d+)? (µs|ms|s|min)){2} per step$", out,
                     flags=re.M), out
    assert "e+" not in out
    assert "one device (CPU reference executor): losses" in out and "check passed (<= --rtol 1e-09)" in out
    # and the figure of that plan
    r = run(readme("weft show plan.json --out plan.png"), d)
    assert r.returncode == 0, r.stderr
    assert (d / "plan.png").read_bytes()[:4] == b"\x89PNG"
    assert f"figure written to {d / 'plan.png'}" in r.stdout


def test_json_on_stdout_and_the_logger(step_json):
    d = step_json
    assert "`--json -` prints the plan's JSON on stdout" in README
    r = run(["weft", "plan", "--model", "step.json", "--cluster", "p3.8xlarge", "--json", "-"], d)
    assert r.returncode == 0 and weft.Plan.from_json(r.stdout).model == "gpt.train"
    assert "Plan for" in r.stderr and "Plan for" not in r.stdout
    assert "`-v` logs through Python's `logging` (`weft` logger)" in README
    r = run(["weft", "-v", "plan", "--model", "step.json", "--cluster", "p3.8xlarge"], d)
    assert r.returncode == 0 and re.search(r"^weft: planning gpt.train", r.stderr, flags=re.M), r.stderr
    assert re.search(r"^weft: plan: .*, step \d+(\.\d+)? µs, .* peak \d+(\.\d+)? kB per device", r.stderr, flags=re.M), \
        r.stderr


def test_plan_help_takes_every_planner_option(tmp_path):
    assert "`weft plan` takes every planner option (`weft plan -h`)" in README
    r = run(["weft", "plan", "-h"], tmp_path)
    assert r.returncode == 0
    from weft.cli import _PLAN_OPTIONS

    for flag, *_ in _PLAN_OPTIONS:
        assert flag in r.stdout, flag
    for flag in ("--recompute", "--calibration", "--nodes"):
        assert flag in r.stdout


def test_reshard(tmp_path):
    cmd = readme('weft reshard --shape 1024,1024 --src "S(0) R" --src-mesh 2x2:0-3 --dst "S(1) R" '
                 '--dst-mesh 2x2:4-7 --bandwidth 100GB/s')
    r = run(cmd + ["--out", "timeline.png"], tmp_path)
    assert r.returncode == 0, r.stderr
    # "plans a cross-mesh resharding (per-host transfers, time against the lower bound, `--out` draws the timeline)"
    out = r.stdout
    assert re.search(r"completion \d+(\.\d+)? µs, lower bound \d+(\.\d+)? µs \(ratio \d\.\d{4}\)", out), out
    hosts = [line.split() for line in out.splitlines() if re.match(r"\s+\d+ ", line)]
    assert len(hosts) == 4  # 2x2 meshes, a host per mesh row
    assert [h[-4:] for h in hosts] == [["2.1", "MB", "0", "B"]] * 2 + [["0", "B", "2.1", "MB"]] * 2
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_mixed_gpu_kinds(tmp_path):
    """"plans mixed GPU kinds (Whale-style uneven data-parallel shares, ...)" (about 30 s on 2 cores)."""
    r = run(readme("weft plan --model BERT-large --batch 768 --cluster M8:1+P100:1"), tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Cluster(1x M8[8x V100-SXM2-32GB] + 1x P100[8x P100-PCIE-16GB])" in r.stdout
    assert "data parallel (uneven shares)" in r.stdout
