"""Calibration: measure this machine and write the constants of weft's cost model.

``weft.calibrate()`` (and ``weft calibrate``) times, on the device it runs on (CPU, or one GPU):

- matmuls of several shapes (square, transformer-like, few rows, short contractions) in each dtype
  -> achieved FLOP/s -> the matmul efficiency curve per dtype (``matmul_efficiency``: ceiling,
  fill_elements, half_k, fitted by :func:`fit_matmul_efficiency`), or where the shapes do not pin
  a curve, ``compute_efficiency`` (the median fraction of the device's peak);
- memory-bound ops (add, gelu, layer_norm, softmax) on large tensors -> achieved bytes/s
  -> ``memory_efficiency``; the same ops on tiny tensors -> the fixed cost per op,
  ``kernel_overhead_s``;
- collectives between ``nproc`` local processes (all-reduce, all-gather, reduce-scatter where the
  backend has it, send/recv) over message sizes from small to large -> a least-squares α (s) and
  β (s/byte) of the link -> ``alpha_scale`` / ``beta_scale`` against a cluster model's link.

The result is a :class:`CalibrationReport`: the raw tables, the fits, and ``.calibration``, a
``weft.Calibration`` built through ``Calibration.from_json`` (so it is valid by construction).
See docs/modules/calibrate.md for the definitions, and the CPU caveat (a CPU has no datasheet
peak: its efficiencies are relative to the best measured matmul / memory op).

torch is imported inside the functions: ``import weft`` works without it.
"""
from __future__ import annotations

import json
import math
import os
import platform
import statistics
import tempfile
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterable, Optional, Sequence, Tuple

from .runtime.launch import free_port

__all__ = ["calibrate", "CalibrationReport", "MatmulTiming", "MemoryOpTiming", "OverheadTiming",
           "CollectiveTiming", "AlphaBetaFit", "fit_alpha_beta", "collective_coefficients", "match_device_kind",
           "MatmulCurveFit", "fit_matmul_efficiency"]

# weft dtype name -> torch dtype attribute name.
_TORCH_DTYPES = {"f32": "float32", "bf16": "bfloat16", "f16": "float16", "f64": "float64"}
_DEVICES = ("auto", "cpu", "cuda")
_BACKENDS = ("gloo", "nccl", "mpi")
_MEMORY_OPS = ("add", "gelu", "layer_norm", "softmax")
_COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")
# Memory-bound ops run in f32: memory_efficiency is per device kind, not per dtype.
_MEMORY_DTYPE = "f32"
_ROW = 1024  # last dimension of the layer_norm / softmax inputs (a hidden size)
_WARMUP_CALLS = 3  # per collective and size: the first calls of a new size set up buffers / channels


# ---------------------------------------------------------------------------------------------
# Measurement tables
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MatmulTiming:
    """One matmul (M×K) @ (K×N): median seconds per call and the achieved FLOP/s (2·M·K·N / s)."""
    m: int
    k: int
    n: int
    dtype: str
    seconds: float
    flops: float
    flops_per_s: float
    spread: float = 0.0  # interquartile range of the repeated timings over their median

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.m, self.k, self.n)


@dataclass(frozen=True)
class MemoryOpTiming:
    """One memory-bound op on a large tensor. ``bytes`` is the minimal traffic (each input read
    once, each output written once) — the same count the cost model uses for an op's bytes."""
    op: str
    dtype: str
    numel: int
    bytes: float
    seconds: float
    bytes_per_s: float
    spread: float = 0.0  # interquartile range of the repeated timings over their median


@dataclass(frozen=True)
class OverheadTiming:
    """One op on a tiny tensor: its time is the fixed cost per op (dispatch / kernel launch)."""
    op: str
    numel: int
    seconds: float


@dataclass(frozen=True)
class CollectiveTiming:
    """One collective between ``nproc`` processes: the slowest rank's median seconds per call.
    ``bytes`` follows the cost model: all_reduce the buffer, all_gather the bytes after (all
    ranks' parts), reduce_scatter the bytes before, send_recv the message."""
    collective: str
    impl: str  # the torch.distributed call that ran (e.g. all_gather_into_tensor)
    bytes: int
    seconds: float
    nproc: int


# Collective timings at least this large set collective_factors (their bandwidth term dominates).
FACTOR_MIN_BYTES = 256 * 1024


def collective_coefficients(collective: str, nproc: int) -> tuple[float, float]:
    """(c_α, c_β) with time = c_α·α + c_β·bytes·β on a flat ring of ``nproc`` (the cost model's forms,
    weft/cluster/alpha_beta.hpp); send_recv is one hop between two processes."""
    n = nproc
    if collective == "all_reduce":
        return 2.0 * (n - 1), 2.0 * (n - 1) / n
    if collective in ("all_gather", "reduce_scatter"):
        return float(n - 1), (n - 1) / n
    if collective == "send_recv":
        return 1.0, 1.0
    raise ValueError(f"unknown collective {collective!r} (known: {', '.join(_COLLECTIVES)})")


@dataclass(frozen=True)
class AlphaBetaFit:
    """α (s, per hop) and β (s/byte, per hop) of a link, fitted to collective timings.
    ``max_rel_error``: the worst |predicted − measured| / measured over the fitted points."""
    alpha: float
    beta: float
    points: int
    max_rel_error: float

    def predict(self, collective: str, nbytes: float, nproc: int) -> float:
        ca, cb = collective_coefficients(collective, nproc)
        return ca * self.alpha + cb * nbytes * self.beta

    @property
    def bandwidth(self) -> float:
        """1/β in bytes/s (inf when β fitted to 0)."""
        return 1.0 / self.beta if self.beta > 0 else math.inf


def _refine_in_log_space(A, t, x):
    """Gauss-Newton on the log ratios log((A·x) / t), from the relative least-squares x, α, β kept
    >= 0: a relative residual lies in (−1, ∞), so where no line fits the timings (a backend whose
    small messages cost more than its middle-sized ones) it prefers predicting too little — by 10x
    at the small sizes — to predicting too much; a log ratio weighs both ways alike. Exact α-β data
    are already a zero of it and stay where they are."""
    import numpy as np

    def cost(v):
        m = A @ v
        return float(np.sum(np.log(m / t) ** 2)) if np.all(m > 0) else math.inf

    best = cost(x)
    if not math.isfinite(best):
        return x
    for _ in range(50):
        m = A @ x
        r = np.log(m / t)
        J = A / m[:, None]
        step = np.linalg.lstsq(J, -r, rcond=None)[0]
        scale, moved = 1.0, False
        while scale > 1e-6:
            cand = np.maximum(x + scale * step, 0.0)
            c = cost(cand)
            if c < best:
                x, best, moved = cand, c, True
                break
            scale /= 2
        if not moved or best < 1e-24:
            break
    return x


def fit_alpha_beta(timings: Sequence[CollectiveTiming]) -> AlphaBetaFit:
    """Least squares for one link's α, β over timings of one or several collectives.

    Each timing gives t ≈ c_α·α + c_β·B·β (collective_coefficients). The residuals are relative
    (divided by t): the sizes span orders of magnitude and a plain fit would ignore the small
    messages, where α is visible. α, β are kept >= 0 (a negative one is dropped and the other
    refitted alone). That solution is then refined to the least squares of the log ratios (model
    over measured), which weigh predicting too little and too much alike."""
    import numpy as np

    if not timings:
        raise ValueError("fit_alpha_beta needs at least one timing")
    rows, t = [], []
    for x in timings:
        ca, cb = collective_coefficients(x.collective, x.nproc)
        rows.append((ca, cb * x.bytes))
        t.append(x.seconds)
    A = np.asarray(rows, dtype=float)
    t = np.asarray(t, dtype=float)
    if np.any(t <= 0):
        raise ValueError("fit_alpha_beta: timings must be > 0 seconds")
    Aw, tw = A / t[:, None], t / t  # relative residuals: (A·x − t) / t

    def solve(cols: list[int]) -> np.ndarray:
        x = np.zeros(2)
        if cols:
            x[cols] = np.linalg.lstsq(Aw[:, cols], tw, rcond=None)[0]
        return x

    x = solve([0, 1])
    if x[0] < 0 or x[1] < 0:  # the non-negative optimum lies on an edge: best of the two edges
        edges = [solve([0]), solve([1])]
        edges = [e for e in edges if e.min() >= 0]
        x = min(edges, key=lambda e: float(np.sum((Aw @ e - tw) ** 2))) if edges else np.zeros(2)
    x = _refine_in_log_space(A, t, x)
    rel = np.abs(A @ x - t) / t
    return AlphaBetaFit(alpha=float(x[0]), beta=float(x[1]), points=len(t), max_rel_error=float(rel.max()))


