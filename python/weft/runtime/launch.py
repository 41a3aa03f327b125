"""Running a program on torch.distributed: in an initialised process (torchrun: ``run_rank``) or by
starting one local process per rank (``run``), with the results gathered on rank 0 into the
:class:`weft.ExecutionResult` the CPU executor returns. ``run`` forks the rank processes from a
server process that has imported torch and weft once (multiprocessing's forkserver, started on
the first call; nothing has run in it, so no thread pool is forked): a rank starts in
milliseconds instead of paying torch's import (~1.3 s of CPU) each time; the caller's script is
not re-imported in a rank (no ``if __name__ == "__main__"`` guard needed, notebooks work). Each
rank process is named ``weft-rank-<r>`` (``/proc/<pid>/comm``).

Failure handling: every rank checks the program before anything runs (a wrong plan fails on every
rank with the same message); a rank that raises reports its error (naming the rank and the
instruction) and exits; the launcher then stops the other ranks at once and raises the first error
(a rank's peers see a closed connection, which is only reported when no rank said more). A rank
killed from outside is reported with its exit code. Process-group timeouts (``timeout_s``) bound
every wait, so nothing hangs.
"""
from __future__ import annotations

import datetime
import multiprocessing
import os
import signal
import sys
import socket
import tempfile
import time
import traceback
import types
from typing import List, Mapping, Optional

import numpy as np

from .. import _weft

