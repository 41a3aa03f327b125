"""The weft command line: zoo, --version, plan from files, --json - on stdout, bad input fails fast."""
import json
import subprocess
import sys
import time

import weft
from weft.cli import main
from weft_env import subprocess_env


def test_version_flag_and_zoo(capsys):
    proc = subprocess.run([sys.executable, "-m", "weft.cli", "--version"], env=subprocess_env(),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"weft {weft.__version__}"
    assert main(["zoo", "--family", "gpt"]) == 0
    out = capsys.readouterr().out.splitlines()
    names = [p["name"] for p in weft.models.presets() if p["family"] == "gpt"]
    assert len(out) == 1 + len(names) and all(any(line.startswith(n + " ") for line in out) for n in names)
    assert main(["zoo", "--family", "nope"]) == 2


def test_plan_from_files_with_json_on_stdout(tmp_path, capsys):
    g = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8)
    (tmp_path / "g.json").write_text(g.to_json())
    (tmp_path / "c.json").write_text(weft.Cluster.preset("p3.8xlarge").to_json())
    assert main(["plan", "--model", str(tmp_path / "g.json"), "--cluster", str(tmp_path / "c.json"),
                 "--no-megatron", "--json", "-"]) == 0
    captured = capsys.readouterr()
    plan = weft.Plan.from_json(captured.out)  # stdout is the plan alone
    assert json.loads(captured.out)["model"] == plan.model and "Plan for" in captured.err
    (tmp_path / "p.json").write_text(captured.out)
    assert main(["show", str(tmp_path / "p.json"), "--out", str(tmp_path / "p.png")]) == 0
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["show", str(tmp_path / "missing.json")]) == 2


def test_bad_arguments_exit_2_before_any_work():
    for args in (["plan", "--json", "/nonexistent-dir/plan.json"], ["plan", "--model", "nope.json"],
                 ["plan", "--cluster", "/nonexistent/c.json"], ["plan", "--steps"]):
        t0 = time.time()
        proc = subprocess.run([sys.executable, "-m", "weft.cli"] + args, env=subprocess_env(), capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 2, (args, proc.stderr)
        assert time.time() - t0 < 10
        assert len(proc.stderr.strip().splitlines()) <= 3 and "Traceback" not in proc.stderr, proc.stderr


def test_simulate(tmp_path, capsys):
    # 1F1B, 4 stages, 8 micro-batches, F=1 s, B=2 s: (m + p - 1)(F + B) = 33 s, bubble (p-1)/(m+p-1) = 3/11.
    assert main(["simulate", "--schedule", "1F1B", "--stages", "4", "--microbatches", "8", "--out",
                 str(tmp_path / "g.png")]) == 0
    out = capsys.readouterr().out
    assert "step 33 s" in out and "bubble 27.3 %" in out
    assert (tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["simulate", "--schedule", "nope"]) == 2