# ---------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MatmulCurveFit:
    """The matmul efficiency curve of one dtype (cluster::MatmulEfficiency, docs/modules/cost.md):
    efficiency(m·n, k) = ceiling × min(1, m·n / fill_elements) × k / (k + half_k), fitted to the
    timings by least squares on log time, never below ``floor``: the curve's value at the smallest
    fitted shape (``smallest``: (m·n, k) of that shape), so a GEMM smaller than any timed one is
    priced at the smallest timed efficiency rather than extrapolated towards 0; ``rms_log_error`` of
    the curve and, for comparison, of one constant efficiency (the median, what
    ``compute_efficiency`` would say)."""
    dtype: str
    ceiling: float
    fill_elements: float
    half_k: float
    rms_log_error: float
    constant_rms_log_error: float
    shapes: int
    floor: float = 0.0
    smallest: Tuple[float, float] = (0.0, 0.0)

    def efficiency(self, m: float, k: float, n: float) -> float:
        e = self.ceiling
        if self.fill_elements > 0 and m * n < self.fill_elements:
            e *= m * n / self.fill_elements
        if self.half_k > 0:
            e *= k / (k + self.half_k)
        return max(e, self.floor)

    def curve(self) -> dict:
        """The Calibration JSON's ``matmul_efficiency.<kind>.<dtype>`` object."""
        out = {"ceiling": _sig(self.ceiling), "fill_elements": _sig(self.fill_elements), "half_k": _sig(self.half_k)}
        if self.floor > 0:
            out["floor"] = min(_sig(self.floor), out["ceiling"])
        return out


def fit_matmul_efficiency(timings: Sequence[MatmulTiming], peak_flops: float) -> MatmulCurveFit:
    """Fits the matmul curve to one dtype's timings against ``peak_flops``: for every
    (fill_elements, half_k) on a log grid (0 = no penalty included), the best ceiling is closed form
    (the geometric mean of measured efficiency over the two shape factors, capped at 1); the pair
    with the least RMS log-time error wins, refined once on a finer grid around it. Deterministic."""
    import numpy as np

    if not timings:
        raise ValueError("fit_matmul_efficiency: no timings")
    dtypes = {t.dtype for t in timings}
    if len(dtypes) != 1:
        raise ValueError(f"fit_matmul_efficiency: timings of one dtype expected, got {sorted(dtypes)}")
    if not peak_flops > 0:
        raise ValueError(f"fit_matmul_efficiency: peak_flops must be > 0, got {peak_flops}")
    mn = np.array([float(t.m) * t.n for t in timings])
    k = np.array([float(t.k) for t in timings])
    log_eff = np.log(np.array([t.flops_per_s for t in timings]) / peak_flops)

    def score(fill, half_k):
        shape = np.zeros_like(log_eff)
        if fill > 0:
            shape += np.log(np.minimum(1.0, mn / fill))
        if half_k > 0:
            shape += np.log(k / (k + half_k))
        log_c = min(0.0, float(np.mean(log_eff - shape)))
        err = log_eff - (log_c + shape)
        return float(np.sqrt(np.mean(err * err))), math.exp(log_c)

    def search(fills, half_ks):
        best = None
        for f in fills:
            for h in half_ks:
                rms, c = score(f, h)
                if best is None or rms < best[0] - 1e-15:
                    best = (rms, c, f, h)
        return best

    fills = [0.0] + list(np.geomspace(mn.min() / 8, mn.max() * 8, 48))
    half_ks = [0.0] + list(np.geomspace(0.5, k.max() * 8, 48))
    rms, c, f, h = search(fills, half_ks)
    step_f = (mn.max() * 64 / mn.min()) ** (1 / 47)
    step_h = (k.max() * 16) ** (1 / 47)
    fine_f = [0.0] if f == 0 else list(np.geomspace(f / step_f, f * step_f, 25))
    fine_h = [0.0] if h == 0 else list(np.geomspace(h / step_h, h * step_h, 25))
    rms, c, f, h = min((rms, c, f, h), search(fine_f, fine_h))
    const = log_eff - float(np.median(log_eff))
    # The floor: the curve at the fitted shape where it is lowest (the smallest one: the curve is
    # monotone), below which nothing was measured.
    curve_at = np.full_like(mn, c)
    if f > 0:
        curve_at *= np.minimum(1.0, mn / f)
    if h > 0:
        curve_at *= k / (k + h)
    low = int(np.argmin(curve_at))
    return MatmulCurveFit(timings[0].dtype, c, float(f), float(h), rms, float(np.sqrt(np.mean(const * const))),
                          len(timings), float(curve_at[low]), (float(mn[low]), float(k[low])))


