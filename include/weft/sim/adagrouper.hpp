#pragma once
// Ada-Grouper (adaptive kFkB): the (k, micro-batch size) candidate frontier under a memory limit,
// a tuner that picks the candidate with the shortest simulated step for the current bandwidth,
// and a driver that replays a long bandwidth trace and switches plans at iteration boundaries.
#include <string>
#include <vector>

#include "weft/sim/simulator.hpp"

namespace weft::sim {

// A stage described per sample, so that the micro-batch size b matters:
//   F(b) = forward_overhead + forward_per_sample·b, B(b) likewise (the whole backward),
//   bytes sent per micro-batch = activation_bytes_per_sample·b,
//   memory(b, n in flight) = static_memory + n·b·activation_memory_per_sample.
struct StageModel {
  double forward_per_sample = 0.0, forward_overhead = 0.0;
  double backward_per_sample = 0.0, backward_overhead = 0.0;
  double activation_bytes_per_sample = 0.0;
  double activation_memory_per_sample = 0.0;
  double static_memory = 0.0;
  ReplicaCollectives replica;  // per micro-batch and per step, whatever b (they move parameters)
  StageSpec at(int micro_batch_size) const;
  bool operator==(const StageModel&) const = default;
};

struct Candidate {
  int k = 1;                 // group size of kFkB
  int micro_batch_size = 1;  // b (divides the global batch)
  int num_micro = 1;         // M = global batch / b
  double peak_memory = 0.0;  // max over stages of static + min(M, k(S−s))·b·activation memory
  bool operator==(const Candidate&) const = default;
  std::string to_string() const;  // "k=2,b=3,M=64"
};

// For k = 1..k_max (k <= M): the largest b dividing global_batch whose peak memory on every stage
// fits memory_limit (kFkB peak in-flight on stage s: min(M, k(S−s))). k without a fitting b is left
// out. These are the points on Ada-Grouper's memory-limit curve (Fig. 3).
// Peak memory of kFkB(S, M, k) at micro-batch size b: max over stages s of
// static_s + min(M, k(S−s))·b·activation_memory_s.
double adagrouper_peak_memory(const std::vector<StageModel>& stages, int k, int b, int M);

std::vector<Candidate> adagrouper_frontier(const std::vector<StageModel>& stages, int global_batch,
                                           double memory_limit, int k_max);

// Simulated step of one candidate: kFkB(S, M, k) with stages at(b) over the links, traces read
// from absolute time t0; replica_trace slows the stages' replica collectives (Pipeline).
double candidate_step_time(const Candidate& c, const std::vector<StageModel>& stages,
                           const std::vector<LinkSpec>& links, double t0,
                           const cluster::BandwidthTrace& replica_trace = {});

struct TuneResult {
  int best = 0;                    // index of the chosen candidate (shortest step; ties: first)
  std::vector<double> step_times;  // per candidate
};
TuneResult adagrouper_tune(const std::vector<Candidate>& candidates, const std::vector<StageModel>& stages,
                           const std::vector<LinkSpec>& links, double t0,
                           const cluster::BandwidthTrace& replica_trace = {});

struct DriverOptions {
  double start = 0.0;           // absolute trace time of the first iteration
  double until = 600.0;         // stop once an iteration starts at or after this time
  int max_iterations = 100000;  // safety bound
  int retune_every = 1;         // re-tune every n iterations (switches only at iteration boundaries)
  // How the tuner sees "the current bandwidth": Lookahead simulates the candidates on the true
  // trace from the iteration's start (perfect profiling of the present network); PastMean uses
  // the mean fraction of each link over the last `window` seconds as a constant (a moving average
  // of measurements, as the paper does).
  enum class Estimate { Lookahead, PastMean } estimate = Estimate::Lookahead;
  double window = 10.0;
  int fixed = -1;  // >= 0: always run this candidate (a fixed-k baseline)
};

struct IterationRecord {
  double start = 0.0, step = 0.0;
  int candidate = 0;
};

struct DriverResult {
  std::vector<IterationRecord> iterations;
  double end_time = 0.0;
  int switches = 0;
  double mean_step() const;  // (end − start) / iterations
  std::string to_string() const;
};

DriverResult adagrouper_drive(const std::vector<Candidate>& candidates, const std::vector<StageModel>& stages,
                              const std::vector<LinkSpec>& links, const DriverOptions& opt = {},
                              const cluster::BandwidthTrace& replica_trace = {});

}  // namespace weft::sim
