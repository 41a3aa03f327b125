// Cluster: nodes of identical GPUs, presets with the papers' hardware, JSON round trip, concat.
// Numbers are vendor datasheet peaks (dense, no sparsity); see docs/modules/cluster.md.
#include "weft/cluster/cluster.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "weft/core/error.hpp"
#include "weft/core/json_reader.hpp"

namespace weft::cluster {
namespace {

constexpr double kT = 1e12;  // TFLOP/s
constexpr double kGB = 1e9;  // GB (decimal) for bandwidths
constexpr double kGiB = 1073741824.0;
constexpr double kGbps = 1e9 / 8;  // Gb/s -> bytes/s

DeviceSpec dev(std::string kind, double f64, double f32, double f16, double bf16, double mem_gib,
               double bw_gbs) {
  DeviceSpec d;
  d.kind = std::move(kind);
  d.peak_flops[DType::F64] = f64 * kT;
  d.peak_flops[DType::F32] = f32 * kT;
  d.peak_flops[DType::F16] = f16 * kT;
  if (bf16 > 0) d.peak_flops[DType::BF16] = bf16 * kT;
  d.memory_bytes = mem_gib * kGiB;
  d.memory_bandwidth = bw_gbs * kGB;
  return d;
}

// The efficiency model of a preset (efficiency.hpp; sources in docs/modules/cost.md, "Defaults").
// Fitted on an H100 (benchmarks/cost/gpu_gemm_sweep.py, 76 GEMM shapes of >= 1 GFLOP per dtype,
// benchmarks/data/gemm_sweep_h100.json): bf16 ceiling 0.74, 2.30M output elements fill the 132
// SMs, half_k 197; f32 (no TF32) 0.74, 0.48M, 36; a dependent kernel costs ~2 us beyond its bytes
// (1M-element add: 5.8 us, 4.2 us of it traffic). Other kinds scale the fill by their SM count;
// their ceilings are their published maximum-achievable-matmul fraction times Hopper's measured
// ratio of the typical large shape to the best one (0.74 / 0.80), or Hopper's where none is
// published.
struct EfficiencyDefaults {
  double tensor_ceiling;  // f16 / bf16
  double vector_ceiling;  // f32 / f64
  int sms;
  double memory_efficiency;
};

void set_efficiency(DeviceSpec& d, const EfficiencyDefaults& e) {
  const double scale = e.sms / 132.0;
  for (const auto& [t, peak] : d.peak_flops) {
    (void)peak;
    const bool tensor = t == DType::F16 || t == DType::BF16;
    d.matmul_efficiency[t] = tensor ? MatmulEfficiency{e.tensor_ceiling, 2.30e6 * scale, 197, 0}
                                    : MatmulEfficiency{e.vector_ceiling, 0.48e6 * scale, 36, 0};
  }
  d.memory_efficiency = e.memory_efficiency;
  d.kernel_overhead = 2e-6;
}

constexpr EfficiencyDefaults kHopper{0.74, 0.74, 132, 0.89};   // measured: H100 (H200: 0.865 HBM)
constexpr EfficiencyDefaults kAmpere{0.79, 0.74, 108, 0.85};   // A100 MAMF 85.9% x 0.74 / 0.80
constexpr EfficiencyDefaults kVolta{0.74, 0.74, 80, 0.85};     // no published MAMF: Hopper's
constexpr EfficiencyDefaults kPascal{0.74, 0.74, 56, 0.85};    // P100: no tensor cores
constexpr EfficiencyDefaults kTuring{0.74, 0.74, 40, 0.85};    // T4

NodeSpec node_preset(std::string_view name) {
  NodeSpec n;
  n.name = std::string(name);
  if (name == "M8") {  // Rhino platform M8: 8x V100-SXM2-32GB, NVLink2, 1x 100G RoCE
    n.num_devices = 8;
    n.device = dev("V100-SXM2-32GB", 7.8, 15.7, 125, 0, 32, 900);
    set_efficiency(n.device, kVolta);
    n.intra = {130 * kGB, 5e-6};  // NVLink2 hybrid cube-mesh, ring bus bandwidth
    n.nic = {100 * kGbps, 10e-6};
  } else if (name == "S1") {  // Rhino platform S1: 1x V100S-PCIE-32GB, 1x 100G RoCE
    n.num_devices = 1;
    n.device = dev("V100S-PCIE-32GB", 8.2, 16.4, 130, 0, 32, 1134);
    set_efficiency(n.device, kVolta);
    n.intra = {12 * kGB, 10e-6};  // unused: one GPU per node
    n.nic = {100 * kGbps, 10e-6};
  } else if (name == "p3.8xlarge") {  // AWS: 4x V100-SXM2-16GB, NVLink, 10 Gbps
    n.num_devices = 4;
    n.device = dev("V100-SXM2-16GB", 7.8, 15.7, 125, 0, 16, 900);
    set_efficiency(n.device, kVolta);
    n.intra = {100 * kGB, 5e-6};
    n.nic = {10 * kGbps, 25e-6};
  } else if (name == "DGX-A100") {  // 8x A100-SXM4-80GB, NVLink3 (300 GB/s/dir), 8x 200 Gb/s HDR
    n.num_devices = 8;
    n.device = dev("A100-SXM4-80GB", 19.5, 19.5, 312, 312, 80, 2039);
    set_efficiency(n.device, kAmpere);
    n.intra = {300 * kGB, 3e-6};
    n.nic = {8 * 200 * kGbps, 5e-6};
  } else if (name == "H100") {  // DGX-H100: 8x H100-SXM5-80GB, NVLink4 (450 GB/s/dir), 8x 400 Gb/s
    n.num_devices = 8;
    n.device = dev("H100-SXM5-80GB", 67, 67, 989, 989, 80, 3350);
    set_efficiency(n.device, kHopper);
    n.intra = {450 * kGB, 3e-6};
    n.nic = {8 * 400 * kGbps, 5e-6};
  } else if (name == "H200") {  // DGX-H200: 8x H200-SXM-141GB (4.8 TB/s HBM3e), NVLink4, 8x 400 Gb/s
    n.num_devices = 8;
    n.device = dev("H200-SXM-141GB", 67, 67, 989, 989, 141, 4800);
    set_efficiency(n.device, {0.74, 0.74, 132, 0.865});
    n.intra = {450 * kGB, 3e-6};
    n.nic = {8 * 400 * kGbps, 5e-6};
  } else if (name == "P100") {  // 8x P100-PCIE-16GB over PCIe 3.0 x16, 100 Gb/s (assumed)
    n.num_devices = 8;
    n.device = dev("P100-PCIE-16GB", 4.7, 9.3, 18.7, 0, 16, 732);
    set_efficiency(n.device, kPascal);
    n.intra = {12 * kGB, 10e-6};
    n.nic = {100 * kGbps, 10e-6};
  } else if (name == "T4") {  // g4dn.12xlarge: 4x T4-16GB over PCIe 3.0, 50 Gb/s
    n.num_devices = 4;
    n.device = dev("T4-16GB", 0.25, 8.1, 65, 0, 16, 320);
    set_efficiency(n.device, kTuring);
    n.intra = {12 * kGB, 10e-6};
    n.nic = {50 * kGbps, 15e-6};
  } else {
    fail("unknown cluster preset '{}' (known: M8, S1, p3.8xlarge, DGX-A100, H100, H200, P100, T4)", name);
  }
  return n;
}

void check_link(const LinkSpec& l, const std::string& what) {
  WEFT_CHECK(std::isfinite(l.bandwidth) && l.bandwidth > 0,
             "{}: link bandwidth must be finite and > 0 (got {})", what, l.bandwidth);
  WEFT_CHECK(std::isfinite(l.latency) && l.latency >= 0, "{}: link latency must be finite and >= 0 (got {})",
             what, l.latency);
}

void check_device_count(std::int64_t n, std::string_view what) {
  WEFT_CHECK(n <= Cluster::kMaxDevices, "{}: {} devices is more than weft models (at most {})", what, n,
             Cluster::kMaxDevices);
}

}  // namespace

double DeviceSpec::peak(DType t) const {
  auto it = peak_flops.find(t);
  WEFT_CHECK(it != peak_flops.end(), "device '{}' has no peak FLOP/s for dtype {}", kind, dtype_name(t));
  return it->second;
}

const MatmulEfficiency& DeviceSpec::matmul(DType t) const {
  static const MatmulEfficiency kDatasheet{};
  auto it = matmul_efficiency.find(t);
  return it != matmul_efficiency.end() ? it->second : kDatasheet;
}

DeviceSpec DeviceSpec::datasheet() const {
  DeviceSpec d = *this;
  d.matmul_efficiency.clear();
  d.memory_efficiency = 1.0;
  d.kernel_overhead = 0;
  return d;
}

Cluster Cluster::datasheet() const {
  std::vector<NodeSpec> nodes = nodes_;
  for (NodeSpec& n : nodes) n.device = n.device.datasheet();
  return Cluster(std::move(nodes));
}

Cluster::Cluster(std::vector<NodeSpec> nodes) : nodes_(std::move(nodes)) {
  WEFT_CHECK(!nodes_.empty(), "a cluster needs at least one node");
  std::int64_t total = 0;
  for (const NodeSpec& n : nodes_) total += std::max(n.num_devices, 0);
  check_device_count(total, "cluster");
  int id = 0;
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const NodeSpec& n = nodes_[i];
    const std::string what = fmt::format("node {} ('{}')", i, n.name);
    WEFT_CHECK(n.num_devices >= 1, "{}: num_devices must be >= 1 (got {})", what, n.num_devices);
    WEFT_CHECK(std::isfinite(n.device.memory_bytes) && n.device.memory_bytes > 0,
               "{}: device memory must be finite and > 0 (got {})", what, n.device.memory_bytes);
    WEFT_CHECK(std::isfinite(n.device.memory_bandwidth) && n.device.memory_bandwidth > 0,
               "{}: device memory bandwidth must be finite and > 0 (got {})", what,
               n.device.memory_bandwidth);
    WEFT_CHECK(std::isfinite(n.device.kernel_overhead) && n.device.kernel_overhead >= 0,
               "{}: kernel overhead must be finite and >= 0 s (got {})", what, n.device.kernel_overhead);
    WEFT_CHECK(!n.device.peak_flops.empty(), "{}: device needs at least one peak FLOP/s entry", what);
    WEFT_CHECK(n.device.memory_efficiency > 0 && n.device.memory_efficiency <= 1,
               "{}: memory efficiency must be in (0, 1] (got {})", what, n.device.memory_efficiency);
    for (const auto& [t, e] : n.device.matmul_efficiency)
      WEFT_CHECK(e.ceiling > 0 && e.ceiling <= 1 && std::isfinite(e.fill_elements) && e.fill_elements >= 0 &&
                     std::isfinite(e.half_k) && e.half_k >= 0 && e.floor >= 0 && e.floor <= e.ceiling,
                 "{}: matmul efficiency for {} needs 0 < ceiling <= 1, fill_elements >= 0, half_k >= 0, "
                 "0 <= floor <= ceiling (got {}, {}, {}, {})",
                 what, dtype_name(t), e.ceiling, e.fill_elements, e.half_k, e.floor);
    for (auto& [t, f] : n.device.peak_flops)
      WEFT_CHECK(std::isfinite(f) && f > 0, "{}: peak FLOP/s for {} must be finite and > 0 (got {})", what,
                 dtype_name(t), f);
    check_link(n.intra, what + " intra-node link");
    check_link(n.nic, what + " NIC");
    const auto& f = n.collective_factors;
    for (double x : {f.all_reduce, f.all_gather, f.reduce_scatter, f.all_to_all, f.p2p})
      WEFT_CHECK(std::isfinite(x) && x > 0, "{}: collective factors must be finite and > 0 (got {})", what,
                 x);
    for (int d = 0; d < n.num_devices; ++d) devices_.push_back(Device{id++, static_cast<int>(i), n.device});
  }
}

