#pragma once
// Planning a cross-mesh resharding: a strategy turns each unit task into transfers, a balancer
// picks the sender host of each transfer and the per-host order, and a host-level simulator gives
// the completion time, to compare with an exact lower bound. See docs/modules/reshard.md.
//
// Timing model (hosts, not devices): host h has a NIC with bandwidth bw(h) per direction (full
// duplex), i.e. a send port and a receive port. A transfer of b bytes from host s to the set R of
// remote receiver hosts occupies the send port of s and the receive port of every r in R for
// b / min(bw(s), bw(r) for r in R) seconds (a pipelined broadcast with K chunks costs
// t * (1 + |R| / K) instead when K > 0; K = 0 is the limit K -> inf). A port serves one transfer at
// a time. Copies inside a host are free. The plan fixes the order of the transfers on every port;
// the simulator starts each transfer as soon as it is first in line on all its ports and its
// dependencies are done (fixed per-host order, start when ready in that order).
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "weft/reshard/problem.hpp"

namespace weft::reshard {

enum class Strategy {
  SendRecv,         // sender -> each remote receiver device, one p2p each
  LocalAllGather,   // Alpa: 1/B of the region to each of B devices of a receiver host, then
                    // all-gather inside the host
  GlobalAllGather,  // 1/N to each of N remote receiver devices, then all-gather among them
  Broadcast,        // one pipelined broadcast per unit task to all remote receivers
};
enum class Balancer {
  Naive,         // lowest-indexed candidate sender, tasks in index order
  LargestFirst,  // largest first to the least-loaded candidate sender host
  Dfs,           // branch and bound over (next transfer, sender), admissible bound, budget
  RandomGreedy,  // repeated randomized maximal sets of non-conflicting transfers (seeded)
  List,          // earliest-start list schedule: next, the (transfer, sender) that can start first
  Best,          // all of the above, the best simulated plan
};
std::string to_string(Strategy s);
std::string to_string(Balancer b);
Strategy parse_strategy(
    const std::string& s);  // "send_recv", "local_allgather", "global_allgather", "broadcast"
Balancer parse_balancer(
    const std::string& s);  // "naive", "largest_first", "dfs", "random_greedy", "list", "best"

struct PlanOptions {
  Strategy strategy = Strategy::Broadcast;
  Balancer balancer = Balancer::Best;
  uint64_t seed = 0;
  int64_t dfs_node_limit = 200000;  // deterministic search budget (nodes expanded)
  double time_limit_s = 2.0;        // wall-clock safety net; results depend on it only when hit
  int greedy_restarts = 16;         // RandomGreedy: independent randomized runs
  int broadcast_chunks = 0;         // K of the pipelined broadcast; 0 = ideal (K -> inf)
};

// One transfer (or intra-host copy when recv_hosts is empty).
struct Op {
  int id = 0;
  int task = 0;  // unit task index
  int tensor = 0;
  int sender = 0;                 // device
  bool from_destination = false;  // reads the sender's destination buffer (all-gather phases)
  std::vector<int> receivers;     // devices
  Region region;                  // global indices (rank 0 for abstract tasks)
  int64_t bytes = 0;
  int send_host = 0;
  std::vector<int> recv_hosts;     // remote hosts whose NIC it crosses (empty: intra-host)
  std::vector<int> deps;           // op ids that must be finished first
  double start = 0, duration = 0;  // from the simulator
  bool operator==(const Op&) const = default;
};

struct LowerBound {
  double value = 0;                  // max of the bounds below
  double per_host = 0;               // max over hosts of must-leave / must-enter bytes over bw
  double sender_sets = 0;            // tasks whose candidates all lie in a host set S, over bw(S)
  double cliques = 0;                // tasks pairwise sharing a receiver or forced sender host
  double whole_tasks = 0;            // unit tasks are indivisible: pigeonhole over a sender set's hosts
  std::map<int, int64_t> must_send;  // per host: bytes of tasks it alone can send to remote hosts
  std::map<int, int64_t> must_recv;  // per host: bytes it needs and holds no replica of
};

// Lower bound on any plan's completion time in the model above (valid for every strategy): a
// host must receive every task it needs without a local replica (per_host, with the send side of
// tasks that only one host can send: the bound); for each union S of candidate host sets,
// the tasks confined to S leave through S's NICs (sender_sets); tasks that pairwise share a
// receiver host or a forced sender host run one after another (cliques, greedy; see below); and, since every
// strategy moves each unit task at least once whole from ONE sender host, the tasks confined to S
// are indivisible items on |S| send ports (whole_tasks: among the k·|S| + 1 longest, some host
// sends k + 1, so the k + 1 shortest of them run one after another on it).
// `strategy` matters to cliques only: a broadcast holds all of a task's receive ports at once (a
// task is one item), send/recv and the local all-gather reach each remote host separately (one
// item per task and remote host), a global all-gather's hosts also feed each other (no cliques).
LowerBound lower_bound(const ReshardProblem& p, Strategy strategy = Strategy::Broadcast);

class ReshardPlan {
 public:
  ReshardProblem problem;
  PlanOptions options;
  std::string balancer_used;              // the one that produced it ("dfs", ...)
  std::vector<Op> ops;                    // by id
  std::map<int, std::vector<int>> order;  // host -> ids of ops it sends, receives or copies, in order
  double completion_time = 0;             // simulated
  LowerBound bound;

  double ratio() const;  // completion / lower bound (1 when both are 0)
  std::map<int, int64_t> nic_bytes_sent() const;
  std::map<int, int64_t> nic_bytes_received() const;
  std::string to_json() const;
  std::string summary() const;  // one line
};

ReshardPlan plan(const ReshardProblem& p, const PlanOptions& opt = {});

// Simulates the plan's per-host orders (the timing model above); writes each op's start and
// duration and returns the completion time. Throws weft::Error on a plan whose orders deadlock
// or that lists an op on a host it does not touch.
double simulate(ReshardPlan& plan);

// Duration of an op in the model (0 for intra-host copies).
double op_duration(const ReshardProblem& p, const Op& op, int broadcast_chunks);

}  // namespace weft::reshard