@dataclass
class CalibrationReport:
    """Everything one calibration measured and derived.

    ``to_json()`` is the Calibration JSON (what ``weft calibrate --out`` writes; loadable by
    ``weft.Calibration.from_json``, which rejects unknown keys). ``report_json()`` adds the raw
    measurements, fits and device description under separate keys (``weft calibrate --report``).
    """
    device: str                       # "cpu" or "cuda"
    device_name: str                  # CPU model / GPU name
    device_kind: str                  # the kind the efficiencies are filed under
    peak_source: str                  # "datasheet" (a DeviceSpec's peaks) or "measured" (best timings)
    reference_peak_flops: dict        # dtype -> FLOP/s the compute efficiencies are relative to
    reference_memory_bandwidth: float  # bytes/s the memory efficiency is relative to
    measured_peak_flops: dict         # dtype -> best achieved FLOP/s
    measured_memory_bandwidth: float  # best achieved bytes/s
    memory_bytes: float               # device (GPU) or host (CPU) memory, bytes
    threads: int                      # torch intra-op threads (CPU)
    torch_version: str
    quick: bool
    seed: int
    matmuls: list = field(default_factory=list)       # MatmulTiming
    memory_ops: list = field(default_factory=list)    # MemoryOpTiming
    overheads: list = field(default_factory=list)     # OverheadTiming
    collectives: list = field(default_factory=list)   # CollectiveTiming
    nproc: int = 1
    backend: Optional[str] = None
    collective_fits: dict = field(default_factory=dict)  # collective -> AlphaBetaFit (link α, β)
    link_fit: Optional[AlphaBetaFit] = None           # one α, β over all collectives
    reference_link: Optional[tuple] = None            # (α, β) of the cluster's axis, if a cluster was given
    reference_cluster: Optional[str] = None
    compute_efficiency: dict = field(default_factory=dict)  # dtype -> efficiency (for device_kind)
    default_compute_efficiency: float = 1.0
    # dtype -> MatmulCurveFit, written as matmul_efficiency (in place of that dtype's
    # compute_efficiency) where the curve fits the timings better than one constant.
    matmul_curves: dict = field(default_factory=dict)
    memory_efficiency: float = 1.0
    kernel_overhead_s: float = 0.0
    alpha_scale: float = 1.0
    beta_scale: float = 1.0
    elapsed_s: float = 0.0
    load_average: Optional[float] = None  # 1-minute load average at the start (None where unknown)
    notes: list = field(default_factory=list)
    cores: int = 1                     # the host's CPU cores (os.cpu_count())
    # seconds per compute op of weft's runtime around its kernel (instruction dispatch, buffers)
    runtime_overhead_s: float = 0.0
    # seconds a small all-reduce adds between two pieces of compute (as a step issues it; 0: none
    # measured): the per-collective latency of local_cluster()
    collective_latency_s: float = 0.0
    # compute run by the nproc collective processes at once over one process alone (CPU: they share
    # the host's memory bandwidth and caches; 1 on GPUs and where not measured)
    concurrent_slowdown: float = 1.0

    # -- outputs -------------------------------------------------------------------------------
    def calibration_dict(self) -> dict:
        """The Calibration JSON as a dict (keys of src/cost/calibration.cpp only)."""
        ce = {"default": _sig(self.default_compute_efficiency)}
        per_dtype = {t: _sig(e) for t, e in self.compute_efficiency.items() if t not in self.matmul_curves}
        if per_dtype:
            ce[self.device_kind] = per_dtype
        curves = {}
        if self.matmul_curves:
            curves["matmul_efficiency"] = {self.device_kind: {t: f.curve() for t, f in self.matmul_curves.items()}}
        return {
            "compute_efficiency": ce,
            **curves,
            "memory_efficiency": {"default": _sig(self.memory_efficiency),
                                  self.device_kind: _sig(self.memory_efficiency)},
            "kernel_overhead_s": _sig(self.kernel_overhead_s),
            "alpha_scale": _sig(self.alpha_scale),
            "beta_scale": _sig(self.beta_scale),
        }

    def to_json(self) -> str:
        """The Calibration JSON: loadable by ``weft.Calibration.from_json``."""
        return json.dumps(self.calibration_dict(), indent=2)

    @property
    def calibration(self):
        """A ``weft.Calibration`` (via ``from_json``, so it passes the C++ validation)."""
        from ._weft import Calibration

        return Calibration.from_json(self.to_json())

    def report_json(self) -> str:
        """The calibration plus the raw measurements, fits and device description."""
        fits = {k: asdict(v) for k, v in self.collective_fits.items()}
        doc = {
            "calibration": self.calibration_dict(),
            "device": {"device": self.device, "name": self.device_name, "kind": self.device_kind,
                       "peak_source": self.peak_source, "reference_peak_flops": self.reference_peak_flops,
                       "reference_memory_bandwidth": self.reference_memory_bandwidth,
                       "measured_peak_flops": self.measured_peak_flops,
                       "measured_memory_bandwidth": self.measured_memory_bandwidth,
                       "memory_bytes": self.memory_bytes, "threads": self.threads,
                       "torch": self.torch_version},
            "measurements": {"matmul": [asdict(x) for x in self.matmuls],
                             "memory": [asdict(x) for x in self.memory_ops],
                             "overhead": [asdict(x) for x in self.overheads],
                             "collectives": [asdict(x) for x in self.collectives]},
            "fits": {"collectives": fits, "link": asdict(self.link_fit) if self.link_fit else None,
                     "reference_link": (None if self.reference_link is None else
                                        {"cluster": self.reference_cluster, "alpha": self.reference_link[0],
                                         "beta": self.reference_link[1]})},
            "run": {"quick": self.quick, "seed": self.seed, "nproc": self.nproc, "backend": self.backend,
                    "cores": self.cores,
                    "elapsed_s": self.elapsed_s, "load_average": self.load_average,
                    "runtime_overhead_s": self.runtime_overhead_s,
                    "collective_latency_s": self.collective_latency_s,
                    "concurrent_slowdown": self.concurrent_slowdown},
            "notes": list(self.notes),
        }
        return json.dumps(doc, indent=2)

    def measured_device_spec(self):
        """A ``weft.DeviceSpec`` with the measured peaks and bandwidth (best timings), under
        ``device_kind``. On a CPU this is the spec that, with this calibration, reproduces the
        measured typical matmul / memory-op speed in the planner's roofline."""
        from ._weft import DeviceSpec

        return DeviceSpec(self.device_kind, dict(self.measured_peak_flops), float(self.memory_bytes),
                          float(self.measured_memory_bandwidth))

    def local_cluster(self, nproc: Optional[int] = None):
        """This host as a ``weft.Cluster`` of ``nproc`` devices, one per local process, priced as
        measured: the planner given it (and no calibration) predicts what a run of ``nproc``
        processes here takes.

        Each device is :meth:`measured_device_spec` with the calibration folded in (the matmul
        curves or constant compute efficiencies, the memory efficiency, the per-op overhead); the
        per-op cost is weft's runtime's (``runtime_overhead_s``: the Python around each kernel,
        which a torch op's own dispatch, ``kernel_overhead_s``, leaves out) where larger; the
        link between them is the fitted α (s) — at least what makes a small all-reduce cost
        ``collective_latency_s``, its cost between compute — and 1/β (bytes/s) of the
        collectives, which the cost model's ring formulas reproduce
        (:func:`collective_coefficients`). On a CPU the processes share the host: each device
        gets ``memory_bytes / nproc`` of memory, and its peaks and memory bandwidth divided by
        ``concurrent_slowdown`` (the measured ``nproc`` processes computing at once share the
        cores, memory bandwidth and caches), or for another ``nproc`` times its share of the
        cores, cores / (nproc × threads). nproc defaults to the processes the collectives were
        measured with; it must be run with the same torch threads per process as the calibration
        (``threads=``) for the prediction to hold.

        Raises ValueError when no collective was measured (``nproc=1`` or ``collectives=False``):
        a cluster of several devices needs its link.
        """
        from ._weft import Cluster, DeviceSpec, MatmulEfficiency, NodeSpec

        n = self.nproc if nproc is None else nproc
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"local_cluster: nproc must be an int >= 1 (got {nproc!r})")
        if self.link_fit is None and n > 1:
            raise ValueError("local_cluster: this calibration measured no collectives (nproc=1, collectives=False, "
                             "or they failed: see its notes); calibrate with nproc >= 2 to get the link between "
                             "processes")
        share = 1.0
        if self.device == "cpu":
            # Measured for this many processes: what sharing the host (cores included) costs them;
            # else each process's share of the cores.
            share = (1.0 / self.concurrent_slowdown if n == self.nproc and self.collectives else
                     min(1.0, self.cores / float(n * max(1, self.threads))))
        curves = {t: MatmulEfficiency(f.ceiling, f.fill_elements, f.half_k, f.floor)
                  for t, f in self.matmul_curves.items()}
        for t, e in self.compute_efficiency.items():  # a constant efficiency: the curve's ceiling alone
            curves.setdefault(t, MatmulEfficiency(e))
        memory = self.memory_bytes / n if self.device == "cpu" else self.memory_bytes
        device = DeviceSpec(self.device_kind, {t: p * share for t, p in self.reference_peak_flops.items()},
                            float(memory), float(self.reference_memory_bandwidth * share),
                            float(max(self.kernel_overhead_s, self.runtime_overhead_s)), curves,
                            float(self.memory_efficiency))
        alpha, beta = (self.link_fit.alpha, self.link_fit.beta) if self.link_fit else (1e-6, 1e-9)
        if self.collective_latency_s > 0 and self.nproc > 1:
            # A step's collectives pay the latency measured between compute (collective_latency_s,
            # a small all-reduce's), which a loop of back-to-back collectives does not show: α such
            # that the ring all-reduce's latency term 2(n − 1)α is that.
            alpha = max(alpha, self.collective_latency_s / collective_coefficients("all_reduce", self.nproc)[0])
        name = "local-" + ("cpu" if self.device == "cpu" else "gpu")
        return Cluster([NodeSpec(name, n, device, 1.0 / beta, alpha, 1.0 / beta, alpha,
                                 collective_factors=self.collective_factors())])

    def collective_factors(self) -> dict:
        """Per collective, how much more (or less) than the joint α-β fit's ring this backend's
        implementation of it costs here: the median, over its timings of at least
        ``FACTOR_MIN_BYTES`` (where the bandwidth term dominates; all of them when none is that
        large), of measured / ``link_fit.predict`` — the factor the cost model applies to the
        collective's bandwidth term (``weft.NodeSpec.collective_factors``). gloo's reduce-scatter,
        for one, runs over an all-reduce. A median of ratios, not a ratio of per-collective α-β
        fits: on a loaded 2-core host those swing by 2x from one calibration to the next. Clamped
        to [1/4, 8]; {} without a joint fit."""
        if not self.link_fit or self.link_fit.beta <= 0:
            return {}
        out = {}
        for name, key in (("all_reduce", "all_reduce"), ("all_gather", "all_gather"),
                          ("reduce_scatter", "reduce_scatter"), ("send_recv", "p2p")):
            rows = [x for x in self.collectives if x.collective == name and x.seconds > 0]
            big = [x for x in rows if x.bytes >= FACTOR_MIN_BYTES] or rows
            predicted = [(x, self.link_fit.predict(name, x.bytes, x.nproc)) for x in big]
            ratios = [x.seconds / p for x, p in predicted if p > 0]
            if ratios:
                out[key] = float(min(8.0, max(0.25, statistics.median(ratios))))
        return out

    def summary(self) -> str:
        """A readable multi-line report: efficiencies per dtype, overheads (s), link α (s) and β (s/byte)."""
        lines = [f"weft calibrate: {self.device} — {self.device_name} "
                 f"({'threads ' + str(self.threads) + ', ' if self.device == 'cpu' else ''}torch {self.torch_version}"
                 f"{', quick' if self.quick else ''}, {self.elapsed_s:.1f} s)",
                 f"  efficiencies filed under kind {self.device_kind!r}; peaks: {self.peak_source}"]
        if self.matmuls:
            lines.append("matmul (median seconds per call):")
            lines.append(f"  {'dtype':<5} {'M x K x N':<20} {'time':>10} {'TFLOP/s':>9} {'of peak':>8}")
            for x in self.matmuls:
                ref = self.reference_peak_flops.get(x.dtype)
                eff = f"{x.flops_per_s / ref:8.2f}" if ref else f"{'-':>8}"
                lines.append(f"  {x.dtype:<5} {f'{x.m}x{x.k}x{x.n}':<20} {_fmt_s(x.seconds):>10} "
                             f"{x.flops_per_s / 1e12:9.3f} {eff}")
        if self.memory_ops:
            lines.append(f"memory-bound ops ({_MEMORY_DTYPE}):")
            lines.append(f"  {'op':<11} {'MB moved':>9} {'time':>10} {'GB/s':>8} {'of ref':>7}")
            for x in self.memory_ops:
                lines.append(f"  {x.op:<11} {x.bytes / 1e6:9.1f} {_fmt_s(x.seconds):>10} {x.bytes_per_s / 1e9:8.2f} "
                             f"{x.bytes_per_s / self.reference_memory_bandwidth:7.2f}")
        if self.overheads:
            per = ", ".join(f"{x.op} {_fmt_s(x.seconds)}" for x in self.overheads)
            lines.append(f"per-op overhead (tiny tensors): {per}")
        if self.collectives:
            lines.append(f"collectives ({self.backend}, {self.nproc} processes; median of the slowest rank):")
            lines.append(f"  {'collective':<15} {'bytes':>10} {'time':>10} {'GB/s':>8}")
            for x in self.collectives:
                lines.append(f"  {x.collective:<15} {_fmt_bytes(x.bytes):>10} {_fmt_s(x.seconds):>10} "
                             f"{x.bytes / x.seconds / 1e9:8.3f}")
            for name, f in self.collective_fits.items():
                lines.append(f"  fit {name:<15} α = {_fmt_s(f.alpha)}, β = {f.beta * 1e9:.4g} ns/B "
                             f"({_fmt_bw(f.bandwidth)}), worst point off by {f.max_rel_error:.0%}")
            if self.link_fit:
                f = self.link_fit
                lines.append(f"  link (all collectives) α = {_fmt_s(f.alpha)}, β = {f.beta * 1e9:.4g} ns/B "
                             f"({_fmt_bw(f.bandwidth)}), worst point off by {f.max_rel_error:.0%}")
            if self.reference_link:
                a, b = self.reference_link
                lines.append(f"  reference link of {self.reference_cluster}: α = {_fmt_s(a)}, "
                             f"β = {b * 1e9:.4g} ns/B ({_fmt_bw(1 / b if b > 0 else math.inf)})")
        ce = ", ".join(f"{t} {e:.3f}" for t, e in self.compute_efficiency.items() if t not in self.matmul_curves)
        lines.append("calibration:")
        lines.append(f"  compute_efficiency  {ce or '-'} (default {self.default_compute_efficiency:.3f})")
        for t, f in self.matmul_curves.items():
            lines.append(f"  matmul_efficiency   {t}: ceiling {f.ceiling:.3f}, fill_elements {f.fill_elements:.4g}, "
                         f"half_k {f.half_k:.4g} (RMS log error {f.rms_log_error:.3f} vs "
                         f"{f.constant_rms_log_error:.3f} for one constant, {f.shapes} shapes); floor "
                         f"{f.floor:.3f}: below the smallest timed shape (m·n {f.smallest[0]:.4g}, k "
                         f"{f.smallest[1]:.4g}) a GEMM is priced at it, not extrapolated")
        lines.append(f"  memory_efficiency   {self.memory_efficiency:.3f}")
        lines.append(f"  kernel_overhead_s   {self.kernel_overhead_s:.3g}")
        if self.concurrent_slowdown != 1.0:
            lines.append(f"  compute run by the {self.nproc} processes at once: {self.concurrent_slowdown:.2f}x one "
                         "process alone (the local cluster's devices are that much slower)")
        if self.collective_latency_s:
            lines.append(f"  a small all-reduce between compute adds {_fmt_s(self.collective_latency_s)} (the "
                         "per-collective latency of local_cluster())")
        if self.runtime_overhead_s:
            lines.append(f"  weft runtime: {_fmt_s(self.runtime_overhead_s)} per op around the kernel "
                         "(the per-op cost of local_cluster())")
        lines.append(f"  alpha_scale {self.alpha_scale:.4g}, beta_scale {self.beta_scale:.4g}")
        for n in self.notes:
            lines.append(f"note: {n}")
        return "\n".join(lines)