BACKENDS = ("gloo", "nccl")
DTYPES = ("f64", "f32", "bf16", "f16")
# Messages of a rank that only saw another rank go away (reported when no rank says more).
_PEER_LOSS = ("Connection closed", "Connection reset", "connection reset", "peer", "Broken pipe",
              "NCCL communicator was aborted", "Socket Timeout", "timed out")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_options(program, nproc, steps, backend, dtype, timeout_s) -> None:
    if not isinstance(program, _weft.Program):
        raise TypeError(f"expected a weft.Program, got {type(program).__name__}")
    if nproc is not None and int(nproc) != program.num_ranks:
        raise ValueError(f"nproc={nproc}, but the program has {program.num_ranks} ranks (one process per rank)")
    from .._checks import integer

    integer("steps", steps, 1)
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES} or None (the graph's dtypes), got {dtype!r}")
    if not float(timeout_s) > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")


def device_for(backend: str, local_rank: int):
    import torch

    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ValueError("backend 'nccl' needs CUDA; this machine has no GPU (use backend='gloo')")
        idx = local_rank % torch.cuda.device_count()
        torch.cuda.set_device(idx)
        return torch.device("cuda", idx)
    return torch.device("cpu")


def check_values(program, init: Optional[str], inputs: Optional[Mapping[str, np.ndarray]]) -> bool:
    """Before any process starts: every leaf that needs a value has one (ValueError naming those that
    do not), ``inputs`` name Input leaves of the program's graph with its global shapes. Returns whether
    parameters without a value are seeded (``init="seed"``)."""
    from ..values import check_init

    seed_all = check_init(init)
    _weft.LeafValues(program.graph, 0, seed_all)  # raises, naming every leaf without a value
    g = program.graph
    headers = {}
    for t in g.tensors:  # file-backed values: the file, the key and the shape checked up front
        src = g.value_source(t["id"]) if t["has_value"] else None
        if isinstance(src, tuple):
            if src[0] not in headers:
                headers[src[0]] = _weft._value_file_header(src[0])
            entry = headers[src[0]].get(src[1])
            if entry is None:
                raise ValueError(f"run: the value of '{t['name']}' is tensor '{src[1]}' of {src[0]}, which has no such tensor")
            if tuple(entry["shape"]) != tuple(t["shape"]):
                raise ValueError(f"run: the value of '{t['name']}' in {src[0]} has shape {tuple(entry['shape'])}, the "
                                 f"tensor {tuple(t['shape'])}")
    names = {t["name"]: t for t in g.tensors}
    input_names = [t["name"] for t in g.tensors if t["role"] == "input" and t["producer"] is None]
    for k, v in (inputs or {}).items():
        t = names.get(str(k))
        if t is None or t["role"] != "input" or t["producer"] is not None:
            what = f" (it is a {t['role']})" if t is not None else ""
            raise ValueError(f"run: inputs['{k}'] is not an Input leaf of the graph{what} (its Inputs: "
                             f"{', '.join(input_names) or 'none'}; parameters, buffers and constants carry their "
                             "values in the graph: weft.load_values)")
    return seed_all


def run_rank(program, *, steps: int = 3, seed: int = 0, dtype: Optional[str] = "f32",
             inputs: Optional[Mapping[str, np.ndarray]] = None, device=None, init: Optional[str] = None):
    """Runs this process's rank (``torch.distributed`` already initialised, world size = the
    program's ranks) for ``steps`` steps; returns the ExecutionResult on rank 0, None elsewhere."""
    import torch.distributed as dist

    from .comm import ProcessGroups
    from .rank import RankRuntime

    rank, world = dist.get_rank(), dist.get_world_size()
    if world != program.num_ranks:
        raise ValueError(f"the world has {world} processes, the program {program.num_ranks} ranks")
    t0 = time.perf_counter()
    layout = _weft.ProgramLayout(program)  # checks the program: a wrong plan fails here, on every rank
    groups = ProcessGroups(layout.collective_groups())
    from ..values import check_init

    rt = RankRuntime(layout, rank, device=device or "cpu", dtype=dtype, seed=seed, inputs=inputs, groups=groups,
                     seed_all_parameters=check_init(init))
    res = rt.run(int(steps))
    gathered = [None] * world if rank == 0 else None
    dist.gather_object(res, gathered, dst=0)
    if rank != 0:
        return None
    return assemble_result(program, gathered, time.perf_counter() - t0)


def assemble_result(program, results: List, seconds: float):
    """The global ExecutionResult from every rank's RankResult."""
    from ..execution import ExecutionResult
    from . import tiles as T

    buffers = program.buffers

    def reduce_kind(b):
        return "max" if "P(max)" in buffers[b]["spec"] else "sum"

    def value(b, pieces):
        pieces = [p for p in pieces if p is not None]
        return T.assemble(buffers[b]["shape"], pieces, reduce_kind(b))

    steps = len(results[0].losses)
    losses = []
    for s in range(steps):
        if program.loss_id < 0:
            losses.append(0.0)
            continue
        losses.append(float(value(program.loss_id, [r.losses[s] for r in results]).reshape(-1)[0]))
    params = {n: value(b, [r.parameters.get(n) for r in results]) for n, b in program.parameter_ids.items()}
    grads = {n: value(b, [r.gradients.get(n) for r in results]) for n, b in program.gradient_ids.items()}
    return ExecutionResult(losses=losses, parameters=params, gradients=grads,
                           bytes_sent=[dict(r.bytes_sent) for r in results],
                           collective_calls=[dict(r.collective_calls) for r in results],
                           peak_bytes=[int(r.peak_bytes) for r in results], seconds=seconds,
                           rank_seconds=[float(sum(r.step_seconds)) for r in results],
                           step_seconds=[list(r.step_seconds) for r in results])


def worker_main(tmp: str, rank: int, world: int, port: int) -> int:
    """One local process of ``run`` (forked by ``_rank_process``): initialise gloo / NCCL over
    TCP on loopback, run the rank, write rank 0's result (or this rank's error) into ``tmp``."""
    try:
        import pickle

        import torch.distributed as dist

        with open(os.path.join(tmp, "options.pkl"), "rb") as f:
            opts = pickle.load(f)
        # The values beyond the inline limit are in values.safetensors beside it: each rank reads its tiles.
        program = _weft.Program.from_json(open(os.path.join(tmp, "program.json")).read(), base_dir=tmp)
        device = device_for(opts["backend"], rank)
        dist.init_process_group(opts["backend"], init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=opts["timeout_s"]))
        res = run_rank(program, steps=opts["steps"], seed=opts["seed"], dtype=opts["dtype"], inputs=opts["inputs"],
                       device=device, init=opts["init"])
        if rank == 0:
            with open(os.path.join(tmp, "result.pkl.part"), "wb") as f:
                pickle.dump(res, f)
            os.replace(os.path.join(tmp, "result.pkl.part"), os.path.join(tmp, "result.pkl"))
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the launcher
        msg = str(e) if isinstance(e, (ValueError, RuntimeError)) else f"{type(e).__name__}: {e}"
        with open(os.path.join(tmp, f"error-{rank}.txt"), "w") as f:
            f.write(msg or traceback.format_exc())
        return 1


