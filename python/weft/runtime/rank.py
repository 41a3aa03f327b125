"""One rank of a lowered program, run in its own process on torch (weft.runtime).

The rank runs its instruction list (``ProgramLayout.instructions(rank)``) once per training step:
compute on its local tiles with the torch kernels (kernels.py), collectives and cross-stage
transfers on torch.distributed (comm.py), leaves initialised from the same counter-based values
as the CPU reference executor (a pure function of seed, tensor, step and global element index, so
every rank fills its own shard), buffers freed where the program says. Parameters and optimizer
states persist across steps; inputs are loaded per micro-batch.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional

import numpy as np
import torch

from .. import _weft
from . import tiles as T
from .comm import Comm, ProcessGroups
from .kernels import ce_grad, ce_loss, ce_row_max, ce_row_sum_target, check_deferred, run_kernel

# Storage dtypes: the runtime's float policy, and the graph's dtype names.
TORCH_DTYPES = {"f64": torch.float64, "f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
_INT_DTYPES = {"i32", "i64", "bool"}
_SIGNIFICAND = {"bf16": 8, "f16": 11, "f32": 24, "f64": 53}


def held_dtype(dt: str, base: str, run: str) -> str:
    """The dtype a float tensor of IR dtype ``dt`` is held (and computed) at when the graph's base
    dtype ``base`` runs at ``run`` -- ir::held_dtype (include/weft/ir/precision.hpp): the base at the
    run's dtype; a tensor narrower than the base at the narrower of (its own, the run's) -- an f32
    region of an f64 model stays f32 in an f64 run --, one wider than the base at the wider of
    them -- a bf16 model's upcast to f32 stays f32 in a bf16 run."""
    if dt == base:
        return run
    narrower = _SIGNIFICAND[dt] < _SIGNIFICAND[base]
    return dt if narrower == (_SIGNIFICAND[dt] < _SIGNIFICAND[run]) else run


class RankError(RuntimeError):
    """A rank's failure, naming the rank and the instruction it failed at."""


@dataclass
class RankResult:
    """What a rank reports at the end of a run (gathered on rank 0)."""

    rank: int
    losses: List[tuple] = field(default_factory=list)  # per step: (flat, values, partial index) or None
    parameters: Dict[str, tuple] = field(default_factory=dict)  # name -> (flat, values, partial index)
    gradients: Dict[str, tuple] = field(default_factory=dict)
    step_seconds: List[float] = field(default_factory=list)
    bytes_sent: Dict[str, int] = field(default_factory=dict)
    collective_calls: Dict[str, int] = field(default_factory=dict)
    peak_bytes: int = 0


