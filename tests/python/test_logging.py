"""Logging: the library talks through the ``weft`` logger (``verbose=`` on weft.plan, ``-v`` on the
CLI) and never prints; only the command lines (weft.cli, python -m weft.run) write to stdout."""
import ast
import logging
import pathlib

import pytest

import weft
from weft.log import level_of, verbosity

PKG = pathlib.Path(weft.__file__).parent
COMMAND_LINES = {"cli.py", "run.py"}  # their output is the command's own


def test_no_print_in_the_library():
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        if path.name in COMMAND_LINES and path.parent == PKG:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                offenders.append(f"{path.relative_to(PKG)}:{node.lineno}")
    assert not offenders, offenders


@pytest.fixture(scope="module")
def step():
    return weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8).train_step()


def test_plan_verbose_logs_info_and_debug(step, caplog):
    from weft.display import _bytes, _seconds  # times and sizes in a readable unit (issue 39)

    c = weft.Cluster.preset("p3.8xlarge")
    with caplog.at_level(logging.WARNING):  # an application that shows warnings only
        caplog.handler.setLevel(logging.NOTSET)  # the capture itself drops nothing
        weft.plan(step, c, pipeline=False, compare_megatron=False)
        assert not [r for r in caplog.records if r.name == "weft"]  # silent by default
        p = weft.plan(step, c, pipeline=False, compare_megatron=False, verbose=True)
        msgs = [r.getMessage() for r in caplog.records if r.name == "weft"]
        assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "weft")
        assert msgs[0].startswith("planning gpt.train") and f"step {_seconds(p.step_time)}," in msgs[-1], msgs
        assert f"peak {_bytes(p.peak_memory)} per device" in msgs[-1] and "e-0" not in msgs[-1], msgs
        caplog.clear()
        weft.plan(step, c, pipeline=False, compare_megatron=False, verbose=2)
        debug = [r.getMessage() for r in caplog.records if r.name == "weft" and r.levelno == logging.DEBUG]
        assert any(m.startswith("plan: grouping") for m in debug) and any("done" in m for m in debug), debug
    assert logging.getLogger("weft").level == logging.NOTSET  # restored after the call


def test_verbosity_levels_and_stderr_handler(capsys):
    assert [level_of(v) for v in (False, None, 0, True, 1, 2, 5, "debug")] == \
        [logging.WARNING] * 3 + [logging.INFO] * 2 + [logging.DEBUG] * 3
    with pytest.raises(ValueError, match="verbose"):
        level_of(-1)
    with pytest.raises(ValueError, match="unknown logging level"):
        level_of("loud")
    with pytest.raises(TypeError):
        level_of(1.5)
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = []  # an application that configured nothing: verbose writes to stderr itself
    try:
        with verbosity(True) as log:
            log.info("hello %d", 3)
            log.debug("not shown")
        logging.getLogger("weft").info("after")  # back to silent
    finally:
        root.handlers = saved
    assert capsys.readouterr().err == "weft: hello 3\n"