Cluster Cluster::preset(std::string_view name, int nodes) {
  WEFT_CHECK(nodes >= 1, "preset '{}': nodes must be >= 1 (got {})", name, nodes);
  NodeSpec n = node_preset(name);
  check_device_count(static_cast<std::int64_t>(nodes) * n.num_devices,
                     fmt::format("preset '{}' x {}", name, nodes));
  return Cluster(std::vector<NodeSpec>(static_cast<std::size_t>(nodes), n));
}

std::vector<std::string> Cluster::preset_names() {
  return {"M8", "S1", "p3.8xlarge", "DGX-A100", "H100", "H200", "P100", "T4"};
}

Cluster Cluster::concat(const Cluster& a, const Cluster& b) {
  std::vector<NodeSpec> n = a.nodes_;
  n.insert(n.end(), b.nodes_.begin(), b.nodes_.end());
  return Cluster(std::move(n));
}

const Device& Cluster::device(int id) const {
  WEFT_CHECK(id >= 0 && id < num_devices(), "device id {} out of range [0, {})", id, num_devices());
  return devices_[static_cast<std::size_t>(id)];
}
int Cluster::node_of(int device_id) const { return device(device_id).node; }
const LinkSpec& Cluster::intra_link(int node) const {
  WEFT_CHECK(node >= 0 && node < num_nodes(), "node {} out of range [0, {})", node, num_nodes());
  return nodes_[static_cast<std::size_t>(node)].intra;
}
const LinkSpec& Cluster::nic(int node) const {
  WEFT_CHECK(node >= 0 && node < num_nodes(), "node {} out of range [0, {})", node, num_nodes());
  return nodes_[static_cast<std::size_t>(node)].nic;
}
std::vector<int> Cluster::devices_of_node(int node) const {
  WEFT_CHECK(node >= 0 && node < num_nodes(), "node {} out of range [0, {})", node, num_nodes());
  std::vector<int> r;
  for (const Device& d : devices_)
    if (d.node == node) r.push_back(d.id);
  return r;
}
bool Cluster::homogeneous() const {
  for (const NodeSpec& n : nodes_)
    if (!(n == nodes_.front())) return false;
  return true;
}

