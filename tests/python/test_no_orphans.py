"""No orphans: the rank processes of weft.run and weft.launch end with the process that started them,
however it ends (SIGKILL included), within 5 s, and their temporary folder goes with them; killing
the forkserver the ranks were forked from ends them too (and weft.run raises)."""
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

pytest.importorskip("torch")

from weft_env import subprocess_env  # noqa: E402

RUN = r"""
import weft
step = weft.models.gpt(layers=2, hidden=64, heads=4, seq=8, vocab=128, batch=8).train_step()
c = weft.Cluster.preset("p3.8xlarge")
plan = weft.megatron_plan(step, c, t=2, p=1, d=2)
print("starting", flush=True)
try:
    weft.run(plan, step, c, steps=10**6, timeout_s=600, init="seed")
except RuntimeError as e:
    print("raised:", str(e)[:300], flush=True)
"""

LAUNCH = r"""
import time, weft
def forever():
    time.sleep(10**6)
print("starting", flush=True)
weft.launch(forever, nproc=3)
"""


def _marked(mark):
    """pid -> (comm, the folder of its log) of every process carrying the test's mark in its environment."""
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if mark.encode() not in open(f"/proc/{pid}/environ", "rb").read():
                continue
            comm = open(f"/proc/{pid}/comm").read().strip()
            log = os.readlink(f"/proc/{pid}/fd/1")
        except OSError:
            continue
        out[int(pid)] = (comm, os.path.dirname(log))
    return out


def _start(code, mark, ranks):
    env = dict(subprocess_env(), WEFT_TEST_MARK=mark)
    p = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        found = {pid: v for pid, v in _marked(mark).items() if v[0].startswith("weft-rank-")}
        if len(found) == ranks:
            return p, found
        if p.poll() is not None:
            raise AssertionError("the caller ended early: " + p.stdout.read())
        time.sleep(0.2)
    p.kill()
    raise AssertionError("the ranks did not start")


def _gone_within(mark, seconds=5.0):
    deadline = time.time() + seconds
    while time.time() < deadline:
        left = {pid: v for pid, v in _marked(mark).items() if v[0].startswith("weft-rank-")}
        if not left:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("code,ranks", [(RUN, 4), (LAUNCH, 3)], ids=["weft.run", "weft.launch"])
def test_sigkill_of_the_caller_leaves_nothing(code, ranks):
    mark = uuid.uuid4().hex
    p, ranks_found = _start(code, mark, ranks)
    tmp = {v[1] for v in ranks_found.values()}
    assert len(tmp) == 1 and os.path.isdir(next(iter(tmp)))
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert _gone_within(mark), f"ranks left after the caller was killed: {_marked(mark)}"
    time.sleep(0.3)
    assert not os.path.exists(next(iter(tmp))), "the run's temporary folder was left"


def test_killing_the_forkserver_ends_the_ranks_and_the_run_raises():
    mark = uuid.uuid4().hex
    p, ranks_found = _start(RUN, mark, 4)
    servers = {int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]) for pid in ranks_found}
    assert len(servers) == 1
    os.kill(servers.pop(), signal.SIGKILL)
    assert _gone_within(mark), f"ranks left after the forkserver was killed: {_marked(mark)}"
    out, _ = p.communicate(timeout=60)
    assert "raised: weft.run: rank" in out, out
