// Calibration constants and their JSON form (see calibration.hpp).
#include "weft/cost/calibration.hpp"

#include <nlohmann/json.hpp>

#include "weft/core/error.hpp"

namespace weft::cost {

double Calibration::compute_eff(const std::string& kind, DType t) const {
  auto it = compute_efficiency.find(kind);
  if (it != compute_efficiency.end()) {
    auto jt = it->second.find(t);
    if (jt != it->second.end()) return jt->second;
  }
  return default_compute_efficiency;
}

double Calibration::memory_eff(const std::string& kind) const {
  auto it = memory_efficiency.find(kind);
  return it != memory_efficiency.end() ? it->second : default_memory_efficiency;
}

cluster::AxisLink Calibration::apply(cluster::AxisLink l) const {
  l.alpha *= alpha_scale;
  l.intra_alpha *= alpha_scale;
  l.inter_alpha *= alpha_scale;
  l.beta *= beta_scale;
  l.intra_beta *= beta_scale;
  l.inter_beta *= beta_scale;
  return l;
}

Calibration Calibration::from_json(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("calibration JSON does not parse: {}", e.what());
  }
  WEFT_CHECK(j.is_object(), "calibration JSON must be an object");
  Calibration c;
  auto pos = [](const nlohmann::json& v, const std::string& what) {
    WEFT_CHECK(v.is_number(), "calibration: '{}' must be a number", what);
    double x = v.get<double>();
    WEFT_CHECK(x > 0, "calibration: '{}' must be > 0 (got {})", what, x);
    return x;
  };
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const auto& v = it.value();
    if (key == "compute_efficiency") {
      WEFT_CHECK(v.is_object(), "calibration: 'compute_efficiency' must be an object");
      for (auto kt = v.begin(); kt != v.end(); ++kt) {
        if (kt.key() == "default") {
          c.default_compute_efficiency = pos(kt.value(), "compute_efficiency.default");
          continue;
        }
        WEFT_CHECK(kt.value().is_object(), "calibration: compute_efficiency.{} must map dtype -> efficiency",
                   kt.key());
        for (auto dt = kt.value().begin(); dt != kt.value().end(); ++dt)
          c.compute_efficiency[kt.key()][parse_dtype(dt.key())] =
              pos(dt.value(), "compute_efficiency." + kt.key() + "." + dt.key());
      }
    } else if (key == "memory_efficiency") {
      WEFT_CHECK(v.is_object(), "calibration: 'memory_efficiency' must be an object");
      for (auto kt = v.begin(); kt != v.end(); ++kt) {
        if (kt.key() == "default")
          c.default_memory_efficiency = pos(kt.value(), "memory_efficiency.default");
        else
          c.memory_efficiency[kt.key()] = pos(kt.value(), "memory_efficiency." + kt.key());
      }
    } else if (key == "kernel_overhead_s") {
      WEFT_CHECK(v.is_number() && v.get<double>() >= 0,
                 "calibration: 'kernel_overhead_s' must be a number >= 0");
      c.kernel_overhead = v.get<double>();
    } else if (key == "alpha_scale") {
      c.alpha_scale = pos(v, key);
    } else if (key == "beta_scale") {
      c.beta_scale = pos(v, key);
    } else {
      fail("calibration JSON: unknown key '{}'", key);
    }
  }
  return c;
}

std::string Calibration::to_json() const {
  nlohmann::json j;
  nlohmann::json ce = {{"default", default_compute_efficiency}};
  for (const auto& [kind, m] : compute_efficiency)
    for (const auto& [t, e] : m) ce[kind][std::string(dtype_name(t))] = e;
  nlohmann::json me = {{"default", default_memory_efficiency}};
  for (const auto& [kind, e] : memory_efficiency) me[kind] = e;
  j["compute_efficiency"] = ce;
  j["memory_efficiency"] = me;
  j["kernel_overhead_s"] = kernel_overhead;
  j["alpha_scale"] = alpha_scale;
  j["beta_scale"] = beta_scale;
  return j.dump();
}

cluster::Cluster calibrated(const cluster::Cluster& c, const Calibration& cal) {
  std::vector<cluster::NodeSpec> nodes = c.nodes();
  for (auto& n : nodes) {
    for (auto& [t, f] : n.device.peak_flops) f *= cal.compute_eff(n.device.kind, t);
    n.device.memory_bandwidth *= cal.memory_eff(n.device.kind);
    n.device.kernel_overhead += cal.kernel_overhead;
    for (cluster::LinkSpec* l : {&n.intra, &n.nic}) {
      l->latency *= cal.alpha_scale;
      l->bandwidth /= cal.beta_scale;
    }
  }
  return cluster::Cluster(std::move(nodes));
}

}  // namespace weft::cost
