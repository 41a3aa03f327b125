"""The environment of a subprocess that must import the same weft as the tests (a development
build through PYTHONPATH, or the installed package): the launcher's, which adds the directories weft
and _weft came from."""
from weft.runtime.launch import _child_env


def subprocess_env(**extra) -> dict:
    env = _child_env()
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env