def _sig(x: float) -> float:
    """Six significant digits: the JSON stays readable; the measurements are not that precise."""
    return float(f"{x:.6g}")


def _fmt_s(s: float) -> str:
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.2f} us"


def _fmt_bytes(b: float) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f:
            return f"{b / f:g} {unit}"
    return f"{int(b)} B"


def _fmt_bw(bps: float) -> str:
    return "inf" if math.isinf(bps) else f"{bps / 1e9:.3g} GB/s"


# ---------------------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Budget:
    """How long to spend on one measurement. A sample runs the op `inner` times back to back (so
    microsecond ops are timed over >= sample_s); the median of the samples is the result."""
    per_measurement_s: float
    sample_s: float
    min_samples: int = 3
    max_samples: int = 25
    max_inner: int = 1000


_QUICK = _Budget(per_measurement_s=0.04, sample_s=0.001)
_FULL = _Budget(per_measurement_s=0.4, sample_s=0.005, min_samples=5, max_samples=50)


def _median_seconds(fn: Callable[[], object], sync: Callable[[], None], budget: _Budget) -> float:
    """Median seconds per call of ``fn`` after a warm-up (allocations, kernel selection, caches)."""
    return _timed(fn, sync, budget)[0]


def timing_spread(samples: Sequence[float]) -> float:
    """The interquartile range of repeated timings of one call over their median: a few per cent
    on an idle machine; other work on the cores (which the load average may not show yet, or
    shows for work that has just ended) makes it tens of per cent or more."""
    if len(samples) < 2:
        return 0.0
    q = statistics.quantiles(samples, n=4, method="inclusive")
    med = statistics.median(samples)
    return (q[2] - q[0]) / med if med > 0 else 0.0


def _timed(fn: Callable[[], object], sync: Callable[[], None], budget: _Budget) -> Tuple[float, float]:
    """(median seconds per call of ``fn`` after a warm-up, :func:`timing_spread` of the samples)."""
    fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    once = max(time.perf_counter() - t0, 1e-9)
    inner = max(1, min(budget.max_inner, int(budget.sample_s / once)))
    samples = max(budget.min_samples, min(budget.max_samples, int(budget.per_measurement_s / (once * inner))))
    times = []
    for _ in range(samples):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times), timing_spread(times)


def _matmul_shapes(device: str, quick: bool) -> list[tuple[int, int, int]]:
    """(M, K, N): squares (each 2× the last side, so 8× the FLOPs) and transformer-like shapes with
    M = tokens, K/N = hidden and 4·hidden (MLP up and down projections); the MLP-up shape also with
    twice the tokens (2× the FLOPs)."""
    if device == "cuda":
        if quick:
            return [(1024, 1024, 1024), (2048, 2048, 2048), (4096, 1024, 4096), (8192, 1024, 4096),
                    (4096, 4096, 1024), (256, 4096, 4096), (4096, 128, 4096)]
        return [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192),
                (8192, 4096, 16384), (16384, 4096, 16384), (8192, 16384, 4096), (8192, 4096, 4096),
                # few output elements (a small micro-batch, a narrow shard) and short contractions
                # (attention's head dimension): they pin the curve's fill and half_k
                (256, 8192, 8192), (8192, 8192, 512), (8192, 128, 8192), (16384, 64, 16384)]
    if quick:
        return [(256, 256, 256), (512, 512, 512), (1024, 256, 1024), (2048, 256, 1024), (1024, 1024, 256),
                (64, 1024, 1024), (1024, 32, 1024)]
    return [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048),
            (4096, 1024, 4096), (8192, 1024, 4096), (4096, 4096, 1024), (4096, 1024, 1024),
            (64, 2048, 2048), (2048, 64, 2048)]


