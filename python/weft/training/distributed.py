"""torch.distributed for training with weft: ``init()`` under torchrun, ``launch(fn, nproc)`` on local
processes (scripts and notebooks).

    weft.distributed.init()                  # in a script started by torchrun --nproc-per-node N
    results = weft.launch(train, nproc=4)    # train() on 4 local processes, torch.distributed set up

``launch`` forks its processes from the forkserver weft.run uses (torch imported once) when ``fn``
can be imported by name, and from this process otherwise (a function written in a notebook or in
the script's ``__main__``). Each process gets torchrun's environment (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so ``init()`` inside ``fn`` (or the Trainer) finds it; a
failing process stops the others and its error is raised naming its rank.
"""
from __future__ import annotations

import datetime
import os
import pickle
import sys
import tempfile
import traceback
from typing import Any, Callable, List, Optional

__all__ = ["init", "launch", "is_initialized", "rank", "world_size"]


def is_initialized() -> bool:
    """Whether torch.distributed is initialised in this process."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    """This process's rank (0 when torch.distributed is not initialised)."""
    import torch.distributed as dist

    return dist.get_rank() if is_initialized() else 0


def world_size() -> int:
    """The number of processes (1 when torch.distributed is not initialised)."""
    import torch.distributed as dist

    return dist.get_world_size() if is_initialized() else 1


def init(backend: Optional[str] = None, timeout_s: float = 600.0) -> None:
    """Initialises torch.distributed from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR,
    MASTER_PORT; LOCAL_RANK picks the GPU under NCCL). Without that environment (``python
    train.py``): one process. ``backend``: "nccl" when CUDA is available, else "gloo". Does nothing
    when already initialised."""
    import torch
    import torch.distributed as dist

    if is_initialized():
        return
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if not float(timeout_s) > 0:
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        from ..runtime.launch import free_port

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(free_port()))
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise ValueError("backend 'nccl' needs CUDA; this machine has no GPU (use backend='gloo')")
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=float(timeout_s)))


def _importable(fn) -> bool:
    """Whether a fresh process can find ``fn`` by its module and name (not __main__, not a closure)."""
    mod = getattr(fn, "__module__", None)
    if mod in (None, "__main__") or "<locals>" in getattr(fn, "__qualname__", "<locals>"):
        return False
    try:
        pickle.dumps(fn)
        return True
    except Exception:  # noqa: BLE001
        return False


def _fn_process(tmp: str, rank: int, world: int, port: int, env: dict, backend: str, timeout_s: float,
                payload: Optional[bytes], caller: int) -> None:
    """One process of ``launch``: its output to rank-<r>.log, torchrun's environment, torch.distributed
    initialised, then fn; its result (or error) written to ``tmp``; it ends with the caller."""
    from ..runtime.launch import enter_rank_process

    enter_rank_process(tmp, rank, env, caller)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    code = 1
    try:
        import torch

        torch.set_num_threads(max(1, int(env.get("OMP_NUM_THREADS", "1"))))
        if payload is None:
            with open(os.path.join(tmp, "fn.pkl"), "rb") as f:
                payload = f.read()
        fn, args, kwargs = pickle.loads(payload)
        init(backend, timeout_s)
        out = fn(*args, **kwargs)
        with open(os.path.join(tmp, f"result-{rank}.pkl.part"), "wb") as f:
            pickle.dump(out, f)
        os.replace(os.path.join(tmp, f"result-{rank}.pkl.part"), os.path.join(tmp, f"result-{rank}.pkl"))
        code = 0
    except BaseException as e:  # noqa: BLE001 - every failure is reported to the launcher
        msg = str(e) if isinstance(e, (ValueError, RuntimeError, TypeError)) else f"{type(e).__name__}: {e}"
        frames = traceback.extract_tb(e.__traceback__)
        where = f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""
        with open(os.path.join(tmp, f"error-{rank}.txt"), "w") as f:
            f.write(msg + where if msg else traceback.format_exc())
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def launch(fn: Callable, *args, nproc: int = 2, backend: str = "gloo", timeout_s: float = 600.0,
           **kwargs) -> List[Any]:
    """Runs ``fn(*args, **kwargs)`` on ``nproc`` local processes with torch.distributed initialised
    (``backend``; one GPU per process under NCCL) and returns every process's return value, in rank
    order (they must be picklable). A process that raises or dies stops the others; the error is
    raised as RuntimeError naming the rank. ``timeout_s`` bounds every collective wait."""
    import multiprocessing

    from ..runtime.launch import _RankProc, _child_env, _context, _start_without_main, _stop, _wait, free_port

    if not callable(fn):
        raise TypeError(f"launch: fn must be callable, got {type(fn).__name__}")
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise ValueError(f"launch: nproc must be a positive integer, got {nproc!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"launch: backend must be 'gloo' or 'nccl', got {backend!r}")
    if not float(timeout_s) > 0:
        raise ValueError(f"launch: timeout_s must be positive, got {timeout_s}")
    if backend == "nccl":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() < nproc:
            raise ValueError(f"launch: backend 'nccl' needs one CUDA device per process: {nproc} processes, "
                             f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} GPUs here")
    by_name = _importable(fn)
    with tempfile.TemporaryDirectory(prefix="weft-launch-") as tmp:
        payload = None
        if by_name:
            with open(os.path.join(tmp, "fn.pkl"), "wb") as f:
                pickle.dump((fn, args, kwargs), f)
            ctx = _context()
        else:  # a notebook's or a script's own function: the forked copy of this process has it
            try:
                payload = pickle.dumps((_Local(fn), args, kwargs))
            except Exception as e:  # noqa: BLE001
                raise ValueError(f"launch: the arguments of fn must be picklable ({type(e).__name__}: {e})") from None
            ctx = multiprocessing.get_context("fork")
            _Local.registry[id(fn)] = fn
        port = free_port()
        env = _child_env()
        procs = []
        try:
            for r in range(nproc):
                p = ctx.Process(target=_fn_process, args=(tmp, r, nproc, port, env, backend, float(timeout_s), payload,
                                                          os.getpid()), name=f"weft-rank-{r}")
                if by_name:
                    _start_without_main(p)
                else:
                    p.start()
                procs.append(_RankProc(p))
            _wait(procs, tmp, what="weft.launch")
            out = []
            for r in range(nproc):
                with open(os.path.join(tmp, f"result-{r}.pkl"), "rb") as f:
                    out.append(pickle.load(f))
            return out
        finally:
            _stop(procs)
            if not by_name:
                _Local.registry.pop(id(fn), None)


class _Local:
    """A function of this process passed to a forked child by identity (it need not be picklable)."""

    registry: dict = {}

    def __init__(self, fn):
        self.key = id(fn)

    def __call__(self, *args, **kwargs):
        return _Local.registry[self.key](*args, **kwargs)
