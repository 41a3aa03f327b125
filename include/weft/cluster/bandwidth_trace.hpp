#pragma once
// BandwidthTrace: the fraction of a link's nominal bandwidth available over time, piecewise
// constant. Segment i covers [times[i], times[i+1]) with fraction fractions[i]; the last segment
// extends to +infinity. times[0] == 0; fractions > 0 (a link never stops completely, so every
// transfer finishes). A default trace is the constant 1.0 (the nominal bandwidth at all times).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace weft::cluster {

class BandwidthTrace {
 public:
  BandwidthTrace();  // constant 1.0
  // Validates: same non-zero length, times[0] == 0, strictly increasing finite times,
  // finite fractions in (0, 1e6].
  BandwidthTrace(std::vector<double> times, std::vector<double> fractions);
  static BandwidthTrace constant(double fraction);

  // Options of the "preempted network" generator: alternating stretches of full bandwidth
  // (lengths uniform in [normal_min, normal_max]) and of preemption (lengths uniform in
  // [preempt_min, preempt_max], fraction uniform in [low, high]) until `duration`.
  struct PreemptedOptions {
    double duration = 600.0;
    double normal_min = 5.0, normal_max = 30.0;
    double preempt_min = 5.0, preempt_max = 30.0;
    double low = 0.3, high = 0.6;
  };
  // Deterministic per seed (own integer-to-double mapping, not std distributions, so the trace is
  // the same with every standard library).
  static BandwidthTrace preempted(std::uint64_t seed, const PreemptedOptions& opt);
  static BandwidthTrace preempted(std::uint64_t seed) { return preempted(seed, PreemptedOptions{}); }

  const std::vector<double>& times() const { return times_; }
  const std::vector<double>& fractions() const { return fractions_; }
  std::size_t size() const { return times_.size(); }
  bool is_constant() const { return times_.size() == 1; }

  // Fraction in effect at time t (t < 0 reads the first segment).
  double fraction_at(double t) const;
  // Time at which `bytes` sent from t0 finish at rate fraction(t)·nominal: the exact solution of
  // ∫_{t0}^{T} fraction(t)·nominal dt = bytes. bytes >= 0, nominal > 0.
  double finish_time(double t0, double bytes, double nominal_bytes_per_s) const;
  // finish_time(t0, ...) - t0, computed without the subtraction: exact however large t0 is (the
  // simulator keeps its clock relative and reads the trace at offset + t).
  double transfer_seconds(double t0, double bytes, double nominal_bytes_per_s) const;
  // (1/(t1−t0))·∫_{t0}^{t1} fraction(t) dt; t1 > t0 (t1 == t0 gives fraction_at(t0)).
  double mean_fraction(double t0, double t1) const;
  // The part [t0, t1) moved to start at time 0; after t1−t0 the fraction at t1 continues.
  BandwidthTrace window(double t0, double t1) const;

  std::string to_json() const;  // {"times":[...],"fractions":[...]}
  static BandwidthTrace from_json(const std::string& text);
  std::string to_string() const;  // one line: BandwidthTrace(n segments, mean f over [0,last])

  bool operator==(const BandwidthTrace& o) const = default;
  std::size_t hash() const;

 private:
  std::size_t segment(double t) const;  // index of the segment containing t
  std::vector<double> times_;
  std::vector<double> fractions_;
};

}  // namespace weft::cluster

template <>
struct std::hash<weft::cluster::BandwidthTrace> {
  std::size_t operator()(const weft::cluster::BandwidthTrace& t) const { return t.hash(); }
};