class RankRuntime:
    """Runs rank ``rank`` of a program (its ProgramLayout) on torch.distributed, already initialised
    with one process per rank (``dist.get_rank() == rank``)."""

    def __init__(self, layout, rank: int, *, device="cpu", dtype: Optional[str] = "f32", seed: int = 0,
                 inputs: Optional[Mapping[str, np.ndarray]] = None, groups: Optional[ProcessGroups] = None,
                 seed_all_parameters: bool = False):
        self.layout = layout
        self.program = layout.program
        self.rank = rank
        self.device = torch.device(device)
        self.info = self.program.ranks[rank]
        self.graph = layout.graph_of(rank)
        self.ops = self.graph.ops
        self.tensors = self.program.graph.tensors
        self.buffers = self.program.buffers
        self.instrs = layout.instructions(rank)
        self.leaves = LeafInit(self.program.graph, seed, seed_all_parameters)
        self.inputs = {k: np.asarray(v) for k, v in (inputs or {}).items()}
        self.float_dtype = TORCH_DTYPES[dtype] if dtype else None
        self.run_dtype = dtype
        self.base_dtype = self.program.graph.base_dtype
        self.groups = groups if groups is not None else ProcessGroups(layout.collective_groups())
        self.comm = Comm(rank, layout, self.buffers, self.groups, self.device)
        self.values: Dict[int, torch.Tensor] = {}
        self.ce_fraction: Dict[int, float] = {}  # op id -> the step's valid fraction (set_ce_fractions)
        self.ce_given: Optional[Dict[int, float]] = None  # the step's fractions, counted by its caller
        self.pending: Dict[int, callable] = {}
        self.live_bytes = 0
        self.peak_bytes = 0
        # Largest tensors first: a rank reading a value file holds one whole tensor transiently (a
        # column split reads its rows), at most the largest while it holds the least.
        self._leaf_ids = sorted((b for b in self.program.leaf_buffer_ids
                                 if self.buffers[b]["stage"] == self.info["stage"]),
                                key=lambda b: -int(np.prod(self.buffers[b]["shape"] or [1])))
        self._local_shape: Dict[int, List[int]] = {}
        self._dtype: Dict[int, torch.dtype] = {}
        self._meta: Dict[int, tuple] = {}
        self._sources: Dict[int, object] = {}
        self._files = ValueFiles()
        self._file_tiles: Dict[tuple, torch.Tensor] = {}  # (buffer, offset) -> a steady leaf's tile
        # Id and label range checks of the kernels (kernels.check_ids): on a GPU they are not read back
        # where they run (a host sync per embedding / loss stalls the launch queue), but once at the
        # end of the step (check_deferred); the CPU checks at once.
        self.deferred_checks: List[tuple] = []
        if self.device.type != "cpu":
            for ins in self.instrs:
                if isinstance(ins.get("context"), dict):
                    ins["context"]["deferred_checks"] = self.deferred_checks

    # -- buffers

    def dtype_of(self, b: int) -> torch.dtype:
        dt = self._dtype.get(b)
        if dt is None:
            dt = self._dtype[b] = self._dtype_of(b)
        return dt

    def _dtype_of(self, b: int) -> torch.dtype:
        t = self.buffers[b]["tensor_id"]
        dt = self.tensors[t]["dtype"] if t is not None and t >= 0 else "f32"
        if dt in _INT_DTYPES:
            return torch.int64
        if self.run_dtype and dt in _SIGNIFICAND and t is not None and t >= 0:  # statistics: the run's
            return TORCH_DTYPES[held_dtype(dt, self.base_dtype, self.run_dtype)]
        return self.float_dtype or TORCH_DTYPES.get(dt, torch.float32)

    def local_shape(self, b: int) -> List[int]:
        if b not in self._local_shape:
            self._local_shape[b] = torch.Size(self.layout.tile(b, self.rank)["local_shape"])
        return self._local_shape[b]

    def read(self, b: int) -> torch.Tensor:
        if self.pending:
            fin = self.pending.pop(b, None)
            if fin is not None:
                self.write(b, fin())
        v = self.values.get(b)
        if v is None:
            raise RankError(f"buffer '{self.buffers[b]['name']}' is not held")
        return v

    def _meta_of(self, b: int) -> tuple:
        """(tile shape, storage dtype, bytes) of buffer b, worked out once: write() runs per result."""
        m = self._meta.get(b)
        if m is None:
            shape, dt = self.local_shape(b), self.dtype_of(b)
            m = self._meta[b] = (shape, dt, shape.numel() * dt.itemsize)
        return m

    def write(self, b: int, v: torch.Tensor) -> None:
        want, dt, nbytes = self._meta_of(b)
        if v.shape != want:
            raise RankError(f"result shape {list(v.shape)} differs from the tile {list(want)} of "
                            f"'{self.buffers[b]['name']}'")
        if v.dtype != dt:
            v = v.to(dt)
        # Row-major storage, as the tiles are laid out: a kernel may return a transposed or expanded
        # view (torch.einsum does for some shapes), and collectives and index maps read raw memory.
        if not v.is_contiguous():
            v = v.contiguous()
        if b not in self.values:
            self.live_bytes += nbytes
            if self.live_bytes > self.peak_bytes:
                self.peak_bytes = self.live_bytes
        self.values[b] = v

    def free(self, b: int) -> None:
        if self.pending:
            fin = self.pending.pop(b, None)
            if fin is not None:
                fin()  # the communication completes; its value is not needed
        if self.values.pop(b, None) is not None:
            self.live_bytes -= self._meta_of(b)[2]

    def fill(self, b: int, step: int, offset: int = 0) -> None:
        """Rank's tile of leaf buffer b: the global values at its elements (dim 0 shifted by offset)."""
        t = self.buffers[b]["tensor_id"]
        source = self._source(t)
        if isinstance(source, tuple):  # a value file: read the tile's box of the tensor, nothing more
            key = (b, offset)
            v = self._file_tiles.get(key)
            if v is None:
                v = self._files.tile(source[0], source[1], self.layout.tile(b, self.rank)["global"], offset)
                v = v.reshape(self.local_shape(b)).to(device=self.device, dtype=self.dtype_of(b))
                if self.tensors[t]["role"] in ("buffer", "constant"):
                    self._file_tiles[key] = v  # refilled every step: read once
            self.write(b, v)
            return
        role = self.tensors[t]["role"]
        # A buffer or constant with its value in the graph (a causal mask, a position table) is the
        # same every step: its tile is worked out once (index math and a host-to-device copy per
        # step cost as much as many kernels); a seeded leaf's value may depend on the step.
        steady = role == "constant" or (role == "buffer" and source == "memory")
        key = (b, offset)
        if steady and key in self._file_tiles:
            self.write(b, self._file_tiles[key])
            return
        shape = self.layout.global_input_shape(t)
        flat = T.flat_global(self.layout.tile(b, self.rank), shape, offset)
        name = self.tensors[t]["name"]
        if name in self.inputs and role == "input":
            vals = self.inputs[name].reshape(-1)[flat]
        else:
            vals = self.leaves.values(t, step, flat)
        v = torch.from_numpy(np.ascontiguousarray(vals, dtype=np.float64)).reshape(self.local_shape(b))
        v = v.to(device=self.device, dtype=self.dtype_of(b))
        if steady:
            self._file_tiles[key] = v
        self.write(b, v)

    def _source(self, t: int):
        """None / 'memory' / (file, key): where leaf t's value is (cached per tensor)."""
        if t not in self._sources:
            self._sources[t] = self.program.graph.value_source(t)
        return self._sources[t]

    # -- a step

    def run(self, steps: int) -> RankResult:
        res = RankResult(rank=self.rank)
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            self.step(step)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            res.step_seconds.append(time.perf_counter() - t0)
            res.losses.append(self.piece(self.program.loss_id))
        res.parameters = {n: self.piece(b) for n, b in self.program.parameter_ids.items()}
        res.gradients = {n: self.piece(b) for n, b in self.program.gradient_ids.items()}
        res.parameters = {k: v for k, v in res.parameters.items() if v is not None}
        res.gradients = {k: v for k, v in res.gradients.items() if v is not None}
        res.bytes_sent = dict(self.comm.bytes_sent)
        res.collective_calls = dict(self.comm.calls)
        res.peak_bytes = self.peak_bytes
        return res

    def piece(self, b: int):
        """(global flat indices, float64 values, partial index) of this rank's tile of b, if held."""
        if b is None or b < 0 or self.buffers[b]["stage"] != self.info["stage"]:
            return None
        if b not in self.values and b not in self.pending:
            return None
        tile = self.layout.tile(b, self.rank)
        v = self.read(b).detach().to("cpu", torch.float64).numpy().reshape(-1)
        return (T.flat_global(tile, self.buffers[b]["shape"]), v, tile["partial_index"])

    def ce_context(self, ins: dict) -> dict:
        """A cross entropy's kernel context with the step's valid fraction (set_ce_fractions)."""
        ctx = ins["context"]
        rho = self.ce_fraction.get(ins["op"])
        if rho is not None:
            ctx["ce_valid_fraction"] = rho
        return ctx

    def set_ce_fractions(self, step: int, inputs: Optional[Mapping[str, np.ndarray]] = None) -> None:
        """The step's weighted valid fraction of each cross entropy (exec::CeValidFractions): given
        (``ce_given``: the Trainer counts local batches across the ranks), else from the step's global
        inputs (``inputs``, else the run's), the graph's values or the seeded data — the same on every
        rank, so no communication."""
        if inputs is None and self.ce_given is not None:
            self.ce_fraction = dict(self.ce_given)
            return
        if inputs is None:
            inputs = self.inputs
        self.ce_fraction = self.layout.ce_valid_fractions(self.leaves.leaf_values, inputs, int(step))

    def step(self, step: int) -> None:
        self.begin_step(step)
        self.run_instructions(self.instrs, step)
        self.finish_step()

    def begin_step(self, step: int, fill_states: Optional[bool] = None) -> None:
        """Frees what the last step kept only as its results (gradients, the loss: gone when the
        next one starts, as a framework's gradients are; the CPU executor does the same) and fills
        the leaves: buffers and constants every step, parameters and optimizer states on the first
        (``fill_states``: whether to fill them; default: at step 1)."""
        leaves = set(self._leaf_ids)
        for b in [b for b in self.values if b not in leaves]:
            self.free(b)
        self.set_ce_fractions(step)
        fill_states = step == 1 if fill_states is None else fill_states
        for b in self._leaf_ids:
            role = self.tensors[self.buffers[b]["tensor_id"]]["role"]
            if role == "input" or (role in ("parameter", "optimizer_state") and not fill_states):
                continue
            self.fill(b, step)

    def run_instructions(self, instrs, step: int) -> None:
        k, n = 0, len(instrs)
        while k < n:
            ins = instrs[k]
            run = 1
            if ins.get("bucket", -1) >= 0:  # a gradient bucket: its adjacent all-reduces at once
                while k + run < n and instrs[k + run].get("bucket", -1) == ins["bucket"]:
                    run += 1
            try:
                if run > 1:
                    self.execute_bucket(instrs[k:k + run])
                else:
                    self.execute(ins, step)
            except RankError as e:
                raise RankError(f"{self.layout.describe(self.rank, ins['pc'])}: {e}") from e
            except Exception as e:  # torch / gloo errors: name where the rank stood
                raise RankError(f"{self.layout.describe(self.rank, ins['pc'])}: {type(e).__name__}: {e}") from e
            k += run

    def collective_input(self, ins: dict) -> torch.Tensor:
        """What this rank contributes to a collective (its input tile; a subclass may cast it)."""
        return self.read(ins["inputs"][0])

    def execute_bucket(self, instrs) -> None:
        xs = [self.collective_input(i) for i in instrs]
        shapes = [self.local_shape(i["outputs"][0]) for i in instrs]
        for i, fin in zip(instrs, self.comm.bucket(instrs, xs, shapes)):
            self.pending[i["outputs"][0]] = fin

    def finish_step(self) -> None:
        for b in list(self.pending):
            self.read(b)
        self.comm.wait_sends()
        check_deferred(self.deferred_checks)

    def execute(self, ins: dict, step: int) -> None:
        kind = ins["kind"]
        inp, out = ins["inputs"], ins["outputs"]
        if kind == "compute":
            ctx = ins["context"] if ins["op"] not in self.ce_fraction else self.ce_context(ins)
            ctx["step"] = step
            outs = run_kernel(self.ops[ins["op"]], [self.read(b) for b in inp], ctx)
            if len(outs) != len(out):
                raise RankError(f"the kernel returned {len(outs)} results, the op has {len(out)}")
            for b, v in zip(out, outs):
                self.write(b, v)
        elif kind == "ce-row-max":
            self.write(out[0], ce_row_max(self.read(inp[0])))
        elif kind == "ce-sum-target":  # (logits, labels, row max[, class weights])
            x = [self.read(b) for b in inp]
            self.write(out[0], ce_row_sum_target(self.ops[ins["op"]], x[0], x[1], x[2], ins["context"],
                                                 x[3] if len(x) > 3 else None))
        elif kind == "ce-loss":  # the op's operands, then the two statistics
            op = self.ops[ins["op"]]
            x = [self.read(b) for b in inp]
            n = len(op["inputs"])
            self.write(out[0], ce_loss(op, x[1], x[n], x[n + 1], self.ce_context(ins), ins["contribute"]))
        elif kind == "ce-grad":
            op = self.ops[ins["op"]]
            x = [self.read(b) for b in inp]
            n = len(op["inputs"])
            self.write(out[0], ce_grad(op, x[0], x[1], x[2], x[n], x[n + 1], self.ce_context(ins),
                                       x[3] if n == 4 else None))
        elif kind == "copy":
            self.write(out[0], self.read(inp[0]))
        elif kind == "load-input":
            self.fill(out[0], step, ins["offset"])
        elif kind == "accumulate":
            self.write(out[0], self.read(inp[0]) + self.read(inp[1]))
        elif kind == "scale":
            self.write(out[0], self.read(inp[0]) * ins["factor"])
        elif kind == "free":
            for b in inp:
                self.free(b)
        elif kind == "local-slice":
            self.write(out[0], self.comm.local_slice(ins, self.read(inp[0]), self.local_shape(out[0])))
        elif kind == "local-partial":
            x = self.read(inp[0])
            keep = ins["reduce"] == "max" or self.info["coord"][ins["axis"]] == 0
            self.write(out[0], x.clone() if keep else torch.zeros_like(x))
        elif kind == "send":
            self.comm.send(ins, self.read(inp[0]))
        elif kind == "recv":
            b = out[0]
            base = self.pending.pop(b, None)
            self.pending[b] = self.comm.recv(ins, base, self.values.get(b) if base is None else None,
                                             self.local_shape(b), self.dtype_of(b))
        elif kind in ("all-reduce", "all-gather", "reduce-scatter", "all-to-all"):
            b = out[0]
            self.pending[b] = self.comm.collective(ins, self.collective_input(ins), self.local_shape(b))
        else:
            raise RankError(f"unknown instruction kind {kind!r}")


