// Planner: strategy -> host-level jobs -> balancer -> ops with per-host orders -> simulated
// completion time, plus the exact lower bound of lower_bound() (math in plan.hpp / balance.cpp).
//
// Which host "the" sender is: a receiver host that holds a replica of a unit task's source tile
// copies it locally (free), so only receiver hosts without a replica are remote; a task leaves
// some candidate host's NIC only when it has a remote receiver host. This is what the lower bound
// counts, so a host that is both a candidate sender and a receiver never pays for itself.
#include "weft/reshard/plan.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "balance.hpp"
#include "weft/core/error.hpp"

namespace weft::reshard {

std::string to_string(Strategy s) {
  switch (s) {
    case Strategy::SendRecv: return "send_recv";
    case Strategy::LocalAllGather: return "local_allgather";
    case Strategy::GlobalAllGather: return "global_allgather";
    case Strategy::Broadcast: return "broadcast";
  }
  return "?";
}
std::string to_string(Balancer b) {
  switch (b) {
    case Balancer::Naive: return "naive";
    case Balancer::LargestFirst: return "largest_first";
    case Balancer::Dfs: return "dfs";
    case Balancer::RandomGreedy: return "random_greedy";
    case Balancer::List: return "list";
    case Balancer::Best: return "best";
  }
  return "?";
}
Strategy parse_strategy(const std::string& s) {
  for (auto v :
       {Strategy::SendRecv, Strategy::LocalAllGather, Strategy::GlobalAllGather, Strategy::Broadcast})
    if (to_string(v) == s) return v;
  fail("unknown resharding strategy '{}' (send_recv, local_allgather, global_allgather, broadcast)", s);
}
Balancer parse_balancer(const std::string& s) {
  for (auto v : {Balancer::Naive, Balancer::LargestFirst, Balancer::Dfs, Balancer::RandomGreedy,
                 Balancer::List, Balancer::Best})
    if (to_string(v) == s) return v;
  fail("unknown balancer '{}' (naive, largest_first, dfs, random_greedy, list, best)", s);
}

namespace {

double tol(double x) { return std::isfinite(x) ? 1e-9 * std::max(1.0, std::abs(x)) : 0.0; }

// Per unit task: hosts of the candidate senders (ordered by their lowest sender device), receiver
// devices grouped by host, remote receiver hosts and receiver hosts with a local replica.
struct TaskHosts {
  std::vector<int> cand_hosts;                // real host ids
  std::map<int, std::vector<int>> sender_on;  // host -> sender devices on it
  std::map<int, std::vector<int>> recv_on;    // host -> receiver devices on it
  std::vector<int> remote, local;             // receiver hosts without / with a replica
};

TaskHosts task_hosts(const ReshardProblem& p, const UnitTask& t) {
  TaskHosts th;
  for (int d : t.senders) {
    int h = p.hosts.host_of(d);
    if (!th.sender_on.count(h)) th.cand_hosts.push_back(h);  // senders sorted: first device order
    th.sender_on[h].push_back(d);
  }
  for (int d : t.receivers) th.recv_on[p.hosts.host_of(d)].push_back(d);
  for (const auto& [h, devs] : th.recv_on) (th.sender_on.count(h) ? th.local : th.remote).push_back(h);
  return th;
}

int64_t part_bytes(const ReshardProblem& p, const UnitTask& t, const Region& part, int idx, int k) {
  if (part.rank() == 0) return t.bytes * (idx + 1) / k - t.bytes * idx / k;  // abstract: even split
  int64_t es = p.tensors.empty() ? 1 : dtype_size(p.tensors[t.tensor].dtype);
  return part.num_elements() * es;
}

struct JobInfo {
  int task = 0;
  enum Kind { Whole, ToHost, ToDevice, Scatter, Gather } kind = Whole;
  int recv_host = -1, recv_device = -1;
};

struct Built {
  std::vector<detail::Job> jobs;
  std::vector<JobInfo> info;
  std::vector<int> host_ids;  // dense -> real
  std::map<int, int> dense;   // real -> dense
};

Built build_jobs(const ReshardProblem& p, const PlanOptions& opt) {
  Built b;
  b.host_ids = p.hosts.hosts();
  for (std::size_t i = 0; i < b.host_ids.size(); ++i) b.dense[b.host_ids[i]] = static_cast<int>(i);
  auto bw = [&](int h) { return p.hosts.bandwidth(h); };
  for (std::size_t ti = 0; ti < p.tasks.size(); ++ti) {
    const UnitTask& t = p.tasks[ti];
    TaskHosts th = task_hosts(p, t);
    if (th.remote.empty() || t.bytes == 0) continue;
    double min_recv_bw = std::numeric_limits<double>::infinity();
    for (int r : th.remote) min_recv_bw = std::min(min_recv_bw, bw(r));
    auto make = [&](double bytes, const std::vector<int>& recv_hosts, double rbw, double factor) {
      detail::Job j;
      for (int h : th.cand_hosts) {
        j.cands.push_back(b.dense[h]);
        j.dur.push_back(bytes / std::min(bw(h), rbw) * factor);
      }
      for (int r : recv_hosts) j.recv.push_back(b.dense[r]);
      return j;
    };
    const int task = static_cast<int>(ti);
    switch (opt.strategy) {
      case Strategy::Broadcast: {
        double f = opt.broadcast_chunks > 0
                       ? 1.0 + static_cast<double>(th.remote.size()) / opt.broadcast_chunks
                       : 1.0;
        b.jobs.push_back(make(static_cast<double>(t.bytes), th.remote, min_recv_bw, f));
        b.info.push_back({task, JobInfo::Whole});
        break;
      }
      case Strategy::LocalAllGather:
        for (int r : th.remote) {
          b.jobs.push_back(make(static_cast<double>(t.bytes), {r}, bw(r), 1.0));
          b.info.push_back({task, JobInfo::ToHost, r});
        }
        break;
      case Strategy::SendRecv:
        for (int r : th.remote)
          for (int d : th.recv_on[r]) {
            b.jobs.push_back(make(static_cast<double>(t.bytes), {r}, bw(r), 1.0));
            b.info.push_back({task, JobInfo::ToDevice, r, d});
          }
        break;
      case Strategy::GlobalAllGather: {
        b.jobs.push_back(make(static_cast<double>(t.bytes), th.remote, min_recv_bw, 1.0));
        b.info.push_back({task, JobInfo::Scatter});
        const double A = static_cast<double>(th.remote.size());
        if (th.remote.size() > 1) {
          detail::Job g;
          g.cands = {b.dense[th.remote[0]]};
          g.dur = {static_cast<double>(t.bytes) * (A - 1) / A / min_recv_bw};
          for (std::size_t k = 1; k < th.remote.size(); ++k) g.extra_send.push_back(b.dense[th.remote[k]]);
          for (int r : th.remote) g.recv.push_back(b.dense[r]);
          g.deps = {static_cast<int>(b.jobs.size()) - 1};
          b.jobs.push_back(g);
          b.info.push_back({task, JobInfo::Gather});
        }
        break;
      }
    }
  }
  return b;
}

// Turns a job schedule into ops and per-host orders (by start time, then op id).
ReshardPlan make_plan(const ReshardProblem& p, const PlanOptions& opt, const Built& b,
                      const detail::JobSchedule& s, const std::string& name) {
  ReshardPlan plan;
  plan.problem = p;
  plan.options = opt;
  plan.balancer_used = name;
  auto add = [&](int task, int sender, bool from_dst, std::vector<int> receivers, Region region,
                 int64_t bytes, std::vector<int> deps, double start) {
    Op op;
    op.id = static_cast<int>(plan.ops.size());
    op.task = task;
    op.tensor = p.tasks[task].tensor;
    op.sender = sender;
    op.from_destination = from_dst;
    op.receivers = std::move(receivers);
    op.region = std::move(region);
    op.bytes = bytes;
    op.send_host = p.hosts.host_of(sender);
    std::set<int> rh;
    for (int d : op.receivers) {
      int h = p.hosts.host_of(d);
      if (h != op.send_host) rh.insert(h);
    }
    op.recv_hosts.assign(rh.begin(), rh.end());
    op.deps = std::move(deps);
    op.start = start;
    plan.ops.push_back(op);
    return op.id;
  };
  // Local copies first: a receiver host holding a replica copies it from there.
  for (std::size_t ti = 0; ti < p.tasks.size(); ++ti) {
    TaskHosts th = task_hosts(p, p.tasks[ti]);
    for (int h : th.local)
      add(static_cast<int>(ti), th.sender_on[h].front(), false, th.recv_on[h], p.tasks[ti].region,
          p.tasks[ti].bytes, {}, 0.0);
  }
  for (std::size_t ji = 0; ji < b.jobs.size(); ++ji) {
    const JobInfo& in = b.info[ji];
    if (in.kind == JobInfo::Gather) continue;  // its ops are emitted with the scatter
    const UnitTask& t = p.tasks[in.task];
    TaskHosts th = task_hosts(p, t);
    const int host = b.host_ids[b.jobs[ji].cands[s.choice[ji]]];
    const int sender = th.sender_on[host].front();
    const double st = s.start[ji];
    switch (in.kind) {
      case JobInfo::Whole: {
        std::vector<int> rec;
        for (int r : th.remote) rec.insert(rec.end(), th.recv_on[r].begin(), th.recv_on[r].end());
        std::sort(rec.begin(), rec.end());
        add(in.task, sender, false, rec, t.region, t.bytes, {}, st);
        break;
      }
      case JobInfo::ToDevice: add(in.task, sender, false, {in.recv_device}, t.region, t.bytes, {}, st); break;
      case JobInfo::ToHost: {
        const auto& devs = th.recv_on[in.recv_host];
        const int B = static_cast<int>(devs.size());
        auto parts = split_region(t.region, B);
        std::vector<int> ids(B, -1);
        for (int j = 0; j < B; ++j) {
          int64_t pb = part_bytes(p, t, parts[j], j, B);
          if (pb > 0) ids[j] = add(in.task, sender, false, {devs[j]}, parts[j], pb, {}, st);
        }
        for (int j = 0; j < B; ++j) {  // all-gather inside the host
          if (ids[j] < 0 || B == 1) continue;
          std::vector<int> others;
          for (int k = 0; k < B; ++k)
            if (k != j) others.push_back(devs[k]);
          add(in.task, devs[j], true, others, parts[j], plan.ops[ids[j]].bytes, {ids[j]}, st);
        }
        break;
      }
      case JobInfo::Scatter: {
        std::vector<int> devs;
        for (int r : th.remote) devs.insert(devs.end(), th.recv_on[r].begin(), th.recv_on[r].end());
        std::sort(devs.begin(), devs.end());
        const int N = static_cast<int>(devs.size());
        auto parts = split_region(t.region, N);
        std::vector<int> ids(N, -1);
        for (int j = 0; j < N; ++j) {
          int64_t pb = part_bytes(p, t, parts[j], j, N);
          if (pb > 0) ids[j] = add(in.task, sender, false, {devs[j]}, parts[j], pb, {}, st);
        }
        // The gather job (next, if any) gives the all-gather's start; intra-host parts go first.
        double gst = ji + 1 < b.jobs.size() && b.info[ji + 1].kind == JobInfo::Gather ? s.start[ji + 1] : st;
        // Ring-shift order: in step s every receiver host i sends its parts to host i+s, so each
        // port serves one peer per step (an all-to-all without hot spots).
        const int A = static_cast<int>(th.remote.size());
        double min_bw = std::numeric_limits<double>::infinity();
        for (int r : th.remote) min_bw = std::min(min_bw, p.hosts.bandwidth(r));
        const double step = static_cast<double>(t.bytes) / A / min_bw;
        auto idx = [&](int h) {
          return static_cast<int>(std::find(th.remote.begin(), th.remote.end(), h) - th.remote.begin());
        };
        for (int j = 0; j < N; ++j) {
          if (ids[j] < 0) continue;
          int hj = p.hosts.host_of(devs[j]);
          for (int r : th.remote) {
            std::vector<int> rec;
            for (int d : th.recv_on[r])
              if (d != devs[j]) rec.push_back(d);
            if (rec.empty()) continue;
            int sft = (idx(r) - idx(hj) + A) % A;
            add(in.task, devs[j], true, rec, parts[j], plan.ops[ids[j]].bytes, {ids[j]},
                r == hj ? st : gst + (sft - 1) * step);
          }
        }
        break;
      }
      case JobInfo::Gather: break;
    }
  }
  // Per-host orders: every op on its send host (when it crosses a NIC), its remote receiver
  // hosts, and, for intra-host receivers, their host.
  std::map<int, std::vector<int>> ord;
  for (const Op& op : plan.ops) {
    std::set<int> hs(op.recv_hosts.begin(), op.recv_hosts.end());
    if (!op.recv_hosts.empty()) hs.insert(op.send_host);
    for (int d : op.receivers) hs.insert(p.hosts.host_of(d));
    for (int h : hs) ord[h].push_back(op.id);
  }
  for (auto& [h, v] : ord)
    std::stable_sort(v.begin(), v.end(), [&](int a, int c) {
      if (plan.ops[a].start != plan.ops[c].start) return plan.ops[a].start < plan.ops[c].start;
      return a < c;
    });
  plan.order = ord;
  plan.bound = lower_bound(p, opt.strategy);
  plan.completion_time = simulate(plan);
  return plan;
}

}  // namespace

namespace {

// Indivisible items (seconds) confined to the host set s, on |s| machines: the k + 1 shortest of
// the k·|s| + 1 longest run on one machine (pigeonhole), for every k.
double pigeonhole_bound(const std::vector<std::pair<std::vector<int>, double>>& items,
                        const std::vector<int>& s) {
  std::vector<double> d;
  for (const auto& [c, t] : items)
    if (std::includes(s.begin(), s.end(), c.begin(), c.end())) d.push_back(t);
  std::sort(d.begin(), d.end(), std::greater<>());
  const std::size_t m = s.size();
  double best = d.empty() ? 0.0 : d.front();
  for (std::size_t k = 1; k * m + 1 <= d.size(); ++k) {
    double sum = 0;
    for (std::size_t i = k * m - k; i <= k * m; ++i) sum += d[i];
    best = std::max(best, sum);
  }
  return best;
}

}  // namespace

LowerBound lower_bound(const ReshardProblem& p, Strategy strategy) {
  LowerBound lb;
  std::vector<std::pair<std::vector<int>, int64_t>> multi;  // candidate host sets of >= 2 hosts
  for (const auto& t : p.tasks) {
    TaskHosts th = task_hosts(p, t);
    if (th.remote.empty() || t.bytes == 0) continue;
    for (int r : th.remote) lb.must_recv[r] += t.bytes;
    if (th.cand_hosts.size() == 1)
      lb.must_send[th.cand_hosts[0]] += t.bytes;
    else {
      auto c = th.cand_hosts;
      std::sort(c.begin(), c.end());
      multi.push_back({c, t.bytes});
    }
  }
  for (auto [h, b] : lb.must_send)
    lb.per_host = std::max(lb.per_host, static_cast<double>(b) / p.hosts.bandwidth(h));
  for (auto [h, b] : lb.must_recv)
    lb.per_host = std::max(lb.per_host, static_cast<double>(b) / p.hosts.bandwidth(h));
  // Sender sets: S ranges over the candidate sets and their unions (closed under union of
  // intersecting sets, capped); tasks with candidates inside S, including single-host ones.
  std::set<std::vector<int>> fam;
  for (const auto& [c, b] : multi) fam.insert(c);
  std::vector<std::vector<int>> v(fam.begin(), fam.end());
  for (std::size_t a = 0; a < v.size() && v.size() < 256; ++a)
    for (std::size_t c = 0; c < a && v.size() < 256; ++c) {
      std::vector<int> in, un;
      std::set_intersection(v[a].begin(), v[a].end(), v[c].begin(), v[c].end(), std::back_inserter(in));
      if (in.empty()) continue;
      std::set_union(v[a].begin(), v[a].end(), v[c].begin(), v[c].end(), std::back_inserter(un));
      if (fam.insert(un).second) v.push_back(un);
    }
  // Whole tasks: one item per task (its shortest whole transfer: the fastest sender to the fastest
  // remote receiver host), confined to S, on |S| send ports.
  std::vector<std::pair<std::vector<int>, double>> items;  // candidate hosts (sorted), seconds
  for (const auto& t : p.tasks) {
    TaskHosts th = task_hosts(p, t);
    if (th.remote.empty() || t.bytes == 0) continue;
    double sbw = 0, rbw = 0;
    for (int h : th.cand_hosts) sbw = std::max(sbw, p.hosts.bandwidth(h));
    for (int r : th.remote) rbw = std::max(rbw, p.hosts.bandwidth(r));
    auto c = th.cand_hosts;
    std::sort(c.begin(), c.end());
    items.push_back({std::move(c), static_cast<double>(t.bytes) / std::min(sbw, rbw)});
  }
  for (const auto& s : v) lb.whole_tasks = std::max(lb.whole_tasks, pigeonhole_bound(items, s));
  for (const auto& s : v) {
    double bytes = 0, bw = 0;
    for (const auto& [c, b] : multi)
      if (std::includes(s.begin(), s.end(), c.begin(), c.end())) bytes += static_cast<double>(b);
    for (int h : s) {
      bw += p.hosts.bandwidth(h);
      auto it = lb.must_send.find(h);
      if (it != lb.must_send.end()) bytes += static_cast<double>(it->second);
    }
    lb.sender_sets = std::max(lb.sender_sets, bytes / bw);
  }
  // Cliques of transfers that pairwise share a remote receiver host or a forced sender host: a
  // broadcast is one transfer per task holding all its remote receive ports; send/recv and the
  // local all-gather reach each remote host separately from the sender (one transfer per task and
  // host). A global all-gather's remote hosts also receive from each other, so no transfer of it
  // is bound to the sender's speed: its cliques would only repeat per_host (none are formed).
  std::vector<double> w;
  std::vector<std::vector<int>> res;
  for (const auto& t : p.tasks) {
    TaskHosts th = task_hosts(p, t);
    if (th.remote.empty() || t.bytes == 0) continue;
    double sbw = 0;
    for (int h : th.cand_hosts) sbw = std::max(sbw, p.hosts.bandwidth(h));
    auto add_item = [&](const std::vector<int>& hosts) {
      double rbw = std::numeric_limits<double>::infinity();
      std::vector<int> r;
      for (int h : hosts) {
        rbw = std::min(rbw, p.hosts.bandwidth(h));
        r.push_back(2 * h + 1);
      }
      if (th.cand_hosts.size() == 1) r.push_back(2 * th.cand_hosts[0]);
      w.push_back(static_cast<double>(t.bytes) / std::min(sbw, rbw));
      res.push_back(std::move(r));
    };
    if (strategy == Strategy::Broadcast)
      add_item(th.remote);
    else if (strategy != Strategy::GlobalAllGather)
      for (int h : th.remote) add_item({h});
  }
  lb.cliques = detail::clique_bound(w, res);
  lb.value = std::max({lb.per_host, lb.sender_sets, lb.cliques, lb.whole_tasks});
  return lb;
}

double op_duration(const ReshardProblem& p, const Op& op, int broadcast_chunks) {
  if (op.recv_hosts.empty()) return 0.0;
  double bw = p.hosts.bandwidth(op.send_host);
  for (int r : op.recv_hosts) bw = std::min(bw, p.hosts.bandwidth(r));
  double t = static_cast<double>(op.bytes) / bw;
  if (broadcast_chunks > 0 && op.receivers.size() > 1 && !op.from_destination)
    t *= 1.0 + static_cast<double>(op.recv_hosts.size()) / broadcast_chunks;
  return t;
}

double simulate(ReshardPlan& plan) {
  const auto& p = plan.problem;
  const int n = static_cast<int>(plan.ops.size());
  for (int i = 0; i < n; ++i) WEFT_CHECK(plan.ops[i].id == i, "plan: op {} has id {}", i, plan.ops[i].id);
  // Port queues from the per-host orders: (host, 0) send port, (host, 1) receive port.
  std::map<std::pair<int, int>, std::vector<int>> queue;
  std::vector<int> seen(n, 0), need(n, 0);
  for (const Op& op : plan.ops) {
    std::set<int> hs(op.recv_hosts.begin(), op.recv_hosts.end());
    if (!op.recv_hosts.empty()) hs.insert(op.send_host);
    for (int d : op.receivers) hs.insert(p.hosts.host_of(d));
    need[op.id] = static_cast<int>(hs.size());
    for (int dep : op.deps)
      WEFT_CHECK(dep >= 0 && dep < n && dep != op.id, "plan: op {} has a bad dependency", op.id);
  }
  for (const auto& [h, ids] : plan.order)
    for (int id : ids) {
      WEFT_CHECK(id >= 0 && id < n, "plan: host {} lists unknown op {}", h, id);
      const Op& op = plan.ops[id];
      bool sends = !op.recv_hosts.empty() && op.send_host == h;
      bool recvs = std::find(op.recv_hosts.begin(), op.recv_hosts.end(), h) != op.recv_hosts.end();
      bool local = std::any_of(op.receivers.begin(), op.receivers.end(),
                               [&, h = h](int d) { return p.hosts.host_of(d) == h; });
      WEFT_CHECK(sends || recvs || local, "plan: host {} lists op {} which does not touch it", h, id);
      ++seen[id];
      if (sends) queue[{h, 0}].push_back(id);
      if (recvs) queue[{h, 1}].push_back(id);
    }
  for (int i = 0; i < n; ++i)
    WEFT_CHECK(seen[i] == need[i], "plan: op {} is listed on {} hosts, expected {}", i, seen[i], need[i]);
  std::map<std::pair<int, int>, std::size_t> head;
  std::map<std::pair<int, int>, double> free;
  std::vector<std::vector<std::pair<int, int>>> ports(n);
  for (const auto& [port, ids] : queue)
    for (int id : ids) ports[id].push_back(port);
  std::vector<std::vector<int>> dependents(n);
  for (const Op& op : plan.ops)
    for (int d : op.deps) dependents[d].push_back(op.id);
  std::vector<double> fin(n, -1.0);
  std::vector<int> work(n);
  for (int i = 0; i < n; ++i) work[i] = n - 1 - i;
  int finished = 0;
  double completion = 0;
  while (!work.empty()) {
    int id = work.back();
    work.pop_back();
    if (fin[id] >= 0) continue;
    Op& op = plan.ops[id];
    double st = 0;
    bool ok = true;
    for (int d : op.deps) {
      ok = ok && fin[d] >= 0;
      st = std::max(st, fin[d]);
    }
    for (const auto& port : ports[id]) {
      ok = ok && queue[port][head[port]] == id;
      st = std::max(st, free[port]);
    }
    if (!ok) continue;
    op.start = st;
    op.duration = op_duration(p, op, plan.options.broadcast_chunks);
    fin[id] = st + op.duration;
    completion = std::max(completion, fin[id]);
    ++finished;
    for (const auto& port : ports[id]) {
      free[port] = fin[id];
      if (++head[port] < queue[port].size()) work.push_back(queue[port][head[port]]);
    }
    for (int d : dependents[id]) work.push_back(d);
  }
  WEFT_CHECK(finished == n, "plan deadlocks: {} of {} ops can never start with these per-host orders",
             n - finished, n);
  plan.completion_time = completion;
  return completion;
}

double ReshardPlan::ratio() const {
  if (bound.value <= 0) return completion_time <= 0 ? 1.0 : std::numeric_limits<double>::infinity();
  return completion_time / bound.value;
}

std::map<int, int64_t> ReshardPlan::nic_bytes_sent() const {
  std::map<int, int64_t> m;
  for (const Op& op : ops)
    if (!op.recv_hosts.empty()) m[op.send_host] += op.bytes;
  return m;
}
std::map<int, int64_t> ReshardPlan::nic_bytes_received() const {
  std::map<int, int64_t> m;
  for (const Op& op : ops)
    for (int r : op.recv_hosts) m[r] += op.bytes;
  return m;
}

std::string ReshardPlan::summary() const {
  return fmt::format(
      "ReshardPlan({} tasks, {} ops, {}+{}, time {:.6g} s, lower bound {:.6g} s, ratio {:.4f})",
      problem.tasks.size(), ops.size(), to_string(options.strategy), balancer_used, completion_time,
      bound.value, ratio());
}

namespace {
nlohmann::json region_json(const Region& r) {
  nlohmann::json j = nlohmann::json::array();
  for (const auto& d : r.dims) {
    nlohmann::json dj = nlohmann::json::array();
    for (const auto& iv : d) dj.push_back({iv.begin, iv.end});
    j.push_back(dj);
  }
  return j;
}
}  // namespace

std::string ReshardPlan::to_json() const {
  nlohmann::json j;
  j["strategy"] = to_string(options.strategy);
  j["balancer"] = to_string(options.balancer);
  j["balancer_used"] = balancer_used;
  j["seed"] = options.seed;
  j["broadcast_chunks"] = options.broadcast_chunks;
  j["completion_time"] = completion_time;
  j["lower_bound"] = bound.value;
  j["ratio"] = ratio();
  nlohmann::json hosts = nlohmann::json::object();
  for (int h : problem.hosts.hosts()) {
    nlohmann::json hj;
    nlohmann::json devs = nlohmann::json::array();
    for (auto [d, hh] : problem.hosts.device_host())
      if (hh == h) devs.push_back(d);
    hj["devices"] = devs;
    hj["bandwidth"] = problem.hosts.bandwidth(h);
    auto it = order.find(h);
    hj["ops"] = it == order.end() ? nlohmann::json::array() : nlohmann::json(it->second);
    hosts[std::to_string(h)] = hj;
  }
  j["hosts"] = hosts;
  nlohmann::json tasks = nlohmann::json::array();
  for (const auto& t : problem.tasks)
    tasks.push_back({{"tensor", t.tensor},
                     {"region", region_json(t.region)},
                     {"bytes", t.bytes},
                     {"senders", t.senders},
                     {"receivers", t.receivers}});
  j["unit_tasks"] = tasks;
  nlohmann::json ops_j = nlohmann::json::array();
  for (const Op& op : ops)
    ops_j.push_back({{"id", op.id},
                     {"task", op.task},
                     {"tensor", op.tensor},
                     {"sender", op.sender},
                     {"from_destination", op.from_destination},
                     {"receivers", op.receivers},
                     {"region", region_json(op.region)},
                     {"bytes", op.bytes},
                     {"send_host", op.send_host},
                     {"recv_hosts", op.recv_hosts},
                     {"deps", op.deps},
                     {"start", op.start},
                     {"duration", op.duration}});
  j["ops"] = ops_j;
  return j.dump();
}

ReshardPlan plan(const ReshardProblem& p, const PlanOptions& opt) {
  p.validate();
  WEFT_CHECK(opt.dfs_node_limit >= 1, "plan: dfs_node_limit must be >= 1");
  WEFT_CHECK(opt.time_limit_s > 0, "plan: time_limit_s must be positive");
  WEFT_CHECK(opt.greedy_restarts >= 1, "plan: greedy_restarts must be >= 1");
  WEFT_CHECK(opt.broadcast_chunks >= 0, "plan: broadcast_chunks must be >= 0");
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double>(opt.time_limit_s));
  Built b = build_jobs(p, opt);
  const int H = static_cast<int>(b.host_ids.size());
  std::vector<std::pair<std::string, detail::JobSchedule>> cands;
  auto want = [&](Balancer x) { return opt.balancer == x || opt.balancer == Balancer::Best; };
  if (want(Balancer::Naive)) cands.push_back({"naive", detail::balance_naive(b.jobs, H)});
  if (want(Balancer::LargestFirst))
    cands.push_back({"largest_first", detail::balance_largest_first(b.jobs, H)});
  if (want(Balancer::RandomGreedy))
    cands.push_back(
        {"random_greedy", detail::balance_random_greedy(b.jobs, H, opt.seed, opt.greedy_restarts)});
  if (want(Balancer::List)) cands.push_back({"list", detail::balance_list(b.jobs, H)});
  if (want(Balancer::Dfs)) {
    detail::JobSchedule inc;
    for (const auto& [n, s] : cands)
      if (s.complete && (!inc.complete || s.makespan < inc.makespan - tol(inc.makespan))) inc = s;
    auto d = detail::balance_dfs(b.jobs, H, inc, opt.dfs_node_limit, deadline);
    if (d.complete && (!inc.complete || d.makespan < inc.makespan - tol(inc.makespan)))
      cands.push_back({"dfs", d});
    if (cands.empty())
      cands.push_back({"largest_first", detail::balance_largest_first(b.jobs, H)});  // budget < depth
  }
  std::optional<ReshardPlan> best;
  for (const auto& [name, s] : cands) {
    ReshardPlan pl = make_plan(p, opt, b, s, name);
    if (!best || pl.completion_time < best->completion_time - tol(best->completion_time))
      best = std::move(pl);
  }
  return *best;
}

}  // namespace weft::reshard
