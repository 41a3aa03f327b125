"""Plans priced with a calibration (weft.plan(..., calibration=...), weft plan --calibration): the
cluster as measured — efficiencies, kernel overhead, α/β scales — by hand, and the planner's times
follow it exactly."""
import json
import subprocess
import sys

import pytest

import weft
from weft_env import subprocess_env

HALF = {"compute_efficiency": {"default": 0.5}, "memory_efficiency": {"default": 0.5},
        "alpha_scale": 2.0, "beta_scale": 2.0}


def test_calibrated_cluster_by_hand():
    cal = {"compute_efficiency": {"default": 0.8, "V100-SXM2-32GB": {"f16": 0.4}},
           "memory_efficiency": {"default": 0.9}, "kernel_overhead_s": 5e-6, "alpha_scale": 1.5, "beta_scale": 1.25}
    c = weft.calibrated_cluster(weft.Cluster.preset("M8", nodes=2), cal)
    spec = c.nodes[0].device
    assert spec.peak("f16") == pytest.approx(125e12 * 0.4)
    assert spec.peak("f32") == pytest.approx(15.7e12 * 0.8)  # the default efficiency for other dtypes
    assert spec.memory_bandwidth == pytest.approx(900e9 * 0.9)
    assert spec.memory_bytes == 32 * 2**30  # capacity unchanged
    assert spec.kernel_overhead == pytest.approx(5e-6)
    n = c.nodes[0]
    assert n.nic_latency == pytest.approx(10e-6 * 1.5) and n.nic_bandwidth == pytest.approx(12.5e9 / 1.25)
    assert n.intra_latency == pytest.approx(5e-6 * 1.5) and n.intra_bandwidth == pytest.approx(130e9 / 1.25)
    assert weft.Cluster.from_json(c.to_json()) == c  # the overhead round-trips through the cluster JSON


def test_an_op_costs_its_calibrated_roofline_plus_overhead():
    # One f32 matmul on one V100 (no communication): the SPMD cost is its roofline time.
    g = weft.Graph("mm")
    x, w = g.input("x", [512, 1024], "f32"), g.parameter("w", [1024, 1024], "f32")
    g.set_loss(g.reduce("sum", g.matmul(x, w, "mm"), [0, 1], "loss"))
    flops = 2 * 512 * 1024 * 1024
    mesh = weft.DeviceMesh([1], [0])
    # The preset's efficiency model by hand: the matmul's local GEMM is 512 x 1024 @ 1024 x 1024
    # (fills the V100's 80 SMs: 512·1024 > 0.48M·80/132), so e = 0.74 · 1024 / (1024 + 36); the sum
    # is memory-bound at 85 % of HBM; 2 us per kernel.
    real = weft.spmd_search(g, weft.Cluster.preset("M8"), mesh, level="O3")
    e = 0.74 * 1024 / (1024 + 36)
    by_hand = flops / (15.7e12 * e) + (512 * 1024 * 4 + 4) / (900e9 * 0.85) + 2 * 2e-6
    assert real.cost == pytest.approx(by_hand, rel=1e-9)
    c = weft.Cluster.preset("M8").datasheet()  # the calibration on the datasheet: its numbers alone
    cal = {"compute_efficiency": {"default": 0.6}, "kernel_overhead_s": 1e-5}
    plain = weft.spmd_search(g, c, mesh, level="O3")
    calib = weft.spmd_search(g, weft.calibrated_cluster(c, cal), mesh, level="O3")
    reduce_bytes = 512 * 1024 * 4 + 4
    mm_plain = flops / 15.7e12
    red_plain = reduce_bytes / 900e9  # memory-bound sum
    assert plain.cost == pytest.approx(mm_plain + red_plain, rel=1e-9)
    assert calib.cost == pytest.approx(mm_plain / 0.6 + red_plain + 2 * 1e-5, rel=1e-9)


@pytest.fixture(scope="module")
def step():
    return weft.models.gpt(layers=2, hidden=64, heads=4, seq=16, vocab=128, batch=8).train_step()


def test_halving_every_rate_doubles_every_plan_exactly(step):
    # Every time in the model is a rate over an amount: halving every efficiency and doubling α and
    # β doubles compute, memory traffic, collectives, resharding and stage transfers alike, so the
    # same plan comes out at exactly twice the step time (a path that ignored the calibration would
    # break the factor).
    # On the datasheet model (no preset efficiencies or overhead, which HALF would replace rather
    # than halve): the calibration is then the only factor.
    c = weft.Cluster.preset("p3.8xlarge").datasheet()
    a, b = weft.plan(step, c, spmd_time_limit=5), weft.plan(step, c, spmd_time_limit=5, calibration=HALF)
    assert b.strategy == a.strategy and b.step_time == pytest.approx(2 * a.step_time, rel=1e-9)
    for fn, kw in [(weft.megatron_plan, dict(t=2, p=2, d=1, num_microbatches=2)),
                   (weft.data_parallel_plan, dict(shares=[2, 2, 2, 2], num_microbatches=1))]:
        x, y = fn(step, c, **kw), fn(step, c, calibration=HALF, **kw)
        assert y.step_time == pytest.approx(2 * x.step_time, rel=1e-9)
    mixed = weft.Cluster.concat(weft.Cluster.preset("p3.8xlarge"), weft.Cluster.preset("P100")).datasheet()
    h1, h2 = weft.plan(step, mixed, spmd_time_limit=5), weft.plan(step, mixed, spmd_time_limit=5, calibration=HALF)
    assert h2.strategy == h1.strategy and h2.step_time == pytest.approx(2 * h1.step_time, rel=1e-9)


def test_calibration_from_a_file_and_the_command_line(step, tmp_path):
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(HALF))
    c = weft.Cluster.preset("p3.8xlarge")
    by_dict = weft.plan(step, c, spmd_time_limit=5, calibration=HALF)
    by_path = weft.plan(step, c, spmd_time_limit=5, calibration=str(path))
    assert by_path.step_time == by_dict.step_time
    assert weft.plan(step, c, spmd_time_limit=5, calibration=weft.load_calibration(path)).step_time == \
        by_dict.step_time
    model = tmp_path / "step.json"
    model.write_text(step.to_json())

    def cli(*extra):
        out = subprocess.run([sys.executable, "-m", "weft.cli", "plan", "--model", str(model), "--cluster",
                              "p3.8xlarge", "--nodes", "1", "--spmd-time-limit", "5", "--json", "-", *extra],
                             capture_output=True, text=True, env=subprocess_env(), timeout=300)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)["step_time"]

    # The CLI plans on the same calibrated cluster as the Python call (and without one, on the preset).
    assert cli("--calibration", str(path)) == pytest.approx(by_dict.step_time, rel=1e-9)
    assert cli() == pytest.approx(weft.plan(step, c, spmd_time_limit=5).step_time, rel=1e-9)


def test_bad_calibrations_are_named(step, tmp_path):
    c = weft.Cluster.preset("p3.8xlarge")
    with pytest.raises(ValueError, match="must be > 0"):
        weft.plan(step, c, calibration={"compute_efficiency": {"default": 0}})
    with pytest.raises(ValueError, match="does not exist"):
        weft.plan(step, c, calibration=str(tmp_path / "missing.json"))
    with pytest.raises(TypeError, match="calibration must be"):
        weft.plan(step, c, calibration=3)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = subprocess.run([sys.executable, "-m", "weft.cli", "plan", "--calibration", str(bad)],
                         capture_output=True, text=True, env=subprocess_env(), timeout=60)
    assert out.returncode == 2 and "calibration" in out.stderr and "Traceback" not in out.stderr
