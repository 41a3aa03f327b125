"""weft.calibrate / `weft calibrate`: measurements on this machine, the fits, the Calibration JSON.

No expected measurement is hard-coded: the checks are positivity, consistency between related
measurements, and that the derived numbers reproduce the measured ones.
"""
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings

import pytest

torch = pytest.importorskip("torch")

import weft  # noqa: E402
from weft_env import subprocess_env  # noqa: E402
from weft.calibration import (AlphaBetaFit, CollectiveTiming, MatmulTiming, collective_coefficients,  # noqa: E402
                              fit_alpha_beta, fit_matmul_efficiency, match_device_kind)

pytestmark = pytest.mark.serial  # times collectives and matmuls: run alone (scripts/test_all.sh)



@pytest.fixture(scope="module")
def quick_cpu():
    """One quick CPU calibration shared by the tests (threads=1: a busy CI machine stalls the
    threads of a parallel kernel, which would make the shape comparisons flaky)."""
    t0 = time.perf_counter()
    report = weft.calibrate(device="cpu", nproc=2, quick=True, threads=1, seed=0,
                            cluster=weft.Cluster.preset("M8"))
    return report, time.perf_counter() - t0


def test_quick_cpu_finishes_fast_and_measures_everything(quick_cpu):
    r, elapsed = quick_cpu
    assert elapsed < 30, f"quick calibration took {elapsed:.1f} s"
    assert r.device == "cpu" and r.quick and r.peak_source == "measured"
    assert {x.dtype for x in r.matmuls} == {"f32", "bf16", "f64"}  # the CPU defaults
    assert {x.op for x in r.memory_ops} == {"add", "gelu", "layer_norm", "softmax"}
    assert {x.op for x in r.overheads} == {"add", "gelu", "layer_norm", "softmax"}
    assert r.nproc == 2 and r.backend == "gloo"
    measured = {x.collective for x in r.collectives}
    assert {"all_reduce", "all_gather", "send_recv"} <= measured  # reduce_scatter only where gloo has it
    for name in measured:
        assert len([x for x in r.collectives if x.collective == name]) >= 3  # sizes small to large
    text = r.summary()
    for word in ("matmul", "memory-bound", "collectives", "alpha_scale", "compute_efficiency"):
        assert word in text


def test_matmul_flops_positive_and_consistent(quick_cpu):
    r, _ = quick_cpu
    for x in r.matmuls:
        assert x.seconds > 0 and x.flops == 2.0 * x.m * x.k * x.n
        assert x.flops_per_s == pytest.approx(x.flops / x.seconds, rel=1e-9)
    for t in ("f32", "bf16", "f64"):
        by_shape = {x.shape: x.seconds for x in r.matmuls if x.dtype == t}
        assert by_shape[(512, 512, 512)] > by_shape[(256, 256, 256)], t          # 8x the FLOPs
        assert by_shape[(2048, 256, 1024)] > by_shape[(1024, 256, 1024)], t       # 2x the tokens
        assert r.measured_peak_flops[t] == max(x.flops_per_s for x in r.matmuls if x.dtype == t)


def test_memory_ops_and_overhead(quick_cpu):
    r, _ = quick_cpu
    for x in r.memory_ops:
        assert x.seconds > 0 and x.bytes_per_s == pytest.approx(x.bytes / x.seconds, rel=1e-9)
        assert x.bytes >= 2 * x.numel * 4  # at least read once and write once (f32)
    assert r.measured_memory_bandwidth == max(x.bytes_per_s for x in r.memory_ops)
    # The per-op overhead is measured on tiny tensors: far below the large ops' times.
    assert 0 < r.kernel_overhead_s < min(x.seconds for x in r.memory_ops)


