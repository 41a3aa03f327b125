"""Optimizers and learning-rate schedules of weft.Trainer, with torch's semantics.

The update rules are torch.optim's single-tensor code, step for step (``torch.optim.SGD``, ``Adam``,
``AdamW``), applied by every rank to its own tiles of a parameter, its gradient and its states: the
rules are elementwise, so updating the shards equals updating the whole tensor. Clipping by the
global norm is the Trainer's (one all-reduce over every shard, replicas counted once), with
``torch.nn.utils.clip_grad_norm_``'s arithmetic (``max_norm / (norm + 1e-6)``, clamped at 1).

The program a plan lowers to carries the optimizer's states (Adam's two moments, SGD's momentum
buffer, the f32 master copy under mixed precision) as tensors placed like their parameter (ZeRO
shards them); the hyper-parameters here (learning rate, weight decay, the clip coefficient) are
runtime values read at every step, never baked into the program.

Schedules are LambdaLR factors: step ``i`` (from 0) trains with ``lr * schedule(i)``, as
``torch.optim.lr_scheduler.LambdaLR(opt, schedule)`` stepped after every ``opt.step()`` does.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "LossScaler", "constant", "linear_warmup", "warmup_cosine",
           "warmup_linear", "as_schedule"]

# What a parameter group selects: a predicate on (name, shape), or name substrings / regular expressions.
Selector = Union[Callable[[str, Tuple[int, ...]], bool], str, Sequence[str]]


def _selects(sel: Selector, name: str, shape: Tuple[int, ...]) -> bool:
    if callable(sel):
        return bool(sel(name, shape))
    pats = [sel] if isinstance(sel, str) else list(sel)
    low = name.lower()
    return any(p.lower() in low or re.fullmatch(p, name) is not None for p in pats)


@dataclass
class Optimizer:
    """The base of weft's optimizers: a learning rate, a weight decay, and parameter groups.

    ``groups``: a list of dicts ``{"params": selector, "lr": ..., "weight_decay": ...}`` (selector: a
    callable ``(name, shape) -> bool``, or name substrings / regular expressions); a parameter takes
    the first group that selects it, else the defaults. ``no_decay``: a shorthand group with weight
    decay 0 (e.g. ``("bias", "norm")``: every name containing "bias" or "norm", case-insensitive)."""

    lr: float = 1e-3
    weight_decay: float = 0.0
    no_decay: Optional[Selector] = None
    groups: List[dict] = field(default_factory=list)

    kind = "base"  # the IR's update op: "adam" or "sgd"

    def __post_init__(self):
        if not (isinstance(self.lr, (int, float)) and self.lr >= 0 and math.isfinite(self.lr)):
            raise ValueError(f"{type(self).__name__}: lr must be a finite number >= 0, got {self.lr!r}")
        if not (isinstance(self.weight_decay, (int, float)) and self.weight_decay >= 0):
            raise ValueError(f"{type(self).__name__}: weight_decay must be >= 0, got {self.weight_decay!r}")
        for g in self.groups:
            if not isinstance(g, dict) or "params" not in g:
                raise ValueError(f"{type(self).__name__}: a group is a dict with 'params' (a selector), got {g!r}")
            unknown = set(g) - {"params", "lr", "weight_decay"}
            if unknown:
                raise ValueError(f"{type(self).__name__}: unknown group keys {sorted(unknown)} (lr, weight_decay)")

    def group_of(self, name: str, shape: Tuple[int, ...]) -> Dict[str, float]:
        """The hyper-parameters of parameter ``name``: {"lr": base lr, "weight_decay": ...}."""
        for g in self.groups:
            if _selects(g["params"], name, shape):
                return {"lr": float(g.get("lr", self.lr)), "weight_decay": float(g.get("weight_decay", self.weight_decay))}
        if self.no_decay is not None and _selects(self.no_decay, name, shape):
            return {"lr": float(self.lr), "weight_decay": 0.0}
        return {"lr": float(self.lr), "weight_decay": float(self.weight_decay)}

    def torch_param_groups(self, named_parameters) -> List[dict]:
        """torch.optim parameter groups with the same assignment (for references and tests)."""
        out: Dict[tuple, dict] = {}
        for n, p in named_parameters:
            h = self.group_of(n, tuple(p.shape))
            key = (h["lr"], h["weight_decay"])
            out.setdefault(key, {"params": [], **h})["params"].append(p)
        return list(out.values())

    def train_step_options(self) -> dict:
        """The keyword arguments of Graph.train_step that give the program this optimizer's states
        (Adam's two moments, SGD's momentum buffer) for the planner to place."""
        raise NotImplementedError

    def update(self, w, g, states: list, hp: Dict[str, float], lr: float, step: int) -> list:
        """Update number ``step`` (from 1) of ``w`` (the weights: the master copy under mixed
        precision), in place, with gradient ``g`` and the states (in place, in the program's order)."""
        raise NotImplementedError

    def update_many(self, ws: list, gs: list, states: list, hps: list, lrs: list, step: int) -> list:
        """:meth:`update` of every tile of a step at once (``states[i]``, ``hps[i]``, ``lrs[i]`` those
        of ``ws[i]``): the same arithmetic, element by element, as one update per tile; an optimizer
        may do it with torch's multi-tensor (``_foreach``) ops, as torch.optim's ``foreach=True``."""
        return [self.update(w, g, st, hp, lr, step) for w, g, st, hp, lr in zip(ws, gs, states, hps, lrs)]


@dataclass
class SGD(Optimizer):
    """torch.optim.SGD: momentum, dampening, nesterov, weight decay added to the gradient."""

    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False

    kind = "sgd"

    def __post_init__(self):
        super().__post_init__()
        if self.momentum < 0 or self.dampening < 0:
            raise ValueError("SGD: momentum and dampening must be >= 0")
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("SGD: nesterov needs momentum > 0 and zero dampening (as torch.optim.SGD)")

    def train_step_options(self) -> dict:
        """Graph.train_step's arguments: SGD, with a momentum buffer when momentum > 0."""
        return dict(optimizer="sgd", lr=float(self.lr), momentum=float(self.momentum))

    def update(self, w, g, states, hp, lr, step):
        """torch.optim.SGD's step on a tile (see Optimizer.update)."""
        wd = hp["weight_decay"]
        if wd != 0:
            g = g.add(w, alpha=wd)
        if self.momentum != 0:
            buf = states[0]
            if step == 1:  # torch: the buffer starts as a copy of the first gradient
                buf.copy_(g)
            else:
                buf.mul_(self.momentum).add_(g, alpha=1 - self.dampening)
            g = g.add(buf, alpha=self.momentum) if self.nesterov else buf
        w.add_(g, alpha=-lr)
        return states


@dataclass
class Adam(Optimizer):
    """torch.optim.Adam (weight decay added to the gradient, L2)."""

    betas: Tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8

    kind = "adam"
    decoupled = False

    def __post_init__(self):
        super().__post_init__()
        b1, b2 = self.betas
        if not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"{type(self).__name__}: betas must be in [0, 1), got {self.betas}")
        if not self.eps >= 0:
            raise ValueError(f"{type(self).__name__}: eps must be >= 0, got {self.eps}")

    def train_step_options(self) -> dict:
        """Graph.train_step's arguments: Adam's update (two moments per parameter)."""
        return dict(optimizer="adam", lr=float(self.lr), beta1=float(self.betas[0]), beta2=float(self.betas[1]),
                    eps=float(self.eps))

    def update(self, w, g, states, hp, lr, step):
        """torch.optim.Adam's (AdamW's: decoupled decay) step on a tile (see Optimizer.update)."""
        m, v = states
        b1, b2 = self.betas
        wd = hp["weight_decay"]
        if wd != 0:
            if self.decoupled:
                w.mul_(1 - lr * wd)
            else:
                g = g.add(w, alpha=wd)
        m.lerp_(g, 1 - b1)
        v.mul_(b2).addcmul_(g, g, value=1 - b2)
        c1 = 1 - b1 ** step
        c2 = 1 - b2 ** step
        denom = (v.sqrt() / math.sqrt(c2)).add_(self.eps)
        w.addcdiv_(m, denom, value=-(lr / c1))
        return [m, v]

    def update_many(self, ws, gs, states, hps, lrs, step):
        """Every tile's :meth:`update` in torch's multi-tensor ops (torch.optim.Adam's ``foreach``
        path): the same operations in the same order per element, a handful of calls per step
        instead of seven per tile."""
        import torch

        b1, b2 = self.betas
        gs = list(gs)
        if self.decoupled:
            decayed = [(w, 1 - lr * hp["weight_decay"]) for w, hp, lr in zip(ws, hps, lrs) if hp["weight_decay"] != 0]
            if decayed:
                torch._foreach_mul_([w for w, _ in decayed], [f for _, f in decayed])
        else:
            for i, (w, hp) in enumerate(zip(ws, hps)):
                if hp["weight_decay"] != 0:
                    gs[i] = gs[i].add(w, alpha=hp["weight_decay"])
        ms, vs = [st[0] for st in states], [st[1] for st in states]
        torch._foreach_lerp_(ms, gs, 1 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, gs, gs, value=1 - b2)
        c1 = 1 - b1 ** step
        c2 = 1 - b2 ** step
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, math.sqrt(c2))
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(ws, ms, denom, [-(lr / c1) for lr in lrs])
        return [[m, v] for m, v in zip(ms, vs)]