def _memory_numel(device: str, quick: bool) -> int:
    """Elements of the large tensors: well beyond the last-level cache (a CPU's is tens of MB)."""
    if device == "cuda":
        return (32 if quick else 256) * 1024 * 1024
    return (4 if quick else 32) * 1024 * 1024


def _collective_sizes(device: str, quick: bool) -> list[int]:
    """Message bytes, ×4 apart from 1 KiB (latency-bound) to MiBs (bandwidth-bound)."""
    top = {("cpu", True): 4 << 20, ("cpu", False): 64 << 20,
           ("cuda", True): 64 << 20, ("cuda", False): 1 << 30}[(device, quick)]
    sizes, b = [], 1 << 10
    while b <= top:
        sizes.append(b)
        b *= 4 if quick else 2
    return sizes


def _measure_matmuls(torch, dev, dtypes, shapes, sync, budget, gen) -> list[MatmulTiming]:
    out = []
    for t in dtypes:
        td = getattr(torch, _TORCH_DTYPES[t])
        for m, k, n in shapes:
            a = torch.randn(m, k, generator=gen).to(device=dev, dtype=td)
            b = torch.randn(k, n, generator=gen).to(device=dev, dtype=td)
            c = torch.empty(m, n, device=dev, dtype=td)  # out=: no allocation inside the timing
            s, spread = _timed(lambda: torch.matmul(a, b, out=c), sync, budget)
            flops = 2.0 * m * k * n
            out.append(MatmulTiming(m, k, n, t, s, flops, flops / s, spread))
            del a, b, c
    return out


def _memory_op_calls(torch, x, y, z):
    """op -> (call, tensors moved: bytes = tensors × numel × element size). Outputs are preallocated (out=):
    a fresh multi-MB CPU allocation per call would time page faults, not memory bandwidth."""
    F = torch.nn.functional
    aten = torch.ops.aten
    rows = x.numel() // _ROW
    x2, z2 = x.view(rows, _ROW), z.view(rows, _ROW)
    w = torch.ones(_ROW, device=x.device, dtype=x.dtype)
    bias = torch.zeros(_ROW, device=x.device, dtype=x.dtype)
    mean = torch.empty(rows, 1, device=x.device, dtype=x.dtype)
    rstd = torch.empty(rows, 1, device=x.device, dtype=x.dtype)

    def with_fallback(out_call, alloc_call):
        try:
            out_call()
            return out_call
        except (AttributeError, RuntimeError, TypeError):
            return alloc_call

    return {
        "add": (lambda: torch.add(x, y, out=z), 3),
        "gelu": (with_fallback(lambda: aten.gelu.out(x, out=z), lambda: F.gelu(x)), 2),
        "layer_norm": (with_fallback(
            lambda: aten.native_layer_norm.out(x2, (_ROW,), w, bias, 1e-5, out0=z2, out1=mean, out2=rstd),
            lambda: F.layer_norm(x2, (_ROW,), w, bias)), 2),
        "softmax": (with_fallback(lambda: aten._softmax.out(x2, -1, False, out=z2),
                                  lambda: torch.softmax(x2, -1)), 2),
    }


