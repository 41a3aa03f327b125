// BandwidthTrace: piecewise-constant bandwidth fraction f(t). finish_time solves
//   ∫_{t0}^{T} f(t)·B dt = bytes  for T
// exactly: walk the segments from the one holding t0, subtracting f_i·B·(segment length) until the
// remainder fits in a segment, then T = a + remainder/(f_i·B). The last segment is unbounded.
#include "weft/cluster/bandwidth_trace.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "weft/core/error.hpp"
#include "weft/core/json_reader.hpp"

namespace weft::cluster {

BandwidthTrace::BandwidthTrace() : times_{0.0}, fractions_{1.0} {}

BandwidthTrace::BandwidthTrace(std::vector<double> times, std::vector<double> fractions)
    : times_(std::move(times)), fractions_(std::move(fractions)) {
  WEFT_CHECK(!times_.empty(), "BandwidthTrace: needs at least one segment");
  WEFT_CHECK(times_.size() == fractions_.size(), "BandwidthTrace: {} times but {} fractions (must be equal)",
             times_.size(), fractions_.size());
  WEFT_CHECK(times_[0] == 0.0, "BandwidthTrace: times must start at 0, got {}", times_[0]);
  for (std::size_t i = 0; i < times_.size(); ++i) {
    WEFT_CHECK(std::isfinite(times_[i]), "BandwidthTrace: time {} is not finite", i);
    if (i > 0)
      WEFT_CHECK(times_[i] > times_[i - 1], "BandwidthTrace: times must be strictly increasing ({} then {})",
                 times_[i - 1], times_[i]);
    WEFT_CHECK(std::isfinite(fractions_[i]) && fractions_[i] > 0.0 && fractions_[i] <= 1e6,
               "BandwidthTrace: fraction {} = {} must be finite and > 0", i, fractions_[i]);
  }
}

BandwidthTrace BandwidthTrace::constant(double fraction) { return BandwidthTrace({0.0}, {fraction}); }

namespace {
// splitmix64: a tiny, fully specified generator (deterministic across standard libraries).
struct SplitMix {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double uniform(double a, double b) { return a + (b - a) * (static_cast<double>(next() >> 11) * 0x1.0p-53); }
};
}  // namespace

BandwidthTrace BandwidthTrace::preempted(std::uint64_t seed, const PreemptedOptions& o) {
  WEFT_CHECK(std::isfinite(o.duration) && o.duration > 0,
             "preempted trace: duration must be finite and > 0, got {}", o.duration);
  WEFT_CHECK(std::isfinite(o.normal_max) && std::isfinite(o.preempt_max) && std::isfinite(o.low) &&
                 std::isfinite(o.high),
             "preempted trace: every option must be finite");
  // Segments last at least min(normal_min, preempt_min): bound their count before generating them.
  WEFT_CHECK(o.duration / std::min(o.normal_min, o.preempt_min) <= 1e7,
             "preempted trace: duration {} s over segments of {} s is more than 10^7 segments", o.duration,
             std::min(o.normal_min, o.preempt_min));
  WEFT_CHECK(0 < o.normal_min && o.normal_min <= o.normal_max,
             "preempted trace: need 0 < normal_min <= normal_max");
  WEFT_CHECK(0 < o.preempt_min && o.preempt_min <= o.preempt_max,
             "preempted trace: need 0 < preempt_min <= preempt_max");
  WEFT_CHECK(0 < o.low && o.low <= o.high && o.high <= 1.0, "preempted trace: need 0 < low <= high <= 1");
  SplitMix rng{seed};
  std::vector<double> t, f;
  double now = 0.0;
  bool preempt = rng.uniform(0, 1) < 0.5;  // the trace may start either way
  while (now < o.duration) {
    t.push_back(now);
    if (preempt) {
      f.push_back(rng.uniform(o.low, o.high));
      now += rng.uniform(o.preempt_min, o.preempt_max);
    } else {
      f.push_back(1.0);
      now += rng.uniform(o.normal_min, o.normal_max);
    }
    preempt = !preempt;
  }
  return BandwidthTrace(std::move(t), std::move(f));
}

std::size_t BandwidthTrace::segment(double t) const {
  auto it = std::upper_bound(times_.begin(), times_.end(), t);
  return it == times_.begin() ? 0 : static_cast<std::size_t>(it - times_.begin()) - 1;
}

double BandwidthTrace::fraction_at(double t) const { return fractions_[segment(t)]; }

double BandwidthTrace::finish_time(double t0, double bytes, double nominal) const {
  return t0 + transfer_seconds(t0, bytes, nominal);
}

double BandwidthTrace::transfer_seconds(double t0, double bytes, double nominal) const {
  WEFT_CHECK(bytes >= 0 && std::isfinite(bytes), "finish_time: bytes must be finite and >= 0, got {}", bytes);
  WEFT_CHECK(nominal > 0 && std::isfinite(nominal), "finish_time: nominal bandwidth must be > 0, got {}",
             nominal);
  if (bytes == 0) return 0.0;
  std::size_t i = segment(t0);
  double now = t0, elapsed = 0.0;  // elapsed accumulates segment lengths: exact past the last change
  double left = bytes;
  for (; i + 1 < times_.size(); ++i) {
    const double rate = fractions_[i] * nominal;
    const double span = times_[i + 1] - now;
    const double cap = rate * span;
    if (left <= cap) return elapsed + left / rate;
    left -= cap;
    elapsed += span;
    now = times_[i + 1];
  }
  return elapsed + left / (fractions_[i] * nominal);
}

double BandwidthTrace::mean_fraction(double t0, double t1) const {
  WEFT_CHECK(t1 >= t0, "mean_fraction: need t1 >= t0, got [{}, {}]", t0, t1);
  if (t1 == t0) return fraction_at(t0);
  double acc = 0.0;
  std::size_t i = segment(t0);
  double now = t0;
  while (now < t1) {
    const double end = (i + 1 < times_.size()) ? std::min(times_[i + 1], t1) : t1;
    acc += fractions_[i] * (end - now);
    now = end;
    ++i;
  }
  return acc / (t1 - t0);
}

BandwidthTrace BandwidthTrace::window(double t0, double t1) const {
  WEFT_CHECK(t1 > t0, "window: need t1 > t0, got [{}, {}]", t0, t1);
  std::vector<double> t{0.0}, f{fraction_at(t0)};
  for (std::size_t i = segment(t0) + 1; i < times_.size() && times_[i] < t1; ++i) {
    if (fractions_[i] == f.back()) continue;
    t.push_back(times_[i] - t0);
    f.push_back(fractions_[i]);
  }
  return BandwidthTrace(std::move(t), std::move(f));
}

std::string BandwidthTrace::to_json() const {
  nlohmann::json j;
  j["times"] = times_;
  j["fractions"] = fractions_;
  return j.dump();
}

BandwidthTrace BandwidthTrace::from_json(const std::string& text) {
  constexpr JsonReader r("BandwidthTrace JSON");
  const auto j = r.parse(text);
  return BandwidthTrace(r.field<std::vector<double>>(j, "times", "$"),
                        r.field<std::vector<double>>(j, "fractions", "$"));
}

std::string BandwidthTrace::to_string() const {
  if (is_constant()) return fmt::format("BandwidthTrace(constant {:g})", fractions_[0]);
  return fmt::format("BandwidthTrace({} segments over [0, {:g}), mean {:.3f}, min {:.3f})", times_.size(),
                     times_.back(), mean_fraction(0, times_.back()),
                     *std::min_element(fractions_.begin(), fractions_.end()));
}

std::size_t BandwidthTrace::hash() const {
  std::size_t h = 0x12345;
  auto mix = [&](double v) { h ^= std::hash<double>{}(v) + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2); };
  for (double v : times_) mix(v);
  for (double v : fractions_) mix(v);
  return h;
}

}  // namespace weft::cluster
