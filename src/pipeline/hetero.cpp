// Whale's hardware-aware load balancing (Algorithm 1), corrected. The problem:
//
//   minimise  max_i t_i(u_i),   t_i(u) = (fixed_i + u · fpu_i) / F_i            (F_i: FLOP/s)
//   s.t.      Σ_i u_i = T,  u_i ∈ ℕ,   static_i + u_i · bpu_i ≤ M_i             (M_i: memory)
//
// Every t_i is increasing in u, so the optimum is the smallest level t* with
// Σ_i min(cap_i, max{u : t_i(u) ≤ t*}) ≥ T (cap_i = the memory bound), and any procedure that
// only ever adds the unit whose resulting time is smallest, starting from shares that lie under
// that level, reaches it. Phase 1 (∝ FLOP/s) starts from the floor of the continuous optimum
// (which lies under t*, since the continuous optimum bounds the integer one from below) and
// hands out the rest greedily; phase 2 (memory) cuts every out-of-memory device down to its cap
// and re-places those units greedily on the devices with headroom — Algorithm 1's peak/valley
// shifts, run until every device fits. Whale's pseudo-code drops a peak device after one shift
// even when it still does not fit, and scales all memory with load; neither is done here.
#include "weft/pipeline/hetero.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "weft/core/error.hpp"