class ValueFiles:
    """Tiles of tensors in safetensors value files, read through the file's slices: a rank reads the
    box its tile spans (its shard for block splits; at most the tensor for strided ones), in the
    file's dtype, never the whole file. The file is mapped for one tensor at a time, so the pages a
    column split touches are released before the next tensor (a rank peaks at its shard plus one
    tensor: benchmarks/frontend/bench_values.py)."""

    def tile(self, path: str, key: str, glob, offset: int = 0) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            if not glob:  # a scalar
                return f.get_tensor(key).reshape(1)
            sl = f.get_slice(key)
            if len(sl.get_shape()) != len(glob):
                raise RankError(f"the value of '{key}' in {path} has shape {sl.get_shape()}, of another rank than "
                                "the tile's tensor")
            idx = [np.asarray(g, dtype=np.int64) + (offset if d == 0 else 0) for d, g in enumerate(glob)]
            lo = [int(i.min()) for i in idx]
            box = sl[tuple(slice(a, int(i.max()) + 1) for i, a in zip(idx, lo))]
        for d, (i, a) in enumerate(zip(idx, lo)):
            if len(i) != box.shape[d] or np.any(i - a != np.arange(len(i))):  # strided: pick the rows
                box = box.index_select(d, torch.from_numpy(i - a))
        # a slice is a view of the whole tensor read from the file: keep the tile, let the rest go
        if box.untyped_storage().nbytes() > box.numel() * box.element_size():
            box = box.clone(memory_format=torch.contiguous_format)
        return box


class LeafInit:
    """The leaf values (exec::LeafValues: the graph's own values, in memory or read from their value
    file for the call — a rank holds its tile, not the tensor —, else seeded) at global element indices."""

    def __init__(self, graph, seed: int, seed_all_parameters: bool = False):
        self._values = _weft.LeafValues(graph, int(seed), bool(seed_all_parameters))  # keeps the graph alive

    @property
    def leaf_values(self):
        """The underlying _weft.LeafValues."""
        return self._values

    def values(self, tensor: int, step: int, flat: np.ndarray) -> np.ndarray:
        return self._values.values(int(tensor), int(step), np.ascontiguousarray(flat, dtype=np.int64))