std::string Cluster::to_string() const {
  std::string s = "Cluster(";
  std::size_t i = 0;
  while (i < nodes_.size()) {
    std::size_t j = i;
    while (j < nodes_.size() && nodes_[j] == nodes_[i]) ++j;
    if (i) s += " + ";
    s += fmt::format("{}x {}[{}x {}]", j - i, nodes_[i].name, nodes_[i].num_devices, nodes_[i].device.kind);
    i = j;
  }
  return s + ")";
}

// JSON: {"nodes": [{"name", "count" (optional, repeats the node), "num_devices",
//   "device": {"kind", "peak_flops": {"f32": ..}, "memory_bytes", "memory_bandwidth",
//              "kernel_overhead" (optional, s per op), "memory_efficiency" (optional, (0, 1]),
//              "matmul_efficiency" (optional): {"bf16": {"ceiling", "fill_elements", "half_k"}}},
//   "intra": {"bandwidth", "latency"}, "nic": {...}} | {"preset": "M8", "count": 2}]}
Cluster Cluster::from_json(std::string_view text) {
  constexpr JsonReader r("cluster JSON");
  const auto j = r.parse(text);
  const auto& jnodes = r.array(r.at(j, "nodes", "$"), "$.nodes");
  std::vector<NodeSpec> nodes;
  std::int64_t total = 0;
  for (std::size_t i = 0; i < jnodes.size(); ++i) {
    const std::string p = JsonReader::index("$.nodes", i);
    const auto& jn = r.object(jnodes[i], p);
    const int count = r.field_or<int>(jn, "count", p, 1);
    if (count < 1) r.bad(p + ".count", fmt::format("must be >= 1, got {}", count));
    NodeSpec n;
    if (jn.contains("preset")) {
      n = node_preset(r.field<std::string>(jn, "preset", p));
    } else {
      n.name = r.field_or<std::string>(jn, "name", p, "node");
      n.num_devices = r.field<int>(jn, "num_devices", p);
      if (n.num_devices < 1) r.bad(p + ".num_devices", fmt::format("must be >= 1, got {}", n.num_devices));
      const std::string pd = p + ".device";
      const auto& jd = r.at(jn, "device", p);
      n.device.kind = r.field<std::string>(jd, "kind", pd);
      const auto& pf = r.object(r.at(jd, "peak_flops", pd), pd + ".peak_flops");
      for (auto it = pf.begin(); it != pf.end(); ++it) {
        const DType t = [&] {
          try {
            return parse_dtype(it.key());
          } catch (const Error& e) {
            r.bad(pd + ".peak_flops", e.what());
          }
        }();
        n.device.peak_flops[t] = r.positive(pf, it.key(), pd + ".peak_flops");
      }
      n.device.memory_bytes = r.positive(jd, "memory_bytes", pd);
      n.device.memory_bandwidth = r.positive(jd, "memory_bandwidth", pd);
      if (jd.contains("kernel_overhead"))
        n.device.kernel_overhead = r.positive(jd, "kernel_overhead", pd, true);
      if (jd.contains("memory_efficiency")) n.device.memory_efficiency = r.positive(jd, "memory_efficiency", pd);
      if (jd.contains("matmul_efficiency")) {
        const std::string pm = pd + ".matmul_efficiency";
        const auto& me = r.object(r.at(jd, "matmul_efficiency", pd), pm);
        for (auto it = me.begin(); it != me.end(); ++it) {
          const std::string pt = pm + "." + it.key();
          const auto& jt = r.object(it.value(), pt);
          MatmulEfficiency e;
          e.ceiling = r.positive(jt, "ceiling", pt);
          e.fill_elements = r.field_or<double>(jt, "fill_elements", pt, 0.0);
          e.half_k = r.field_or<double>(jt, "half_k", pt, 0.0);
          e.floor = r.field_or<double>(jt, "floor", pt, 0.0);
          try {
            n.device.matmul_efficiency[parse_dtype(it.key())] = e;
          } catch (const Error& err) {
            r.bad(pm, err.what());
          }
        }
      }
      auto link = [&](const char* key) {
        const std::string pl = p + "." + key;
        const auto& jl = r.at(jn, key, p);
        return LinkSpec{r.positive(jl, "bandwidth", pl), r.positive(jl, "latency", pl, /*allow_zero=*/true)};
      };
      n.intra = link("intra");
      n.nic = link("nic");
      if (jn.contains("collective_factors")) {  // absent: the ring (1 each)
        const std::string pf = p + ".collective_factors";
        const auto& jf = r.object(r.at(jn, "collective_factors", p), pf);
        auto& f = n.collective_factors;
        f.all_reduce = r.field_or<double>(jf, "all_reduce", pf, 1.0);
        f.all_gather = r.field_or<double>(jf, "all_gather", pf, 1.0);
        f.reduce_scatter = r.field_or<double>(jf, "reduce_scatter", pf, 1.0);
        f.all_to_all = r.field_or<double>(jf, "all_to_all", pf, 1.0);
        f.p2p = r.field_or<double>(jf, "p2p", pf, 1.0);
      }
    }
    total += static_cast<std::int64_t>(count) * n.num_devices;
    check_device_count(total, "cluster JSON");
    for (int c = 0; c < count; ++c) nodes.push_back(n);
  }
  return Cluster(std::move(nodes));
}

