// Load balancing and ordering of resharding transfers over hosts (see balance.hpp for the
// model). Solves  min_{sender choice, start times} max_j (S_j + T_j)  subject to: j's sender is
// one of its candidates; jobs sharing a port (the sender's send port, any receiver's receive
// port) do not overlap in time; S_j >= finish of j's deps.
//
// Lower bound (admissible, used to prune and to stop): for every port p, the jobs that must use
// it run one after another after the port is free: free(p) + sum of their durations; for every
// union S of candidate sender sets, the jobs whose candidates all lie in S are spread over the
// |S| send ports: (sum_{h in S} free(h) + sum of their shortest durations) / |S|.
//
// Largest-first is the classical LPT rule for min-max load (a 4/3-approximation in general,
// exact for equal sizes). Dfs branches on (next job, sender) with the serial append rule, one
// branch per class of identical jobs, children ordered by earliest start then by the load left
// on their ports, and prunes with the bound above. RandomGreedy is the paper's iterative
// randomized maximal-set heuristic, event-driven so that unequal sizes do not wait for rounds.
#include "balance.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <tuple>

#include "weft/core/error.hpp"

namespace weft::reshard::detail {

double Job::dmin() const { return *std::min_element(dur.begin(), dur.end()); }

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
double tol(double x) { return std::isfinite(x) ? 1e-9 * std::max(1.0, std::abs(x)) : 0.0; }

// Ports: send port of host h is h, receive port is H + h.
std::vector<int> ports_of(const Job& j, int k, int H) {
  std::vector<int> p;
  p.push_back(j.cands[k]);
  for (int s : j.extra_send) p.push_back(s);
  for (int r : j.recv) p.push_back(H + r);
  return p;
}

// Unions of candidate sets with at least two hosts, closed under union of intersecting sets
// (capped), plus the union of all of them.
std::vector<std::vector<int>> candidate_families(const std::vector<Job>& jobs) {
  std::set<std::vector<int>> fam;
  for (const auto& j : jobs)
    if (j.cands.size() >= 2) {
      auto c = j.cands;
      std::sort(c.begin(), c.end());
      fam.insert(c);
    }
  std::vector<std::vector<int>> v(fam.begin(), fam.end());
  for (std::size_t a = 0; a < v.size() && v.size() < 256; ++a)
    for (std::size_t b = 0; b < a && v.size() < 256; ++b) {
      std::vector<int> in, un;
      std::set_intersection(v[a].begin(), v[a].end(), v[b].begin(), v[b].end(), std::back_inserter(in));
      if (in.empty()) continue;
      std::set_union(v[a].begin(), v[a].end(), v[b].begin(), v[b].end(), std::back_inserter(un));
      if (fam.insert(un).second) v.push_back(un);
    }
  if (!v.empty()) {
    std::set<int> all;
    for (const auto& s : v) all.insert(s.begin(), s.end());
    std::vector<int> u(all.begin(), all.end());
    if (fam.insert(u).second) v.push_back(u);
  }
  return v;
}

bool subset(const std::vector<int>& small, const std::vector<int>& sorted_big) {
  for (int x : small)
    if (!std::binary_search(sorted_big.begin(), sorted_big.end(), x)) return false;
  return true;
}

// Forced per-port load of a job: (port, amount) for ports it uses whatever the choice.
std::vector<std::pair<int, double>> forced_load(const Job& j, int H) {
  std::vector<std::pair<int, double>> f;
  double d = j.dmin();
  if (j.cands.size() == 1) f.push_back({j.cands[0], j.dur[0]});
  for (int s : j.extra_send) f.push_back({s, d});
  for (int r : j.recv) f.push_back({H + r, d});
  return f;
}

void check_jobs(const std::vector<Job>& jobs, int H) {
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const auto& j = jobs[i];
    WEFT_ASSERT(!j.cands.empty() && j.cands.size() == j.dur.size(), "job without candidates");
    for (int c : j.cands) WEFT_ASSERT(c >= 0 && c < H, "bad candidate host");
    for (int d : j.deps) WEFT_ASSERT(d >= 0 && d < static_cast<int>(i), "deps must point to earlier jobs");
  }
}

}  // namespace

