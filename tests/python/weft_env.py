"""The environment of a subprocess that must import the same weft as the tests (a development
build through PYTHONPATH, or the installed package): the directories weft and _weft came from."""
import os

import weft


def subprocess_env(**extra) -> dict:
    paths = [os.path.dirname(os.path.dirname(os.path.abspath(weft.__file__))),
             os.path.dirname(os.path.abspath(weft._weft.__file__))]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["OMP_NUM_THREADS"] = "1"
    env.update(extra)
    return env
