"""weft.Trainer: the user's torch module trained on a weft plan, inside the user's own loop.

    weft.distributed.init()                       # torchrun's environment (or weft.launch)
    trainer = weft.Trainer(model, example_batch, cluster="p3.8xlarge",
                           optimizer=weft.optim.AdamW(lr=3e-4, weight_decay=0.1, no_decay=("bias", "norm")),
                           lr_schedule=weft.optim.warmup_cosine(warmup=100, total=5000), grad_clip=1.0)
    for batch in loader:
        metrics = trainer.step(batch)             # loss, grad norm, lr, tokens/s (global, every rank)
    model.load_state_dict(trainer.full_state_dict())

Every rank imports the module (its own values: weights, buffers, constants), builds the training
step, gets the plan (``plan=None``: rank 0 plans and broadcasts it; lowering is deterministic, so
every rank derives the same program) and runs its rank of the program once per ``step`` on the
batch it is given: the GLOBAL batch, as the module's forward takes it; each rank reads the samples
its program loads (its micro-batches of its data-parallel share).
"""
from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from .. import _weft
from .optim import LossScaler, Optimizer, Adam, as_schedule

log = logging.getLogger("weft")

PRECISIONS = ("f32", "f64", "bf16-mixed", "f16-mixed")
_HALF_OF = {"bf16-mixed": "bf16", "f16-mixed": "f16"}


def _torch():
    import torch

    return torch


def _dist():
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise ValueError("weft.Trainer needs torch.distributed initialised: call weft.distributed.init() first "
                         "(under torchrun), or run the function with weft.launch(fn, nproc=N)")
    return dist


def _cluster_of(cluster):
    if cluster is None:
        return None
    if isinstance(cluster, str):
        from .._args import cluster_arg

        cluster = cluster_arg(cluster, 1)
    if not isinstance(cluster, _weft.Cluster):
        raise TypeError(f"cluster: expected a weft.Cluster or a preset spec string, got {type(cluster).__name__}")
    return cluster


