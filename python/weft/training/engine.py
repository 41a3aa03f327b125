"""One rank of weft.Trainer: the rank's program run once per training step, with the optimizer
applied by the Trainer (runtime learning rate, weight decay, clipping by the global norm).

A lowered training program updates each parameter as soon as its gradient is final (that is what
the planner prices). Clipping by the global norm needs every gradient first, so the rank splits its
instruction list once: the instructions that do not depend on any update (forward, backward,
gradient synchronisation) run first; then one all-reduce of (Σ squares of the gradients, replicas
counted once; the rank's share of the loss) over the world; then the updates and what depends on
them (ZeRO's gathers of updated shards), in program order. Every rank applies the same rule to its
own list, so the collectives of each group keep one order on all its members.

Mixed precision (a bf16 / f16 graph with f32 master weights, ``grad_dtype="f32"``): parameters and
activations keep the graph's half dtype; the gradients of the parameters (the tensors the updates
read, the terms summed into them, every buffer of theirs: micro-batch accumulations, all-reduces,
reduce-scatters) and the loss are stored in f32. ``grad_reduce_dtype`` ("bf16" / "f16"): the
gradient collectives send and reduce in that dtype, their results kept in f32. Loss scaling
multiplies the backward's seed (the Constant leaf "d:<loss>", 1.0) by the scale, so every gradient
is scaled and the forward's loss is not.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from ..runtime.kernels import check_deferred
from ..runtime.rank import TORCH_DTYPES, RankError, RankRuntime

UPDATE_KINDS = ("adam_update", "sgd_update")
_STATE_ROLES = ("parameter", "optimizer_state")
_REDUCING = ("all-reduce", "reduce-scatter")


def split_at_updates(instrs: Sequence[dict], ops: Sequence[dict], buffers: Sequence[dict],
                     tensors: Sequence[dict]) -> Tuple[List[dict], List[dict]]:
    """(before, after): the instructions that depend on no optimizer update, in order, and those that
    do (the updates themselves, what reads their results, the frees of what they read), in order.
    Raises RankError when moving the updates after the rest would let an instruction overwrite a
    buffer an update still has to read (a program that reuses buffers that way cannot be split)."""

    def is_update(ins):
        return ins["kind"] == "compute" and ops[ins["op"]]["kind"] in UPDATE_KINDS

    def is_updated_state(b):  # a received updated parameter or state (a tied weight's copy)
        t = buffers[b]["tensor_id"]
        return t is not None and t >= 0 and tensors[t]["role"] in _STATE_ROLES and tensors[t]["producer"] is not None

    after_bufs = set()
    late = [False] * len(instrs)
    for i, ins in enumerate(instrs):
        if ins["kind"] == "free":
            continue
        if (is_update(ins) or any(b in after_bufs for b in ins["inputs"])
                or (ins["kind"] == "recv" and any(is_updated_state(b) for b in ins["outputs"]))):
            late[i] = True
            after_bufs.update(ins["outputs"])
    used_late = set()
    for i, ins in enumerate(instrs):
        if late[i]:
            used_late.update(ins["inputs"])
            used_late.update(ins["outputs"])
    for i, ins in enumerate(instrs):
        if ins["kind"] == "free" and any(b in used_late for b in ins["inputs"]):
            late[i] = True
    # No early instruction after a late one may write what the late one reads (a write-after-read).
    read_late: set = set()
    for i, ins in enumerate(instrs):
        if late[i]:
            read_late.update(ins["inputs"])
        elif ins["kind"] != "free" and read_late.intersection(ins["outputs"]):
            raise RankError(f"instruction {ins['pc']} ({ins['kind']}) overwrites a buffer an optimizer update reads "
                            "earlier; the program cannot be split at its updates")
    return ([ins for i, ins in enumerate(instrs) if not late[i]], [ins for i, ins in enumerate(instrs) if late[i]])


def parameter_gradient_tensors(graph) -> set:
    """The ids of the tensors holding parameters' gradients: those the updates read, and the terms
    added into them (a tied weight's gradient is the sum of its uses' gradients)."""
    producer = {}
    for o in graph.ops:
        for t in o["outputs"]:
            producer[t] = o
    tensors = graph.tensors
    out = set()
    todo = [o["inputs"][1] for o in graph.ops if o["kind"] in UPDATE_KINDS and len(o["inputs"]) > 1]
    while todo:
        t = todo.pop()
        if t in out:
            continue
        out.add(t)
        o = producer.get(t)
        if o is not None and o["kind"] == "binary" and o["attrs"].get("binary", "add") == "add":
            todo.extend(i for i in o["inputs"] if tensors[i]["role"] == "gradient")
    return out


class TrainingRank(RankRuntime):
    """RankRuntime with the Trainer's optimizer: ``train_step(step, inputs, ...)`` runs one step."""

    def __init__(self, layout, rank: int, optimizer, *, device="cpu", dtype: Optional[str] = "f32", seed: int = 0,
                 groups=None, grad_dtype: Optional[str] = None, grad_reduce_dtype: Optional[str] = None):
        # Set before the base class fills anything (dtype_of reads them).
        graph = layout.program.graph
        self._grad_dtype = TORCH_DTYPES[grad_dtype] if grad_dtype else None
        self._reduce_dtype = TORCH_DTYPES[grad_reduce_dtype] if grad_reduce_dtype else None
        self.grad_tensors = parameter_gradient_tensors(graph)
        loss = layout.program.loss_id
        self.loss_tensor = layout.program.buffers[loss]["tensor_id"] if loss is not None and loss >= 0 else None
        seed_name = None if self.loss_tensor is None else "d:" + graph.tensors[self.loss_tensor]["name"]
        self.seed_tensor = next((t["id"] for t in graph.tensors if t["name"] == seed_name and t["producer"] is None),
                                None)
        self._loss_scale = 1.0
        super().__init__(layout, rank, device=device, dtype=dtype, seed=seed, groups=groups)
        if self._grad_dtype is not None:  # mixed precision: the sensitive kernels compute in f32 inside
            for ins in self.instrs:
                if isinstance(ins.get("context"), dict):
                    ins["context"]["f32_inside"] = True
        self.optimizer = optimizer
        self.before, self.after = split_at_updates(self.instrs, self.ops, self.buffers, self.tensors)
        self.updates = [ins for ins in self.after if ins["kind"] == "compute"
                        and self.ops[ins["op"]]["kind"] in UPDATE_KINDS]
        self.after = batch_updates(self.after, self.updates)
        self.world = len(self.program.ranks)
        self._stage_ranks = [r for r in range(self.world) if self.program.ranks[r]["stage"] == self.info["stage"]]
        # Each gradient an update reads, with the number of ranks holding the same elements.
        self.grad_buffers = [(ins["inputs"][1], self._holders(ins["inputs"][1])) for ins in self.updates]
        self._grad_holders = torch.tensor([float(h) for _, h in self.grad_buffers], dtype=torch.float64,
                                          device=self.device)
        self.hyper: Dict[int, dict] = {}
        for ins in self.updates:
            p = self.tensors[self.buffers[ins["inputs"][0]]["tensor_id"]]
            self.hyper[ins["pc"]] = optimizer.group_of(p["name"], tuple(p["shape"]))
        loss = self.program.loss_id
        self.loss_share = None
        if loss is not None and loss >= 0 and self.buffers[loss]["stage"] == self.info["stage"]:
            self.loss_share = (loss, self._holders(loss))
        self.states_filled = False
        self.optimizer_steps = 0  # updates applied (a skipped f16 step is not one)
        self._lr_factor = 1.0
        self._clip_coef = 1.0

    def _holders(self, b: int) -> int:
        """How many ranks hold the same term of the same elements of buffer b as this one."""
        def key(r):
            t = self.layout.tile(b, r)
            return (tuple(tuple(g) for g in t["global"]), t["partial_index"])

        mine = key(self.rank)
        return sum(1 for r in self._stage_ranks if key(r) == mine)

    def tensor_name(self, b: int) -> str:
        return self.tensors[self.buffers[b]["tensor_id"]]["name"]

    # -- mixed precision

    def is_gradient_buffer(self, b: int) -> bool:
        """Whether buffer b holds (a term of) a parameter's gradient."""
        return self.buffers[b]["tensor_id"] in self.grad_tensors

    def _dtype_of(self, b: int) -> torch.dtype:
        dt = super()._dtype_of(b)
        if self._grad_dtype is not None and dt.is_floating_point:
            t = self.buffers[b]["tensor_id"]
            if t is not None and t >= 0 and (t in self.grad_tensors or t == self.loss_tensor):
                return self._grad_dtype  # gradients and the loss: f32 under mixed precision
        return dt

    def fill(self, b: int, step: int, offset: int = 0) -> None:
        super().fill(b, step, offset)
        if self._loss_scale != 1.0 and self.buffers[b]["tensor_id"] == self.seed_tensor:
            self.write(b, self.read(b) * self._loss_scale)  # the backward's seed: every gradient × scale

    # -- one step

    def train_step(self, step: int, *, lr_factor: float, grad_clip: Optional[float],
                   loss_scale: float = 1.0) -> Dict[str, float]:
        """Runs step ``step`` (1-based; the dropout counter) on the inputs already set in
        ``self.inputs``. Returns {"loss", "grad_norm", "skipped"} (global values, on every rank)."""
        self._loss_scale = float(loss_scale)
        if self._loss_scale != 1.0 and self.seed_tensor is None:
            raise RankError("loss scaling needs the backward's seed 'd:<loss>' (a Constant leaf); the graph has none")
        self.begin_step(step, fill_states=not self.states_filled)
        self.states_filled = True
        self.run_instructions(self.before, step)
        sq = torch.zeros((), dtype=torch.float64, device=self.device)
        if self.grad_buffers:
            # Each tile's 2-norm accumulated in f64 in one multi-tensor call (no f64 copy of a gradient).
            norms = torch._foreach_norm([self.read(b) for b, _ in self.grad_buffers], 2, dtype=torch.float64)
            sq = (torch.stack(norms).square() / self._grad_holders).sum()
        share = torch.zeros((), dtype=torch.float64, device=self.device)
        if self.loss_share is not None:
            b, holders = self.loss_share
            share = self.read(b).to(torch.float64).reshape(()) / holders
        stats = torch.stack([sq, share])
        if self.world > 1:
            dist.all_reduce(stats)
        sq_total, loss = float(stats[0]), float(stats[1])
        # The forward's and backward's deferred id / label checks (a GPU's; the sync above already
        # drained the queue): a bad id stops the step before any parameter changes.
        check_deferred(self.deferred_checks)
        # The gradients are scaled (through the seed), the forward's loss is not.
        norm = math.sqrt(sq_total) / loss_scale if math.isfinite(sq_total) else math.inf
        skipped = not math.isfinite(norm)  # an inf / nan gradient on any rank: every rank skips
        # clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped at 1 (the grads are multiplied by it)
        coef = 1.0 / loss_scale
        if grad_clip is not None and not skipped:
            coef *= min(1.0, float(grad_clip) / (norm + 1e-6))
        self._clip_coef = coef
        self._lr_factor = float(lr_factor)
        self._skip = skipped
        if not skipped:
            self.optimizer_steps += 1
        self.run_instructions(self.after, step)
        self.finish_step()
        return {"loss": loss, "grad_norm": norm, "skipped": skipped}

    def execute(self, ins: dict, step: int) -> None:
        kind = ins["kind"]
        if kind == _UPDATES:
            self._update_all(ins["updates"])
        elif kind == "compute" and self.ops[ins["op"]]["kind"] in UPDATE_KINDS:
            self._update_all([ins])
        else:
            super().execute(ins, step)

    def collective_input(self, ins: dict) -> torch.Tensor:
        x = super().collective_input(ins)
        if (self._reduce_dtype is not None and ins["kind"] in _REDUCING and ins["reduce"] != "max"
                and self.is_gradient_buffer(ins["inputs"][0])):
            # A gradient reduced in the half dtype (half the bytes sent); the result is stored in f32.
            x = x.to(self._reduce_dtype)
        return x

    def _update_all(self, updates: Sequence[dict]) -> None:
        """The optimizer's rule on this rank's tiles of every update in ``updates`` at once
        (``Optimizer.update_many``): (p, g[, master], states...) -> (p'[, master'], states'...)."""
        ws, gs, states, hps, lrs, outs = [], [], [], [], [], []
        # A tensor is updated in place only when the update writes it back into the buffer it came
        # from and no other held buffer shares its storage (a copy instruction aliases its input, a
        # reshape is a view): else the rule gets a copy, and the other holders keep the old value.
        # (A view's _base is the tensor owning its storage: one attribute read where untyped_storage()
        # makes a Python object per call.)
        storages: Dict[int, int] = {}
        for v in self.values.values():
            key = id(v if v._base is None else v._base)
            storages[key] = storages.get(key, 0) + 1

        def own(b_in: int, b_out: int) -> torch.Tensor:
            v = self.read(b_in)
            base = v if v._base is None else v._base
            return v if b_in == b_out and base is v and storages.get(id(v), 0) == 1 else v.clone()

        for ins in updates:
            inp, out = ins["inputs"], ins["outputs"]
            has_master = len(inp) > 2 and self.tensor_name(inp[2]).startswith("master:")
            state_in = inp[3:] if has_master else inp[2:]
            state_out = out[2:] if has_master else out[1:]
            if len(state_in) != len(state_out):
                raise RankError(f"update '{self.ops[ins['op']]['name']}': {len(state_in)} states in, "
                                f"{len(state_out)} out")
            w = own(inp[2], out[1]) if has_master else own(inp[0], out[0])
            ws.append(w)
            states.append([own(a, b) for a, b in zip(state_in, state_out)])
            gs.append(self.read(inp[1]).to(w.dtype))
            hp = self.hyper[ins["pc"]]
            hps.append(hp)
            lrs.append(hp["lr"] * self._lr_factor)
            outs.append((out[0], out[1] if has_master else None, state_out, self.read(inp[0]).dtype))
        if not self._skip and ws:
            if self._clip_coef != 1.0:
                gs = [g * self._clip_coef for g in gs]
            states = self.optimizer.update_many(ws, gs, states, hps, lrs, self.optimizer_steps)
        for w, st, (p_out, master_out, state_out, p_dtype) in zip(ws, states, outs):
            if master_out is not None:
                self.write(p_out, w.to(p_dtype))
                self.write(master_out, w)
            else:
                self.write(p_out, w)
            for b, v in zip(state_out, st):
                self.write(b, v)