double clique_bound(const std::vector<double>& w, const std::vector<std::vector<int>>& res,
                    std::size_t max_items) {
  const std::size_t n = w.size();
  if (n == 0 || n > max_items) return 0.0;
  const std::size_t words = (n + 63) / 64;
  std::vector<uint64_t> adj(n * words, 0);  // row i: the items conflicting with i
  auto row = [&](std::size_t i) { return adj.data() + i * words; };
  std::map<int, std::vector<std::size_t>> users;
  for (std::size_t i = 0; i < n; ++i)
    for (int r : res[i]) users[r].push_back(i);
  for (const auto& [r, us] : users)
    for (std::size_t a : us)
      for (std::size_t b : us)
        if (a != b) row(a)[b / 64] |= uint64_t{1} << (b % 64);
  std::vector<std::size_t> by_w(n);
  std::iota(by_w.begin(), by_w.end(), std::size_t{0});
  std::stable_sort(by_w.begin(), by_w.end(), [&](std::size_t a, std::size_t b) { return w[a] > w[b]; });
  double best = 0;
  std::vector<uint64_t> common(words);
  for (std::size_t s = 0; s < std::min<std::size_t>(n, 64); ++s) {
    std::size_t seed = by_w[s];
    std::copy(row(seed), row(seed) + words, common.begin());
    double sum = w[seed];
    for (std::size_t j : by_w)
      if (common[j / 64] >> (j % 64) & 1) {
        sum += w[j];
        for (std::size_t k = 0; k < words; ++k) common[k] &= row(j)[k];
      }
    best = std::max(best, sum);
  }
  return best;
}

double job_lower_bound(const std::vector<Job>& jobs, int H) {
  std::vector<double> port(2 * H, 0.0);
  double lb = 0;
  for (const auto& j : jobs) {
    for (auto [p, a] : forced_load(j, H)) port[p] += a;
    lb = std::max(lb, j.dmin());
  }
  for (double x : port) lb = std::max(lb, x);
  for (const auto& s : candidate_families(jobs)) {
    double sum = 0;
    for (const auto& j : jobs)
      if (j.cands.size() >= 2 && subset(j.cands, s)) sum += j.dmin();
    lb = std::max(lb, sum / static_cast<double>(s.size()));
  }
  std::vector<double> w;
  std::vector<std::vector<int>> res;
  for (const auto& j : jobs) {
    w.push_back(j.dmin());
    std::vector<int> r;
    if (j.cands.size() == 1) r.push_back(j.cands[0]);
    for (int e : j.extra_send) r.push_back(e);
    for (int x : j.recv) r.push_back(H + x);
    res.push_back(r);
  }
  return std::max(lb, clique_bound(w, res));
}

JobSchedule schedule_in_order(const std::vector<Job>& jobs, int H, const std::vector<int>& order,
                              const std::vector<int>& choice) {
  check_jobs(jobs, H);
  JobSchedule s;
  s.choice = choice;
  s.start.assign(jobs.size(), -1.0);
  std::vector<double> free(2 * H, 0.0), fin(jobs.size(), -1.0);
  for (int id : order) {
    const Job& j = jobs[id];
    double st = 0;
    for (int p : ports_of(j, choice[id], H)) st = std::max(st, free[p]);
    for (int d : j.deps) {
      WEFT_ASSERT(fin[d] >= 0, "order places a job before its dependency");
      st = std::max(st, fin[d]);
    }
    fin[id] = st + j.dur[choice[id]];
    s.start[id] = st;
    for (int p : ports_of(j, choice[id], H)) free[p] = fin[id];
    s.makespan = std::max(s.makespan, fin[id]);
  }
  s.complete = order.size() == jobs.size();
  return s;
}

JobSchedule balance_naive(const std::vector<Job>& jobs, int H) {
  std::vector<int> order(jobs.size());
  std::iota(order.begin(), order.end(), 0);
  return schedule_in_order(jobs, H, order, std::vector<int>(jobs.size(), 0));
}