def test_calibration_is_valid_and_holds_the_efficiencies(quick_cpu):
    r, _ = quick_cpu
    cal = r.calibration
    assert isinstance(cal, weft.Calibration)
    assert weft.Calibration.from_json(r.to_json()) == cal
    for t, e in r.compute_efficiency.items():
        # On a CPU the peak is the best measured matmul: the typical one is a fraction of it.
        assert 0 < e <= 1.0
        if t in r.matmul_curves:  # filed as the shape curve instead (the loader refuses both)
            curve = cal.matmul_efficiency[r.device_kind][t]
            fit = r.matmul_curves[t]
            assert (curve.ceiling, curve.fill_elements, curve.half_k) == pytest.approx(
                (fit.ceiling, fit.fill_elements, fit.half_k), rel=1e-5)
            assert 0 < curve.ceiling <= 1.0 and fit.rms_log_error < fit.constant_rms_log_error
        else:
            assert cal.compute_eff(r.device_kind, t) == pytest.approx(e, rel=1e-5)
    assert 0 < cal.memory_eff(r.device_kind) <= 1.0
    assert cal.kernel_overhead == pytest.approx(r.kernel_overhead_s, rel=1e-5)
    doc = json.loads(r.report_json())
    assert json.loads(r.to_json()) == doc["calibration"]
    assert len(doc["measurements"]["matmul"]) == len(r.matmuls)
    assert len(doc["measurements"]["collectives"]) == len(r.collectives)


def test_measured_device_spec_with_calibration_reproduces_typical_speed(quick_cpu):
    # The planner's roofline with the measured spec and this calibration gives the median matmul
    # speed per dtype (plus the per-op overhead): the CPU numbers are self-consistent.
    r, _ = quick_cpu
    spec = r.measured_device_spec()
    node = weft.NodeSpec("this-cpu", 1, spec, 1e9, 1e-6, 1e9, 1e-6)
    dev = weft.Cluster([node]).device(0)
    for t in ("f32", "bf16", "f64"):
        rows = [x for x in r.matmuls if x.dtype == t]
        if t in r.matmul_curves:
            # The calibration's curve gives each measured shape's time; over the shapes its RMS
            # log error is the fit's, below one constant efficiency's.
            curve = r.calibration.matmul_efficiency[r.device_kind][t]
            err = [math.log(x.flops / (r.reference_peak_flops[t] * curve.at(x.m, x.k, x.n)) / x.seconds) for x in rows]
            rms = math.sqrt(sum(e * e for e in err) / len(err))
            assert rms == pytest.approx(r.matmul_curves[t].rms_log_error, rel=1e-3, abs=1e-6)
            continue
        median = statistics.median(x.flops_per_s for x in rows)
        flops = 1e12
        assert weft.compute_time(flops, 0, t, dev, r.calibration) == pytest.approx(
            flops / median + r.kernel_overhead_s, rel=1e-4)


def test_fitted_alpha_beta_reproduce_the_measured_times(quick_cpu):
    r, _ = quick_cpu
    assert r.link_fit is not None and r.link_fit.alpha > 0 and r.link_fit.beta > 0
    for name, fit in r.collective_fits.items():
        rows = [x for x in r.collectives if x.collective == name]
        ratios = [fit.predict(name, x.bytes, x.nproc) / x.seconds for x in rows]
        # Most points within 3x: noise on a shared machine can spoil a point or two, so no single
        # measured point is asserted (the fit's math is checked exactly on synthetic data below).
        assert statistics.median(abs(math.log(q)) for q in ratios) < math.log(3), (name, ratios)
    # Scales against the M8 preset's link for 2 devices (NVLink: α 5 µs, β 1/130 GB/s).
    link = weft.DeviceMesh.iota([2]).axis_links(weft.Cluster.preset("M8"))[0]
    assert r.reference_link == (link.alpha, link.beta)
    assert r.alpha_scale == pytest.approx(r.link_fit.alpha / link.alpha, rel=1e-12)
    assert r.beta_scale == pytest.approx(r.link_fit.beta / link.beta, rel=1e-12)
    cal = r.calibration
    scaled = cal.alpha_scale * link.alpha * 2 + cal.beta_scale * link.beta * (1 << 20)  # all-reduce, n = 2
    assert weft.collective_time("all-reduce", link, 1 << 20, cal) == pytest.approx(scaled, rel=1e-4)