std::string Cluster::to_json() const {
  nlohmann::json j;
  j["nodes"] = nlohmann::json::array();
  for (const NodeSpec& n : nodes_) {
    nlohmann::json jn;
    jn["name"] = n.name;
    jn["num_devices"] = n.num_devices;
    nlohmann::json pf = nlohmann::json::object();
    for (auto& [t, f] : n.device.peak_flops) pf[std::string(dtype_name(t))] = f;
    jn["device"] = {{"kind", n.device.kind},
                    {"peak_flops", pf},
                    {"memory_bytes", n.device.memory_bytes},
                    {"memory_bandwidth", n.device.memory_bandwidth}};
    if (n.device.kernel_overhead > 0) jn["device"]["kernel_overhead"] = n.device.kernel_overhead;
    if (n.device.memory_efficiency != 1.0) jn["device"]["memory_efficiency"] = n.device.memory_efficiency;
    if (!n.device.matmul_efficiency.empty()) {
      nlohmann::json me = nlohmann::json::object();
      for (const auto& [t, e] : n.device.matmul_efficiency) {
        auto& jt = me[std::string(dtype_name(t))];
        jt = {{"ceiling", e.ceiling}, {"fill_elements", e.fill_elements}, {"half_k", e.half_k}};
        if (e.floor > 0) jt["floor"] = e.floor;
      }
      jn["device"]["matmul_efficiency"] = me;
    }
    jn["intra"] = {{"bandwidth", n.intra.bandwidth}, {"latency", n.intra.latency}};
    jn["nic"] = {{"bandwidth", n.nic.bandwidth}, {"latency", n.nic.latency}};
    if (const auto& f = n.collective_factors; !f.is_unit())
      jn["collective_factors"] = {{"all_reduce", f.all_reduce},
                                  {"all_gather", f.all_gather},
                                  {"reduce_scatter", f.reduce_scatter},
                                  {"all_to_all", f.all_to_all},
                                  {"p2p", f.p2p}};
    j["nodes"].push_back(jn);
  }
  return j.dump();
}

}  // namespace weft::cluster