def _measure_memory_ops(torch, dev, numel, sync, budget, gen) -> list[MemoryOpTiming]:
    td = getattr(torch, _TORCH_DTYPES[_MEMORY_DTYPE])
    numel = max(_ROW, numel // _ROW * _ROW)
    x = torch.randn(numel, generator=gen).to(device=dev, dtype=td)
    y = torch.randn(numel, generator=gen).to(device=dev, dtype=td)
    z = torch.empty(numel, device=dev, dtype=td)
    size = x.element_size()
    out = []
    for op, (call, tensors) in _memory_op_calls(torch, x, y, z).items():
        s, spread = _timed(call, sync, budget)
        nbytes = float(tensors * numel * size)
        out.append(MemoryOpTiming(op, _MEMORY_DTYPE, numel, nbytes, s, nbytes / s, spread))
    return out


def _measure_runtime_overhead(dev, sync, budget) -> float:
    """Seconds per compute op of weft's own runtime (weft.runtime's RankRuntime, one rank) on a
    training step of a GPT so small that its kernels cost nothing: the Python around each op (its
    instruction, buffer reads and writes, frees), which the planner must count per op when it
    predicts a run of weft's runtime here (:meth:`CalibrationReport.local_cluster`)."""
    from . import lower_spmd, models, spmd_search
    from ._weft import Cluster, DeviceMesh, ProgramLayout
    from .runtime.comm import ProcessGroups
    from .runtime.rank import RankRuntime

    step = models.gpt(layers=2, hidden=8, heads=2, seq=4, vocab=16, batch=2).train_step()
    cluster, mesh = Cluster.preset("M8"), DeviceMesh([1], [0])
    program = lower_spmd(step, cluster, mesh, spmd_search(step, cluster, mesh))
    rt = RankRuntime(ProgramLayout(program), 0, device=dev, dtype="f32", seed=0, groups=ProcessGroups([]))
    ops = sum(1 for i in program.instructions(0) if i["kind"] == "compute")
    counter = iter(range(1, 1 << 30))
    seconds = _median_seconds(lambda: rt.step(next(counter)), sync, budget)
    return seconds / max(1, ops)


def _measure_overheads(torch, dev, sync, budget, gen) -> list[OverheadTiming]:
    # One row of _ROW elements: the same ops as above with nothing to move; what is left is the
    # per-op cost the roofline adds as kernel_overhead_s (dispatch on CPU, launch on GPU; a sample
    # runs many back to back, as a training step does, so a GPU launch is not serialized with a sync).
    td = getattr(torch, _TORCH_DTYPES[_MEMORY_DTYPE])
    x = torch.randn(_ROW, generator=gen).to(device=dev, dtype=td)
    y = torch.randn(_ROW, generator=gen).to(device=dev, dtype=td)
    z = torch.empty(_ROW, device=dev, dtype=td)
    tiny = _Budget(per_measurement_s=budget.per_measurement_s, sample_s=max(budget.sample_s, 0.002),
                   min_samples=budget.min_samples, max_samples=budget.max_samples, max_inner=2000)
    return [OverheadTiming(op, _ROW, _median_seconds(call, sync, tiny))
            for op, (call, _) in _memory_op_calls(torch, x, y, z).items()]


# ---------------------------------------------------------------------------------------------
# Collectives between local processes
# ---------------------------------------------------------------------------------------------

def _collective_calls(torch, dist, name, nbytes, nproc, rank, dev) -> list:
    """[(impl, call)] for one collective of ``nbytes`` (the cost model's byte convention), in order of
    preference: the single-tensor forms first (their names differ across torch versions), the list
    forms as the fallback for a backend that lacks them. ``call`` is None where this rank has no part
    (send_recv beyond ranks 0 and 1)."""
    numel = _collective_numel(nbytes, nproc)
    out = []
    if name == "all_reduce":
        buf = torch.ones(numel, device=dev)
        out.append(("all_reduce", lambda: dist.all_reduce(buf)))
    elif name in ("all_gather", "reduce_scatter"):
        gather = name == "all_gather"  # gather: part -> full; reduce-scatter: full -> part
        part = (torch.ones if gather else torch.empty)(numel // nproc, device=dev)
        full = (torch.empty if gather else torch.ones)(numel, device=dev)
        single = f"{name}_single", ("all_gather_into_tensor" if gather else "reduce_scatter_tensor")
        impl = next((n for n in single if hasattr(dist, n)), None)
        if impl is not None:
            f = getattr(dist, impl)
            out.append((impl, (lambda: f(full, part)) if gather else (lambda: f(part, full))))
        parts = list(full.chunk(nproc))
        out.append((name, (lambda: dist.all_gather(parts, part)) if gather else
                    (lambda: dist.reduce_scatter(part, parts))))
    elif name == "send_recv":
        # Ping-pong between ranks 0 and 1: a call is one round trip, two one-way messages; the
        # timing loop halves it (see _collective_worker).
        buf = torch.ones(numel, device=dev)
        if rank == 0:
            out.append(("send/recv", lambda: (dist.send(buf, 1), dist.recv(buf, 1))))
        elif rank == 1:
            out.append(("send/recv", lambda: (dist.recv(buf, 0), dist.send(buf, 0))))
        else:
            out.append(("send/recv", None))
    else:
        raise ValueError(f"unknown collective {name!r}")
    return out


def _collective_numel(nbytes: int, nproc: int) -> int:
    """f32 elements for a message of about ``nbytes``, divisible among the ranks."""
    return max(nproc, nbytes // 4 // nproc * nproc)


def _collective_worker(rank: int, nproc: int, backend: str, init_method: str, device: str, sizes: list,
                       budget: _Budget, timeout_s: float, threads: int, result_path: str) -> None:
    """One process of the collective benchmark (spawned; module-level so that it pickles by name).
    Every rank runs the same number of calls: the counts come from a MAX all-reduce of a first
    timing, never from a rank's own clock. Rank 0 writes the rows as JSON to ``result_path``."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)
    if device == "cuda":
        torch.cuda.set_device(rank)
        dev = torch.device("cuda", rank)
        sync = torch.cuda.synchronize
    else:
        dev = torch.device("cpu")
        sync = lambda: None  # noqa: E731 (gloo calls return when done)
    dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=nproc,
                            timeout=timedelta(seconds=timeout_s))
    # NCCL's barrier is an all-reduce on a GPU: name this rank's, or it guesses.
    barrier = (lambda: dist.barrier(device_ids=[rank])) if backend == "nccl" else dist.barrier

    def agree_max(x: float) -> float:
        v = torch.tensor([x], dtype=torch.float64 if device == "cpu" else torch.float32, device=dev)
        dist.all_reduce(v, op=dist.ReduceOp.MAX)
        return float(v.item())

    rows, skipped = [], {}
    try:
        for name in _COLLECTIVES:
            if name == "send_recv" and nproc < 2:
                continue
            for nbytes in sizes:
                impl, call = None, None
                for cand_impl, cand_call in _collective_calls(torch, dist, name, nbytes, nproc, rank, dev):
                    run = cand_call or (lambda: None)
                    failed = 0.0
                    try:  # warm-up (connections, buffers) and the support check: an unsupported
                        for _ in range(_WARMUP_CALLS):  # call raises on every rank alike
                            run()
                        sync()
                    except (RuntimeError, NotImplementedError, ValueError) as e:
                        failed = 1.0
                        skipped[name] = f"{cand_impl}: {str(e).strip().splitlines()[0][:160]}"
                    if not agree_max(failed):
                        impl, call = cand_impl, cand_call
                        break
                if impl is None:
                    break  # no form of this collective works on this backend
                skipped.pop(name, None)
                run = call or (lambda: None)
                t0 = time.perf_counter()
                run()
                sync()
                once = max(agree_max(time.perf_counter() - t0), 1e-9)
                inner = max(1, min(budget.max_inner, int(budget.sample_s / once)))
                samples = max(budget.min_samples,
                              min(budget.max_samples, int(budget.per_measurement_s / (once * inner))))
                times = []
                for _ in range(samples):
                    barrier()
                    t0 = time.perf_counter()
                    for _ in range(inner):
                        run()
                    sync()
                    times.append((time.perf_counter() - t0) / inner)
                seconds = agree_max(statistics.median(times) if call else 0.0)
                if name == "send_recv":
                    seconds /= 2  # a round trip is two one-way messages
                rows.append({"collective": name, "impl": impl, "bytes": _collective_numel(nbytes, nproc) * 4,
                             "seconds": seconds, "nproc": 2 if name == "send_recv" else nproc})
        in_step, slowdown = _in_step_latency(torch, dist, dev, sync, barrier, agree_max, budget)
        if rank == 0:
            with open(result_path, "w") as f:
                json.dump({"rows": rows, "skipped": skipped, "in_step_latency": in_step,
                           "concurrent_slowdown": slowdown}, f)
    finally:
        dist.destroy_process_group()


def _in_step_latency(torch, dist, dev, sync, barrier, agree_max, budget: _Budget) -> tuple[float, float]:
    """(seconds a small all-reduce adds between two pieces of compute, the slowdown of compute run by
    every process at once against rank 0 alone). The first as a training step issues its
    collectives (the processes arrive as their compute ends, not in lock step as in a loop of
    collectives): the median over samples of (k × (compute + all-reduce) − k × compute) / k, the
    slowest rank's; on a CPU the collective also runs on the cores that compute. The second: the
    processes of one host share its memory bandwidth and caches (and cores, when more than it has),
    which one process timed alone does not see."""
    # A step's mix in small: a matmul and a memory-bound op over more than a core's caches hold.
    a = torch.randn(256, 256, device=dev)
    big = torch.randn(1 << 21, device=dev)
    out = torch.empty_like(big)
    x = torch.zeros(64, device=dev)

    def compute():
        torch.mm(a, a)
        torch.add(big, big, out=out)

    k = 20 if budget is _QUICK else 100
    samples = max(3, budget.min_samples)
    rank = dist.get_rank()

    def per_iteration(with_collective: bool, runs: bool = True) -> float:
        """Seconds per iteration of k after a barrier (0 on a rank that only waits)."""
        barrier()
        if not runs:
            return 0.0
        t0 = time.perf_counter()
        for _ in range(k):
            compute()
            if with_collective:
                dist.all_reduce(x)
        sync()
        return (time.perf_counter() - t0) / k

    extra = []
    for _ in range(samples):
        plain = per_iteration(False)
        extra.append(per_iteration(True) - plain)
    alone, together = [], []
    for _ in range(samples):
        alone.append(per_iteration(False, runs=rank == 0))
        together.append(per_iteration(False))
    slowdown = statistics.median(together) / statistics.median(alone) if rank == 0 else 0.0
    return agree_max(max(0.0, statistics.median(extra))), max(1.0, agree_max(slowdown))


def _run_collectives(device: str, nproc: int, backend: str, sizes: list, budget: _Budget,
                     timeout_s: float) -> tuple[list[CollectiveTiming], list[str], float, float]:
    """Spawns ``nproc`` processes, runs the collective benchmark in them, and returns the rows and
    notes. Never hangs: the processes get ``timeout_s`` in all (their process group the same
    timeout), after which they are killed and the collectives reported as missing."""
    import torch.multiprocessing as mp

    notes: list[str] = []
    threads = max(1, (os.cpu_count() or 1) // nproc)
    with tempfile.TemporaryDirectory(prefix="weft-calibrate-") as tmp:
        result_path = os.path.join(tmp, "collectives.json")
        init_method = f"tcp://127.0.0.1:{free_port()}"
        ctx = mp.start_processes(_collective_worker, nprocs=nproc, join=False, start_method="spawn",
                                 args=(nproc, backend, init_method, device, sizes, budget, timeout_s, threads,
                                       result_path))
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=max(0.05, min(1.0, deadline - time.monotonic()))):
                if time.monotonic() > deadline:
                    notes.append(f"collectives timed out after {timeout_s:g} s: skipped")
                    break
        except Exception as e:  # a worker raised or died: report, keep the other measurements
            msg = str(e).strip().splitlines()
            notes.append(f"collectives failed ({type(e).__name__}: {msg[-1][:200] if msg else ''}): skipped")
        finally:
            for p in ctx.processes:  # the workers this call started, and only those
                if p.is_alive():
                    p.kill()
                    p.join(5)
        if not os.path.exists(result_path):
            if not notes:
                notes.append("collectives produced no result: skipped")
            return [], notes, 0.0, 1.0
        with open(result_path) as f:
            doc = json.load(f)
    rows = [CollectiveTiming(**r) for r in doc["rows"]]
    for name, why in doc["skipped"].items():
        notes.append(f"{name} not measured: the {backend} backend refused it ({why})")
    return rows, notes, float(doc.get("in_step_latency", 0.0)), float(doc.get("concurrent_slowdown", 1.0))


# ---------------------------------------------------------------------------------------------
# Device identification and reference peaks
# ---------------------------------------------------------------------------------------------

def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _host_memory_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1.0


def _load_average() -> Optional[float]:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):  # not on every platform
        return None


def _tokens(text: str) -> list[str]:
    out, cur = [], ""
    for ch in text.upper():
        if ch.isalnum():
            cur += ch
        elif cur:
            out.append(cur)
            cur = ""
    return out + ([cur] if cur else [])


def _form_factor(tokens: Iterable[str]) -> Optional[str]:
    for t in tokens:
        for ff in ("SXM", "PCIE", "NVL"):
            if t.startswith(ff):
                return ff
    return None


def match_device_kind(gpu_name: str, gpu_memory_bytes: float, specs: Iterable) -> Optional[object]:
    """The DeviceSpec among ``specs`` that describes a GPU called ``gpu_name``, or None.

    Conservative, because a wrong match gives wrong efficiencies: the kind's family (its first
    token, "H100" in "H100-SXM5-80GB") must be a word of the name, a form factor named by both
    (SXM / PCIe / NVL) must agree, and the memory sizes must be within 15 %. An H200 is
    ``H200-SXM-141GB``; an H100 PCIe or an A100 40GB matches none of the presets: their efficiencies are then relative to measured
    peaks (pass ``device_spec=`` for their datasheet)."""
    name_tokens = _tokens(gpu_name)
    best = None
    for spec in specs:
        kind_tokens = _tokens(spec.kind)
        if not kind_tokens or kind_tokens[0] not in name_tokens:
            continue
        ff_name, ff_kind = _form_factor(name_tokens), _form_factor(kind_tokens)
        if ff_name and ff_kind and ff_name != ff_kind:
            continue
        if gpu_memory_bytes > 0 and spec.memory_bytes > 0 and \
                abs(gpu_memory_bytes - spec.memory_bytes) > 0.15 * spec.memory_bytes:
            continue
        score = sum(t in name_tokens for t in kind_tokens)
        if best is None or score > best[0]:
            best = (score, spec)
    return best[1] if best else None


def _candidate_specs(cluster) -> list:
    """Device specs to match a GPU against: the given cluster's first, then every preset's."""
    from ._weft import Cluster

    specs = []
    if cluster is not None:
        specs += [n.device for n in cluster.nodes]
    for name in Cluster.preset_names():
        specs.append(Cluster.preset(name).nodes[0].device)
    return specs


# ---------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------

def _check_args(device, nproc, backend, dtypes, device_spec, cluster, seed, collectives, timeout_s):
    from ._weft import Cluster, DeviceSpec

    if not isinstance(device, str) or device not in _DEVICES:
        raise ValueError(f"calibrate: device must be one of {', '.join(map(repr, _DEVICES))} (got {device!r})")
    if isinstance(nproc, bool) or not isinstance(nproc, int):
        raise TypeError(f"calibrate: nproc must be an int (got {type(nproc).__name__})")
    if nproc < 1:
        raise ValueError(f"calibrate: nproc must be >= 1 (got {nproc}); nproc=1 skips the collectives")
    if backend is not None and backend not in _BACKENDS:
        raise ValueError(f"calibrate: backend must be None (gloo on CPU, nccl on CUDA) or one of "
                         f"{', '.join(_BACKENDS)} (got {backend!r})")
    if dtypes is not None:
        if isinstance(dtypes, str):
            dtypes = (dtypes,)
        dtypes = tuple(dtypes)
        if not dtypes:
            raise ValueError("calibrate: dtypes is empty (give at least one of f32, bf16, f16, f64)")
        for t in dtypes:
            if t not in _TORCH_DTYPES:
                raise ValueError(f"calibrate: unknown dtype {t!r} (known: {', '.join(_TORCH_DTYPES)})")
        if len(set(dtypes)) != len(dtypes):
            raise ValueError(f"calibrate: dtypes has duplicates: {dtypes}")
    if device_spec is not None and not isinstance(device_spec, DeviceSpec):
        raise TypeError(f"calibrate: device_spec must be a weft.DeviceSpec (got {type(device_spec).__name__})")
    if cluster is not None and not isinstance(cluster, Cluster):
        raise TypeError(f"calibrate: cluster must be a weft.Cluster (got {type(cluster).__name__})")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"calibrate: seed must be an int (got {type(seed).__name__})")
    if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and timeout_s > 0):
        raise ValueError(f"calibrate: timeout_s must be > 0 seconds (got {timeout_s!r})")
    if cluster is not None and collectives and nproc > 1 and cluster.num_devices < nproc:
        raise ValueError(f"calibrate: the cluster has {cluster.num_devices} devices, fewer than nproc={nproc}; "
                         f"its link for {nproc} processes is undefined")
    return dtypes


# The median interquartile spread of repeated timings above which a calibration is called busy.
SPREAD_LIMIT = 0.2


def _warn_busy(notes: list, why: str) -> None:
    busy = f"the machine was busy ({why}): the timings include contention; calibrate on an idle machine for the planner"
    notes.append(busy)
    # Loud, not only in the report: a calibration timed under load mis-prices every plan made with it.
    warnings.warn(f"weft.calibrate: {busy}", RuntimeWarning, stacklevel=4)


def _import_torch():
    try:
        import torch
    except ImportError as e:
        raise ImportError("weft.calibrate needs PyTorch (pip install torch); the rest of weft does not") from e
    return torch


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------

def calibrate(device: str = "auto", nproc: int = 2, backend: Optional[str] = None,
              dtypes: Optional[Sequence[str]] = None, device_spec=None, cluster=None, quick: bool = False,
              seed: int = 0, collectives: bool = True, timeout_s: Optional[float] = None,
              threads: Optional[int] = None) -> CalibrationReport:
    """Measures this machine and returns a :class:`CalibrationReport` (``.calibration`` is the
    ``weft.Calibration``; ``.to_json()`` its JSON).

    device: "auto" (CUDA when torch sees a GPU, else CPU), "cpu" or "cuda" (GPU 0).
    nproc: local processes for the collectives (1, or ``collectives=False``, skips them; on CUDA
        at most the number of GPUs).
    backend: torch.distributed backend; None = gloo on CPU, nccl on CUDA.
    dtypes: matmul dtypes; None = f32, bf16, f64 on CPU and f32, bf16, f16 on CUDA.
    device_spec: a ``weft.DeviceSpec`` whose datasheet peaks the efficiencies are relative to; None =
        on CUDA the GPU's name matched to ``cluster``'s / the presets' kinds, on CPU (or no match) the
        best measured matmul per dtype and the best memory op (see docs/modules/calibrate.md).
    cluster: a ``weft.Cluster``; when given, alpha_scale / beta_scale are the measured α / β over the
        α / β of the cluster's link for a 1-D mesh of ``nproc`` devices (devices 0..nproc-1);
        without one they are 1.0 and the raw α, β are in the report.
    quick: small shapes and short timings (seconds on a CPU) instead of the full run.
    seed: seeds the random inputs.
    timeout_s: the collectives' time limit (default 60 s quick, 600 s full).
    threads: torch intra-op threads for the CPU measurements (None = torch's current setting; restored
        afterwards). The collective processes share the cores: each gets cores / nproc threads.
    """
    dtypes = _check_args(device, nproc, backend, dtypes, device_spec, cluster, seed, collectives, timeout_s)
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"calibrate: threads must be None or an int >= 1 (got {threads!r})")
    torch = _import_torch()
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _calibrate(torch, device, nproc, backend, dtypes, device_spec, cluster, quick, seed, collectives,
                          timeout_s)
    finally:
        torch.set_num_threads(previous_threads)


def _calibrate(torch, device, nproc, backend, dtypes, device_spec, cluster, quick, seed, collectives,
               timeout_s) -> CalibrationReport:
    started = time.perf_counter()
    notes: list[str] = []
    load = _load_average()
    cores = os.cpu_count() or 1
    busy = load is not None and load > 0.5 * cores
    if busy:
        # Other work on the cores stalls the threads of a parallel kernel (and the collective
        # processes): the timings then measure the machine's load as much as the device.
        _warn_busy(notes, f"load average {load:.1f} on {cores} cores")

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("calibrate: device='cuda' but torch sees no CUDA GPU (torch.cuda.is_available() is False)")
    if dtypes is None:
        dtypes = ("f32", "bf16", "f16") if device == "cuda" else ("f32", "bf16", "f64")
    if backend is None:
        backend = "nccl" if device == "cuda" else "gloo"
    if backend == "nccl" and device != "cuda":
        raise ValueError("calibrate: the nccl backend needs device='cuda' (use gloo on CPU)")

    budget = _QUICK if quick else _FULL
    gen = torch.Generator().manual_seed(seed)  # inputs are made on the CPU, then moved: same values everywhere
    if device == "cuda":
        dev = torch.device("cuda", 0)
        sync = torch.cuda.synchronize
        props = torch.cuda.get_device_properties(0)
        device_name, memory_bytes, threads = torch.cuda.get_device_name(0), float(props.total_memory), 1
    else:
        dev = torch.device("cpu")
        sync = lambda: None  # noqa: E731 (CPU ops return when done)
        device_name, memory_bytes, threads = _cpu_name(), _host_memory_bytes(), torch.get_num_threads()
    if device == "cuda" and "f32" in dtypes and torch.get_float32_matmul_precision() != "highest":
        notes.append(f"torch float32 matmul precision is {torch.get_float32_matmul_precision()!r} (TF32): "
                     "f32 efficiencies against the FP32 datasheet peak can exceed 1")

    # -- compute and memory ------------------------------------------------------------------
    matmuls = _measure_matmuls(torch, dev, dtypes, _matmul_shapes(device, quick), sync, budget, gen)
    memory_ops = _measure_memory_ops(torch, dev, _memory_numel(device, quick), sync, budget, gen)
    overheads = _measure_overheads(torch, dev, sync, budget, gen)
    runtime_overhead = _measure_runtime_overhead(dev, sync, budget)
    if device == "cuda":
        torch.cuda.empty_cache()

    # The load average lags (a minute's mean) and misses short bursts: repeated timings that
    # scatter say the same from inside the measurement.
    spread = statistics.median(x.spread for x in [*matmuls, *memory_ops])
    if spread > SPREAD_LIMIT and not busy:
        _warn_busy(notes, f"repeated timings scattered by {spread:.0%} of their median (interquartile range; "
                          f"an idle machine stays under {SPREAD_LIMIT:.0%})")

    measured_peak = {t: max(x.flops_per_s for x in matmuls if x.dtype == t) for t in dtypes}
    measured_bw = max(x.bytes_per_s for x in memory_ops)

    # -- reference peaks: a datasheet where we know the device, else the best measurement ---------
    spec = device_spec
    if spec is None and device == "cuda":
        spec = match_device_kind(device_name, memory_bytes, _candidate_specs(cluster))
        if spec is None:
            notes.append(f"GPU {device_name!r} matches no known device kind (pass device_spec= for its "
                         "datasheet): efficiencies are relative to the best measurement")
    if spec is not None:
        kind, peak_source = spec.kind, "datasheet"
        reference_peak = {t: spec.peak_flops[t] for t in dtypes if t in spec.peak_flops}
        for t in dtypes:
            if t not in reference_peak:
                notes.append(f"{spec.kind} has no datasheet peak for {t}: no compute efficiency for it")
        reference_bw = spec.memory_bandwidth
    else:
        kind = f"{'cpu' if device == 'cpu' else 'cuda'}:{device_name}"
        peak_source = "measured"
        reference_peak, reference_bw = dict(measured_peak), measured_bw
        if device == "cpu":
            notes.append("a CPU has no datasheet peak: compute efficiencies are relative to the best measured "
                         "matmul per dtype, the memory efficiency to the best memory op; use "
                         "report.measured_device_spec() as the device with this calibration")

    # Efficiency = the typical (median over shapes / ops) achieved speed over the reference peak.
    compute_eff = {t: statistics.median(x.flops_per_s for x in matmuls if x.dtype == t) / reference_peak[t]
                   for t in dtypes if t in reference_peak}
    memory_eff = statistics.median(x.bytes_per_s for x in memory_ops) / reference_bw
    default_compute_eff = statistics.median(compute_eff.values()) if compute_eff else 1.0
    # The shape curve per dtype where the shapes determine it (>= 5) and it fits better than one
    # constant; a dtype without one keeps its median efficiency.
    curves = {}
    for t in compute_eff:
        rows = [x for x in matmuls if x.dtype == t]
        if len(rows) >= 5:
            fit = fit_matmul_efficiency(rows, reference_peak[t])
            if fit.rms_log_error < fit.constant_rms_log_error:
                curves[t] = fit
    kernel_overhead = statistics.median(x.seconds for x in overheads)

    report = CalibrationReport(
        device=device, device_name=device_name, device_kind=kind, peak_source=peak_source,
        reference_peak_flops=reference_peak, reference_memory_bandwidth=reference_bw,
        measured_peak_flops=measured_peak, measured_memory_bandwidth=measured_bw, memory_bytes=memory_bytes,
        threads=threads, torch_version=torch.__version__.split("+")[0], quick=quick, seed=seed,
        matmuls=matmuls, memory_ops=memory_ops, overheads=overheads, compute_efficiency=compute_eff,
        default_compute_efficiency=default_compute_eff, matmul_curves=curves, memory_efficiency=memory_eff,
        kernel_overhead_s=kernel_overhead, load_average=load, notes=notes, cores=cores,
        runtime_overhead_s=runtime_overhead)

    # -- collectives ---------------------------------------------------------------------------
    if collectives and nproc > 1:
        _calibrate_collectives(report, torch, device, nproc, backend, cluster, quick, budget, timeout_s)
    elif nproc == 1:
        notes.append("nproc=1: no collectives measured (alpha_scale = beta_scale = 1)")
    else:
        notes.append("collectives=False: no collectives measured (alpha_scale = beta_scale = 1)")

    report.elapsed_s = time.perf_counter() - started
    report.calibration  # noqa: B018 (validates through Calibration.from_json; raises if it cannot load)
    return report


def _calibrate_collectives(report: CalibrationReport, torch, device, nproc, backend, cluster, quick, budget,
                           timeout_s) -> None:
    import torch.distributed as dist

    notes = report.notes
    if not dist.is_available():
        notes.append("torch.distributed is not available in this torch build: no collectives measured")
        return
    if device == "cuda":
        gpus = torch.cuda.device_count()
        if gpus < 2:
            notes.append(f"{gpus} GPU: collectives need >= 2 GPUs (one per process); none measured")
            return
        if gpus < nproc:
            notes.append(f"nproc={nproc} > {gpus} GPUs: collectives between {gpus} processes")
            nproc = gpus
    available = getattr(dist, f"is_{backend}_available", None)
    if available is not None and not available():
        notes.append(f"the {backend} backend is not available in this torch build: no collectives measured")
        return
    if timeout_s is None:
        timeout_s = 60.0 if quick else 600.0
    rows, more, in_step, slowdown = _run_collectives(device, nproc, backend, _collective_sizes(device, quick),
                                                     budget, timeout_s)
    notes += more
    report.nproc, report.backend, report.collectives = nproc, backend, rows
    report.collective_latency_s = in_step
    report.concurrent_slowdown = slowdown if device == "cpu" else 1.0  # one GPU per process: its own
    if not rows:
        return
    for name in _COLLECTIVES:
        mine = [x for x in rows if x.collective == name]
        if len(mine) >= 2:
            report.collective_fits[name] = fit_alpha_beta(mine)
    report.link_fit = fit_alpha_beta(rows)
    alpha, beta = report.link_fit.alpha, report.link_fit.beta
    if cluster is None:
        notes.append("no cluster given: alpha_scale = beta_scale = 1; the fitted link α, β are in the report")
        return
    from ._weft import DeviceMesh

    link = DeviceMesh.iota([nproc]).axis_links(cluster)[0]
    report.reference_link = (link.alpha, link.beta)
    report.reference_cluster = repr(cluster)
    # The scales must be > 0 for Calibration: a coefficient fitted to 0 (no visible latency, say)
    # is floored at 1e-3 of the cluster's, with a note.
    for attr, measured, model in (("alpha_scale", alpha, link.alpha), ("beta_scale", beta, link.beta)):
        if model <= 0:
            notes.append(f"{attr}: the cluster's link has {attr.split('_')[0]} 0; the scale stays 1")
            continue
        scale = measured / model
        if scale < 1e-3:
            notes.append(f"{attr}: measured {measured:.3g} is < 1e-3 of the cluster's {model:.3g}; floored")
            scale = 1e-3
        setattr(report, attr, scale)

