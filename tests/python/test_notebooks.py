"""The example notebooks (examples/notebooks/*.ipynb) execute without an error with nbclient, and
each one draws at least one figure (an image/png output)."""
import importlib.util
import pathlib
import time

import pytest

from weft_env import subprocess_env

NB_DIR = pathlib.Path(__file__).resolve().parents[2] / "examples" / "notebooks"
NOTEBOOKS = sorted(NB_DIR.glob("*.ipynb"))

try:
    import nbclient
    import nbformat
    if importlib.util.find_spec("ipykernel") is None:  # the kernel nbclient starts
        raise ImportError("No module named 'ipykernel'")
    _MISSING = None
except ImportError as e:  # pragma: no cover - depends on the environment
    _MISSING = f"the notebooks need nbclient, nbformat and ipykernel ({e}); scripts/install_deps.sh installs them"


def test_the_five_notebooks_are_there_and_have_no_outputs():
    names = [p.stem for p in NOTEBOOKS]
    assert names == ["01_quickstart", "02_heterogeneous_cluster", "03_busy_network_kfkb", "04_resharding",
                     "05_torch_model"]
    if _MISSING:
        pytest.skip(_MISSING)
    for p in NOTEBOOKS:  # checked in clean: outputs are made by running them
        nb = nbformat.read(str(p), as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code and all(not c.get("outputs") and c.get("execution_count") is None for c in code)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_and_draws_a_figure(path, monkeypatch):
    if _MISSING:
        print(f"SKIP: {_MISSING}")
        pytest.skip(_MISSING)
    if path.stem == "05_torch_model":
        pytest.importorskip("torch", reason="the torch notebook needs PyTorch")
    for k, v in subprocess_env().items():
        monkeypatch.setenv(k, v)  # the kernel imports the same weft as the tests
    nb = nbformat.read(str(path), as_version=4)
    t0 = time.time()
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(NB_DIR)}}).execute()
    elapsed = time.time() - t0
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{path.name} drew no figure"
    assert any("text/html" in o.get("data", {}) for o in outputs), f"{path.name} showed no rich display"
    assert elapsed < 60, f"{path.name} took {elapsed:.1f} s"