JobSchedule balance_largest_first(const std::vector<Job>& jobs, int H) {
  const int n = static_cast<int>(jobs.size());
  std::vector<int> prio(n);
  std::iota(prio.begin(), prio.end(), 0);
  std::stable_sort(prio.begin(), prio.end(), [&](int a, int b) { return jobs[a].dmin() > jobs[b].dmin(); });
  std::vector<double> load(H, 0.0);
  std::vector<int> choice(n, 0);
  for (int id : prio) {
    const Job& j = jobs[id];
    int best = 0;
    for (int k = 1; k < static_cast<int>(j.cands.size()); ++k)
      if (load[j.cands[k]] + j.dur[k] < load[j.cands[best]] + j.dur[best] - tol(load[j.cands[best]]))
        best = k;
    choice[id] = best;
    load[j.cands[best]] += j.dur[best];
  }
  // Priority order, each job as soon as its deps are placed.
  std::vector<int> order, pending = prio;
  std::vector<char> placed(n, 0);
  while (!pending.empty()) {
    auto it = std::find_if(pending.begin(), pending.end(), [&](int id) {
      return std::all_of(jobs[id].deps.begin(), jobs[id].deps.end(), [&](int d) { return placed[d] != 0; });
    });
    WEFT_ASSERT(it != pending.end(), "cyclic job dependencies");
    placed[*it] = 1;
    order.push_back(*it);
    pending.erase(it);
  }
  return schedule_in_order(jobs, H, order, choice);
}

JobSchedule balance_list(const std::vector<Job>& jobs, int H) {
  check_jobs(jobs, H);
  const int n = static_cast<int>(jobs.size());
  std::vector<double> free(2 * static_cast<std::size_t>(H), 0.0), fin(jobs.size(), -1.0);
  std::vector<int> order, choice(jobs.size(), 0);
  std::vector<char> placed(jobs.size(), 0);
  for (int step = 0; step < n; ++step) {
    int bj = -1, bk = 0;
    double bst = kInf, bfin = kInf;
    for (int id = 0; id < n; ++id) {
      if (placed[id]) continue;
      const Job& j = jobs[id];
      double dep = 0;
      bool ready = true;
      for (int d : j.deps) {
        ready = ready && placed[d];
        dep = std::max(dep, fin[d]);
      }
      if (!ready) continue;
      for (int k = 0; k < static_cast<int>(j.cands.size()); ++k) {
        double st = dep;
        for (int p : ports_of(j, k, H)) st = std::max(st, free[p]);
        const double f = st + j.dur[k];
        const bool better =
            st < bst - tol(bst) ||
            (st <= bst + tol(bst) &&
             (f < bfin - tol(bfin) || (f <= bfin + tol(bfin) && bj >= 0 && j.dur[k] > jobs[bj].dur[bk])));
        if (bj < 0 || better) bj = id, bk = k, bst = st, bfin = f;
      }
    }
    WEFT_ASSERT(bj >= 0, "cyclic job dependencies");
    placed[bj] = 1;
    choice[bj] = bk;
    fin[bj] = bfin;
    for (int p : ports_of(jobs[bj], bk, H)) free[p] = bfin;
    order.push_back(bj);
  }
  return schedule_in_order(jobs, H, order, choice);
}

