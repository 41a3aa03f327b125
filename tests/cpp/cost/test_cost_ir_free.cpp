// Closed-form checks of the IR-independent cost model: roofline, collectives, calibration.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "weft/cluster/cluster.hpp"
#include "weft/core/error.hpp"
#include "weft/cost/calibration.hpp"
#include "weft/cost/collectives.hpp"
#include "weft/cost/roofline.hpp"

using namespace weft::cost;
using weft::DType;
using weft::cluster::Cluster;
using weft::cluster::DeviceMesh;

TEST_CASE("roofline: compute-bound matmul and memory-bound elementwise on V100") {
  const auto dev = Cluster::preset("M8").device(0);
  // 4096^3 matmul in f16: 2·4096^3 FLOPs, 3·4096^2·2 bytes.
  const double f = 2.0 * 4096 * 4096 * 4096, b = 3.0 * 4096 * 4096 * 2;
  // The preset's efficiency model (Volta: ceiling 0.74, 85% of HBM, 2 us per kernel).
  auto r = roofline(f, b, DType::F16, dev);
  CHECK(r.compute == doctest::Approx(f / (125e12 * 0.74)).epsilon(1e-9));
  CHECK(r.memory == doctest::Approx(b / (900e9 * 0.85)).epsilon(1e-9));
  CHECK(r.compute_bound());
  CHECK(compute_time(f, b, DType::F16, dev) == doctest::Approx(f / (125e12 * 0.74) + 2e-6).epsilon(1e-9));
  // ReLU over 1e8 f32: 1e8 FLOPs, 8e8 bytes -> memory-bound.
  auto e = roofline(1e8, 8e8, DType::F32, dev);
  CHECK_FALSE(e.compute_bound());
  CHECK(e.total == doctest::Approx(8e8 / (900e9 * 0.85) + 2e-6).epsilon(1e-9));
  // The datasheet: 100% of peak, no overhead.
  weft::cluster::Device ds = dev;
  ds.spec = dev.spec.datasheet();
  CHECK(compute_time(f, b, DType::F16, ds) == doctest::Approx(f / 125e12).epsilon(1e-9));
  CHECK(compute_time(1e8, 8e8, DType::F32, ds) == doctest::Approx(8e8 / 900e9).epsilon(1e-9));
  Calibration cal;  // a measured efficiency replaces the preset's ceiling, the overhead its overhead
  cal.default_compute_efficiency = 0.5;
  cal.kernel_overhead = 1e-5;
  CHECK(compute_time(f, b, DType::F16, dev, cal) == doctest::Approx(f / 62.5e12 + 1e-5).epsilon(1e-9));
  CHECK_THROWS_AS(compute_time(f, b, DType::BF16, dev), weft::Error);
  CHECK_THROWS_AS(compute_time(-1, b, DType::F16, dev), weft::Error);
}

TEST_CASE("collectives along mesh axes of 2x DGX-A100 match the closed forms") {
  auto c = Cluster::preset("DGX-A100", 2);
  auto L = calibrated_axis_links(c, DeviceMesh::iota({2, 8}));
  const double B = 256e6;
  const double bi = 1 / 300e9, ai = 3e-6, bo = 8 / 200e9, ao = 5e-6;
  // axis 1: inside a node, n = 8
  CHECK(collective_time(Collective::AllReduce, L[1], B) ==
        doctest::Approx(2 * 7.0 / 8 * B * bi + 14 * ai).epsilon(1e-9));
  CHECK(collective_time(Collective::AllGather, L[1], B) ==
        doctest::Approx(7.0 / 8 * B * bi + 7 * ai).epsilon(1e-9));
  CHECK(collective_time(Collective::ReduceScatter, L[1], B) ==
        doctest::Approx(7.0 / 8 * B * bi + 7 * ai).epsilon(1e-9));
  CHECK(collective_time(Collective::AllToAll, L[1], B) ==
        doctest::Approx(7.0 / 8 * B * bi + 7 * ai).epsilon(1e-9));
  // axis 0: across nodes, n = 2, 8 rings share each node's 200 GB/s
  CHECK(collective_time(Collective::AllReduce, L[0], B) ==
        doctest::Approx(2 * 0.5 * B * bo + 2 * ao).epsilon(1e-9));
  CHECK(collective_time(Collective::P2P, L[0], B) == doctest::Approx(ao + B * bo).epsilon(1e-9));
  Calibration cal = Calibration::from_json(R"({"beta_scale": 2.0, "alpha_scale": 0.5})");
  CHECK(collective_time(Collective::AllReduce, L[0], B, cal) ==
        doctest::Approx(2 * 0.5 * B * 2 * bo + ao).epsilon(1e-9));
  CHECK(parse_collective("all_reduce") == Collective::AllReduce);
  CHECK_THROWS_AS(parse_collective("gossip"), weft::Error);
}

TEST_CASE("calibration JSON round trip and errors") {
  auto c = Calibration::from_json(
      R"({"compute_efficiency": {"default": 0.7, "V100-SXM2-32GB": {"f16": 0.55}},
          "memory_efficiency": {"A100-SXM4-80GB": 0.9}, "kernel_overhead_s": 4e-6, "beta_scale": 1.1})");
  CHECK(c.compute_eff("V100-SXM2-32GB", DType::F16) == 0.55);
  CHECK(c.compute_eff("V100-SXM2-32GB", DType::F32) == 0.7);
  CHECK(c.memory_eff("A100-SXM4-80GB") == 0.9);
  CHECK(c.memory_eff("T4-16GB") == 1.0);
  CHECK(Calibration::from_json(c.to_json()) == c);
  CHECK_THROWS_AS(Calibration::from_json(R"({"beta_scale": 0})"), weft::Error);
  CHECK_THROWS_AS(Calibration::from_json(R"({"gamma": 1})"), weft::Error);
  CHECK_THROWS_AS(Calibration::from_json("[1"), weft::Error);
}

TEST_CASE("matmul efficiency: the floor holds below the fitted shapes, through both JSONs") {
  weft::cluster::MatmulEfficiency e{0.8, 4e6, 64, 0.05};
  const weft::cluster::MatmulEfficiency free{0.8, 4e6, 64, 0};
  CHECK(free.at(64, 16) < 0.001);                // extrapolated towards 0
  CHECK(e.at(64, 16) == 0.05);                   // held at the floor
  CHECK(e.at(1e7, 4096) == free.at(1e7, 4096));  // above it, the curve
  auto c = Calibration::from_json(
      R"({"matmul_efficiency": {"cpu": {"f32": {"ceiling": 0.8, "fill_elements": 4e6, "half_k": 64, "floor": 0.05}}}})");
  CHECK(c.matmul_efficiency.at("cpu").at(DType::F32) == e);
  CHECK(Calibration::from_json(c.to_json()) == c);
  CHECK_THROWS_AS(
      Calibration::from_json(R"({"matmul_efficiency": {"cpu": {"f32": {"ceiling": 0.5, "floor": 0.6}}}})"),
      weft::Error);
  auto cl = weft::cluster::Cluster::preset("M8", 1);
  auto j = nlohmann::json::parse(cl.to_json());
  j["nodes"][0]["device"]["matmul_efficiency"]["f32"]["floor"] = 0.05;
  const auto back = weft::cluster::Cluster::from_json(j.dump());
  CHECK(back.device(0).spec.matmul_efficiency.at(DType::F32).floor == 0.05);
  CHECK(nlohmann::json::parse(back.to_json())["nodes"][0]["device"]["matmul_efficiency"]["f32"]["floor"] ==
        0.05);
}