namespace weft::pipeline {
namespace {

constexpr double kGiB = 1073741824.0;

std::string gib(double bytes) { return fmt::format("{:.3g} GiB", bytes / kGiB); }

std::string fmt_units(const std::vector<std::int64_t>& u) { return fmt::format("[{}]", fmt::join(u, ",")); }

struct Problem {
  const std::vector<DeviceCapacity>& dev;
  std::vector<LoadModel> load;
  double time(std::size_t i, std::int64_t u) const { return load[i].work(u) / dev[i].flops; }
  double util(std::size_t i, std::int64_t u) const { return load[i].memory(u) / dev[i].memory_bytes; }
};

std::vector<LoadModel> expand(const std::vector<DeviceCapacity>& devices,
                              const std::vector<LoadModel>& loads) {
  WEFT_CHECK(!devices.empty(), "load balancing needs at least one device");
  WEFT_CHECK(loads.size() == devices.size() || loads.size() == 1,
             "load balancing needs one load model or one per device (got {} for {} devices)", loads.size(),
             devices.size());
  for (std::size_t i = 0; i < devices.size(); ++i)
    WEFT_CHECK(devices[i].flops > 0 && devices[i].memory_bytes > 0,
               "device {} ('{}') needs flops > 0 and memory > 0", i, devices[i].name);
  if (loads.size() == devices.size()) return loads;
  return std::vector<LoadModel>(devices.size(), loads[0]);
}

// The continuous optimum: level t with Σ_i max(0, (t·F_i − fixed_i)/fpu_i) = T.
std::vector<double> continuous_shares(const Problem& p, std::int64_t total) {
  const std::size_t n = p.dev.size();
  std::vector<double> x(n, 0.0);
  if (total == 0) return x;
  std::vector<std::size_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  auto t0 = [&](std::size_t i) { return p.load[i].fixed_flops / p.dev[i].flops; };
  std::stable_sort(idx.begin(), idx.end(), [&](std::size_t a, std::size_t b) { return t0(a) < t0(b); });
  double num = static_cast<double>(total), den = 0;
  double level = 0;
  for (std::size_t k = 0; k < n; ++k) {
    const std::size_t i = idx[k];
    num += p.load[i].fixed_flops / p.load[i].flops_per_unit;
    den += p.dev[i].flops / p.load[i].flops_per_unit;
    level = num / den;
    if (k + 1 == n || level <= t0(idx[k + 1])) break;
  }
  for (std::size_t i = 0; i < n; ++i)
    x[i] = std::max(0.0, (level * p.dev[i].flops - p.load[i].fixed_flops) / p.load[i].flops_per_unit);
  return x;
}

// Index of the device whose time after one more unit is smallest among those `allowed`
// (ties: lower memory utilisation, lower index); n when none.
template <class Allowed>
std::size_t best_receiver(const Problem& p, const std::vector<std::int64_t>& u, Allowed allowed) {
  const std::size_t n = p.dev.size();
  std::size_t best = n;
  double bt = 0, bm = 0;
  for (std::size_t i = 0; i < n; ++i) {
    if (!allowed(i)) continue;
    const double t = p.time(i, u[i] + 1), m = p.util(i, u[i]);
    if (best == n || t < bt || (t == bt && m < bm)) best = i, bt = t, bm = m;
  }
  return best;
}

HeteroShares finish(const Problem& p, std::vector<std::int64_t> units) {
  HeteroShares r;
  r.units = std::move(units);
  const std::size_t n = p.dev.size();
  r.time.resize(n);
  r.memory.resize(n);
  for (std::size_t i = 0; i < n; ++i) {
    r.time[i] = p.time(i, r.units[i]);
    r.memory[i] = p.load[i].memory(r.units[i]);
    r.max_time = std::max(r.max_time, r.time[i]);
    if (r.memory[i] > p.dev[i].memory_bytes) r.feasible = false;
  }
  return r;
}

}  // namespace

DeviceCapacity::DeviceCapacity(double f, double m, std::string n)
    : flops(f), memory_bytes(m), name(std::move(n)) {
  WEFT_CHECK(std::isfinite(f) && f > 0, "DeviceCapacity '{}': flops must be finite and > 0 (got {})", name,
             f);
  WEFT_CHECK(std::isfinite(m) && m > 0, "DeviceCapacity '{}': memory_bytes must be finite and > 0 (got {})",
             name, m);
}

std::string DeviceCapacity::to_string() const {
  return fmt::format("{}({:.4g} TFLOP/s, {})", name.empty() ? "device" : name, flops / 1e12,
                     gib(memory_bytes));
}

LoadModel::LoadModel(double fpu, double sb, double bpu, double ff)
    : flops_per_unit(fpu), static_bytes(sb), bytes_per_unit(bpu), fixed_flops(ff) {
  WEFT_CHECK(std::isfinite(fpu) && fpu > 0, "LoadModel: flops_per_unit must be finite and > 0 (got {})", fpu);
  WEFT_CHECK(std::isfinite(sb) && sb >= 0, "LoadModel: static_bytes must be finite and >= 0 (got {})", sb);
  WEFT_CHECK(std::isfinite(bpu) && bpu >= 0, "LoadModel: bytes_per_unit must be finite and >= 0 (got {})",
             bpu);
  WEFT_CHECK(std::isfinite(ff) && ff >= 0, "LoadModel: fixed_flops must be finite and >= 0 (got {})", ff);
}

std::int64_t LoadModel::max_units(double memory_bytes) const {
  if (static_bytes > memory_bytes) return -1;
  if (bytes_per_unit <= 0) return kUnlimitedUnits;
  const double u = std::floor((memory_bytes - static_bytes) / bytes_per_unit);
  return u >= static_cast<double>(kUnlimitedUnits) ? kUnlimitedUnits : static_cast<std::int64_t>(u);
}

std::string LoadModel::to_string() const {
  return fmt::format("LoadModel({:.4g} FLOP/unit, static {}, {:.4g} MiB/unit, fixed {:.4g} FLOP)",
                     flops_per_unit, gib(static_bytes), bytes_per_unit / 1048576.0, fixed_flops);
}

std::string HeteroShares::to_string() const {
  if (!feasible && !message.empty()) return fmt::format("HeteroShares(infeasible: {})", message);
  return fmt::format("HeteroShares(units={}, max_time={:.6g} s, shifts={}{})", fmt_units(units), max_time,
                     shifts, feasible ? "" : ", over memory");
}

HeteroShares evaluate_load(const std::vector<DeviceCapacity>& devices, const std::vector<LoadModel>& loads,
                           const std::vector<std::int64_t>& units) {
  Problem p{devices, expand(devices, loads)};
  WEFT_CHECK(units.size() == devices.size(), "evaluate_load: {} shares for {} devices", units.size(),
             devices.size());
  for (std::int64_t u : units) WEFT_CHECK(u >= 0, "evaluate_load: shares must be >= 0 (got {})", u);
  return finish(p, units);
}

HeteroShares try_balance_load(const std::vector<DeviceCapacity>& devices, const std::vector<LoadModel>& loads,
                              std::int64_t total) {
  Problem p{devices, expand(devices, loads)};
  WEFT_CHECK(total >= 0, "load balancing: total units must be >= 0 (got {})", total);
  const std::size_t n = devices.size();

  // Memory caps and the infeasibility report.
  std::vector<std::int64_t> cap(n);
  std::int64_t slots = 0;
  double static_missing = 0;
  std::string why;
  for (std::size_t i = 0; i < n; ++i) {
    cap[i] = p.load[i].max_units(devices[i].memory_bytes);
    if (cap[i] < 0) {
      const double miss = p.load[i].static_bytes - devices[i].memory_bytes;
      static_missing += miss;
      why += fmt::format("{}device {} ('{}') needs {} of load-independent memory but has {} ({} missing)",
                         why.empty() ? "" : "; ", i, devices[i].name, gib(p.load[i].static_bytes),
                         gib(devices[i].memory_bytes), gib(miss));
    } else {
      slots = std::min(kUnlimitedUnits, slots + cap[i]);
    }
  }
  if (!why.empty() || slots < total) {
    HeteroShares r;
    r.feasible = false;
    r.units.assign(n, 0);
    r.missing_units = std::max<std::int64_t>(0, total - slots);
    double bpu = std::numeric_limits<double>::infinity();
    for (std::size_t i = 0; i < n; ++i)
      if (cap[i] >= 0) bpu = std::min(bpu, p.load[i].bytes_per_unit);
    if (!std::isfinite(bpu)) bpu = p.load[0].bytes_per_unit;
    r.missing_bytes = static_missing + static_cast<double>(r.missing_units) * bpu;
    if (r.missing_units > 0)
      why += fmt::format(
          "{}{} of {} units fit on no device (the devices hold at most {}); at least {} more memory "
          "is needed ({} per unit)",
          why.empty() ? "" : "; ", r.missing_units, total, slots,
          gib(static_cast<double>(r.missing_units) * bpu), gib(bpu));
    r.message =
        fmt::format("load does not fit in memory: {} missing in total: {}", gib(r.missing_bytes), why);
    return r;
  }

  // Phase 1: ∝ FLOP/s (the continuous optimum, floored), the rest greedily by resulting time.
  const std::vector<double> x = continuous_shares(p, total);
  std::vector<std::int64_t> u(n);
  std::int64_t given = 0;
  for (std::size_t i = 0; i < n; ++i) {
    u[i] = static_cast<std::int64_t>(std::floor(x[i] * (1 - 1e-12)));
    given += u[i];
  }
  WEFT_ASSERT(given <= total, "proportional floor exceeds the total");
  for (; given < total; ++given) ++u[best_receiver(p, u, [](std::size_t) { return true; })];
  const std::vector<std::int64_t> proportional = u;

  // Phase 2: shift load from the fullest out-of-memory device to the least-loaded device with
  // headroom until every device fits.
  int shifts = 0;
  for (;;) {
    std::size_t peak = n;
    for (std::size_t i = 0; i < n; ++i)
      if (u[i] > cap[i] && (peak == n || p.util(i, u[i]) > p.util(peak, u[peak]))) peak = i;
    if (peak == n) break;
    auto has_room = [&](std::size_t i) { return u[i] < cap[i]; };
    const std::size_t valley = best_receiver(p, u, has_room);
    WEFT_ASSERT(valley < n, "no device with headroom although the caps hold the load");
    const std::size_t next = best_receiver(p, u, [&](std::size_t i) { return i != valley && has_room(i); });
    std::int64_t greedy = kUnlimitedUnits;  // units the valley takes before passing the next valley
    if (next < n) {
      const double t = p.time(next, u[next] + 1);
      const double k = std::floor((t * devices[valley].flops - p.load[valley].fixed_flops) /
                                  p.load[valley].flops_per_unit * (1 + 1e-12));
      greedy = std::max<std::int64_t>(1, static_cast<std::int64_t>(std::min(k, 4e18)) - u[valley]);
    }
    const std::int64_t b = std::min({u[peak] - cap[peak], cap[valley] - u[valley], greedy});
    u[peak] -= b;
    u[valley] += b;
    ++shifts;
  }
  HeteroShares r = finish(p, std::move(u));
  WEFT_ASSERT(r.feasible, "balanced shares over memory");
  r.proportional = proportional;
  r.shifts = shifts;
  return r;
}

HeteroShares try_balance_load(const std::vector<DeviceCapacity>& devices, const LoadModel& load,
                              std::int64_t total) {
  return try_balance_load(devices, std::vector<LoadModel>{load}, total);
}

HeteroShares balance_load(const std::vector<DeviceCapacity>& devices, const std::vector<LoadModel>& loads,
                          std::int64_t total) {
  HeteroShares r = try_balance_load(devices, loads, total);
  if (!r.feasible) fail("{}", r.message);
  return r;
}

HeteroShares balance_load(const std::vector<DeviceCapacity>& devices, const LoadModel& load,
                          std::int64_t total) {
  return balance_load(devices, std::vector<LoadModel>{load}, total);
}

std::vector<std::int64_t> even_units(std::int64_t total, int devices) {
  WEFT_CHECK(devices >= 1 && total >= 0, "even_units needs devices >= 1 and total >= 0 (got {}, {})", devices,
             total);
  std::vector<std::int64_t> u(static_cast<std::size_t>(devices), total / devices);
  for (std::int64_t i = 0; i < total % devices; ++i) ++u[static_cast<std::size_t>(i)];
  return u;
}

std::vector<std::int64_t> split_dimension(const std::vector<DeviceCapacity>& devices, std::int64_t dim_size,
                                          std::int64_t granularity, const LoadModel& per_granule) {
  WEFT_CHECK(granularity >= 1 && dim_size >= 1,
             "split_dimension needs dim_size >= 1 and granularity >= 1 (got {}, {})", dim_size, granularity);
  WEFT_CHECK(dim_size % granularity == 0, "split_dimension: granularity {} does not divide the dim size {}",
             granularity, dim_size);
  HeteroShares r = balance_load(devices, per_granule, dim_size / granularity);
  for (std::int64_t& u : r.units) u *= granularity;
  return r.units;
}

std::vector<std::int64_t> proportional_pieces(std::int64_t size, const std::vector<double>& fraction) {
  WEFT_CHECK(size >= 0 && !fraction.empty(), "proportional_pieces needs size >= 0 and a fraction per piece");
  double total = 0;
  for (double f : fraction) {
    WEFT_CHECK(std::isfinite(f) && f >= 0, "proportional_pieces: fractions must be finite and >= 0 (got {})",
               f);
    total += f;
  }
  WEFT_CHECK(total > 0, "proportional_pieces: the fractions sum to 0");
  std::vector<std::int64_t> out(fraction.size());
  std::vector<std::pair<double, std::size_t>> rest;
  std::int64_t left = size;
  for (std::size_t i = 0; i < fraction.size(); ++i) {
    const double exact = static_cast<double>(size) * fraction[i] / total;
    out[i] = std::min(left, static_cast<std::int64_t>(std::floor(exact)));
    left -= out[i];
    rest.emplace_back(exact - static_cast<double>(out[i]), i);
  }
  std::stable_sort(rest.begin(), rest.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (std::size_t k = 0; left > 0; k = (k + 1) % rest.size(), --left) ++out[rest[k].second];
  return out;
}

std::vector<int> memory_descending_order(const std::vector<DeviceCapacity>& devices) {
  std::vector<int> idx(devices.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) {
    const auto& x = devices[static_cast<std::size_t>(a)];
    const auto& y = devices[static_cast<std::size_t>(b)];
    if (x.memory_bytes != y.memory_bytes) return x.memory_bytes > y.memory_bytes;
    return x.flops > y.flops;
  });
  return idx;
}

std::vector<DeviceCapacity> capacities(const cluster::Cluster& c, const std::vector<int>& ids, DType dtype,
                                       const cost::Calibration& cal) {
  std::vector<DeviceCapacity> out;
  out.reserve(ids.size());
  for (int id : ids) {
    const cluster::Device& d = c.device(id);
    const cluster::DeviceSpec spec = cost::calibrated(d.spec, cal);  // the throughput a GEMM reaches
    out.emplace_back(spec.peak(dtype) * spec.matmul(dtype).ceiling, d.spec.memory_bytes,
                     fmt::format("{}#{}", d.spec.kind, id));
  }
  return out;
}

}  // namespace weft::pipeline