@dataclass
class AdamW(Adam):
    """torch.optim.AdamW: decoupled weight decay (the parameter shrinks by lr·wd before the Adam step)."""

    weight_decay: float = 1e-2
    decoupled = True


@dataclass
class LossScaler:
    """Dynamic loss scaling with torch.amp.GradScaler's semantics (the f16-mixed default): the
    backward starts from ``scale`` instead of 1, so every gradient is multiplied by it; a step whose
    gradients hold an inf or nan anywhere is skipped on every rank (no update, no optimizer step
    counted) and the scale is multiplied by ``backoff_factor``; after ``growth_interval``
    consecutive finite steps it is multiplied by ``growth_factor``. ``dynamic=False``: a constant
    scale (never changed; a non-finite step is still skipped)."""

    init_scale: float = 2.0 ** 16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    dynamic: bool = True

    def __post_init__(self):
        if not (math.isfinite(self.init_scale) and self.init_scale > 0):
            raise ValueError(f"LossScaler: init_scale must be a finite number > 0, got {self.init_scale!r}")
        if not self.growth_factor > 1.0:
            raise ValueError(f"LossScaler: growth_factor must be > 1, got {self.growth_factor!r}")
        if not 0.0 < self.backoff_factor < 1.0:
            raise ValueError(f"LossScaler: backoff_factor must be in (0, 1), got {self.backoff_factor!r}")
        if not (isinstance(self.growth_interval, int) and self.growth_interval >= 1):
            raise ValueError(f"LossScaler: growth_interval must be an integer >= 1, got {self.growth_interval!r}")
        self.scale = float(self.init_scale)
        self.growth_tracker = 0  # consecutive finite steps since the last change

    def update(self, found_inf: bool) -> None:
        """After a step: back off on a non-finite gradient, grow after growth_interval finite steps."""
        if not self.dynamic:
            return
        if found_inf:
            self.scale *= self.backoff_factor
            self.growth_tracker = 0
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            self.scale *= self.growth_factor
            self.growth_tracker = 0

    def state_dict(self) -> dict:
        """The scaler's running state: {"scale", "growth_tracker"} (to checkpoint with the model)."""
        return {"scale": self.scale, "growth_tracker": self.growth_tracker}

    def load_state_dict(self, state: dict) -> None:
        """Restores a state_dict() (a resumed run continues with the same scale)."""
        self.scale, self.growth_tracker = float(state["scale"]), int(state["growth_tracker"])


