"""Typing: python/weft/_weft.pyi (the C++ extension's stubs, scripts/gen_stubs.py) and py.typed ship
with the package, and mypy passes on examples/ against them — and catches a wrong call."""
import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "weft"


def _mypy(paths, tmp_path):
    if importlib.util.find_spec("mypy") is None:
        reason = "mypy is not installed (scripts/install_deps.sh installs it)"
        print(f"SKIP: {reason}")
        pytest.skip(reason)
    env = dict(os.environ, MYPYPATH=str(ROOT / "python"))
    return subprocess.run([sys.executable, "-m", "mypy", "--follow-imports=silent", "--ignore-missing-imports",
                           "--no-incremental", "--cache-dir", str(tmp_path / "cache"), *map(str, paths)],
                          capture_output=True, text=True, timeout=600, env=env, cwd=str(ROOT))


def test_stubs_and_marker_are_in_the_package():
    stub = (PKG / "_weft.pyi").read_text()
    assert (PKG / "py.typed").exists()
    for name in ("class Graph", "class Plan", "class Cluster", "class ShardingSpec", "def make_plan", "def show"):
        assert name in stub, name
    # the wheel takes the whole python/weft folder (pyproject: wheel.packages), .pyi and py.typed included
    assert 'wheel.packages = ["python/weft"]' in (ROOT / "pyproject.toml").read_text()


def test_mypy_passes_on_the_examples_and_sees_the_stubs(tmp_path):
    examples = sorted((ROOT / "examples").rglob("*.py"))
    assert examples
    r = _mypy(examples, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    bad = tmp_path / "bad.py"
    bad.write_text("import weft\n"
                   "c = weft.Cluster.preset(3)\n"          # a str is expected
                   "n: str = weft.dtype_size('f32')\n")    # returns an int
    r = _mypy([bad], tmp_path)
    assert r.returncode == 1 and 'Argument 1 to "preset" of "Cluster"' in r.stdout, r.stdout
    assert "bad.py:3: error: Incompatible types in assignment" in r.stdout, r.stdout