def test_fit_alpha_beta_recovers_exact_data():
    alpha, beta = 30e-6, 1 / 5e9
    rows = []
    for name, n in (("all_reduce", 4), ("all_gather", 4), ("reduce_scatter", 4), ("send_recv", 2)):
        for b in (1 << 10, 1 << 16, 1 << 22):
            ca, cb = collective_coefficients(name, n)
            rows.append(CollectiveTiming(name, name, b, ca * alpha + cb * b * beta, n))
    fit = fit_alpha_beta(rows)
    assert isinstance(fit, AlphaBetaFit)
    assert fit.alpha == pytest.approx(alpha, rel=1e-6) and fit.beta == pytest.approx(beta, rel=1e-6)
    assert fit.max_rel_error < 1e-6 and fit.points == len(rows)
    # Pure bandwidth data: α must come out 0, not negative.
    flat = [CollectiveTiming("send_recv", "send/recv", b, b * beta, 2) for b in (1 << 10, 1 << 20)]
    assert fit_alpha_beta(flat).alpha == pytest.approx(0, abs=1e-15)
    with pytest.raises(ValueError, match="at least one"):
        fit_alpha_beta([])
    with pytest.raises(ValueError, match="unknown collective"):
        collective_coefficients("gossip", 2)


def timings_of(truth, shapes, dtype, peak):
    """The MatmulTiming rows a device whose efficiency is exactly ``truth`` would give."""
    rows = []
    for m, k, n in shapes:
        flops = 2.0 * m * k * n
        s = flops / (peak * truth.at(m, k, n))
        rows.append(MatmulTiming(m, k, n, dtype, s, flops, flops / s))
    return rows


@pytest.mark.parametrize("ceiling,fill,half_k", [(0.74, 2.3e6, 197.0), (0.5, 0.0, 36.0), (0.9, 5e4, 0.0)])
def test_fit_matmul_efficiency_recovers_a_known_curve(ceiling, fill, half_k):
    # Timings made from a known curve (the H100 bf16 default, and curves without one of the
    # penalties) on the GPU calibration's shapes: the fit recovers the curve and predicts every time.
    peak = 989e12
    truth = weft.MatmulEfficiency(ceiling, fill, half_k)
    shapes = [(2048, 2048, 2048), (4096, 4096, 4096), (8192, 8192, 8192), (8192, 4096, 16384),
              (16384, 4096, 16384), (8192, 16384, 4096), (8192, 4096, 4096), (256, 8192, 8192),
              (8192, 8192, 512), (8192, 128, 8192), (16384, 64, 16384), (64, 4096, 1024), (128, 64, 128)]
    rows = timings_of(truth, shapes, "bf16", peak)
    fit = fit_matmul_efficiency(rows, peak)
    assert fit.rms_log_error < 0.01 < fit.constant_rms_log_error
    assert fit.ceiling == pytest.approx(ceiling, rel=0.02)
    for m, k, n in shapes:
        assert fit.efficiency(m, k, n) == pytest.approx(truth.at(m, k, n), rel=0.03)
    # Deterministic, and refuses what it cannot fit.
    assert fit_matmul_efficiency(rows, peak) == fit
    with pytest.raises(ValueError, match="one dtype"):
        fit_matmul_efficiency(rows + [MatmulTiming(64, 64, 64, "f32", 1e-6, 5e5, 5e11)], peak)
    with pytest.raises(ValueError, match="peak_flops"):
        fit_matmul_efficiency(rows, 0.0)


