#pragma once
// Discrete-event simulation of a pipeline schedule (weft::schedule::Schedule) on devices joined by
// links with time-varying bandwidth. See docs/modules/sim.md for the exact timing model.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "weft/cluster/bandwidth_trace.hpp"
#include "weft/schedule/schedule.hpp"

namespace weft::sim {

// Collectives across a stage's data-parallel replicas (plain data parallelism, ZeRO 1-3, FSDP;
// plan/zero.hpp), in seconds at the replica axis' nominal bandwidth (Pipeline::replica_trace scales
// them). They run on each device's communication stream, one FIFO per device in the order of the
// compute they serve (docs/modules/sim.md, "Collectives"):
//   gather_forward / gather_backward: per micro-batch, before its F / B (ZeRO-3's all-gathers). The
//     first gather_unit of it ends before the compute starts, and the compute ends no earlier than
//     the gather's end plus gather_unit of its own time (block-by-block prefetch); with `prefetch`
//     the gather may start once the compute before it on the device has started, else after it ended.
//   reduce_backward: per micro-batch, after its backward (B, or W when split): ZeRO-2/3's
//     reduce-scatter. It starts with the backward and ends no earlier than the backward's end plus
//     reduce_unit of itself (bucketed, overlapped).
//   step_sync: once per step, with the stage's last backward in the same way (sync_unit): the
//     gradient all-reduce (DDP) or reduce-scatter (ZeRO-1), hybrid sharding's all-reduce across
//     groups. The optimizer waits for it.
//   step_gather: once per step after the optimizer: ZeRO-1/2's all-gather of the new parameters.
// Units are fractions in (0, 1]: 1 = no overlap with the compute it serves.
struct ReplicaCollectives {
  double gather_forward = 0, gather_backward = 0, reduce_backward = 0, step_sync = 0, step_gather = 0;
  double gather_unit = 1, reduce_unit = 1, sync_unit = 1;
  bool prefetch = true;
  bool operator==(const ReplicaCollectives&) const = default;
};

// Per-micro-batch description of one logical pipeline stage.
struct StageSpec {
  double forward_time = 1.0;       // F
  double backward_time = 2.0;      // B: input gradient (the whole backward in non-split schedules is B + W)
  double weight_time = 0.0;        // W: weight gradient
  double activation_bytes = 0.0;   // sent stage s → s+1 per micro-batch; its gradient (same size) s+1 → s
  double activation_memory = 0.0;  // bytes held per in-flight micro-batch (F done, last backward not)
  double static_memory = 0.0;      // parameters, gradients, optimizer state
  double optimizer_time = 0.0;     // the optimizer step after the stage's last backward
  ReplicaCollectives replica;      // across the stage's replicas (none by default)
  bool operator==(const StageSpec&) const = default;
};

// A directed-pair link between neighbouring devices (full duplex: each direction is its own FIFO
// wire). A transfer of b bytes starting at t occupies its direction until
// trace.finish_time(t + latency, b, bandwidth) (trace read at absolute time, see SimOptions).
struct LinkSpec {
  double bandwidth = 1e300;  // nominal bytes/s (> 0; 1e300 ~ infinite)
  double latency = 0.0;      // seconds, >= 0
  cluster::BandwidthTrace trace;
  bool operator==(const LinkSpec&) const = default;
};

// stages: one per logical stage, or one for all. links: link d joins device d and device d+1
// (the last, d = D−1, joins D−1 and 0 and is needed only by interleaved schedules): give D−1 or D
// links, or one for all boundaries, or none (no communication cost).
// replica_trace: the fraction of nominal bandwidth the replica collectives get over time (a busy
// network slows them as it slows the links), read at absolute time like the links' traces.
struct Pipeline {
  std::vector<StageSpec> stages;
  std::vector<LinkSpec> links;
  cluster::BandwidthTrace replica_trace;
};

struct SimOptions {
  double trace_offset = 0.0;  // simulation time 0 reads the traces at this absolute time
  bool check_pairing = true;  // refuse orders whose send/recv channels do not pair (weft::Error)
  bool record_timeline = true;
};

// Gather / Reduce: a replica collective (ReplicaCollectives) on the device's communication stream;
// micro = -1 for the once-per-step ones.
enum class TaskKind : std::uint8_t { F, B, W, Optimizer, SendActivation, SendGradient, Gather, Reduce };
const char* task_kind_name(TaskKind k);

struct TimelineEntry {
  TaskKind kind;
  std::int32_t stage;   // producing stage for transfers
  std::int32_t micro;   // -1 for the optimizer
  std::int32_t device;  // compute device, or the sending device of a transfer
  std::int32_t peer;    // receiving device of a transfer, -1 for compute and collectives
  double start, end;
};

struct SimResult {
  double step_time = 0.0;                  // end of the last compute task or replica collective
  double bubble_fraction = 0.0;            // 1 − Σ_d busy_d / (D · step_time)
  std::vector<double> busy_time;           // per device, compute only
  std::vector<double> collective_time;     // per device, its communication stream's busy time
  std::vector<int> peak_in_flight;         // per logical stage
  std::vector<int> peak_in_flight_device;  // per device
  std::vector<double> peak_memory;         // per device: Σ static + max_t Σ in-flight · activation_memory
  std::size_t events = 0;                  // task completions processed
  std::size_t num_tasks = 0;
  bool deadlock = false;
  std::string deadlock_report;
  std::vector<TimelineEntry> timeline;  // empty unless record_timeline
  std::string to_chrome_trace() const;  // Chrome trace-event JSON (chrome://tracing, Perfetto)
  std::string to_string() const;
};

SimResult simulate(const schedule::Schedule& sched, const Pipeline& pipe, const SimOptions& opt = {});

}  // namespace weft::sim

namespace weft::cluster {
class Cluster;
}

namespace weft::sim {
// Adapter from a cluster: the links between consecutive pipeline devices device_ids[d] and
// device_ids[d+1] (and, with wrap, the last back to the first): the node's intra-node link when
// both are on one node, otherwise the slower NIC of the two nodes (bandwidth) and the larger
// latency. Every link gets `trace`. NIC sharing between concurrent transfers is not modelled.
std::vector<LinkSpec> links_from_cluster(const cluster::Cluster& c, const std::vector<int>& device_ids,
                                         const cluster::BandwidthTrace& trace = {}, bool wrap = false);
}  // namespace weft::sim
