"""CBC never reads stdin: weft.plan from 4 Python threads at once (each with its own thread pool)
with stdin an open pipe that nobody writes. CBC's command-line driver keeps its argv index in a
global; concurrent solves used to run one another past "-quit" into CBC's interactive "Coin:"
prompt, which waited on stdin for ever (reproduced before the fix: 1 run in 2 hung)."""
import subprocess
import sys

from weft_env import subprocess_env

SCRIPT = r"""
import threading, weft
g = weft.models.gpt(layers=4, hidden=256, heads=8, seq=128, vocab=4096, batch=16).train_step()
c = weft.Cluster.preset("M8")
times, errors = [], []
def one():
    try:
        times.append(weft.plan(g, c, threads=2).step_time)
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=one) for _ in range(4)]
[t.start() for t in threads]
[t.join() for t in threads]
print("plans", len(times), "distinct", len(set(times)), "errors", errors)
"""


def test_planning_from_four_threads_never_reads_stdin():
    for _ in range(3):
        p = subprocess.Popen([sys.executable, "-c", SCRIPT], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, env=subprocess_env())
        try:
            out, _ = p.communicate(timeout=240)  # stdin stays open (a pipe) until the process ends
        except subprocess.TimeoutExpired:
            p.kill()
            raise AssertionError("weft.plan from 4 threads hung (CBC waiting on stdin?): " + p.communicate()[0][-500:])
        assert p.returncode == 0, out
        assert "Coin:" not in out
        assert "plans 4 distinct 1 errors []" in out  # the same plan from every thread
