// O2 coarsening: critical nodes, segments, DP stitching with per-segment ILPs (math in
// coarsen.hpp).
#include "weft/spmd/coarsen.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <optional>
#include <unordered_map>

#include "weft/core/error.hpp"

namespace weft::spmd {

std::vector<int> critical_nodes(int n, const std::vector<std::vector<int>>& succ,
                                const std::vector<double>& weight, double heavy_fraction) {
  std::vector<int> indeg(n, 0);
  for (int u = 0; u < n; ++u)
    for (int v : succ[u]) ++indeg[v];
  std::vector<int> order;
  std::vector<int> q;
  for (int u = 0; u < n; ++u)
    if (!indeg[u]) q.push_back(u);
  for (std::size_t i = 0; i < q.size(); ++i) {
    order.push_back(q[i]);
    for (int v : succ[q[i]])
      if (--indeg[v] == 0) q.push_back(v);
  }
  WEFT_CHECK(static_cast<int>(order.size()) == n, "critical_nodes: the op graph has a cycle");
  std::vector<int> es(n, 0), ls(n, 0);
  for (int u : order)
    for (int v : succ[u]) es[v] = std::max(es[v], es[u] + 1);
  const int len = n ? *std::max_element(es.begin(), es.end()) : 0;
  std::fill(ls.begin(), ls.end(), len);
  for (auto it = order.rbegin(); it != order.rend(); ++it)
    for (int v : succ[*it]) ls[*it] = std::min(ls[*it], ls[v] - 1);
  const double wmax = n ? *std::max_element(weight.begin(), weight.begin() + n) : 0;
  std::vector<int> out;
  for (int u = 0; u < n; ++u)
    if (es[u] == ls[u] && weight[u] > 0 && weight[u] >= heavy_fraction * wmax) out.push_back(u);
  return out;
}

namespace {

using O2Cache = std::unordered_map<std::string, std::vector<std::pair<double, std::vector<int>>>>;

// Cache key of a sub-problem: its numbers (rounded to 1e-9 of fscale, so the repeated layers'
// bit-level noise does not split them) as raw bytes, with the sizes that delimit them. Binary
// rather than text: formatting every number dominated deep O2 runs.
std::string key_of(const StrategyProblem& p, double fscale) {
  std::string k;
  std::size_t total = 0;
  for (const auto& c : p.node_cost) total += c.size() + 1;
  for (const auto& e : p.edges) total += e.cost.size() + 2;
  k.reserve(8 * (total + 4));
  auto raw = [&](const void* d, std::size_t n) { k.append(static_cast<const char*>(d), n); };
  auto num = [&](double x) {
    const double r = std::isinf(x) ? x : std::round(x / fscale * 1e9) / 1e9;
    raw(&r, sizeof r);
  };
  auto count = [&](std::size_t n) {
    const auto c = static_cast<std::uint64_t>(n);
    raw(&c, sizeof c);
  };
  count(p.node_cost.size());
  for (const auto& c : p.node_cost) {
    count(c.size());
    for (double x : c) num(x);
  }
  count(p.edges.size());
  for (const auto& e : p.edges) {
    const std::int32_t uv[2] = {e.u, e.v};
    raw(uv, sizeof uv);
    for (double x : e.cost) num(x);
  }
  count(p.memory_rows.size());
  for (const auto& r : p.memory_rows) {
    num(r.constant);
    count(r.terms.size());
    for (const auto& t : r.terms) {
      count(static_cast<std::size_t>(t.node));
      for (double x : t.bytes) num(x);
    }
  }
  return k;
}

// One ILP solve of a sub-problem, counted in the O2 statistics (solves, largest model, worst
// status and gap over the solves that found something).
ProblemSolution solve_counted(const StrategyProblem& q, const O2Options& opt, O2Stats& st,
                              std::vector<int> warm_start = {}) {
  SolveOptions so;
  so.time_limit_s = opt.time_limit_s;
  so.relative_gap = opt.relative_gap;
  so.warm_start = std::move(warm_start);
  so.stop = opt.stop;
  // Without memory rows the model is one-hot rows plus their linearisation: CBC's presolve and
  // integer preprocessing find little there and took more than half of each refinement window's
  // solve (GPT, 2x4 mesh).
  so.presolve = so.preprocess = !q.memory_rows.empty() && !std::isinf(q.memory_limit);
  auto sol = solve_ilp(q, so);
  ++st.ilp_solves;
  st.max_ilp_variables = std::max(st.max_ilp_variables, sol.ilp_variables);
  st.max_ilp_constraints = std::max(st.max_ilp_constraints, sol.ilp_constraints);
  st.max_gap = std::max(st.max_gap, sol.gap);
  if (static_cast<int>(sol.status) > static_cast<int>(st.worst_status) && sol.has_solution())
    st.worst_status = sol.status;
  return sol;
}

// Solve the sub-problem of the nodes `win` with every other node fixed at `cur` (edges to them
// folded into node costs, their bytes into row constants). Exact (elimination) when no memory
// row can bind and the tables fit, else an ILP warm-started at `cur`. Returns the window's
// choice (in `win` order), or empty when nothing feasible was found; `delta` = the change of
// the total cost if it is taken (the sub-problem holds every node and edge term that involves
// the window), `feasible` = its rows hold. `lid` is scratch of size n, all -1 on entry and exit.
struct WindowResult {
  std::vector<int> choice;
  double delta = 0;
  bool feasible = false;
};

WindowResult solve_window(const StrategyProblem& p, const std::vector<int>& win, const std::vector<int>& cur,
                          const std::vector<std::vector<int>>& adj, const O2Options& opt, O2Cache& cache,
                          O2Stats& st, std::vector<int>& lid) {
  for (int i = 0; i < static_cast<int>(win.size()); ++i) lid[win[i]] = i;
  StrategyProblem sub;
  sub.node_cost.resize(win.size());
  for (int i = 0; i < static_cast<int>(win.size()); ++i) {
    const int v = win[i];
    sub.node_cost[i] = p.node_cost[v];
    for (int e : adj[v]) {
      const auto& ed = p.edges[e];
      const int other = ed.u == v ? ed.v : ed.u;
      const int sv = static_cast<int>(p.node_cost[ed.v].size());
      if (lid[other] >= 0) {
        if (ed.u == v) sub.edges.push_back({lid[ed.u], lid[ed.v], ed.cost});  // once, from u
        continue;
      }
      for (int s = 0; s < static_cast<int>(sub.node_cost[i].size()); ++s)
        sub.node_cost[i][s] += ed.u == v ? ed.cost[static_cast<std::size_t>(s) * sv + cur[other]]
                                         : ed.cost[static_cast<std::size_t>(cur[other]) * sv + s];
    }
  }
  if (!std::isinf(p.memory_limit))
    for (const auto& row : p.memory_rows) {
      MemoryRow r{row.label, row.constant, {}};
      double maxv = row.constant;
      for (const auto& t : row.terms) {
        if (lid[t.node] >= 0) {
          r.terms.push_back({lid[t.node], t.bytes});
          maxv += *std::max_element(t.bytes.begin(), t.bytes.end());
        } else {
          r.constant += t.bytes[cur[t.node]];
          maxv += t.bytes[cur[t.node]];
        }
      }
      if (maxv > p.memory_limit && !r.terms.empty()) sub.memory_rows.push_back(std::move(r));
    }
  for (int v : win) lid[v] = -1;
  if (!sub.memory_rows.empty()) sub.memory_limit = p.memory_limit;
  std::vector<int> now;
  for (int v : win) now.push_back(cur[v]);
  WindowResult out;
  auto finish = [&](std::vector<int> res) {
    if (!res.empty()) {
      const Evaluation e = evaluate(sub, res);
      out.delta = e.cost - evaluate(sub, now).cost;
      out.feasible = e.feasible();
    }
    out.choice = std::move(res);
    return out;
  };
  const std::string key = opt.reuse_repeated ? "w" + key_of(sub, 1.0) : std::string();
  if (opt.reuse_repeated) {
    auto hit = cache.find(key);
    if (hit != cache.end()) {
      ++st.cache_hits;
      return finish(hit->second.front().second);
    }
  }
  std::vector<int> res;
  // Exact elimination on the reduced window (dominated strategies dropped, separable edges
  // folded) when it is narrow enough; else an ILP warm-started at the current choice.
  std::optional<ProblemSolution> el;
  if (sub.memory_rows.empty()) el = solve_reduced_elimination(sub, opt.max_table);
  if (el) {
    res = el->choice;
  } else if (sub.num_nodes() <= opt.refine_ilp_max_nodes) {
    const auto sol = solve_counted(sub, opt, st, now);
    res = sol.choice;
  }
  if (opt.reuse_repeated) cache.emplace(key, std::vector<std::pair<double, std::vector<int>>>{{0.0, res}});
  return finish(std::move(res));
}

// Block-coordinate descent after the DP: windows of `refine_window` consecutive segments are
// re-solved exactly with everything else fixed; a window's optimum is never worse than its
// current restriction, so the total cost only goes down. Stops after a sweep without gain.
// This repairs what the single-boundary DP cannot see: edges that skip a critical node
// (residuals, forward activations read by the backward pass of the same layer).
// Without memory rows a window's answer depends only on its nodes and their neighbours: a
// window none of whose nodes or neighbours changed since it was last solved is skipped (its
// answer would be the same), and moves are scored by the window's local cost change.
// Returns false when the stop token's deadline cut it short (cur is then the refined-so-far
// assignment, as good as the DP's or better).
bool refine(const StrategyProblem& p, const std::vector<std::vector<int>>& segs, const O2Options& opt,
            O2Cache& cache, O2Stats& st, std::vector<int>& cur) {
  const int n = p.num_nodes();
  std::vector<std::vector<int>> adj(n);
  for (int e = 0; e < static_cast<int>(p.edges.size()); ++e) {
    adj[p.edges[e].u].push_back(e);
    adj[p.edges[e].v].push_back(e);
  }
  const bool rows = !std::isinf(p.memory_limit) && !p.memory_rows.empty();
  Evaluation ev;
  double total = 0;
  if (rows) {
    ev = evaluate(p, cur);
    total = ev.cost;
  } else {
    total = evaluate(p, cur).cost;
  }
  const int ns = static_cast<int>(segs.size());
  const int w = std::max(1, std::min(opt.refine_window, ns));
  std::vector<int> lid(n, -1);
  std::vector<long> changed(n, 0);      // move stamp of each node's last change
  std::vector<long> solved_at(ns, -1);  // move stamp when window k was last solved
  long stamp = 0;
  for (int sweep = 0; sweep < opt.refine_sweeps; ++sweep) {
    ++st.refine_sweeps;
    bool improved = false;
    for (int k = 0; k + w <= ns; ++k) {
      opt.stop.throw_if_cancelled("the O2 refinement");
      if (opt.stop.expired()) return false;
      std::vector<int> win;
      for (int j = k; j < k + w; ++j) win.insert(win.end(), segs[j].begin(), segs[j].end());
      if (!rows && solved_at[k] >= 0) {
        bool dirty = false;
        for (int v : win) {
          if (changed[v] > solved_at[k]) dirty = true;
          for (int e : adj[v]) {
            const int o = p.edges[e].u == v ? p.edges[e].v : p.edges[e].u;
            if (changed[o] > solved_at[k]) dirty = true;
          }
          if (dirty) break;
        }
        if (!dirty) continue;
      }
      solved_at[k] = stamp;
      const auto res = solve_window(p, win, cur, adj, opt, cache, st, lid);
      if (res.choice.empty()) continue;
      bool same = true;
      for (std::size_t i = 0; i < win.size() && same; ++i) same = cur[win[i]] == res.choice[i];
      if (same) continue;
      if (rows) {
        std::vector<int> cand = cur;
        for (std::size_t i = 0; i < win.size(); ++i) cand[win[i]] = res.choice[i];
        const Evaluation ce = evaluate(p, cand);
        if (!(ce.feasible() && ce.cost < ev.cost - 1e-12 * std::abs(ev.cost))) continue;
        cur = std::move(cand);
        ev = ce;
      } else {
        if (!(res.feasible && res.delta < -1e-12 * std::abs(total))) continue;
        total += res.delta;
        ++stamp;
        for (std::size_t i = 0; i < win.size(); ++i)
          if (cur[win[i]] != res.choice[i]) cur[win[i]] = res.choice[i], changed[win[i]] = stamp;
      }
      improved = true;
      ++st.refine_moves;
    }
    if (!improved) break;
  }
  return true;
}

}  // namespace

ProblemSolution solve_o2(const StrategyProblem& p, int n_ops, const std::vector<std::vector<int>>& succ,
                         const std::vector<double>& weight, const std::vector<int>& order_pos,
                         const O2Options& opt, O2Stats* stats_out) {
  p.validate();
  const auto t0 = std::chrono::steady_clock::now();
  O2Stats st;
  const int n = p.num_nodes();
  st.critical = critical_nodes(n_ops, succ, weight, opt.heavy_fraction);
  std::vector<char> is_crit(n, 0);
  for (int c : st.critical) is_crit[c] = 1;
  std::vector<int> nodes(n);
  std::iota(nodes.begin(), nodes.end(), 0);
  std::stable_sort(nodes.begin(), nodes.end(), [&](int a, int b) {
    return order_pos[a] != order_pos[b] ? order_pos[a] < order_pos[b] : (a >= n_ops) > (b >= n_ops);
  });
  // Leaves sort before the op at the same position (their first consumer), so a segment ending
  // at a critical op holds the leaves it reads.
  std::vector<std::vector<int>> segs(1);
  for (int v : nodes) {
    segs.back().push_back(v);
    if (v < n_ops && is_crit[v]) segs.emplace_back();
  }
  if (segs.back().empty()) segs.pop_back();
  st.segments = static_cast<int>(segs.size());
  std::vector<int> seg_of(n, -1);
  for (int k = 0; k < static_cast<int>(segs.size()); ++k)
    for (int v : segs[k]) seg_of[v] = k;
  // Adjacency with edge indices.
  std::vector<std::vector<int>> adj(n);
  for (int e = 0; e < static_cast<int>(p.edges.size()); ++e) {
    adj[p.edges[e].u].push_back(e);
    adj[p.edges[e].v].push_back(e);
  }
  // Smallest bytes of each node in each row (for "later" nodes).
  const bool has_mem = !std::isinf(p.memory_limit) && !p.memory_rows.empty();

  // DP state after segment k: boundary node b_k (the critical node ending it), F over its
  // strategies, and for each strategy its segment's local choice, whose first entry (when the
  // segment has a boundary) is the previous boundary's strategy: the assignment of every node
  // of segments <= k is rebuilt by walking back (a full vector per state per segment made the
  // DP quadratic in depth).
  int boundary = -1;
  std::vector<double> F;                                  // over strategies of boundary
  std::vector<std::vector<int>> seg_local;                // per segment: its local nodes
  std::vector<std::vector<std::vector<int>>> seg_choice;  // per segment, per end strategy: local choice
  auto rebuild = [&](int k, int t) {  // the assignment behind segment k ending in strategy t
    std::vector<int> full(n, -1);
    for (; k >= 0; --k) {
      const auto& ch = seg_choice[k][t];
      WEFT_ASSERT(!ch.empty(), "O2 DP: no choice behind a finite state");
      for (std::size_t i = 0; i < ch.size(); ++i)
        if (full[seg_local[k][i]] < 0) full[seg_local[k][i]] = ch[i];
      t = k > 0 ? ch[0] : 0;  // local 0 is the boundary, whose strategy picks the history
    }
    return full;
  };
  O2Cache cache;
  const double fscale = 1.0;
  ProblemSolution out;
  if (!opt.start.empty()) {  // refinement only, from the caller's assignment
    WEFT_CHECK(static_cast<int>(opt.start.size()) == n, "solve_o2: a start of {} nodes for {} nodes",
               opt.start.size(), n);
    out.choice = opt.start;
  } else {
    for (int k = 0; k < static_cast<int>(segs.size()); ++k) {
      if (opt.progress) opt.progress(static_cast<double>(k) / static_cast<double>(segs.size()));
      opt.stop.throw_if_cancelled("the O2 search");
      if (opt.stop.expired()) {  // no complete assignment before the last segment
        ProblemSolution none;
        none.status = solver::IlpStatus::Timeout;
        st.worst_status = solver::IlpStatus::Timeout;
        st.dp_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (stats_out) *stats_out = st;
        return none;
      }
      const auto& seg = segs[k];
      const int last = seg.back();
      const bool ends_critical = last < n_ops && is_crit[last];
      // Context: the best assignment so far.
      std::vector<int> ctx(n, -1);
      double fmin = 0;
      if (boundary >= 0) {
        int best = 0;
        for (int s = 1; s < static_cast<int>(F.size()); ++s)
          if (F[s] < F[best]) best = s;
        ctx = rebuild(k - 1, best);
        fmin = F[best];
      }
      // Local problem: nodes = [boundary?] + seg.
      std::vector<int> local;
      if (boundary >= 0) local.push_back(boundary);
      for (int v : seg) local.push_back(v);
      std::vector<int> lid(n, -1);
      for (int i = 0; i < static_cast<int>(local.size()); ++i) lid[local[i]] = i;
      StrategyProblem sub;
      sub.node_cost.resize(local.size());
      for (int i = 0; i < static_cast<int>(local.size()); ++i) {
        const int v = local[i];
        if (v == boundary) {
          sub.node_cost[i] = F;
          for (double& x : sub.node_cost[i]) x = std::isinf(x) ? x : x - fmin;
        } else {
          sub.node_cost[i] = p.node_cost[v];
        }
      }
      for (int i = 0; i < static_cast<int>(local.size()); ++i) {
        const int v = local[i];
        if (v == boundary) continue;
        for (int e : adj[v]) {
          const auto& ed = p.edges[e];
          const int other = ed.u == v ? ed.v : ed.u;
          const int sv = static_cast<int>(p.node_cost[ed.v].size());
          if (lid[other] >= 0) {
            if (ed.u == v && lid[other] >= 0 && other != boundary) {
              sub.edges.push_back({lid[ed.u], lid[ed.v], ed.cost});
            } else if (other == boundary) {
              sub.edges.push_back({lid[ed.u], lid[ed.v], ed.cost});
            }
            // edges inside seg are added once (from their u side)
          } else if (ctx[other] >= 0) {
            // fold against the context choice of an earlier node
            for (int s = 0; s < static_cast<int>(sub.node_cost[i].size()); ++s)
              sub.node_cost[i][s] += ed.u == v ? ed.cost[s * sv + ctx[other]] : ed.cost[ctx[other] * sv + s];
          }
          // later nodes: charged when they are solved
        }
      }
      if (has_mem) {
        sub.memory_limit = p.memory_limit;
        for (const auto& row : p.memory_rows) {
          MemoryRow r{row.label, row.constant, {}};
          double maxv = row.constant;
          for (const auto& t : row.terms) {
            if (lid[t.node] >= 0 && !(t.node == boundary && false)) {
              r.terms.push_back({lid[t.node], t.bytes});
              maxv += *std::max_element(t.bytes.begin(), t.bytes.end());
            } else if (ctx[t.node] >= 0) {
              r.constant += t.bytes[ctx[t.node]];
              maxv += t.bytes[ctx[t.node]];
            } else {
              double mn = *std::min_element(t.bytes.begin(), t.bytes.end());
              r.constant += mn;
              maxv += mn;
            }
          }
          if (maxv > p.memory_limit) sub.memory_rows.push_back(std::move(r));
        }
      }
      // Solve for each strategy of the segment's end (or once when it is not critical): by
      // elimination keeping the end node when no memory row binds, else one ILP per end strategy.
      const int lend = lid[last];
      const int nt = ends_critical ? static_cast<int>(p.node_cost[last].size()) : 1;
      std::vector<double> nF(nt, kInfCost);
      std::vector<std::vector<int>> nchoice(nt);
      bool all_cached = true;
      using Entry = std::vector<std::pair<double, std::vector<int>>>;  // per end strategy
      const std::string key =
          opt.reuse_repeated ? key_of(sub, fscale) + (ends_critical ? "c" : "n") : std::string();
      Entry entry;
      auto hit = opt.reuse_repeated ? cache.find(key) : cache.end();
      if (hit != cache.end()) {
        entry = hit->second;
        ++st.cache_hits;
      } else {
        all_cached = false;
        entry.assign(nt, {kInfCost, {}});
        Elimination el(sub, ends_critical ? lend : -1, opt.max_table);
        if (el.ok()) {
          for (int t = 0; t < nt; ++t)
            if (!std::isinf(el.kept_cost()[t])) {
              auto ch = el.choice_for(t);
              entry[t] = {evaluate(sub, ch).cost, std::move(ch)};
            }
        } else {
          // Memory rows bind or the elimination tables are too large: an ILP. One per strategy of
          // the end node keeps the DP exact; on a large segment that is too slow, so one ILP with
          // the end free stands for the whole table (only its end strategy gets a finite F).
          const bool per_end =
              ends_critical && (nt <= opt.per_end_max_strategies || sub.num_nodes() <= opt.per_end_max_nodes);
          for (int t = 0; t < (per_end ? nt : 1); ++t) {
            StrategyProblem q = sub;
            if (per_end) {
              for (int s = 0; s < static_cast<int>(q.node_cost[lend].size()); ++s)
                if (s != t) q.node_cost[lend][s] = kInfCost;
              if (std::isinf(q.node_cost[lend][t])) continue;
            }
            const auto sol = solve_counted(q, opt, st);
            if (!sol.has_solution()) continue;
            const int at = per_end || !ends_critical ? t : sol.choice[lend];
            entry[at] = {evaluate(q, sol.choice).cost, sol.choice};
          }
        }
        if (opt.reuse_repeated) cache.emplace(key, entry);
      }
      for (int t = 0; t < nt; ++t) {
        const auto& res = entry[t];
        if (res.second.empty()) continue;
        nF[t] = res.first + fmin;
        nchoice[t] = res.second;
      }
      if (all_cached && k > 0) ++st.reused_segments;
      if (std::all_of(nF.begin(), nF.end(), [](double x) { return std::isinf(x); })) {
        ProblemSolution none;
        // A segment whose ILPs ran out of time found nothing: that proves no infeasibility.
        none.status = opt.stop.expired() ? solver::IlpStatus::Timeout : solver::IlpStatus::Infeasible;
        if (none.status == solver::IlpStatus::Timeout) st.worst_status = none.status;
        if (stats_out) *stats_out = st;
        return none;
      }
      seg_local.push_back(std::move(local));
      seg_choice.push_back(std::move(nchoice));
      F = std::move(nF);
      if (ends_critical) {
        boundary = last;
      } else {
        // A final non-critical segment: keep the single state with a dummy boundary.
        boundary = -1;
        WEFT_ASSERT(k == static_cast<int>(segs.size()) - 1,
                    "only the last segment may end without a critical node");
      }
    }
    int best = 0;
    for (int s = 1; s < static_cast<int>(F.size()); ++s)
      if (F[s] < F[best]) best = s;
    out.choice = rebuild(static_cast<int>(segs.size()) - 1, best);
  }
  for (int v = 0; v < n; ++v) WEFT_ASSERT(out.choice[v] >= 0, "O2 left a node without a strategy");
  st.dp_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bool refined = true;
  if (opt.refine_sweeps > 0 && segs.size() > 1) refined = refine(p, segs, opt, cache, st, out.choice);
  if (!refined) st.worst_status = solver::IlpStatus::Timeout;
  st.refine_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - st.dp_seconds;
  const auto ev = evaluate(p, out.choice);
  out.cost = ev.cost;
  out.status = ev.feasible()          ? st.worst_status
               : opt.stop.expired() ? solver::IlpStatus::Timeout
                                    : solver::IlpStatus::Infeasible;
  if (!ev.feasible()) out.choice.clear();
  out.gap = st.max_gap;
  out.ilp_variables = st.max_ilp_variables;
  out.ilp_constraints = st.max_ilp_constraints;
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (stats_out) *stats_out = st;
  return out;
}

}  // namespace weft::spmd
