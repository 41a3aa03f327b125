// Calibration constants and their JSON form (see calibration.hpp).
#include "weft/cost/calibration.hpp"

#include <nlohmann/json.hpp>

#include "weft/core/error.hpp"

namespace weft::cost {

std::optional<double> Calibration::given_compute_eff(const std::string& kind, DType t) const {
  auto it = compute_efficiency.find(kind);
  if (it != compute_efficiency.end()) {
    auto jt = it->second.find(t);
    if (jt != it->second.end()) return jt->second;
  }
  return default_compute_efficiency;
}

std::optional<double> Calibration::given_memory_eff(const std::string& kind) const {
  auto it = memory_efficiency.find(kind);
  if (it != memory_efficiency.end()) return it->second;
  return default_memory_efficiency;
}

const cluster::MatmulEfficiency* Calibration::given_matmul(const std::string& kind, DType t) const {
  for (const std::string& k : {kind, std::string("default")}) {
    auto it = matmul_efficiency.find(k);
    if (it == matmul_efficiency.end()) continue;
    auto jt = it->second.find(t);
    if (jt != it->second.end()) return &jt->second;
  }
  return nullptr;
}

double Calibration::compute_eff(const std::string& kind, DType t) const {
  return given_compute_eff(kind, t).value_or(1.0);
}

double Calibration::memory_eff(const std::string& kind) const { return given_memory_eff(kind).value_or(1.0); }

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
    } else if (key == "matmul_efficiency") {
      WEFT_CHECK(v.is_object(), "calibration: 'matmul_efficiency' must be an object");
      for (auto kt = v.begin(); kt != v.end(); ++kt) {
        WEFT_CHECK(kt.value().is_object(), "calibration: matmul_efficiency.{} must map dtype -> curve", kt.key());
        for (auto dt = kt.value().begin(); dt != kt.value().end(); ++dt) {
          const std::string at = "matmul_efficiency." + kt.key() + "." + dt.key();
          WEFT_CHECK(dt.value().is_object(), "calibration: {} must be an object with 'ceiling'", at);
          cluster::MatmulEfficiency e;
          for (auto ft = dt.value().begin(); ft != dt.value().end(); ++ft) {
            WEFT_CHECK(ft.value().is_number() && ft.value().get<double>() >= 0,
                       "calibration: {}.{} must be a number >= 0", at, ft.key());
            if (ft.key() == "ceiling")
              e.ceiling = pos(ft.value(), at + ".ceiling");
            else if (ft.key() == "fill_elements")
              e.fill_elements = ft.value().get<double>();
            else if (ft.key() == "half_k")
              e.half_k = ft.value().get<double>();
            else if (ft.key() == "floor")
              e.floor = ft.value().get<double>();
            else
              fail("calibration: unknown key '{}' in {}", ft.key(), at);
          }
          WEFT_CHECK(dt.value().contains("ceiling"), "calibration: {} needs 'ceiling'", at);
          WEFT_CHECK(e.ceiling <= 1, "calibration: {}.ceiling must be <= 1 (got {})", at, e.ceiling);
          WEFT_CHECK(e.floor <= e.ceiling, "calibration: {}.floor must be <= its ceiling (got {} > {})", at,
                     e.floor, e.ceiling);
          c.matmul_efficiency[kt.key()][parse_dtype(dt.key())] = e;
        }
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
  for (const auto& [kind, m] : c.matmul_efficiency)
    for (const auto& [t, e] : m) {
      (void)e;
      auto it = c.compute_efficiency.find(kind);
      WEFT_CHECK(it == c.compute_efficiency.end() || !it->second.count(t),
                 "calibration: both compute_efficiency and matmul_efficiency given for {} {}: give one "
                 "(the matmul curve's ceiling is the compute efficiency)",
                 kind, dtype_name(t));
    }
  return c;
}

std::string Calibration::to_json() const {
  nlohmann::json j;
  nlohmann::json ce = nlohmann::json::object();
  if (default_compute_efficiency) ce["default"] = *default_compute_efficiency;
  for (const auto& [kind, m] : compute_efficiency)
    for (const auto& [t, e] : m) ce[kind][std::string(dtype_name(t))] = e;
  nlohmann::json mm = nlohmann::json::object();
  for (const auto& [kind, m] : matmul_efficiency)
    for (const auto& [t, e] : m) {
      auto& jt = mm[kind][std::string(dtype_name(t))];
      jt = {{"ceiling", e.ceiling}, {"fill_elements", e.fill_elements}, {"half_k", e.half_k}};
      if (e.floor > 0) jt["floor"] = e.floor;
    }
  nlohmann::json me = nlohmann::json::object();
  if (default_memory_efficiency) me["default"] = *default_memory_efficiency;
  for (const auto& [kind, e] : memory_efficiency) me[kind] = e;
  if (!ce.empty()) j["compute_efficiency"] = ce;
  if (!mm.empty()) j["matmul_efficiency"] = mm;
  if (!me.empty()) j["memory_efficiency"] = me;
  if (kernel_overhead) j["kernel_overhead_s"] = *kernel_overhead;
  j["alpha_scale"] = alpha_scale;
  j["beta_scale"] = beta_scale;
  return j.dump();
}

cluster::DeviceSpec calibrated(const cluster::DeviceSpec& spec, const Calibration& cal) {
  cluster::DeviceSpec d = spec;
  for (auto& [t, f] : d.peak_flops) {
    if (const cluster::MatmulEfficiency* m = cal.given_matmul(d.kind, t)) {
      d.matmul_efficiency[t] = *m;  // the measured curve, relative to the datasheet peak
    } else if (auto e = cal.given_compute_eff(d.kind, t)) {
      f *= *e;  // the measured fraction of the datasheet replaces the default ceiling
      if (auto it = d.matmul_efficiency.find(t); it != d.matmul_efficiency.end()) it->second.ceiling = 1.0;
    }
  }
  if (auto e = cal.given_memory_eff(d.kind)) {
    d.memory_bandwidth *= *e;
    d.memory_efficiency = 1.0;
  }
  if (cal.kernel_overhead) d.kernel_overhead = *cal.kernel_overhead;
  return d;
}

cluster::Cluster calibrated(const cluster::Cluster& c, const Calibration& cal) {
  std::vector<cluster::NodeSpec> nodes = c.nodes();
  for (auto& n : nodes) {
    n.device = calibrated(n.device, cal);
    for (cluster::LinkSpec* l : {&n.intra, &n.nic}) {
      l->latency *= cal.alpha_scale;
      l->bandwidth /= cal.beta_scale;
    }
  }
  return cluster::Cluster(std::move(nodes));
}

}  // namespace weft::cost
