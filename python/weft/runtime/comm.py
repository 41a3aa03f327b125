"""Communication of the torch runtime: process groups per collective group (created once, in the
same order on every process), the collectives of a lowered program on torch.distributed, and the
cross-stage transfers.

Every collective is prepared once per instruction (the index maps from the tiles of its group's
members, tiles.py) and issued asynchronously; its result is finished when an instruction first
reads the output buffer (so compute between the two overlaps the communication). Kinds:

- all-reduce: ``all_reduce`` in place when every member holds the same elements in the same order
  (a partial value -> replicated), else the general reduce-exchange below;
- all-gather: ``all_gather_single`` (``all_gather_into_tensor``) of the padded flat tiles, then each
  element of the output tile picked from the member that holds it;
- reduce-scatter: ``reduce_scatter_single`` (``reduce_scatter_tensor``): member m's input chunk j is
  its terms of member j's output tile;
- all-to-all: ``all_to_all_single`` with split sizes: member m sends member j the elements of j's
  output tile that m is the first holder of;
- a gradient bucket (all-reduces of one ``bucket``, adjacent in the list): one ``all_reduce`` of
  their tiles laid end to end when each is the in-place case (DDP's flat bucket), each output a
  slice of it; else one by one;
- a ZeRO bucket of reduce-scatters (gradients) or all-gathers (parameters): one
  ``reduce_scatter_tensor`` / ``all_gather_into_tensor`` over FSDP's flat layout — chunk r of the
  flat buffer is the concatenation of every tensor's r-th shard (padded as the single collective
  pads it) —, each output a slice of (or picked from) the result; else one by one;
- reduce-exchange (the general fallback for a reducing collective whose tiles differ):
  ``all_to_all_single`` of every held term, summed (maxed) by the receiver;
- send / recv: ``batch_isend_irecv`` of the region's elements to each receiver (non-blocking) and
  ``irecv`` into the receiver's part of its buffer, matched by the program's message tag; a message
  to the rank itself (two stages of one device group: ZB-V) is handed over in memory.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.distributed as dist

from . import tiles as T

_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def reduce_op(name: str):
    return dist.ReduceOp.MAX if name == "max" else dist.ReduceOp.SUM


class ProcessGroups:
    """The process group of every collective group of a program, created once: ``new_group`` is
    collective over the world, so every process creates all of them in the same (sorted) order."""

    def __init__(self, groups: Sequence[Sequence[int]], timeout=None):
        self._pg: Dict[Tuple[int, ...], object] = {}
        for g in groups:
            key = tuple(int(r) for r in g)
            if len(key) > 1 and key not in self._pg:
                self._pg[key] = dist.new_group(list(key), timeout=timeout) if timeout else dist.new_group(list(key))

    def of(self, group: Sequence[int]):
        key = tuple(int(r) for r in group)
        if key not in self._pg:
            raise ValueError(f"no process group for ranks {list(key)} (not a collective group of the program)")
        return self._pg[key]

    def __len__(self) -> int:
        return len(self._pg)


Finish = Callable[[], torch.Tensor]


class Comm:
    """One rank's communication: prepares each collective / transfer once (cached by its position
    in the rank's list) and issues it; returns the finisher that yields the output tile."""

    def __init__(self, rank: int, layout, buffers: List[dict], groups: ProcessGroups, device):
        self.rank = rank
        self.layout = layout
        self.buffers = buffers
        self.groups = groups
        self.device = device
        self._prep: Dict[int, tuple] = {}
        self._flat_cache: Dict[Tuple[int, int], np.ndarray] = {}
        self.bytes_sent: Dict[str, int] = {}
        self.calls: Dict[str, int] = {}  # collective kind -> launches (a bucket is one)
        self.sends: List[object] = []  # in-flight send works (waited at the end of a step)
        # Messages a rank sends to itself (two stages of one device group, ZB-V): no process group
        # sends to its own rank, so they are handed over here, by tag.
        self._to_self: Dict[int, torch.Tensor] = {}

    # -- tile index maps

    def _numel(self, b: int) -> int:
        return int(np.prod(self.buffers[b]["shape"])) if self.buffers[b]["shape"] else 1

    def flat(self, b: int, r: int) -> np.ndarray:
        key = (b, r)
        if key not in self._flat_cache:
            self._flat_cache[key] = T.flat_global(self.layout.tile(b, r), self.buffers[b]["shape"])
        return self._flat_cache[key]

    def _count(self, kind: str, n_elements: int, t: torch.Tensor) -> None:
        self.bytes_sent[kind] = self.bytes_sent.get(kind, 0) + int(n_elements) * t.element_size()

    def _idx(self, a: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(a, dtype=torch.int64, device=self.device)

    # -- collectives

    def collective(self, ins: dict, x: torch.Tensor, local_shape: Sequence[int]) -> Finish:
        group = ins["group"]
        if len(group) == 1:  # a group of one: the tiles are the same
            out = x.clone()
            return lambda: out
        prep = self._prepared(ins)
        pg = self.groups.of(group)
        self.calls[ins["kind"]] = self.calls.get(ins["kind"], 0) + 1
        return prep[0](ins, x, local_shape, pg, *prep[1:])

    def _prepared(self, ins: dict) -> tuple:
        prep = self._prep.get(ins["pc"])
        if prep is None:
            prep = self._prep[ins["pc"]] = self._prepare(ins)
        return prep

    def bucket(self, instrs: Sequence[dict], xs: Sequence[torch.Tensor],
               local_shapes: Sequence[Sequence[int]]) -> List[Finish]:
        """The collectives of one bucket (one kind, group and reduce op) as one collective: all-reduces
        over their tiles laid end to end (each the in-place case), reduce-scatters and all-gathers
        over FSDP's flat layout (``_bucket_reduce_scatter`` / ``_bucket_all_gather``); one dtype; the
        outputs slices of the result. Otherwise one by one."""
        group = instrs[0]["group"]
        kind = instrs[0]["kind"]
        simple = {"all-reduce": self._all_reduce, "reduce-scatter": self._reduce_scatter,
                  "all-gather": self._all_gather}.get(kind)
        flat_ok = (simple is not None and len(group) > 1 and len({x.dtype for x in xs}) == 1 and
                   all(i["kind"] == kind and i["group"] == group for i in instrs) and
                   all(self._prepared(i)[0] == simple for i in instrs))
        if not flat_ok:
            return [self.collective(i, x, s) for i, x, s in zip(instrs, xs, local_shapes)]
        if kind == "reduce-scatter":
            return self._bucket_reduce_scatter(instrs, xs, local_shapes)
        if kind == "all-gather":
            return self._bucket_all_gather(instrs, xs, local_shapes)
        flat = torch.cat([x.reshape(-1) for x in xs])
        work = dist.all_reduce(flat, op=reduce_op(instrs[0]["reduce"]), group=self.groups.of(group), async_op=True)
        self.calls["all-reduce"] = self.calls.get("all-reduce", 0) + 1
        k = len(group)
        self._count("all-reduce", 2 * (k - 1) * flat.numel() // k, flat)
        fins, at = [], 0
        for x, shape in zip(xs, local_shapes):
            n = x.numel()
            fins.append(_finisher(work, lambda a=at, n=n, shape=shape: flat[a:a + n].reshape(shape)))
            at += n
        return fins

    def _bucket_reduce_scatter(self, instrs, xs, local_shapes) -> List[Finish]:
        """One ``reduce_scatter_tensor`` for the bucket: each tensor's input laid out as its single
        reduce-scatter does ([members, chunk]: row j = its terms of member j's output tile), the
        rows concatenated across the tensors, so the flat input is rank-major — chunk r = every
        tensor's r-th shard, as FSDP's flat parameter — and member r receives the concatenation of
        its output tiles."""
        group = instrs[0]["group"]
        k = len(group)
        rows, sizes = [], []
        for i, x in zip(instrs, xs):
            _, maxn, chunks, pad, n_out = self._prepared(i)
            inp = x.reshape(-1)[chunks]
            if pad.numel():
                inp[pad] = -torch.inf if i["reduce"] == "max" else 0
            rows.append(inp.reshape(k, maxn))
            sizes.append((maxn, n_out))
        flat = torch.cat(rows, dim=1).reshape(-1).contiguous()
        total = sum(m for m, _ in sizes)
        out = flat.new_empty(total)
        work = _reduce_scatter_flat(out, flat, op=reduce_op(instrs[0]["reduce"]), group=self.groups.of(group),
                                    async_op=True)
        self.calls["reduce-scatter"] = self.calls.get("reduce-scatter", 0) + 1
        self._count("reduce-scatter", (k - 1) * sum(n for _, n in sizes), flat)
        fins, at = [], 0
        for (maxn, n_out), shape in zip(sizes, local_shapes):
            fins.append(_finisher(work, lambda a=at, n=n_out, shape=shape: out[a:a + n].reshape(shape)))
            at += maxn
        return fins

    def _bucket_all_gather(self, instrs, xs, local_shapes) -> List[Finish]:
        """One ``all_gather_into_tensor`` for the bucket: this rank's padded tiles laid end to end
        (its shard of the flat parameter); member r's block of the result holds member r's tiles at
        the same offsets, from which each output tile picks its elements."""
        group = instrs[0]["group"]
        pcs = tuple(i["pc"] for i in instrs)
        prep = self._prep.get(("bucket",) + pcs)
        if prep is None:
            offs, at = [], 0
            for i in instrs:
                maxn = self._prepared(i)[1]
                offs.append(at)
                at += maxn
            sels = []
            for i, off in zip(instrs, offs):
                _, maxn, sel = self._prepared(i)
                sels.append(torch.div(sel, maxn, rounding_mode="floor") * at + off + sel % maxn)
            prep = self._prep[("bucket",) + pcs] = (at, offs, sels)
        total, offs, sels = prep
        flat = xs[0].new_zeros(total)
        for x, off in zip(xs, offs):
            flat[off:off + x.numel()] = x.reshape(-1)
        gathered = flat.new_empty(total * len(group))
        work = _all_gather_flat(gathered, flat, group=self.groups.of(group), async_op=True)
        self.calls["all-gather"] = self.calls.get("all-gather", 0) + 1
        self._count("all-gather", (len(group) - 1) * sum(x.numel() for x in xs), flat)
        return [_finisher(work, lambda sel=sel, shape=shape: gathered[sel].reshape(shape))
                for sel, shape in zip(sels, local_shapes)]

    def _prepare(self, ins: dict) -> tuple:
        kind, group, me = ins["kind"], ins["group"], self.rank
        src, dst = ins["inputs"][0], ins["outputs"][0]
        flats = [self.flat(src, m) for m in group]
        mine = group.index(me)
        numel = self._numel(src)
        if kind == "all-reduce":
            same = all(len(f) == len(flats[mine]) and np.array_equal(f, flats[mine]) for f in flats) and \
                np.array_equal(self.flat(dst, me), flats[mine])
            if same:
                return (self._all_reduce,)
            return self._prepare_reduce_exchange(ins, flats, numel)
        if kind == "all-gather":
            maxn = max(len(f) for f in flats)
            who, where = T.holder_map(flats, numel)
            out_flat = self.flat(dst, me)
            if np.any(who[out_flat] < 0):
                raise ValueError(f"no rank of group {group} holds element {int(out_flat[who[out_flat] < 0][0])}")
            sel = who[out_flat] * maxn + where[out_flat]
            return (self._all_gather, maxn, self._idx(sel))
        if kind == "reduce-scatter":
            dsts = [self.flat(dst, m) for m in group]
            maxn = max(len(f) for f in dsts)
            pos = T.positions_in(flats[mine], numel)
            chunks = np.full((len(group), maxn), -1, dtype=np.int64)
            for j, f in enumerate(dsts):
                chunks[j, :len(f)] = pos[f]
            if all(np.all(pos[f] >= 0) for f in dsts):
                return (self._reduce_scatter, maxn, self._idx(chunks.reshape(-1).clip(min=0)),
                        self._idx(np.nonzero(chunks.reshape(-1) < 0)[0]), len(dsts[mine]))
            return self._prepare_reduce_exchange(ins, flats, numel)
        if kind == "all-to-all":
            return self._prepare_exchange(ins, flats, numel)
        raise ValueError(f"not a collective: {kind}")

    def _all_reduce(self, ins, x, local_shape, pg):
        out = x.clone(memory_format=torch.contiguous_format)
        work = dist.all_reduce(out, op=reduce_op(ins["reduce"]), group=pg, async_op=True)
        k = len(ins["group"])
        self._count(ins["kind"], 2 * (k - 1) * out.numel() // k, out)
        return _finisher(work, lambda: out)

    def _all_gather(self, ins, x, local_shape, pg, maxn, sel):
        flat = x.reshape(-1)
        if flat.numel() < maxn:
            flat = torch.cat([flat, flat.new_zeros(maxn - flat.numel())])
        gathered = flat.new_empty(maxn * len(ins["group"]))
        work = _all_gather_flat(gathered, flat.contiguous(), group=pg, async_op=True)
        self._count(ins["kind"], (len(ins["group"]) - 1) * x.numel(), x)
        return _finisher(work, lambda: gathered[sel].reshape(local_shape))

    def _reduce_scatter(self, ins, x, local_shape, pg, maxn, chunks, pad, n_out):
        inp = x.reshape(-1)[chunks]
        if pad.numel():
            inp[pad] = -torch.inf if ins["reduce"] == "max" else 0
        out = x.new_empty(maxn)
        work = _reduce_scatter_flat(out, inp.contiguous(), op=reduce_op(ins["reduce"]), group=pg, async_op=True)
        self._count(ins["kind"], (len(ins["group"]) - 1) * n_out, x)
        return _finisher(work, lambda: out[:n_out].reshape(local_shape))

    def _prepare_exchange(self, ins, flats, numel):
        """all-to-all: each element of a member's output tile from its first holder."""
        group, me = ins["group"], self.rank
        mine = group.index(me)
        who, where = T.holder_map(flats, numel)
        send_idx, send_n = [], []
        for m in group:
            f = self.flat(ins["outputs"][0], m)
            if np.any(who[f] < 0):
                raise ValueError(f"no rank of group {group} holds element {int(f[who[f] < 0][0])}")
            take = who[f] == mine
            send_idx.append(where[f][take])
            send_n.append(int(take.sum()))
        out_flat = self.flat(ins["outputs"][0], me)
        recv_pos, recv_n = [], []
        for j in range(len(group)):
            at = np.nonzero(who[out_flat] == j)[0]
            recv_pos.append(at)
            recv_n.append(len(at))
        return (self._all_to_all, self._idx(np.concatenate(send_idx)), send_n,
                self._idx(np.concatenate(recv_pos)), recv_n, len(out_flat), None)

    def _prepare_reduce_exchange(self, ins, flats, numel):
        """A reducing collective in general: every member sends each member all of its terms of that
        member's output tile; the receiver sums (maxes) them."""
        group, me = ins["group"], self.rank
        mine = group.index(me)
        pos_me = T.positions_in(flats[mine], numel)
        send_idx, send_n = [], []
        for m in group:
            f = self.flat(ins["outputs"][0], m)
            held = pos_me[f]
            send_idx.append(held[held >= 0])
            send_n.append(int((held >= 0).sum()))
        out_flat = self.flat(ins["outputs"][0], me)
        recv_pos, recv_n = [], []
        covered = np.zeros(len(out_flat), dtype=bool)
        for j in range(len(group)):
            at = np.nonzero(T.positions_in(flats[j], numel)[out_flat] >= 0)[0]
            covered[at] = True
            recv_pos.append(at)
            recv_n.append(len(at))
        if not np.all(covered):
            raise ValueError(f"no rank of group {group} holds element {int(out_flat[~covered][0])}")
        return (self._all_to_all, self._idx(np.concatenate(send_idx)), send_n,
                self._idx(np.concatenate(recv_pos)), recv_n, len(out_flat), ins["reduce"])

    def _all_to_all(self, ins, x, local_shape, pg, send_idx, send_n, recv_pos, recv_n, n_out, reduce):
        """all_to_all_single of prepared elements; the receiver places them (reduce None) or sums /
        maxes the terms it got (the reduce-exchange)."""
        inp = x.reshape(-1)[send_idx].contiguous()
        got = x.new_empty(sum(recv_n))
        work = dist.all_to_all_single(got, inp, recv_n, send_n, group=pg, async_op=True)
        self._count(ins["kind"], sum(send_n) - send_n[ins["group"].index(self.rank)], x)

        def finish():
            if reduce is None:
                out = x.new_empty(n_out)
                out[recv_pos] = got
            elif reduce == "max":
                out = x.new_full((n_out,), -torch.inf)
                out.scatter_reduce_(0, recv_pos, got, reduce="amax", include_self=False)
            else:
                out = x.new_zeros(n_out).index_add_(0, recv_pos, got)
            return out.reshape(local_shape)

        return _finisher(work, finish)

    # -- a local reshard step (R -> S along one axis: this rank's part of its own tile)

    def local_slice(self, ins: dict, x: torch.Tensor, local_shape) -> torch.Tensor:
        key = ins["pc"]
        if key not in self._prep:
            src, dst = ins["inputs"][0], ins["outputs"][0]
            pos = T.positions_in(self.flat(src, self.rank), self._numel(src))[self.flat(dst, self.rank)]
            if np.any(pos < 0):
                raise ValueError("the sliced tile is not inside the input tile")
            self._prep[key] = (self._idx(pos),)
        return x.reshape(-1)[self._prep[key][0]].reshape(local_shape)

    # -- cross-stage transfers

    def send(self, ins: dict, x: torch.Tensor) -> None:
        key = ins["pc"]
        if key not in self._prep:
            self._prep[key] = (self._idx(T.local_offsets(self.layout.tile(ins["inputs"][0], self.rank),
                                                         ins["region"])),)
        msg = x.reshape(-1)[self._prep[key][0]].contiguous()
        if self.rank in ins["group"]:
            self._to_self[int(ins["tag"])] = msg
        ops = [dist.P2POp(dist.isend, msg, int(q), tag=int(ins["tag"])) for q in ins["group"] if q != self.rank]
        if ops:
            self.sends.extend(dist.batch_isend_irecv(ops))
        self.sends.append(msg)  # alive until the step's end
        self._count("send", msg.numel() * len(ins["group"]), msg)

    def recv(self, ins: dict, base: Optional[Finish], held: Optional[torch.Tensor], local_shape, dtype) -> Finish:
        key = ins["pc"]
        if key not in self._prep:
            self._prep[key] = (self._idx(T.local_offsets(self.layout.tile(ins["outputs"][0], self.rank),
                                                         ins["region"])),)
        at = self._prep[key][0]
        if int(ins["group"][0]) == self.rank:  # its own message: the send came first (program order)
            buf, work = self._to_self.pop(int(ins["tag"])), None
        else:
            buf = torch.empty(at.numel(), dtype=dtype, device=self.device)
            work = dist.irecv(buf, src=int(ins["group"][0]), tag=int(ins["tag"]))

        def finish():
            prev = base() if base is not None else held
            out = torch.zeros(local_shape, dtype=dtype, device=self.device) if prev is None else prev.clone()
            if work is not None:
                work.wait()
            out.view(-1)[at] = buf
            return out

        return finish

    def wait_sends(self) -> None:
        for w in self.sends:
            if hasattr(w, "wait"):
                w.wait()
        self.sends.clear()


def _finisher(work, result: Callable[[], torch.Tensor]) -> Finish:
    done: List[torch.Tensor] = []

    def finish():
        if not done:
            work.wait()
            done.append(result())
        return done[0]

    return finish
