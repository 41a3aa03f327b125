// Simulator speed: events (task completions) per second of weft::sim::simulate on large schedules.
// Usage: weft_bench_sim_speed [--json] [--repeat N]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "weft/schedule/schedule.hpp"
#include "weft/sim/simulator.hpp"

using namespace weft;

int main(int argc, char** argv) {
  bool json = false;
  int repeat = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--json")) json = true;
    if (!std::strcmp(argv[i], "--repeat") && i + 1 < argc) repeat = std::atoi(argv[++i]);
  }
  struct Case {
    const char* name;
    schedule::Schedule sched;
  };
  const int S = 64, M = 1024;
  Case cases[] = {{"1f1b", schedule::one_f_one_b(S, M)},
                  {"kfkb(k=4)", schedule::kfkb(S, M, 4)},
                  {"zb_h1", schedule::zb_h1(S, M)},
                  {"interleaved(v=2)", schedule::interleaved_1f1b(S, 2, M)}};
  sim::Pipeline pipe;
  pipe.stages.push_back(sim::StageSpec{.forward_time = 1e-3, .backward_time = 2e-3, .weight_time = 1e-3,
                                       .activation_bytes = 8e6, .activation_memory = 1e8});
  pipe.links.push_back(sim::LinkSpec{.bandwidth = 12.5e9, .latency = 1e-5,
                                     .trace = cluster::BandwidthTrace::preempted(1, {.duration = 600,
                                                                                     .normal_min = 0.05,
                                                                                     .normal_max = 0.3,
                                                                                     .preempt_min = 0.05,
                                                                                     .preempt_max = 0.3})});
  if (!json) std::printf("%-18s %10s %12s %14s %14s\n", "schedule (S=64,M=1024)", "tasks", "best s", "events/s", "incl. timeline");
  for (auto& c : cases) {
    double best = 1e30, best_tl = 1e30;
    std::size_t events = 0;
    for (int r = 0; r < repeat; ++r) {
      for (bool tl : {false, true}) {
        sim::SimOptions o;
        o.record_timeline = tl;
        o.check_pairing = false;
        auto t0 = std::chrono::steady_clock::now();
        auto res = sim::simulate(c.sched, pipe, o);
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        events = res.events;
        (tl ? best_tl : best) = std::min(tl ? best_tl : best, dt);
      }
    }
    const double eps = static_cast<double>(events) / best, eps_tl = static_cast<double>(events) / best_tl;
    if (json) {
      std::printf(
          "{\"bench\":\"sim_speed\",\"case\":\"%s S=64 M=1024\",\"metric\":\"events_per_s\",\"value\":%.0f,\"unit\":"
          "\"1/s\",\"baseline\":1000000}\n",
          c.name, eps);
    } else {
      std::printf("%-22s %10zu %12.4f %14.3g %14.3g\n", c.name, events, best, eps, eps_tl);
    }
  }
  return 0;
}