def _is_peer_loss(msg: str) -> bool:
    return any(s in msg for s in _PEER_LOSS)


def _child_env() -> dict:
    """The environment of a rank process: this process's (a forked rank imports weft as the server
    did), one OpenMP thread unless set."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # N ranks on one host: no oversubscription by default
    return env


def _context():
    """multiprocessing's forkserver context (one server per process, started on first use), its
    server preloading torch and weft (the preload list only matters when the server starts)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "weft", "weft.runtime.rank", "weft.runtime.comm"])
    return ctx


def _name_process(name: str) -> None:
    """Sets this process's name (Linux: /proc/self/comm, 15 bytes), so a rank can be found."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie — killed, not yet reaped by its parent — does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    except OSError:  # no /proc: the signal check
        try:
            os.kill(pid, 0)
            return True
        except OSError:
            return False


def die_with(caller: int, tmp: Optional[str] = None) -> None:
    """Makes this forked process end when the process that started the run ends, however it ends
    (SIGKILL included), removing the run's temporary folder, which a killed caller cannot: a
    watchdog thread checks the caller every 0.2 s (it runs while the main thread waits in a
    collective), and the kernel sends SIGTERM when this process's parent dies (PR_SET_PDEATHSIG:
    the forkserver, which exits when the caller goes, or is killed)."""
    import threading

    def leave(*_):
        if tmp is not None and not _alive(caller):
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
        os._exit(1)

    parent = os.getppid()
    signal.signal(signal.SIGTERM, leave)
    try:
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before the line above: nobody to wait for
        leave()

    def watch():
        while _alive(caller):
            time.sleep(0.2)
        leave()

    threading.Thread(target=watch, name="weft-watchdog", daemon=True).start()


def enter_rank_process(tmp: str, rank: int, env: dict, caller: int) -> None:
    """The start of a forked rank process (weft.run's and weft.launch's): it ends with the caller
    (die_with), writes its output to rank-<r>.log in ``tmp``, is named weft-rank-<r>, and takes the
    launcher's environment."""
    die_with(caller, tmp)
    log = os.open(os.path.join(tmp, f"rank-{rank}.log"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    _name_process(f"weft-rank-{rank}")
    os.environ.clear()
    os.environ.update(env)


def _rank_process(tmp: str, rank: int, world: int, port: int, env: dict, caller: int) -> None:
    """One rank of ``run``, forked from the forkserver (enter_rank_process), then worker_main;
    leaves at once (tearing down a process group whose peers failed can block)."""
    enter_rank_process(tmp, rank, env, caller)
    import torch

    torch.set_num_threads(max(1, int(env.get("OMP_NUM_THREADS", "1"))))
    code = worker_main(tmp, rank, world, port)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _start_without_main(proc) -> None:
    """Starts a forkserver process with the caller's ``__main__`` hidden: multiprocessing would
    otherwise re-import the caller's script (or -m module) in every rank, running its top level
    again. The rank needs nothing of it (its target lives in weft)."""
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        proc.start()
    finally:
        if main is not None:
            sys.modules["__main__"] = main


class _RankProc:
    """A forked rank with the Popen methods _wait and _stop use."""

    def __init__(self, proc):
        self._p = proc

    def poll(self):
        return self._p.exitcode

    def kill(self):
        self._p.kill()

    def wait(self, timeout=None):
        self._p.join(timeout)


def run(program, *, steps: int = 3, backend: str = "gloo", seed: int = 0, dtype: Optional[str] = "f32",
        inputs: Optional[Mapping[str, np.ndarray]] = None, timeout_s: float = 60.0, nproc: Optional[int] = None,
        init: Optional[str] = None):
    """Starts one local process per rank of ``program`` (forked from a server that has imported
    torch: see the module's docstring), runs ``steps`` steps on torch.distributed and returns rank
    0's ExecutionResult. A failing rank stops the others; its error is raised as RuntimeError naming
    the rank and the instruction."""
    import pickle

    check_options(program, nproc, steps, backend, dtype, timeout_s)
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < program.num_ranks:
            raise ValueError(f"backend 'nccl' needs one CUDA device per rank: {program.num_ranks} ranks, "
                             f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} GPUs here")
    program.check()  # a wrong program: ValueError here, before any process starts
    check_values(program, init, inputs)  # a leaf without a value, a misnamed input: ValueError, before too
    world = program.num_ranks
    from ..values import _array

    opts = dict(steps=int(steps), backend=backend, seed=int(seed), dtype=dtype, timeout_s=float(timeout_s),
                inputs={str(k): _array(str(k), v) for k, v in (inputs or {}).items()}, init=init)
    with tempfile.TemporaryDirectory(prefix="weft-run-") as tmp:
        with open(os.path.join(tmp, "program.json"), "w") as f:
            # large values in a value file (a rank reads only its tiles of them), the rest inline
            f.write(program.to_json(sidecar=os.path.join(tmp, "values.safetensors"), sidecar_ref="values.safetensors"))
        with open(os.path.join(tmp, "options.pkl"), "wb") as f:
            pickle.dump(opts, f)
        port = free_port()
        env = _child_env()
        ctx = _context()
        procs = []
        try:
            for r in range(world):
                p = ctx.Process(target=_rank_process, args=(tmp, r, world, port, env, os.getpid()),
                                name=f"weft-rank-{r}")
                _start_without_main(p)
                procs.append(_RankProc(p))
            _wait(procs, tmp)
            with open(os.path.join(tmp, "result.pkl"), "rb") as f:
                return pickle.load(f)
        finally:
            _stop(procs)


def _error_of(tmp: str, r: int) -> Optional[str]:
    path = os.path.join(tmp, f"error-{r}.txt")
    return open(path).read() if os.path.exists(path) else None


def _wait(procs, tmp: str, what: str = "weft.run") -> None:
    """Until every rank exits 0; on the first failure, stop the others and raise its error."""
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if not failed and all(c == 0 for c in codes):
            return
        if failed:
            time.sleep(0.3)  # the other ranks' reports of the same failure
            _stop(procs)
            errors = [(r, _error_of(tmp, r)) for r in range(len(procs))]
            said = [(r, m) for r, m in errors if m]
            first = next(((r, m) for r, m in said if not _is_peer_loss(m)), None)
            if first is None:  # a rank that died without a word (killed) is the cause
                r = next((r for r in failed if not _error_of(tmp, r)), failed[0])
                c = codes[r]
                why = f"signal {signal.Signals(-c).name}" if c is not None and c < 0 else f"exit code {c}"
                log = open(os.path.join(tmp, f"rank-{r}.log")).read().strip().splitlines()[-5:]
                first = (r, f"the process died ({why})" + (": " + " | ".join(log) if log else ""))
            raise RuntimeError(f"{what}: rank {first[0]} failed: {first[1]} (the other ranks were stopped)")
        time.sleep(0.05)


def _stop(procs) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        try:
            p.wait(timeout=5)
        except Exception:  # noqa: BLE001
            pass