JobSchedule balance_random_greedy(const std::vector<Job>& jobs, int H, uint64_t seed, int restarts) {
  check_jobs(jobs, H);
  const int n = static_cast<int>(jobs.size()), P = 2 * H;
  JobSchedule best;
  best.makespan = kInf;
  for (int r = 0; r < std::max(1, restarts); ++r) {
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + static_cast<uint64_t>(r) * 0xBF58476D1CE4E5B9ULL + 1);
    JobSchedule s;
    s.choice.assign(n, 0);
    s.start.assign(n, -1.0);
    std::vector<double> free(P, 0.0), fin(n, kInf), load(H, 0.0);
    std::vector<char> started(n, 0);
    std::vector<char> taken(P, 0);
    int left = n;
    double t = 0;
    while (left > 0) {
      std::vector<int> ready;
      for (int id = 0; id < n; ++id) {
        if (started[id]) continue;
        bool ok = true;
        for (int d : jobs[id].deps) ok = ok && fin[d] <= t + tol(t);
        if (ok) ready.push_back(id);
      }
      std::vector<std::pair<int, int>> best_set;  // (job, choice)
      std::pair<int, double> best_score{-1, 0};
      const int trials = std::clamp(40000 / std::max<int>(1, static_cast<int>(ready.size())), 1, 8);
      for (int trial = 0; trial < trials && !ready.empty(); ++trial) {
        std::vector<int> perm = ready;
        std::shuffle(perm.begin(), perm.end(), rng);
        std::vector<std::pair<int, int>> set;
        std::vector<int> used;
        double bytes = 0;
        auto port_ok = [&](int p) { return !taken[p] && free[p] <= t + tol(t); };
        for (int id : perm) {
          const Job& j = jobs[id];
          bool rest_ok = true;
          for (int s2 : j.extra_send) rest_ok = rest_ok && port_ok(s2);
          for (int rr : j.recv) rest_ok = rest_ok && port_ok(H + rr);
          if (!rest_ok) continue;
          int pick = -1;
          for (int k = 0; k < static_cast<int>(j.cands.size()); ++k) {
            int h = j.cands[k];
            if (!port_ok(h) || std::find(j.extra_send.begin(), j.extra_send.end(), h) != j.extra_send.end())
              continue;
            if (pick < 0 || load[h] + j.dur[k] < load[j.cands[pick]] + j.dur[pick] - tol(load[h])) pick = k;
          }
          if (pick < 0) continue;
          for (int p : ports_of(j, pick, H)) {
            taken[p] = 1;
            used.push_back(p);
          }
          set.push_back({id, pick});
          bytes += j.dur[pick];
        }
        for (int p : used) taken[p] = 0;
        std::pair<int, double> score{static_cast<int>(used.size()), bytes};
        if (score > best_score) {
          best_score = score;
          best_set = set;
        }
      }
      for (auto [id, k] : best_set) {
        const Job& j = jobs[id];
        started[id] = 1;
        --left;
        s.choice[id] = k;
        s.start[id] = t;
        fin[id] = t + j.dur[k];
        load[j.cands[k]] += j.dur[k];
        for (int p : ports_of(j, k, H)) free[p] = fin[id];
        s.makespan = std::max(s.makespan, fin[id]);
      }
      if (left == 0) break;
      double next = kInf;
      for (double f : free)
        if (f > t + tol(t)) next = std::min(next, f);
      WEFT_ASSERT(next < kInf, "random greedy: no job can start and none is running");
      t = next;
    }
    s.complete = true;
    if (!best.complete || s.makespan < best.makespan - tol(best.makespan)) best = s;
  }
  return best;
}

namespace {

struct Dfs {
  const std::vector<Job>& jobs;
  int H, P, n;
  std::vector<double> free, fin;
  std::vector<char> done;
  std::vector<std::vector<std::pair<int, double>>> forced;
  std::vector<double> rem_port;
  std::vector<std::vector<int>> fam;
  std::vector<double> rem_fam;
  std::vector<std::vector<int>> fam_of_job;
  std::vector<std::vector<int>> members;
  std::vector<int> next_idx, class_of;
  std::vector<int> choice;
  std::vector<double> start;
  JobSchedule best;
  double root_lb = 0, now_makespan = 0;
  int64_t nodes = 0, limit = 0;
  std::chrono::steady_clock::time_point deadline;
  bool stop = false;
  int remaining = 0;

  Dfs(const std::vector<Job>& j, int h) : jobs(j), H(h), P(2 * h), n(static_cast<int>(j.size())) {
    free.assign(P, 0.0);
    fin.assign(n, -1.0);
    done.assign(n, 0);
    rem_port.assign(P, 0.0);
    for (const auto& job : jobs) {
      forced.push_back(forced_load(job, H));
      for (auto [p, a] : forced.back()) rem_port[p] += a;
    }
    fam = candidate_families(jobs);
    rem_fam.assign(fam.size(), 0.0);
    fam_of_job.resize(n);
    for (int i = 0; i < n; ++i)
      if (jobs[i].cands.size() >= 2)
        for (std::size_t s = 0; s < fam.size(); ++s)
          if (subset(jobs[i].cands, fam[s])) {
            fam_of_job[i].push_back(static_cast<int>(s));
            rem_fam[s] += jobs[i].dmin();
          }
    // Classes of interchangeable jobs: same candidates, durations and ports, no deps.
    std::map<std::tuple<std::vector<int>, std::vector<double>, std::vector<int>, std::vector<int>>, int> key;
    class_of.assign(n, -1);
    for (int i = 0; i < n; ++i) {
      const Job& jb = jobs[i];
      int c;
      if (!jb.deps.empty()) {
        c = static_cast<int>(members.size());
        members.push_back({});
      } else {
        auto [it, fresh] = key.emplace(std::make_tuple(jb.cands, jb.dur, jb.recv, jb.extra_send),
                                       static_cast<int>(members.size()));
        if (fresh) members.push_back({});
        c = it->second;
      }
      members[c].push_back(i);
      class_of[i] = c;
    }
    next_idx.assign(members.size(), 0);
    choice.assign(n, 0);
    start.assign(n, -1.0);
    remaining = n;
  }