_UPDATES = "optimizer-updates"  # the updates of a step run at once (batch_updates)


def batch_updates(after: Sequence[dict], updates: Sequence[dict]) -> List[dict]:
    """``after`` with its optimizer updates run at once where the first one stands (one
    ``optimizer-updates`` instruction), so the optimizer can take them in multi-tensor ops — when
    that changes nothing: no other instruction between the first and the last update writes a
    buffer a later update reads, or reads (other than to free it) a buffer a later update writes.
    Otherwise ``after`` as it is."""
    ids = {id(u) for u in updates}
    pos = [i for i, ins in enumerate(after) if id(ins) in ids]
    if len(pos) < 2:
        return list(after)
    later_reads: set = set()
    later_writes: set = set()
    for ins in reversed(after[pos[0]:pos[-1] + 1]):
        if id(ins) in ids:
            later_reads.update(ins["inputs"])
            later_writes.update(ins["outputs"])
            continue
        reads = set(ins["inputs"]) if ins["kind"] != "free" else set()
        if set(ins["outputs"]) & later_reads or reads & later_writes:
            return list(after)
    merged = {"kind": _UPDATES, "pc": after[pos[0]]["pc"], "inputs": [], "outputs": [],
              "updates": [after[i] for i in pos]}
    return [merged if i == pos[0] else ins for i, ins in enumerate(after) if i == pos[0] or id(ins) not in ids]