def test_the_fitted_curve_has_a_floor_at_its_smallest_shape():
    """Issue 36: a curve fitted on 256^3 and up is not extrapolated to shapes far smaller (the tiny
    GEMMs of a pipeline's micro-batches): below the smallest timed shape it stays at the curve's
    value there, through the JSON and the planner's cluster."""
    peak = 1e12
    truth = weft.MatmulEfficiency(0.8, 4e6, 64.0)
    shapes = [(256, 256, 256), (512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (1024, 256, 1024),
              (2048, 256, 1024), (1024, 1024, 256)]
    fit = fit_matmul_efficiency(timings_of(truth, shapes, "f32", peak), peak)
    at_smallest = min(fit.efficiency(m, k, n) for m, k, n in shapes)
    assert fit.floor == pytest.approx(at_smallest, rel=1e-9) and fit.floor > 0
    assert fit.smallest == (256.0 * 256, 256.0)
    # far below the timed shapes: the floor, where the unfloored curve would say ~1000x less
    tiny = (8, 16, 8)
    unfloored = fit.ceiling * (8 * 8 / fit.fill_elements) * (16 / (16 + fit.half_k))
    assert unfloored < fit.floor / 100
    assert fit.efficiency(*tiny) == fit.floor
    curve = weft.Calibration.from_json(json.dumps({"matmul_efficiency": {"cpu": {"f32": fit.curve()}}}))
    got = curve.matmul_efficiency["cpu"]["f32"]
    assert got.floor == pytest.approx(fit.floor, rel=1e-3)
    assert got.at(*tiny) == pytest.approx(fit.floor, rel=1e-3)
    assert got.at(2048, 2048, 2048) == pytest.approx(fit.efficiency(2048, 2048, 2048), rel=1e-3)
    with pytest.raises(ValueError, match="floor"):
        weft.Calibration.from_json(json.dumps({"matmul_efficiency": {"cpu": {"f32": {"ceiling": 0.5, "floor": 0.6}}}}))
    with pytest.raises(ValueError, match="floor"):
        weft.MatmulEfficiency(0.5, 0.0, 0.0, 0.7)


def test_a_fitted_curve_reaches_the_planner_through_the_calibration_json():
    truth = weft.MatmulEfficiency(0.4, 4e6, 400.0)  # below the A100 preset's curve at every shape
    shapes = [(2048, 2048, 2048), (4096, 4096, 4096), (256, 8192, 8192), (8192, 128, 8192), (8192, 8192, 512),
              (16384, 64, 16384)]
    fit = fit_matmul_efficiency(timings_of(truth, shapes, "bf16", 312e12), 312e12)
    doc = {"matmul_efficiency": {"A100-SXM4-80GB": {"bf16": fit.curve()}}}
    cal = weft.Calibration.from_json(json.dumps(doc))
    got = cal.matmul_efficiency["A100-SXM4-80GB"]["bf16"]
    assert got.ceiling == pytest.approx(0.4, rel=0.02)
    c = weft.Cluster.preset("DGX-A100", nodes=1)
    g = weft.models.gpt(layers=2, hidden=256, heads=4, seq=64, vocab=512, batch=8, dtype="bf16").train_step()
    # A slower curve than the preset's (ceiling 0.79, fill 1.9e6, half_k 197) makes the same layout slower.
    base = weft.layout_plan(g, c, [(0, 1, [0])], num_blocks=2)
    slow = weft.layout_plan(g, c, [(0, 1, [0])], num_blocks=2, calibration=cal)
    assert slow.stages[0].forward_time > base.stages[0].forward_time


def test_cli_writes_a_loadable_calibration(tmp_path):
    out, rep = tmp_path / "tmp.json", tmp_path / "report.json"
    env = subprocess_env()
    proc = subprocess.run([sys.executable, "-m", "weft.cli", "calibrate", "--quick", "--device", "cpu",
                           "--out", str(out), "--report", str(rep), "--local-cluster", str(tmp_path / "local.json")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "compute_efficiency" in proc.stdout and f"calibration written to {out}" in proc.stdout
    text = out.read_text()
    cal = weft.Calibration.from_json(text)
    doc = json.loads(text)
    effs = [cal.default_compute_efficiency, cal.default_memory_efficiency]
    for kind, v in doc["compute_efficiency"].items():
        effs += list(v.values()) if isinstance(v, dict) else [v]
    effs += list(doc["memory_efficiency"].values())
    assert all(0 < e <= 1.5 for e in effs), effs
    assert cal.kernel_overhead >= 0
    assert cal.alpha_scale == 1.0 and cal.beta_scale == 1.0  # no --cluster: raw α, β in the report
    report = json.loads(rep.read_text())
    assert report["calibration"] == doc and report["measurements"]["matmul"]
    assert report["fits"]["link"]["alpha"] > 0
    # --local-cluster: this host as 2 devices (--nproc's default) linked by the fitted β and α (at
    # least the small all-reduce's cost between compute over 2(n - 1)).
    local = weft.Cluster.from_json((tmp_path / "local.json").read_text())
    link = weft.DeviceMesh.iota([2]).axis_links(local)[0]
    assert local.num_devices == 2
    alpha = max(report["fits"]["link"]["alpha"], report["run"]["collective_latency_s"] / 2)
    assert (link.alpha, link.beta) == pytest.approx((alpha, report["fits"]["link"]["beta"]), rel=1e-9)


def test_cli_rejects_bad_input(tmp_path):
    env = subprocess_env()
    proc = subprocess.run([sys.executable, "-m", "weft.cli", "calibrate", "--nproc", "0", "--out",
                           str(tmp_path / "x.json")], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "nproc must be >= 1" in proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_import_weft_without_torch():
    # torch is imported inside weft.calibrate's functions: weft imports without it, and calibrate
    # says what is missing.
    code = ("import sys; sys.modules['torch'] = None\n"
            "import weft\n"
            "from weft.calibration import fit_alpha_beta\n"
            "try:\n    weft.calibrate(quick=True)\nexcept ImportError as e:\n    print('ImportError:', e)\n")
    env = subprocess_env()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "ImportError: weft.calibrate needs PyTorch" in proc.stdout


def test_collectives_time_out_instead_of_hanging():
    # Far too short for spawning processes: the workers are killed, the rest of the report stays.
    t0 = time.perf_counter()
    r = weft.calibrate(device="cpu", nproc=2, quick=True, dtypes=("f32",), threads=1, timeout_s=0.3)
    assert time.perf_counter() - t0 < 20
    assert r.collectives == [] and r.alpha_scale == 1.0 and r.matmuls
    assert any("timed out" in n for n in r.notes), r.notes
    weft.Calibration.from_json(r.to_json())


def test_single_process_skips_collectives():
    r = weft.calibrate(device="cpu", nproc=1, quick=True, dtypes=("f32",), threads=1)
    assert r.collectives == [] and r.link_fit is None and r.alpha_scale == 1.0 and r.beta_scale == 1.0
    assert any("nproc=1" in n for n in r.notes)
    assert set(r.compute_efficiency) == {"f32"}
    r2 = weft.calibrate(device="cpu", nproc=2, quick=True, dtypes="f64", collectives=False)
    assert r2.collectives == [] and set(r2.compute_efficiency) == {"f64"}


def test_a_busy_machine_is_warned_about(monkeypatch):
    """Issue 36: timings taken while the host is loaded measure the load as much as the device; the
    calibration says so loudly (a RuntimeWarning, and a note in the report), not only in the notes."""
    import weft.calibration as cal

    monkeypatch.setattr(cal, "_load_average", lambda: 4.0 * (os.cpu_count() or 1))
    with pytest.warns(RuntimeWarning, match="the machine was busy"):
        r = weft.calibrate(device="cpu", nproc=1, quick=True, dtypes=("f32",), threads=1)
    assert any("busy" in n for n in r.notes)
    monkeypatch.setattr(cal, "_load_average", lambda: 0.0)
    monkeypatch.setattr(cal, "SPREAD_LIMIT", math.inf)  # this test is the load average's (the spread's: below)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        r = weft.calibrate(device="cpu", nproc=1, quick=True, dtypes=("f32",), threads=1)
    assert not any("busy" in n for n in r.notes)


def test_timing_spread_by_hand():
    from weft.calibration import timing_spread

    # quartiles (inclusive) of 1, 2, 3, 4, 5: 2 and 4; median 3 -> (4 - 2) / 3
    assert timing_spread([5.0, 1.0, 3.0, 2.0, 4.0]) == pytest.approx(2.0 / 3.0, rel=1e-12)
    assert timing_spread([2.0] * 7) == 0.0
    assert timing_spread([1.0]) == 0.0


def test_scattered_timings_are_warned_about(monkeypatch):
    """Issue 36: the load average lags a minute behind; repeated timings that scatter (a median
    interquartile spread above SPREAD_LIMIT over the matmuls and memory ops) say the host is loaded
    from inside the measurement."""
    import weft.calibration as cal

    monkeypatch.setattr(cal, "_load_average", lambda: 0.0)
    monkeypatch.setattr(cal, "timing_spread", lambda samples: 2 * cal.SPREAD_LIMIT)
    with pytest.warns(RuntimeWarning, match="scattered by"):
        r = weft.calibrate(device="cpu", nproc=1, quick=True, dtypes=("f32",), threads=1)
    assert any("busy" in n and "scattered" in n for n in r.notes)
    assert all(x.spread == 2 * cal.SPREAD_LIMIT for x in [*r.matmuls, *r.memory_ops])
    monkeypatch.setattr(cal, "timing_spread", lambda samples: 0.5 * cal.SPREAD_LIMIT)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        r = weft.calibrate(device="cpu", nproc=1, quick=True, dtypes=("f32",), threads=1)
    assert not any("busy" in n for n in r.notes)


def test_local_cluster_is_this_host_as_measured(quick_cpu):
    """Issue 36: ``local_cluster()`` is N processes on this host as a weft.Cluster: the devices price
    ops with the measured peaks and curves (and weft's runtime's per-op cost), the link is the fitted
    α, β, and N processes share the cores and the host's memory."""
    r, _ = quick_cpu
    assert r.cores == (os.cpu_count() or 1) and r.threads == 1
    assert r.runtime_overhead_s > 0
    c = r.local_cluster()
    assert c.num_devices == r.nproc == 2 and c.homogeneous
    node = c.nodes[0]
    # the 2 processes computing at once: each slower by the measured factor (cores, memory shared)
    assert r.concurrent_slowdown >= 1.0
    share = 1.0 / r.concurrent_slowdown
    for t, p in r.reference_peak_flops.items():
        assert node.device.peak_flops[t] == pytest.approx(p * share, rel=1e-12)
    assert node.device.memory_bytes == pytest.approx(r.memory_bytes / 2, rel=1e-12)
    assert node.device.memory_bandwidth == pytest.approx(r.reference_memory_bandwidth * share, rel=1e-12)
    assert node.device.kernel_overhead == pytest.approx(max(r.kernel_overhead_s, r.runtime_overhead_s), rel=1e-12)
    # The link: the fitted β, and α at least what makes a small all-reduce cost what it adds between
    # two pieces of compute (2(n - 1)α = collective_latency_s for n = 2).
    assert r.collective_latency_s > 0
    alpha = max(r.link_fit.alpha, r.collective_latency_s / 2)
    link = weft.DeviceMesh.iota([2]).axis_links(c)[0]
    assert (link.alpha, link.beta) == pytest.approx((alpha, r.link_fit.beta), rel=1e-12)
    # Each collective's bandwidth term scaled by the median of measured / the joint fit's prediction
    # over its timings of >= 256 KiB (gloo's implementations differ), clamped to [1/4, 8].
    import statistics

    import weft.calibration as cal

    fac = node.collective_factors
    for name, key in (("all_reduce", "all_reduce"), ("all_gather", "all_gather"),
                      ("reduce_scatter", "reduce_scatter"), ("send_recv", "p2p")):
        big = [x for x in r.collectives if x.collective == name and x.bytes >= cal.FACTOR_MIN_BYTES]
        assert big
        ca, cb = cal.collective_coefficients(name, 2)
        ratio = statistics.median(x.seconds / (ca * r.link_fit.alpha + cb * x.bytes * r.link_fit.beta) for x in big)
        assert fac[key] == pytest.approx(min(8.0, max(0.25, ratio)), rel=1e-12)
    assert fac["all_to_all"] == 1.0  # not measured: the ring's
    for nbytes in (1 << 12, 1 << 20):  # the ring all-reduce on 2 devices: 2α + B·β (× its factor)
        assert weft.collective_time("all-reduce", link, nbytes) == pytest.approx(
            2 * alpha + nbytes * r.link_fit.beta * fac["all_reduce"], rel=1e-9)
        assert weft.collective_time("reduce-scatter", link, nbytes) == pytest.approx(
            alpha + nbytes / 2 * r.link_fit.beta * fac["reduce_scatter"], rel=1e-9)
    # Compute on a local device: the shared peak times the measured ceiling (the curve's, or the
    # constant efficiency), plus the per-op cost.
    ceiling = r.matmul_curves["f32"].ceiling if "f32" in r.matmul_curves else r.compute_efficiency["f32"]
    expected = 1e9 / (r.reference_peak_flops["f32"] * share * ceiling) + node.device.kernel_overhead
    assert weft.compute_time(1e9, 0, "f32", c.device(0)) == pytest.approx(expected, rel=1e-5)
    # Four processes: each a quarter of the memory (and of the cores, on a host with fewer than 4).
    c4 = r.local_cluster(4)
    assert c4.num_devices == 4
    assert c4.nodes[0].device.memory_bytes == pytest.approx(r.memory_bytes / 4, rel=1e-12)
    assert c4.nodes[0].device.peak_flops["f32"] == pytest.approx(
        r.reference_peak_flops["f32"] * min(1.0, r.cores / 4), rel=1e-12)
    with pytest.raises(ValueError, match="nproc must be an int >= 1"):
        r.local_cluster(0)


def test_local_cluster_needs_the_link():
    r = weft.calibrate(device="cpu", nproc=1, quick=True, dtypes=("f32",), threads=1)
    assert r.local_cluster().num_devices == 1  # one process: no link needed
    with pytest.raises(ValueError, match="measured no collectives"):
        r.local_cluster(2)


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="device must be one of"):
        weft.calibrate(device="tpu")
    with pytest.raises(ValueError, match="nproc must be >= 1"):
        weft.calibrate(nproc=0)
    with pytest.raises(TypeError, match="nproc must be an int"):
        weft.calibrate(nproc="2")
    with pytest.raises(ValueError, match="unknown dtype 'f8'"):
        weft.calibrate(dtypes=("f32", "f8"))
    with pytest.raises(ValueError, match="dtypes is empty"):
        weft.calibrate(dtypes=())
    with pytest.raises(ValueError, match="backend must be"):
        weft.calibrate(backend="smoke-signals")
    with pytest.raises(TypeError, match="cluster must be a weft.Cluster"):
        weft.calibrate(cluster="M8")
    with pytest.raises(TypeError, match="device_spec must be a weft.DeviceSpec"):
        weft.calibrate(device_spec={"f32": 1e12})
    with pytest.raises(ValueError, match="fewer than nproc=2"):
        weft.calibrate(cluster=weft.Cluster.preset("S1"), nproc=2)  # S1: one GPU
    with pytest.raises(ValueError, match="threads must be"):
        weft.calibrate(threads=0)
    with pytest.raises(ValueError, match="nccl backend needs device='cuda'"):
        weft.calibrate(device="cpu", backend="nccl")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_requested_without_gpu():
    with pytest.raises(ValueError, match="no CUDA GPU"):
        weft.calibrate(device="cuda", quick=True)


def test_gpu_names_match_preset_kinds_conservatively():
    specs = [weft.Cluster.preset(n).nodes[0].device for n in weft.Cluster.preset_names()]
    gib = 1 << 30

    def kind(name, mem_gib):
        spec = match_device_kind(name, mem_gib * gib, specs)
        return spec.kind if spec else None

    assert kind("NVIDIA H100 80GB HBM3", 79.1) == "H100-SXM5-80GB"
    assert kind("NVIDIA A100-SXM4-80GB", 79.2) == "A100-SXM4-80GB"
    assert kind("Tesla V100-SXM2-32GB", 31.7) == "V100-SXM2-32GB"
    assert kind("Tesla V100-SXM2-16GB", 15.8) == "V100-SXM2-16GB"
    assert kind("Tesla T4", 14.7) == "T4-16GB"
    assert kind("NVIDIA H200", 139.8) == "H200-SXM-141GB"  # its own preset, not an H100's
    assert kind("NVIDIA H100 PCIe", 79.6) is None      # another form factor, other peaks
    assert kind("NVIDIA A100-SXM4-40GB", 39.4) is None  # other memory, other bandwidth
    assert kind("NVIDIA GeForce RTX 4090", 23.6) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_quick_cuda_calibration():
    r = weft.calibrate(device="cuda", nproc=min(2, torch.cuda.device_count()), quick=True)
    assert r.device == "cuda" and r.matmuls and r.memory_ops
    assert {x.dtype for x in r.matmuls} == {"f32", "bf16", "f16"}
    for t, e in r.compute_efficiency.items():
        assert 0 < e <= 1.5, (t, e)  # against a datasheet peak when the GPU is a known kind
    assert 0 < r.memory_efficiency <= 1.5
    assert 0 < r.kernel_overhead_s < 1e-3
    weft.Calibration.from_json(r.to_json())
    if torch.cuda.device_count() >= 2:
        assert r.backend == "nccl" and r.link_fit is not None