class Trainer:
    """Trains ``model`` on a weft plan in this process's rank (torch.distributed initialised, one
    process per device of the plan).

    ``example_inputs``: a batch as ``model.forward`` takes it (a tuple, or a dict of keyword
    inputs), of the global batch size every ``step`` will get; the model returns the scalar loss
    (or a Hugging Face output with ``.loss``), or give ``loss_fn`` and ``targets`` as for
    :func:`weft.from_torch`.
    ``plan``: a :class:`weft.Plan`, a plan JSON path, a lowered :class:`weft.Program`, or None (rank 0
    plans with :func:`weft.plan` on ``cluster`` and ``plan_options``, and broadcasts the plan).
    ``cluster``: a :class:`weft.Cluster` or a preset spec ("p3.8xlarge", "M8:2") with one device
    per process (needed unless ``plan`` is a Program).
    ``optimizer``: :class:`weft.optim.SGD` / ``Adam`` / ``AdamW`` (default AdamW(lr=1e-3), torch's
    defaults). ``lr_schedule``: a factor per step (``weft.optim.warmup_cosine(...)``, any callable
    step -> factor as LambdaLR's lambda, or a torch LRScheduler). ``grad_clip``: the max global norm
    (None: no clipping; the norm is reported either way).
    ``precision``: "f32", "f64" (proofs), "bf16-mixed", "f16-mixed" (docs/modules/training_precision.md):
    mixed runs the graph in bf16 / f16 (parameters, activations) with f32 master weights and Adam
    moments, parameters' gradients and the loss in f32, the sensitive kernels in f32 inside.
    ``grad_reduce_dtype`` (mixed only): "f32" (default) or the half dtype ("bf16" / "f16"): the
    gradients' all-reduces / reduce-scatters send and sum in it, the results kept in f32.
    ``loss_scaler``: a :class:`weft.optim.LossScaler` (default for "f16-mixed": GradScaler's dynamic
    scaling, init 2**16; None otherwise); ``False``: none. A step with a non-finite gradient is
    skipped on every rank (metrics "skipped"; "loss_scale" is the scale the step ran with).
    ``device``: this rank's torch device (default: cuda:<local rank> under NCCL, else cpu).
    ``callbacks``: functions called with each step's metrics dict. ``progress``: a tqdm bar on rank 0
    (default: when stderr is a terminal). ``check_batch``: every step, check (one small all-reduce)
    that every rank was given the same global batch — a ValueError otherwise."""

    def __init__(self, model, example_inputs, *, plan=None, cluster=None, optimizer: Optional[Optimizer] = None,
                 lr_schedule=None, grad_clip: Optional[float] = None, precision: str = "f32",
                 loss_fn: Optional[Callable] = None, targets: Sequence[Any] = (), plan_options: Optional[dict] = None,
                 device=None, seed: int = 0, callbacks: Sequence[Callable[[dict], Any]] = (),
                 progress: Optional[bool] = None, total_steps: Optional[int] = None, check_batch: bool = True,
                 grad_reduce_dtype: Optional[str] = None, loss_scaler=None):
        torch = _torch()
        dist = _dist()
        from .optim import AdamW

        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if optimizer is None:
            optimizer = AdamW()
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"optimizer: expected a weft.optim optimizer (SGD, Adam, AdamW), got "
                            f"{type(optimizer).__name__} (torch optimizers act on whole tensors; weft's act on shards)")
        if grad_clip is not None and not (isinstance(grad_clip, (int, float)) and grad_clip > 0):
            raise ValueError(f"grad_clip must be a positive number or None, got {grad_clip!r}")
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"model: expected a torch.nn.Module, got {type(model).__name__}")
        half = _HALF_OF.get(precision)
        if grad_reduce_dtype not in (None, "f32") and grad_reduce_dtype != half:
            raise ValueError(f"grad_reduce_dtype: 'f32' or, under {precision!r}, "
                             f"{repr(half) if half else 'nothing else'}; got {grad_reduce_dtype!r}")
        if loss_scaler is None:
            loss_scaler = LossScaler() if precision == "f16-mixed" else False
        if loss_scaler is not False and not isinstance(loss_scaler, LossScaler):
            raise TypeError(f"loss_scaler: expected a weft.optim.LossScaler, None or False, got "
                            f"{type(loss_scaler).__name__}")
        self.scaler: Optional[LossScaler] = loss_scaler or None
        self.grad_reduce_dtype = grad_reduce_dtype if grad_reduce_dtype not in (None, "f32") else None
        self.model = model
        self.optimizer = optimizer
        self.schedule = as_schedule(lr_schedule)
        self.grad_clip = None if grad_clip is None else float(grad_clip)
        self.precision = precision
        self.callbacks = list(callbacks)
        self.check_batch = bool(check_batch)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.seed = int(seed)
        self.loss_fn, self.targets = loss_fn, tuple(targets)
        self._keys = list(example_inputs) if isinstance(example_inputs, Mapping) else None
        self._example = self._flatten(example_inputs, self.targets)

        self.step_graph = self._training_graph(model, example_inputs)
        self.input_names = self._input_names(model, example_inputs)
        self.cluster = _cluster_of(cluster)
        self.plan, self.program = self._program(plan, plan_options or {})
        if self.program.num_ranks != self.world:
            raise ValueError(f"the plan has {self.program.num_ranks} ranks, this job {self.world} processes "
                             "(one process per device of the plan)")
        from ..runtime.launch import check_values

        check_values(self.program, None, None)  # a leaf without a value: ValueError naming it, on every rank
        self.device = torch.device(device) if device is not None else self._default_device()
        from ..runtime.comm import ProcessGroups
        from .engine import TrainingRank

        self.layout = _weft.ProgramLayout(self.program)
        self.engine = TrainingRank(self.layout, self.rank, optimizer, device=self.device,
                                   dtype=self._storage_dtype(), seed=self.seed,
                                   groups=ProcessGroups(self.layout.collective_groups()),
                                   grad_dtype="f32" if half else None, grad_reduce_dtype=self.grad_reduce_dtype)
        self.steps_done = 0
        self.total_steps = total_steps
        self.history: List[dict] = []
        self._bar = None
        self._progress = progress
        self._local: Optional[List[int]] = None
        self._ce_needed: Optional[bool] = None
        self.tokens_per_step, self.samples_per_step = self._sizes()
        log.info("weft.Trainer: rank %d of %d, %s, %d instructions per step", self.rank, self.world,
                 self.plan.strategy if self.plan is not None else "a given program", len(self.engine.instrs))

    # ---- set-up

    @staticmethod
    def training_graph(model, example_inputs, optimizer: Optional[Optimizer] = None, precision: str = "f32",
                       loss_fn: Optional[Callable] = None, targets: Sequence[Any] = ()):
        """The training graph a Trainer with these arguments builds (to plan on before making it)."""
        from ..frontend import from_torch
        from .optim import AdamW

        optimizer = optimizer if optimizer is not None else AdamW()
        dtype = _HALF_OF.get(precision)
        g = from_torch(model, example_inputs, loss_fn=loss_fn, targets=tuple(targets), dtype=dtype)
        return g.train_step(**optimizer.train_step_options(), master_weights=True if dtype else None)

    @staticmethod
    def _flatten(inputs, targets) -> list:
        vals = list(inputs.values()) if isinstance(inputs, Mapping) else (
            [inputs] if _torch().is_tensor(inputs) else list(inputs))
        return vals + list(targets)

    def _training_graph(self, model, example_inputs):
        return Trainer.training_graph(model, example_inputs, self.optimizer, self.precision, self.loss_fn, self.targets)

    def _input_names(self, model, example_inputs) -> List[str]:
        from ..frontend.torch import _signature_names

        n = len(self._example) - len(self.targets)
        names = self._keys if self._keys is not None else _signature_names(model.forward, n, 0, "input")
        if self.targets:
            names = names + _signature_names(self.loss_fn, len(self.targets), 1, "target")
        leaves = {t["name"]: t for t in self.step_graph.tensors if t["role"] == "input" and t["producer"] is None}
        unknown = [k for k in leaves if k not in names]
        if unknown:  # the importer named them otherwise: never guess which batch entry feeds them
            raise ValueError(f"weft.Trainer: the graph's inputs {unknown} match no argument of the model's forward "
                             f"({names})")
        return names

    def _program(self, plan, plan_options):
        from ..execution import lower
        from ..planning import plan as make_plan

        if isinstance(plan, _weft.Program):
            return None, plan
        if self.cluster is None:
            raise ValueError("weft.Trainer: give cluster= (a weft.Cluster or a preset spec with one device per "
                             "process) to plan and lower on")
        if self.cluster.num_devices < self.world:
            raise ValueError(f"the cluster has {self.cluster.num_devices} devices, this job {self.world} processes")
        if isinstance(plan, str):
            plan = _weft.Plan.from_json(open(plan).read())
        if plan is None or (callable(plan) and not isinstance(plan, _weft.Plan)):
            # planned once, on rank 0, and broadcast (lowering is deterministic: every rank derives
            # the same program from it)
            how = plan if plan is not None else (lambda g, c: make_plan(g, c, **plan_options))
            dist = _dist()
            text = [None]
            if self.rank == 0:
                try:
                    made = how(self.step_graph, self.cluster)
                    if not isinstance(made, _weft.Plan):
                        raise TypeError(f"plan: the callable returned {type(made).__name__}, not a weft.Plan")
                    text = [made.to_json()]
                except Exception as e:  # noqa: BLE001 - every rank raises the same error, none hangs
                    text = [e]
            dist.broadcast_object_list(text, src=0)
            if isinstance(text[0], Exception):
                raise text[0]
            plan = _weft.Plan.from_json(text[0])
        if not isinstance(plan, _weft.Plan):
            raise TypeError(f"plan: expected a weft.Plan, a plan JSON path, a callable (graph, cluster) -> Plan, a "
                            f"weft.Program or None, got {type(plan).__name__}")
        try:
            return plan, lower(plan, self.step_graph, self.cluster)
        except ValueError as e:
            raise ValueError(f"{e} (a plan for the Trainer is made on its training graph, which depends on the "
                             "optimizer: pass plan=lambda graph, cluster: weft.megatron_plan(graph, cluster, ...), or "
                             "make it on trainer.training_graph(model, example, optimizer))") from None

    def _storage_dtype(self):
        return {"f32": "f32", "f64": "f64"}.get(self.precision)  # mixed: the graph's own dtypes

    def _default_device(self):
        torch = _torch()
        import torch.distributed as dist

        if dist.get_backend() == "nccl":
            import os

            idx = int(os.environ.get("LOCAL_RANK", self.rank)) % torch.cuda.device_count()
            torch.cuda.set_device(idx)
            return torch.device("cuda", idx)
        return torch.device("cpu")

    def _sizes(self):
        """(tokens, samples) of a global batch: an integer input's elements (token ids), the first
        input's leading dim."""
        torch = _torch()
        first = self._example[0]
        ints = [x for x in self._example if not torch.is_floating_point(x)]
        samples = int(first.shape[0]) if first.dim() else 1
        return (int(ints[0].numel()) if ints else samples), samples

    # ---- the batch

    def _inputs(self, batch, targets=()) -> Dict[str, np.ndarray]:
        torch = _torch()
        if self._keys is not None:
            if not isinstance(batch, Mapping):
                raise TypeError(f"step: the model takes keyword inputs {self._keys}; give the batch as a dict")
            missing = [k for k in self._keys if k not in batch]
            if missing:
                raise ValueError(f"step: the batch lacks {missing} (the example had {self._keys})")
            vals = [batch[k] for k in self._keys]
        elif torch.is_tensor(batch):
            vals = [batch]
        elif isinstance(batch, (tuple, list)):
            vals = list(batch)
        else:
            raise TypeError(f"step: expected the batch as the model's forward takes it (a tuple of tensors, or a "
                            f"dict), got {type(batch).__name__}")
        vals += list(targets)
        if len(vals) != len(self._example):
            raise ValueError(f"step: the batch has {len(vals)} tensors, the example had {len(self._example)} "
                             f"({', '.join(self.input_names)})")
        out = {}
        for name, v, ex in zip(self.input_names, vals, self._example):
            if not torch.is_tensor(v):
                v = torch.as_tensor(np.asarray(v))
            if tuple(v.shape) != tuple(ex.shape):
                raise ValueError(f"step: '{name}' has shape {tuple(v.shape)}, the plan is for {tuple(ex.shape)} (the "
                                 f"global batch is fixed by the plan: drop an incomplete last batch, "
                                 f"DataLoader(drop_last=True))")
            if torch.is_floating_point(v) != torch.is_floating_point(ex):
                raise ValueError(f"step: '{name}' is {v.dtype}, the example was {ex.dtype}")
            a = v.detach().to("cpu")
            out[name] = a.numpy() if torch.is_floating_point(a) else a.to(torch.int64).numpy()
        return out

    # ---- reading only this rank's samples

    def local_indices(self) -> List[int]:
        """The positions in the global batch (0 .. batch-1) whose samples this rank's program reads
        (its micro-batches of its data-parallel share; every position on a rank that holds the batch
        whole, and none on a pipeline stage that reads no input)."""
        if self._local is None:  # (exec::ProgramLayout::rows_read: the rows the loss's counts assume)
            self._local = [int(k) for k in self.layout.rows_read(self.rank)]
        return list(self._local)

    def sampler(self, dataset, *, shuffle: bool = True, seed: int = 0, drop_last: bool = True):
        """A batch sampler for ``torch.utils.data.DataLoader(dataset, batch_sampler=...)`` that yields,
        per step, the dataset indices of the samples THIS rank reads (the global batch is a
        permutation of the dataset, the same on every rank: ``seed`` and the epoch; ``set_epoch``
        as DistributedSampler); turn each loaded batch into the step's input with
        :meth:`local_batch`. Only complete global batches are drawn."""
        if not drop_last:
            raise ValueError("sampler: the plan's global batch is fixed; drop_last must be True")
        return _RankSampler(len(dataset), self._example[0].shape[0], self.local_indices(), shuffle, int(seed))

    def local_batch(self, rows):
        """The global batch for :meth:`step` from this rank's rows only (a tuple / dict like the
        module's input, each tensor holding the samples of :meth:`local_indices`, in that order):
        the rows placed at their positions, zeros elsewhere (rows this rank never reads)."""
        torch = _torch()
        local = self.local_indices()
        if not local:  # this rank reads no sample: any rows (the sampler's placeholder) give zeros
            zeros = [torch.zeros(ex.shape, dtype=ex.dtype) for ex in self._example]
            return _LocalDict(zip(self._keys, zeros)) if self._keys is not None else _LocalTuple(zeros)
        if self._keys is not None:
            vals = [rows[k] for k in self._keys]
        else:
            vals = [rows] if torch.is_tensor(rows) else list(rows)
        out = []
        for v, ex in zip(vals, self._example):
            v = torch.as_tensor(v)
            if v.dim() == 0 or v.shape[0] != len(local) or tuple(v.shape[1:]) != tuple(ex.shape[1:]):
                raise ValueError(f"local_batch: a tensor of shape {tuple(v.shape)}, expected "
                                 f"{(len(local),) + tuple(ex.shape[1:])} (this rank's {len(local)} samples)")
            full = torch.zeros(ex.shape, dtype=v.dtype)
            full[torch.as_tensor(local, dtype=torch.int64)] = v
            out.append(full)
        if self._keys is not None:
            return _LocalDict(zip(self._keys, out))
        return _LocalTuple(out)

    # ---- training

    def lr(self, step: Optional[int] = None) -> Dict[str, float]:
        """The base learning rate (``optimizer.lr`` times the schedule's factor; a group with its own
        lr scales the same way) at ``step`` (from 0; default: the next step), as {"lr": ...}."""
        i = self.steps_done if step is None else int(step)
        f = float(self.schedule(i))
        return {"lr": self.optimizer.lr * f}

    def step(self, batch, targets: Sequence[Any] = ()) -> Dict[str, float]:
        """One training step on the global ``batch``: forward, backward, gradient synchronisation,
        clipping and the optimizer's update. Returns this step's metrics, equal on every rank:
        step, loss, grad_norm, lr, step_seconds, tokens_per_s, samples_per_s, mfu (the model's
        FLOPs over the step time and the cluster's peak), predicted_step_seconds (the plan's),
        skipped (a non-finite gradient: no update), loss_scale (with a loss scaler: this step's)."""
        inputs = self._inputs(batch, targets)
        if self.check_batch and self.world > 1 and not isinstance(batch, (_LocalTuple, _LocalDict)):
            self._check_same_batch(inputs)
        self.engine.inputs = inputs
        self.engine.ce_given = None
        if isinstance(batch, (_LocalTuple, _LocalDict)) and self.world > 1 and self._needs_ce_labels():
            self.engine.ce_given = self._local_ce_fractions(inputs, self.steps_done + 1)
        factor = float(self.schedule(self.steps_done))
        if not math.isfinite(factor) or factor < 0:
            raise ValueError(f"lr_schedule({self.steps_done}) = {factor}: not a finite factor >= 0")
        torch = _torch()
        t0 = time.perf_counter()
        scale = self.scaler.scale if self.scaler is not None else 1.0
        got = self.engine.train_step(self.steps_done + 1, lr_factor=factor, grad_clip=self.grad_clip,
                                     loss_scale=scale)
        if self.scaler is not None:
            self.scaler.update(got["skipped"])  # the same on every rank: "skipped" is global
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        dt = time.perf_counter() - t0
        self.steps_done += 1
        m = {"step": self.steps_done, "loss": got["loss"], "grad_norm": got["grad_norm"],
             "lr": self.optimizer.lr * factor, "step_seconds": dt, "tokens_per_s": self.tokens_per_step / dt,
             "samples_per_s": self.samples_per_step / dt, "skipped": got["skipped"]}
        if self.scaler is not None:
            m["loss_scale"] = scale
        if self.plan is not None:
            m["predicted_step_seconds"] = float(self.plan.step_time)
            peak = float(self.plan.cluster_peak_flops)
            if peak > 0:
                m["mfu"] = float(self.plan.model_flops) / (dt * peak)
        self.history.append(m)
        self._report(m)
        return m

    def _needs_ce_labels(self) -> bool:
        """Whether the program has a cross entropy that divides by the step's weighted count of valid
        labels (torch's mean with ignore_index / class weights: exec::CeValidFractions)."""
        if self._ce_needed is None:
            self._ce_needed = bool(self.layout.ce_valid_fractions(self.engine.leaves.leaf_values, {}, 1))
        return self._ce_needed

    def _local_ce_fractions(self, inputs: Dict[str, np.ndarray], step: int) -> Dict[int, float]:
        """The step's weighted valid fraction of each cross entropy (exec::CeValidFractions) from local
        batches: every rank holds only its rows, but the loss divides by the count of valid labels of
        the WHOLE step. Each rank counts the parts (micro-batch x replica) assigned to it — each part
        to one rank that holds its rows, so rows several ranks read count once — and one all-reduce
        (sum) of two numbers per loss gives the step's counts. Rows of a part no single rank holds
        (its batch split inside a replica; usually none) are max-reduced to every rank first."""
        torch = _torch()
        dist = _dist()
        leaves = self.engine.leaves.leaf_values
        unheld = list(self.layout.ce_unheld_rows())
        if unheld:
            local = self.local_indices()
            held = set(local)
            mine = [k for k, row in enumerate(unheld) if row in held]
            batch = int(self.layout.global_batch())
            gathered = {}
            for name, v in inputs.items():
                full = v.astype(np.float64)  # (copied: the step's own inputs stay as given)
                if v.ndim >= 1 and v.shape[0] == batch:  # per sample: the unheld rows
                    t = torch.full((len(unheld),) + v.shape[1:], -math.inf, dtype=torch.float64, device=self.device)
                    if mine:
                        t[torch.as_tensor(mine, dtype=torch.int64)] = torch.from_numpy(
                            full[[unheld[k] for k in mine]]).to(self.device)
                else:  # whole, from the ranks that hold every row (they alone were given it)
                    t = torch.full(v.shape, -math.inf, dtype=torch.float64, device=self.device)
                    if len(local) == batch:
                        t.copy_(torch.from_numpy(full))
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
                got = t.to("cpu").numpy()
                got[got == -math.inf] = 0  # held by no rank: no loss part reads it
                if v.ndim >= 1 and v.shape[0] == batch:
                    full[unheld] = got
                else:
                    full = got
                gathered[name] = full
            inputs = {**inputs, **gathered}
        counts = self.layout.ce_valid_counts(leaves, inputs, int(step), self.rank)
        t = torch.tensor(counts, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return self.layout.ce_fractions_from_counts(t.to("cpu").tolist())

    def _check_same_batch(self, inputs: Dict[str, np.ndarray]) -> None:
        """Every rank must be given the same global batch (each reads its rows of it): a CRC of the
        batch's bytes, max-reduced with its negation — one small all-reduce — tells them apart."""
        import zlib

        torch = _torch()
        crc = 0
        for name in self.input_names:
            crc = zlib.crc32(np.ascontiguousarray(inputs[name]).tobytes(), crc)
        t = torch.tensor([float(crc), -float(crc)], dtype=torch.float64, device=self.device)
        _dist().all_reduce(t, op=_dist().ReduceOp.MAX)
        if float(t[0]) != -float(t[1]):
            raise ValueError(f"step {self.steps_done + 1}: the ranks were given different batches; trainer.step takes "
                             "the same GLOBAL batch on every rank (seed the data order the same way everywhere), or "
                             "each rank's own samples through trainer.sampler(dataset) + trainer.local_batch(rows)")

    def _report(self, m: dict) -> None:
        for cb in self.callbacks:
            cb(m)
        if m["step"] == 1 or m["step"] % 10 == 0:
            log.info("step %d: loss %.5g, grad norm %.4g, lr %.3g, %.1f tokens/s", m["step"], m["loss"],
                     m["grad_norm"], m["lr"], m["tokens_per_s"])
        if self.rank != 0:
            return
        if self._bar is None and self._progress is not False:
            import sys

            if self._progress or sys.stderr.isatty():
                from tqdm.auto import tqdm

                self._bar = tqdm(total=self.total_steps, desc="weft", unit="step")
        if self._bar is not None:
            post = {"loss": f"{m['loss']:.4f}", "tok/s": f"{m['tokens_per_s']:.0f}"}
            if "mfu" in m:
                post["mfu"] = f"{100 * m['mfu']:.1f}%"
            self._bar.set_postfix(post)
            self._bar.update(1)

    def close(self) -> None:
        """Closes the progress bar (rank 0)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    # ---- checkpoints (weft/training/checkpoint.py; docs/modules/training_checkpoints.md)

    def save(self, path: str, extra: Optional[dict] = None) -> None:
        """Saves the parameters, optimizer states, the step and ``extra`` (a picklable dict, e.g. the
        data position) to the directory ``path`` with torch.distributed.checkpoint, each rank
        writing the shards it owns (a collective: call it on every rank). Keys: ``model.<name>``,
        ``optim.state.<name>.exp_avg`` ... (torch's layout: plain torch loads it with DCP)."""
        from .checkpoint import save

        save(self, str(path), extra)

    def load(self, path: str) -> dict:
        """Loads a checkpoint written by :meth:`save` under any plan and world size (DCP reads
        the overlaps into this rank's tiles); training resumes at its step. Returns its ``extra``.
        ValueError naming the tensor when it is another model's (missing, unexpected, shape)."""
        from .checkpoint import load

        return load(self, str(path))

    # ---- the weights

    def _pieces(self, ids: Mapping[str, int]) -> Dict[str, tuple]:
        out = {}
        for n, b in ids.items():
            p = self.engine.piece(b)
            if p is not None:
                out[n] = p
        return out

    def _module_keys(self):
        """(key, canonical parameter name or None, the module's tensor) for every state_dict key."""
        own = self.model.state_dict(keep_vars=True)
        names = {}
        for n, p in self.model.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), n)
        trained = self.program.parameter_ids
        return [(k, names.get(id(v), k) if names.get(id(v), k) in trained else None, v) for k, v in own.items()]

    def save_full_state_dict(self, path: str) -> None:
        """Streams the module's state_dict with the trained parameters (full_state_dict's keys and
        dtypes) to a safetensors file written by rank 0, one tensor at a time: rank 0 holds one
        assembled tensor at once, not the model (a collective: call it on every rank).
        ``safetensors.torch.load_file(path)`` then ``model.load_state_dict(..., strict=True)``."""
        import json
        import struct

        torch = _torch()
        dist = _dist()
        from .._files import check_writable, write_atomically
        from ..runtime import tiles as T

        if self.rank == 0:
            check_writable(path, "save_full_state_dict")
        keys = self._module_keys()
        st_dtype = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
                    torch.bool: "BOOL"}
        header, offset = {}, 0
        for k, _, v in keys:
            if v.dtype not in st_dtype:
                raise ValueError(f"save_full_state_dict: '{k}' has dtype {v.dtype}, which safetensors cannot hold")
            n = v.numel() * v.element_size()
            header[k] = {"dtype": st_dtype[v.dtype], "shape": list(v.shape), "data_offsets": [offset, offset + n]}
            offset += n
        head = json.dumps(header, separators=(",", ":")).encode()
        head += b" " * (-len(head) % 8)  # safetensors aligns the data to 8 bytes

        def tensors():  # every rank takes part in each gather; rank 0 gets the assembled tensor
            for k, canon, v in keys:
                if canon is None:
                    yield v.detach().to("cpu")
                    continue
                b = self.program.parameter_ids[canon]
                got = [None] * self.world if self.rank == 0 else None
                dist.gather_object(self.engine.piece(b), got, dst=0)
                if self.rank == 0:
                    full = T.assemble(self.program.buffers[b]["shape"], [g for g in got if g is not None])
                    yield torch.from_numpy(full).to(v.dtype).reshape(v.shape)
                else:
                    yield None

        def write(f):
            f.write(struct.pack("<Q", len(head)))
            f.write(head)
            for t in tensors():
                f.write(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")

        if self.rank == 0:
            write_atomically(path, write, binary=True)
        else:
            for _ in tensors():
                pass

    def full_state_dict(self, rank0_only: bool = False) -> Dict[str, Any]:
        """The module's state_dict with the trained parameters (the module's own keys, tied names
        included, its dtypes, on the CPU): gathered from every rank's tiles (a collective: call it on
        every rank). ``rank0_only``: other ranks get {} (the full model held once). For a model too
        large to hold: :meth:`save_full_state_dict` streams it to a file."""
        torch = _torch()
        dist = _dist()
        from ..runtime import tiles as T

        mine = self._pieces(self.program.parameter_ids)
        gathered = [None] * self.world
        if rank0_only:
            dist.gather_object(mine, gathered if self.rank == 0 else None, dst=0)
            if self.rank != 0:
                return {}
        else:
            dist.all_gather_object(gathered, mine)
        values = {}
        for n, b in self.program.parameter_ids.items():
            pieces = [g[n] for g in gathered if g and n in g]
            values[n] = T.assemble(self.program.buffers[b]["shape"], pieces)
        out = {}
        for k, canon, v in self._module_keys():
            if canon is not None:
                out[k] = torch.from_numpy(values[canon]).to(v.dtype).reshape(v.shape)
            else:
                out[k] = v.detach().to("cpu").clone()
        return out


class _LocalTuple(tuple):
    """A batch made by Trainer.local_batch: this rank's rows only (the ranks' batches differ)."""


class _LocalDict(dict):
    """A keyword batch made by Trainer.local_batch."""


class _RankSampler:
    """Per step, the dataset indices of a rank's samples of the global batch (see Trainer.sampler)."""

    def __init__(self, n: int, batch: int, local: List[int], shuffle: bool, seed: int):
        if n < batch:
            raise ValueError(f"sampler: the dataset has {n} samples, fewer than one global batch of {batch}")
        self.n, self.batch, self.local, self.shuffle, self.seed = n, batch, list(local), shuffle, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.n // self.batch

    def __iter__(self):
        order = np.arange(self.n)
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch]).permutation(self.n)
        for s in range(len(self)):
            glob = order[s * self.batch:(s + 1) * self.batch]
            # a rank that reads no sample (a middle pipeline stage) still gets one, so that a
            # DataLoader has a batch to give; local_batch ignores it
            yield [int(glob[i]) for i in self.local] if self.local else [int(glob[0])]