  double bound() const {
    double lb = now_makespan;
    for (int p = 0; p < P; ++p)
      if (rem_port[p] > 0) lb = std::max(lb, free[p] + rem_port[p]);
    for (std::size_t s = 0; s < fam.size(); ++s)
      if (rem_fam[s] > 0) {
        double sum = rem_fam[s];
        for (int h : fam[s]) sum += free[h];
        lb = std::max(lb, sum / static_cast<double>(fam[s].size()));
      }
    return lb;
  }

  struct Child {
    double st, crit, dur;
    int job, k;
  };

  void rec() {
    if (stop) return;
    ++nodes;
    if (nodes > limit || ((nodes & 255) == 0 && std::chrono::steady_clock::now() > deadline)) {
      stop = true;
      return;
    }
    if (remaining == 0) {
      if (now_makespan < best.makespan - tol(best.makespan)) {
        best.choice = choice;
        best.start = start;
        best.makespan = now_makespan;
        best.complete = true;
        if (best.makespan <= root_lb + tol(root_lb)) stop = true;
      }
      return;
    }
    if (bound() >= best.makespan - tol(best.makespan)) return;
    std::vector<Child> kids;
    for (std::size_t c = 0; c < members.size(); ++c) {
      if (next_idx[c] >= static_cast<int>(members[c].size())) continue;
      int id = members[c][next_idx[c]];
      const Job& j = jobs[id];
      bool ready = true;
      double dep = 0;
      for (int d : j.deps) {
        ready = ready && done[d];
        dep = std::max(dep, fin[d]);
      }
      if (!ready) continue;
      for (int k = 0; k < static_cast<int>(j.cands.size()); ++k) {
        double st = dep, crit = 0;
        for (int p : ports_of(j, k, H)) {
          st = std::max(st, free[p]);
          crit = std::max(crit, rem_port[p] + free[p]);
        }
        if (st + j.dur[k] >= best.makespan - tol(best.makespan)) continue;
        kids.push_back({st, crit, j.dur[k], id, k});
      }
    }
    std::sort(kids.begin(), kids.end(), [](const Child& a, const Child& b) {
      if (a.st != b.st) return a.st < b.st;
      if (a.crit != b.crit) return a.crit > b.crit;
      if (a.dur != b.dur) return a.dur > b.dur;
      if (a.job != b.job) return a.job < b.job;
      return a.k < b.k;
    });
    for (const Child& ch : kids) {
      const Job& j = jobs[ch.job];
      auto ports = ports_of(j, ch.k, H);
      std::vector<double> saved;
      for (int p : ports) saved.push_back(free[p]);
      double saved_ms = now_makespan, f = ch.st + ch.dur;
      for (int p : ports) free[p] = f;
      fin[ch.job] = f;
      done[ch.job] = 1;
      choice[ch.job] = ch.k;
      start[ch.job] = ch.st;
      now_makespan = std::max(now_makespan, f);
      for (auto [p, a] : forced[ch.job]) rem_port[p] -= a;
      for (int s : fam_of_job[ch.job]) rem_fam[s] -= j.dmin();
      ++next_idx[class_of[ch.job]];
      --remaining;
      rec();
      ++remaining;
      --next_idx[class_of[ch.job]];
      for (int s : fam_of_job[ch.job]) rem_fam[s] += j.dmin();
      for (auto [p, a] : forced[ch.job]) rem_port[p] += a;
      now_makespan = saved_ms;
      done[ch.job] = 0;
      fin[ch.job] = -1;
      start[ch.job] = -1;
      for (std::size_t i = 0; i < ports.size(); ++i) free[ports[i]] = saved[i];
      if (stop) return;
    }
  }
};

}  // namespace

JobSchedule balance_dfs(const std::vector<Job>& jobs, int H, const JobSchedule& incumbent, int64_t node_limit,
                        std::chrono::steady_clock::time_point deadline) {
  check_jobs(jobs, H);
  Dfs d(jobs, H);
  d.best = incumbent;
  if (!d.best.complete) d.best.makespan = kInf;
  d.root_lb = job_lower_bound(jobs, H);
  d.limit = node_limit;
  d.deadline = deadline;
  if (d.best.complete && d.best.makespan <= d.root_lb + tol(d.root_lb)) return d.best;
  d.rec();
  return d.best;
}

}  // namespace weft::reshard::detail
