#pragma once
// Internal: the host-level scheduling problem the balancers solve.
//
// A job is one transfer decision: pick its sender host k among `cands` (it then takes dur[k]
// seconds), and a start time. While it runs it occupies the send port of that host, the send
// ports in `extra_send` and the receive ports in `recv`. A port serves one job at a time; a job
// starts after its `deps` finish. Objective: minimise the makespan (the paper's Eq. 1-3 with
// per-port rather than per-device exclusivity, since links are full duplex).
//
// All balancers return a schedule built by the serial "append" rule: jobs are taken in some
// order and each starts at the earliest time its ports are free (after the last job already on
// each of its ports) and its deps are done. Ordering any optimal schedule's jobs by start time
// and appending them in that order reproduces start times no later than the optimal ones, so
// searching over (order, sender) with this rule is complete; Dfs does exactly that.
#include <chrono>
#include <cstdint>
#include <vector>

namespace weft::reshard::detail {

struct Job {
  std::vector<int> cands;       // candidate sender hosts (dense index), preferred first
  std::vector<double> dur;      // duration when sent by cands[k]
  std::vector<int> recv;        // receive ports (dense host index)
  std::vector<int> extra_send;  // further send ports it occupies whatever the choice
  std::vector<int> deps;        // job ids, all smaller than this job's id
  double dmin() const;
};

struct JobSchedule {
  std::vector<int> choice;  // per job, index into cands
  std::vector<double> start;
  double makespan = 0;
  bool complete = false;
};

// Lower bound on the makespan of any schedule (per-port forced loads and, for each union of
// candidate sets S, the jobs confined to S spread over |S| send ports).
double job_lower_bound(const std::vector<Job>& jobs, int num_hosts);

// Items that share a resource (a port) cannot overlap in time, so the total weight of any set of
// pairwise-conflicting items (a clique of the conflict graph) bounds the makespan. Greedy cliques
// grown from the heaviest items; 0 when there are more than max_items items.
double clique_bound(const std::vector<double>& weight, const std::vector<std::vector<int>>& resources,
                    std::size_t max_items = 3000);

JobSchedule schedule_in_order(const std::vector<Job>& jobs, int num_hosts, const std::vector<int>& order,
                              const std::vector<int>& choice);
JobSchedule balance_naive(const std::vector<Job>& jobs, int num_hosts);
JobSchedule balance_largest_first(const std::vector<Job>& jobs, int num_hosts);
// Earliest-start list schedule: repeatedly the ready (job, sender) that can start first (ties: the
// earlier finish, then the longer job, then the lower id), appended.
JobSchedule balance_list(const std::vector<Job>& jobs, int num_hosts);
JobSchedule balance_random_greedy(const std::vector<Job>& jobs, int num_hosts, uint64_t seed, int restarts);
// Branch and bound; starts from `incumbent` (may be incomplete) and stops at the root bound, after
// node_limit expanded nodes, or at the deadline.
JobSchedule balance_dfs(const std::vector<Job>& jobs, int num_hosts, const JobSchedule& incumbent,
                        int64_t node_limit, std::chrono::steady_clock::time_point deadline);

}  // namespace weft::reshard::detail