# ---- schedules: step (from 0) -> factor of the base learning rate (LambdaLR's lr_lambda)

def constant() -> Callable[[int], float]:
    """The base learning rate at every step."""
    return lambda step: 1.0


def linear_warmup(warmup: int) -> Callable[[int], float]:
    """Rises linearly over ``warmup`` steps ((i + 1) / warmup), then constant."""
    _check_steps(warmup=warmup)
    return lambda step: min(1.0, (step + 1) / warmup) if warmup > 0 else 1.0


def warmup_cosine(warmup: int, total: int, min_factor: float = 0.0) -> Callable[[int], float]:
    """Linear warmup over ``warmup`` steps, then a cosine decay to ``min_factor`` at step ``total``
    (constant after), the schedule of GPT-style training (torchtitan's "cosine" with warmup)."""
    _check_steps(warmup=warmup, total=total)
    if total <= warmup:
        raise ValueError(f"warmup_cosine: total ({total}) must exceed warmup ({warmup})")

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = min(1.0, (step - warmup) / (total - warmup))
        return min_factor + (1 - min_factor) * 0.5 * (1 + math.cos(math.pi * t))

    return f


def warmup_linear(warmup: int, total: int, min_factor: float = 0.0) -> Callable[[int], float]:
    """Linear warmup, then a linear decay to ``min_factor`` at step ``total``."""
    _check_steps(warmup=warmup, total=total)
    if total <= warmup:
        raise ValueError(f"warmup_linear: total ({total}) must exceed warmup ({warmup})")

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        t = min(1.0, (step - warmup) / (total - warmup))
        return 1.0 - (1.0 - min_factor) * t

    return f


def _check_steps(**kw):
    for k, v in kw.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 0:
            raise ValueError(f"{k} must be an integer >= 0, got {v!r}")


class _TorchScheduler:
    """A torch LRScheduler (bound to any optimizer) read as a schedule: the factor of step i is its
    optimizer's first learning rate after i scheduler steps, over the initial one. Steps are taken
    in order only (a resumed run replays them)."""

    def __init__(self, sched):
        self.sched = sched
        self.base = float(sched.base_lrs[0]) if getattr(sched, "base_lrs", None) else 1.0
        self.at = 0
        self.factors = [float(sched.optimizer.param_groups[0]["lr"]) / self.base]

    def __call__(self, step: int) -> float:
        import warnings

        while len(self.factors) <= step:
            with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": none here
                warnings.simplefilter("ignore")
                self.sched.step()
            self.factors.append(float(self.sched.optimizer.param_groups[0]["lr"]) / self.base)
        return self.factors[step]


def as_schedule(schedule) -> Callable[[int], float]:
    """None (constant), a callable step -> factor (LambdaLR's lr_lambda), or a torch LRScheduler."""
    if schedule is None:
        return constant()
    try:
        from torch.optim.lr_scheduler import LRScheduler
    except ImportError:  # pragma: no cover
        LRScheduler = ()
    if LRScheduler and isinstance(schedule, LRScheduler):
        return _TorchScheduler(schedule)
    if callable(schedule):
        return schedule
    raise TypeError(f"lr_schedule: expected a callable step -> factor or a torch LRScheduler, got "
                    f"{type(schedule).__name__}")
