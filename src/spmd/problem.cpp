// ILP and exhaustive solvers of StrategyProblem; the formulation is written out in problem.hpp.
#include "weft/spmd/problem.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "weft/core/error.hpp"

namespace weft::spmd {

namespace {
std::string node_name(const StrategyProblem& p, int v) {
  return v < static_cast<int>(p.names.size()) && !p.names[v].empty() ? p.names[v]
                                                                     : "node " + std::to_string(v);
}
}  // namespace

void StrategyProblem::validate() const {
  const int n = num_nodes();
  WEFT_CHECK(names.empty() || static_cast<int>(names.size()) == n, "StrategyProblem: {} names for {} nodes",
             names.size(), n);
  for (int v = 0; v < n; ++v) {
    WEFT_CHECK(!node_cost[v].empty(), "StrategyProblem: {} has no strategy", node_name(*this, v));
    for (double c : node_cost[v])
      WEFT_CHECK(!std::isnan(c) && c >= 0, "StrategyProblem: {} has a negative or NaN cost",
                 node_name(*this, v));
  }
  for (const auto& e : edges) {
    WEFT_CHECK(e.u >= 0 && e.u < n && e.v >= 0 && e.v < n && e.u != e.v, "StrategyProblem: bad edge {}-{}",
               e.u, e.v);
    WEFT_CHECK(e.cost.size() == node_cost[e.u].size() * node_cost[e.v].size(),
               "StrategyProblem: edge {}-{} has {} costs, expected {}", node_name(*this, e.u),
               node_name(*this, e.v), e.cost.size(), node_cost[e.u].size() * node_cost[e.v].size());
    for (double c : e.cost)
      WEFT_CHECK(!std::isnan(c) && c >= 0, "StrategyProblem: edge with a negative/NaN cost");
  }
  for (const auto& r : memory_rows)
    for (const auto& t : r.terms) {
      WEFT_CHECK(t.node >= 0 && t.node < n, "StrategyProblem: memory row '{}' names node {}", r.label,
                 t.node);
      WEFT_CHECK(t.bytes.size() == node_cost[t.node].size(),
                 "StrategyProblem: memory row '{}' has {} values for {}", r.label, t.bytes.size(),
                 node_name(*this, t.node));
    }
  WEFT_CHECK(!std::isnan(memory_limit) && memory_limit > 0, "StrategyProblem: memory limit must be > 0");
}

Evaluation evaluate(const StrategyProblem& p, const std::vector<int>& choice) {
  WEFT_CHECK(static_cast<int>(choice.size()) == p.num_nodes(), "evaluate: {} choices for {} nodes",
             choice.size(), p.num_nodes());
  Evaluation ev;
  for (int v = 0; v < p.num_nodes(); ++v) {
    WEFT_CHECK(choice[v] >= 0 && choice[v] < static_cast<int>(p.node_cost[v].size()),
               "evaluate: choice {} out of range for {}", choice[v], node_name(p, v));
    const double c = p.node_cost[v][choice[v]];
    if (std::isinf(c))
      ev.violations.push_back(fmt::format("{}: forbidden strategy {}", node_name(p, v), choice[v]));
    ev.node_cost += c;
  }
  for (const auto& e : p.edges) {
    const double c = e.cost[choice[e.u] * p.node_cost[e.v].size() + choice[e.v]];
    if (std::isinf(c))
      ev.violations.push_back(
          fmt::format("edge {}-{}: forbidden pair", node_name(p, e.u), node_name(p, e.v)));
    ev.edge_cost += c;
  }
  for (int r = 0; r < static_cast<int>(p.memory_rows.size()); ++r) {
    const auto& row = p.memory_rows[r];
    double m = row.constant;
    for (const auto& t : row.terms) m += t.bytes[choice[t.node]];
    if (ev.peak_row < 0 || m > ev.peak_memory) {
      ev.peak_memory = m;
      ev.peak_row = r;
    }
    if (m > p.memory_limit * (1 + 1e-9))
      ev.violations.push_back(
          fmt::format("memory row '{}': {:.6g} B > limit {:.6g} B", row.label, m, p.memory_limit));
  }
  ev.cost = ev.node_cost + ev.edge_cost;
  return ev;
}

ProblemSolution solve_exhaustive(const StrategyProblem& p, std::size_t max_combinations) {
  p.validate();
  const auto t0 = std::chrono::steady_clock::now();
  const int n = p.num_nodes();
  double total = 1;
  for (const auto& c : p.node_cost) total *= static_cast<double>(c.size());
  WEFT_CHECK(total <= static_cast<double>(max_combinations), "solve_exhaustive: {} combinations > {}", total,
             max_combinations);
  ProblemSolution best;
  best.status = solver::IlpStatus::Infeasible;
  std::vector<int> x(n, 0);
  while (true) {
    const Evaluation ev = evaluate(p, x);
    if (ev.feasible() && (!best.has_solution() || ev.cost < best.cost)) {
      best.choice = x;
      best.cost = ev.cost;
      best.status = solver::IlpStatus::Optimal;
    }
    int i = 0;
    while (i < n && ++x[i] == static_cast<int>(p.node_cost[i].size())) x[i++] = 0;
    if (i == n) break;
  }
  best.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return best;
}

namespace {

// solve_ilp's exact preprocessing: live strategies (finite cost), parallel edges merged into one
// matrix per node pair, dominated strategies dropped, separable matrices folded into node costs.
// `keep` (or -1): a node whose strategies all stay (the O2 DP needs a value for each).
struct Reduced {
  bool infeasible = false;
  std::vector<std::vector<int>> live;       // per node: surviving strategies (original indices)
  std::vector<std::vector<int>> dominator;  // per node and strategy: a never-worse one, or -1
  std::vector<std::vector<double>> unary;   // per node, original indexing, separable edges folded in
  struct LiveEdge {
    int a, b;
    std::vector<double> m;  // [live a][live b]
  };
  std::vector<LiveEdge> ledges;
  // Folded nodes ("following", exact): a node with at most two neighbours and no memory terms
  // is eliminated into them (min-sum series reduction); its choice is a function of theirs.
  struct Folded {
    int v = -1, w1 = -1, w2 = -1;  // the neighbours (-1: none)
    std::vector<int> arg;          // best strategy of v per strategy of w1 (× strategies of w2)
  };
  std::vector<Folded> folded;  // in elimination order
  std::vector<char> gone;      // per node: folded
  // Completes a choice over the remaining nodes with the folded ones (reverse order).
  void lift(std::vector<int>& choice, const StrategyProblem& p) const {
    for (auto it = folded.rbegin(); it != folded.rend(); ++it) {
      std::size_t idx = 0;
      if (it->w1 >= 0) idx = static_cast<std::size_t>(choice[it->w1]);
      if (it->w2 >= 0) idx = idx * p.node_cost[it->w2].size() + static_cast<std::size_t>(choice[it->w2]);
      choice[it->v] = it->arg[idx];
    }
  }
};

Reduced reduce(const StrategyProblem& p, double dominance_max_work, int keep = -1) {
  const int n = p.num_nodes();
  Reduced r;
  auto& live = r.live;
  auto& dominator = r.dominator;
  auto& unary = r.unary;
  auto& ledges = r.ledges;
  live.resize(n);
  dominator.resize(n);
  for (int v = 0; v < n; ++v) {
    for (int s = 0; s < static_cast<int>(p.node_cost[v].size()); ++s)
      if (!std::isinf(p.node_cost[v][s])) live[v].push_back(s);
    if (live[v].empty()) {
      r.infeasible = true;
      return r;
    }
  }
  // Merge parallel edges into one matrix per unordered pair (u < v), over all strategies.
  unary.resize(n);
  for (int v = 0; v < n; ++v) unary[v] = p.node_cost[v];
  std::map<std::pair<int, int>, std::vector<double>> pair_cost;
  for (const auto& e : p.edges) {
    const int su = static_cast<int>(p.node_cost[e.u].size()), sv = static_cast<int>(p.node_cost[e.v].size());
    const bool flip = e.u > e.v;
    const int a = flip ? e.v : e.u, b = flip ? e.u : e.v;
    const int sb = flip ? su : sv;
    auto& m = pair_cost[{a, b}];
    if (m.empty()) m.assign(p.node_cost[a].size() * p.node_cost[b].size(), 0.0);
    for (int s = 0; s < su; ++s)
      for (int t = 0; t < sv; ++t) {
        const double c = e.cost[s * sv + t];
        const int i = flip ? t : s, j = flip ? s : t;
        m[i * sb + j] += c;
      }
  }
  // Dominated strategies (exact): t of node v is dropped when another live strategy s is never
  // worse whatever the neighbours choose,
  //   c_v(s) - c_v(t) + Σ_{pairs (v,w)} max_{j live in w, M(t,j) < ∞} (M(s,j) - M(t,j)) <= 0,
  // and s needs no more bytes than t in every memory row. Some optimum survives (replace t by s
  // in any optimum: the cost does not rise, no row grows). dominator[v][t] = s maps a warm start
  // onto live strategies. Work is bounded (dense graphs with many strategies skip it).
  {
    std::vector<std::vector<std::pair<int, const std::vector<double>*>>> nbr(n);  // (w, M) with v = a
    std::vector<std::vector<char>> flipped(n);
    for (const auto& [key, m] : pair_cost) {
      nbr[key.first].push_back({key.second, &m});
      flipped[key.first].push_back(0);
      nbr[key.second].push_back({key.first, &m});
      flipped[key.second].push_back(1);
    }
    std::vector<std::vector<const std::vector<double>*>> bytes_of(n);
    if (!std::isinf(p.memory_limit))
      for (const auto& row : p.memory_rows)
        for (const auto& t : row.terms) bytes_of[t.node].push_back(&t.bytes);
    double work = 0;
    for (int v = 0; v < n; ++v) {
      double w = 0;
      for (const auto& [u, m] : nbr[v]) w += static_cast<double>(live[u].size());
      work += static_cast<double>(live[v].size() * live[v].size()) * std::max(1.0, w);
    }
    if (work <= dominance_max_work) {
      for (int v = 0; v < n; ++v) dominator[v].assign(p.node_cost[v].size(), -1);
      for (int pass = 0; pass < 3; ++pass) {
        bool changed = false;
        for (int v = 0; v < n; ++v) {
          if (live[v].size() < 2 || v == keep) continue;
          std::vector<char> alive(p.node_cost[v].size(), 0);
          for (int s : live[v]) alive[s] = 1;
          const int sv = static_cast<int>(p.node_cost[v].size());
          auto entry = [&](std::size_t k, int s, int j) {
            const auto& [u, m] = nbr[v][k];
            const int su = static_cast<int>(p.node_cost[u].size());
            return flipped[v][k] ? (*m)[static_cast<std::size_t>(j) * sv + s]
                                 : (*m)[static_cast<std::size_t>(s) * su + j];
          };
          for (int t : live[v]) {
            for (int s : live[v]) {
              if (s == t || !alive[s]) continue;
              double d = p.node_cost[v][s] - p.node_cost[v][t];
              bool ok = true;
              for (const auto* b : bytes_of[v])
                if ((*b)[s] > (*b)[t]) ok = false;
              for (std::size_t k = 0; k < nbr[v].size() && ok && d <= 0; ++k) {
                double mx = -kInfCost;
                for (int j : live[nbr[v][k].first]) {
                  const double mt = entry(k, t, j);
                  if (std::isinf(mt)) continue;
                  mx = std::max(mx, entry(k, s, j) - mt);
                }
                if (mx > -kInfCost) d += mx;  // -inf: t is infeasible against every j
              }
              if (ok && d <= 0) {
                alive[t] = 0;
                dominator[v][t] = s;
                changed = true;
                break;
              }
            }
          }
          std::erase_if(live[v], [&](int s) { return !alive[s]; });
        }
        if (!changed) break;
      }
    }
  }
  // Following, done exactly: nodes with at most two neighbours (elementwise and reshape chains,
  // most leaves) and no memory terms are eliminated into their neighbours, repeatedly:
  //   one neighbour w:      c_w(t) += min_s c_v(s) + M_vw(s, t)
  //   two neighbours w, x:  M_wx(t, u) += min_s c_v(s) + M_vw(s, t) + M_vx(s, u)
  // (the second only when the new matrix is no larger than the two it replaces). Alpa merges a
  // follower into its producer's choice, a heuristic; this keeps the optimum and recovers the
  // folded node's strategy from its neighbours' after the solve.
  r.gone.assign(n, 0);
  {
    std::vector<char> has_mem(n, 0);
    if (!std::isinf(p.memory_limit))
      for (const auto& row : p.memory_rows)
        for (const auto& t : row.terms) has_mem[t.node] = 1;
    std::vector<std::set<int>> nb(n);
    for (const auto& [key, m] : pair_cost) nb[key.first].insert(key.second), nb[key.second].insert(key.first);
    // M(s, t) of the pair (v, w) over all strategies, s of v and t of w.
    auto entry = [&](int v, int w, int s, int t) {
      const auto& m = pair_cost.at({std::min(v, w), std::max(v, w)});
      return v < w ? m[static_cast<std::size_t>(s) * p.node_cost[w].size() + static_cast<std::size_t>(t)]
                   : m[static_cast<std::size_t>(t) * p.node_cost[v].size() + static_cast<std::size_t>(s)];
    };
    auto drop_infinite = [&](int w) {
      std::erase_if(live[w], [&](int t) { return std::isinf(unary[w][t]); });
      return !live[w].empty();
    };
    std::vector<int> queue;
    for (int v = 0; v < n; ++v) queue.push_back(v);
    while (!queue.empty()) {
      const int v = queue.back();
      queue.pop_back();
      if (r.gone[v] || v == keep || has_mem[v] || nb[v].size() > 2) continue;
      Reduced::Folded f;
      f.v = v;
      if (nb[v].size() == 2) {
        const int w = *nb[v].begin(), x = *nb[v].rbegin();
        const std::size_t lv = live[v].size(), lw = live[w].size(), lx = live[x].size();
        if (lw * lx > lv * (lw + lx)) continue;  // the new matrix would be larger
        const std::size_t sw = p.node_cost[w].size(), sx = p.node_cost[x].size();
        f.w1 = w, f.w2 = x;
        f.arg.assign(sw * sx, live[v][0]);
        auto& mwx = pair_cost[{w, x}];  // w < x (set order)
        if (mwx.empty()) mwx.assign(sw * sx, 0.0);
        for (int t : live[w])
          for (int u : live[x]) {
            double best = kInfCost;
            for (int s : live[v]) {
              const double c = unary[v][s] + entry(v, w, s, t) + entry(v, x, s, u);
              if (c < best) best = c, f.arg[t * sx + u] = s;
            }
            mwx[t * sx + u] += best;
          }
        pair_cost.erase({std::min(v, w), std::max(v, w)});
        pair_cost.erase({std::min(v, x), std::max(v, x)});
        nb[w].erase(v), nb[x].erase(v), nb[w].insert(x), nb[x].insert(w);
        queue.push_back(w), queue.push_back(x);
      } else if (nb[v].size() == 1) {
        const int w = *nb[v].begin();
        f.w1 = w;
        f.arg.assign(p.node_cost[w].size(), live[v][0]);
        for (int t : live[w]) {
          double best = kInfCost;
          for (int s : live[v]) {
            const double c = unary[v][s] + entry(v, w, s, t);
            if (c < best) best = c, f.arg[t] = s;
          }
          unary[w][t] += best;
        }
        pair_cost.erase({std::min(v, w), std::max(v, w)});
        nb[w].erase(v);
        if (!drop_infinite(w)) {
          r.infeasible = true;
          return r;
        }
        queue.push_back(w);
      } else {
        f.arg.assign(1, live[v][0]);
        for (int s : live[v])
          if (unary[v][s] < unary[v][f.arg[0]]) f.arg[0] = s;
      }
      r.gone[v] = 1;
      r.folded.push_back(std::move(f));
    }
  }
  // Fold separable matrices (restricted to live strategies) into node costs.
  for (auto& [key, m] : pair_cost) {
    const auto [a, b] = key;
    const int sb = static_cast<int>(p.node_cost[b].size());
    const auto& la = live[a];
    const auto& lb = live[b];
    std::vector<double> lm(la.size() * lb.size());
    for (std::size_t i = 0; i < la.size(); ++i)
      for (std::size_t j = 0; j < lb.size(); ++j) lm[i * lb.size() + j] = m[la[i] * sb + lb[j]];
    bool has_inf = std::any_of(lm.begin(), lm.end(), [](double c) { return std::isinf(c); });
    bool separable = !has_inf;
    if (separable) {
      const double m00 = lm[0];
      for (std::size_t i = 0; i < la.size() && separable; ++i)
        for (std::size_t j = 0; j < lb.size(); ++j) {
          const double pred = lm[i * lb.size()] + lm[j] - m00;
          if (std::abs(lm[i * lb.size() + j] - pred) >
              1e-12 * std::max(1.0, std::abs(lm[i * lb.size() + j]))) {
            separable = false;
            break;
          }
        }
    }
    if (separable) {
      const double m00 = lm[0];
      for (std::size_t i = 0; i < la.size(); ++i) unary[a][la[i]] += lm[i * lb.size()] - m00;
      for (std::size_t j = 0; j < lb.size(); ++j) unary[b][lb[j]] += lm[j];
      continue;
    }
    ledges.push_back({a, b, std::move(lm)});
  }
  return r;
}

// Nodes in order, each the strategy among `live` cheapest against the nodes already chosen.
std::vector<int> greedy_choice(const StrategyProblem& p, const std::vector<std::vector<int>>& live) {
  const int n = p.num_nodes();
  std::vector<std::vector<std::pair<int, const EdgeCost*>>> nb(n);
  for (const auto& e : p.edges) {
    nb[e.u].push_back({e.v, &e});
    nb[e.v].push_back({e.u, &e});
  }
  std::vector<int> greedy(n, -1);
  for (int v = 0; v < n; ++v) {
    double best = kInfCost;
    for (int s : live[v]) {
      double c = p.node_cost[v][s];
      for (auto [u, e] : nb[v]) {
        if (greedy[u] < 0) continue;
        const std::size_t sv = p.node_cost[e->v].size();
        c += e->u == v ? e->cost[s * sv + greedy[u]] : e->cost[greedy[u] * sv + s];
      }
      if (greedy[v] < 0 || c < best) best = c, greedy[v] = s;
    }
  }
  return greedy;
}

// What solve_ilp answers once its deadline has passed (before or during its preprocessing): the
// caller's warm start or the greedy choice, status Timeout, no bound beyond 0 (costs are >= 0).
ProblemSolution past_deadline(const StrategyProblem& p, const SolveOptions& opt,
                              std::chrono::steady_clock::time_point t0) {
  ProblemSolution out;
  out.status = solver::IlpStatus::Timeout;
  std::vector<int> choice = opt.warm_start;
  if (choice.empty()) {
    std::vector<std::vector<int>> live(p.num_nodes());
    for (int v = 0; v < p.num_nodes(); ++v)
      for (int s = 0; s < static_cast<int>(p.node_cost[v].size()); ++s)
        if (!std::isinf(p.node_cost[v][s])) live[v].push_back(s);
    choice = greedy_choice(p, live);
  }
  const bool complete = static_cast<int>(choice.size()) == p.num_nodes() &&
                        std::find(choice.begin(), choice.end(), -1) == choice.end();
  if (complete) {
    const Evaluation ev = evaluate(p, choice);
    if (ev.feasible()) {
      out.choice = std::move(choice);
      out.cost = ev.cost;
      out.gap = ev.cost > 0 ? 1.0 : 0.0;
    }
  }
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace

ProblemSolution solve_ilp(const StrategyProblem& p, const SolveOptions& opt) {
  p.validate();
  const auto t0 = std::chrono::steady_clock::now();
  const int n = p.num_nodes();
  opt.stop.throw_if_cancelled("the SPMD ILP");
  if (opt.stop.expired()) return past_deadline(p, opt, t0);
  ProblemSolution out;
  // ---- preprocessing (exact)
  Reduced red = reduce(p, opt.dominance_max_work);
  if (red.infeasible) {
    out.status = solver::IlpStatus::Infeasible;
    return out;
  }
  opt.stop.throw_if_cancelled("the SPMD ILP");
  if (opt.stop.expired()) return past_deadline(p, opt, t0);
  const auto& live = red.live;
  const auto& dominator = red.dominator;
  const auto& unary = red.unary;
  const auto& ledges = red.ledges;
  // ---- the ILP. Costs are seconds (1e-6..1e-1); CBC's tolerances are absolute, so the
  // objective is scaled to make the largest finite coefficient 1e3.
  double cmax = 0;
  for (int v = 0; v < n; ++v)
    for (int s : live[v]) cmax = std::max(cmax, std::abs(unary[v][s]));
  for (const auto& e : ledges)
    for (double c : e.m)
      if (!std::isinf(c)) cmax = std::max(cmax, c);
  const double oscale = cmax > 0 ? 1e3 / cmax : 1.0;
  solver::Ilp ilp;
  std::vector<std::vector<int>> xv(n);
  for (int v = 0; v < n; ++v) {
    if (red.gone[v]) continue;  // folded: chosen from its neighbours after the solve
    std::vector<solver::Term> onehot;
    for (int s : live[v]) {
      xv[v].push_back(ilp.add_binary(unary[v][s] * oscale));
      onehot.push_back({xv[v].back(), 1.0});
    }
    ilp.add_constraint(std::move(onehot), solver::Sense::Equal, 1);
  }
  // Edge variables over groups of interchangeable strategies: strategies of u whose rows of
  // M are equal (typically: the same spec of the tensor on this edge) share one group, same for
  // the columns of v. With K[g][h] the compressed matrix,
  //   Σ_h e_gh = Σ_{s∈g} x_us,  Σ_g e_gh = Σ_{t∈h} x_vt,  e ≥ 0
  // is still exact (the marginals are one-hot), and far smaller than strategy pairs.
  std::vector<std::vector<int>> ev(ledges.size());
  std::vector<std::vector<int>> ga(ledges.size()), gb(ledges.size());  // group of each live strategy
  std::vector<std::size_t> nga(ledges.size()), ngb(ledges.size());
  for (std::size_t k = 0; k < ledges.size(); ++k) {
    const auto& e = ledges[k];
    const std::size_t na = live[e.a].size(), nb = live[e.b].size();
    auto group = [](std::size_t count, auto&& key) {
      std::map<std::vector<double>, int> ids;
      std::vector<int> g(count);
      for (std::size_t i = 0; i < count; ++i)
        g[i] = ids.emplace(key(i), static_cast<int>(ids.size())).first->second;
      return std::pair{g, ids.size()};
    };
    std::tie(ga[k], nga[k]) = group(na, [&](std::size_t i) {
      return std::vector<double>(e.m.begin() + static_cast<std::ptrdiff_t>(i * nb),
                                 e.m.begin() + static_cast<std::ptrdiff_t>((i + 1) * nb));
    });
    std::tie(gb[k], ngb[k]) = group(nb, [&](std::size_t j) {
      std::vector<double> col(na);
      for (std::size_t i = 0; i < na; ++i) col[i] = e.m[i * nb + j];
      return col;
    });
    std::vector<std::size_t> rep_a(nga[k]), rep_b(ngb[k]);
    for (std::size_t i = 0; i < na; ++i) rep_a[ga[k][i]] = i;
    for (std::size_t j = 0; j < nb; ++j) rep_b[gb[k][j]] = j;
    ev[k].resize(nga[k] * ngb[k]);
    for (std::size_t g = 0; g < nga[k]; ++g)
      for (std::size_t h = 0; h < ngb[k]; ++h) {
        const double c = e.m[rep_a[g] * nb + rep_b[h]];
        const bool inf = std::isinf(c);
        ev[k][g * ngb[k] + h] = ilp.add_continuous(0, inf ? 0 : 1, inf ? 0 : c * oscale);
      }
    for (std::size_t g = 0; g < nga[k]; ++g) {
      std::vector<solver::Term> row;
      for (std::size_t i = 0; i < na; ++i)
        if (ga[k][i] == static_cast<int>(g)) row.push_back({xv[e.a][i], -1.0});
      for (std::size_t h = 0; h < ngb[k]; ++h) row.push_back({ev[k][g * ngb[k] + h], 1.0});
      ilp.add_constraint(std::move(row), solver::Sense::Equal, 0);
    }
    for (std::size_t h = 0; h < ngb[k]; ++h) {
      std::vector<solver::Term> row;
      for (std::size_t j = 0; j < nb; ++j)
        if (gb[k][j] == static_cast<int>(h)) row.push_back({xv[e.b][j], -1.0});
      for (std::size_t g = 0; g < nga[k]; ++g) row.push_back({ev[k][g * ngb[k] + h], 1.0});
      ilp.add_constraint(std::move(row), solver::Sense::Equal, 0);
    }
  }
  if (!std::isinf(p.memory_limit))
    for (const auto& row : p.memory_rows) {
      std::map<int, double> coef;
      for (const auto& t : row.terms)
        for (std::size_t i = 0; i < live[t.node].size(); ++i) coef[xv[t.node][i]] += t.bytes[live[t.node][i]];
      // Scale rows to O(1) numbers: bytes are ~1e9 and CBC's tolerances are absolute.
      const double scale = 1.0 / p.memory_limit;
      std::vector<solver::Term> terms;
      for (auto [var, c] : coef)
        if (c != 0) terms.push_back({var, c * scale});
      ilp.add_constraint(std::move(terms), solver::Sense::LessEqual, (p.memory_limit - row.constant) * scale);
    }
  solver::IlpOptions io;
  io.time_limit_s = opt.time_limit_s;
  io.relative_gap = opt.relative_gap;
  io.presolve = opt.presolve;
  io.preprocess = opt.preprocess;
  io.stop = opt.stop;
  // CBC can fail to find any incumbent on large one-hot models within the limit; hand it a
  // greedy one.
  const std::vector<int> greedy = opt.warm_start.empty() ? greedy_choice(p, live) : std::vector<int>{};
  const std::vector<int>& ws = opt.warm_start.empty() ? greedy : opt.warm_start;
  if (!ws.empty()) {
    WEFT_CHECK(static_cast<int>(ws.size()) == n, "solve_ilp: warm start has {} choices for {} nodes",
               ws.size(), n);
    std::vector<double> w(ilp.num_variables(), 0.0);
    bool ok = true;
    std::vector<int> li(n, -1);
    for (int v = 0; v < n && ok; ++v) {
      if (red.gone[v]) continue;
      int want = ws[v];
      // A dominated strategy's dominator is never worse (chains end at a live strategy).
      for (int hops = 0; want >= 0 && want < static_cast<int>(dominator[v].size()) &&
                         dominator[v][want] >= 0 && hops < static_cast<int>(dominator[v].size());
           ++hops)
        want = dominator[v][want];
      auto it = std::find(live[v].begin(), live[v].end(), want);
      if (it == live[v].end())
        ok = false;
      else {
        li[v] = static_cast<int>(it - live[v].begin());
        w[xv[v][li[v]]] = 1;
      }
    }
    for (std::size_t k = 0; k < ledges.size() && ok; ++k)
      w[ev[k][static_cast<std::size_t>(ga[k][li[ledges[k].a]]) * ngb[k] +
              static_cast<std::size_t>(gb[k][li[ledges[k].b]])]] = 1;
    if (ok) io.warm_start = std::move(w);
  }
  const auto r = solver::solve(ilp, io);
  out.status = r.status;
  out.gap = r.gap;
  out.ilp_variables = ilp.num_variables();
  out.ilp_constraints = ilp.num_constraints();
  // Every node folded: the empty model's optimum is the lift alone.
  if (r.has_solution() || (ilp.num_variables() == 0 && r.status == solver::IlpStatus::Optimal)) {
    out.choice.assign(n, 0);
    for (int v = 0; v < n; ++v)
      for (std::size_t i = 0; i < xv[v].size(); ++i)
        if (r.values[xv[v][i]] > 0.5) out.choice[v] = live[v][i];
    red.lift(out.choice, p);
    out.cost = evaluate(p, out.choice).cost;
  }
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace weft::spmd

namespace weft::spmd {

namespace {
std::size_t table_size(const std::vector<int>& vars, const StrategyProblem& p) {
  std::size_t s = 1;
  for (int v : vars) {
    const std::size_t d = p.node_cost[v].size();
    if (d != 0 && s > std::numeric_limits<std::size_t>::max() / d)
      return std::numeric_limits<std::size_t>::max();
    s *= d;
  }
  return s;
}
}  // namespace

double Elimination::eval(const Factor& f, const std::vector<int>& x) const {
  std::size_t idx = 0;
  for (int v : f.vars) idx = idx * p_.node_cost[v].size() + static_cast<std::size_t>(x[v]);
  return f.table[idx];
}

Elimination::Elimination(const StrategyProblem& p, int keep, std::size_t max_table) : p_(p), keep_(keep) {
  p.validate();
  const int n = p.num_nodes();
  if (!std::isinf(p.memory_limit) && !p.memory_rows.empty()) return;
  std::vector<Factor> fs;
  for (int v = 0; v < n; ++v) fs.push_back({{v}, p.node_cost[v]});
  for (const auto& e : p.edges) {
    if (e.u < e.v) {
      fs.push_back({{e.u, e.v}, e.cost});
    } else {
      const std::size_t su = p.node_cost[e.u].size(), sv = p.node_cost[e.v].size();
      std::vector<double> t(su * sv);
      for (std::size_t a = 0; a < su; ++a)
        for (std::size_t b = 0; b < sv; ++b) t[b * su + a] = e.cost[a * sv + b];
      fs.push_back({{e.v, e.u}, std::move(t)});
    }
  }
  // Symbolic pass first: the greedy order depends on the factors' scopes only, so the order,
  // each new table's scope, and whether some table would pass max_table are known before any
  // table is computed (a problem that is too wide is then refused at almost no cost).
  std::vector<int> order;
  std::vector<std::vector<int>> scopes;
  {
    // The interaction graph: a node's scope when eliminated is its neighbour set, and
    // eliminating v joins its neighbours into a clique (exactly the union of the scopes of the
    // factors that touch a node, kept incrementally). Only v's neighbours change size.
    std::vector<std::vector<int>> nb(n);
    for (const auto& f : fs)
      for (int u : f.vars)
        for (int w : f.vars)
          if (u != w) nb[u].push_back(w);
    for (auto& l : nb) {
      std::sort(l.begin(), l.end());
      l.erase(std::unique(l.begin(), l.end()), l.end());
    }
    std::vector<std::size_t> size(n);
    for (int v = 0; v < n; ++v) size[v] = table_size(nb[v], p);
    std::vector<char> gone(n, 0);
    for (int step = 0; step < n - (keep >= 0 ? 1 : 0); ++step) {
      // Pick the node whose elimination makes the smallest table (the lowest id on a tie).
      int best = -1;
      for (int v = 0; v < n; ++v)
        if (!gone[v] && v != keep && (best < 0 || size[v] < size[best])) best = v;
      if (size[best] > max_table) return;
      std::vector<int> best_scope = nb[best];
      gone[best] = 1;
      for (int u : best_scope) {
        std::vector<int> merged;
        merged.reserve(nb[u].size() + best_scope.size());
        std::set_union(nb[u].begin(), nb[u].end(), best_scope.begin(), best_scope.end(),
                       std::back_inserter(merged));
        std::erase_if(merged, [&](int w) { return w == u || w == best; });
        nb[u] = std::move(merged);
        size[u] = table_size(nb[u], p);
      }
      nb[best].clear();
      order.push_back(best);
      scopes.push_back(std::move(best_scope));
    }
  }
  used_.resize(n);
  for (std::size_t step = 0; step < order.size(); ++step) {
    const int v = order[step];
    const std::vector<int>& best_scope = scopes[step];
    const std::size_t best_size = table_size(best_scope, p);
    std::vector<Factor> touching, rest;
    for (auto& f : fs)
      (std::binary_search(f.vars.begin(), f.vars.end(), v) ? touching : rest).push_back(std::move(f));
    Factor nf{best_scope, std::vector<double>(best_size, kInfCost)};
    const std::size_t sv = p.node_cost[v].size();
    // The new table in row-major order of its scope, an odometer over the scope's strategies:
    // each touching factor's offset is kept incrementally (its stride for every scope variable,
    // 0 when absent, and for v), instead of decoding and re-encoding every index.
    const std::size_t nsc = best_scope.size(), nt = touching.size();
    std::vector<std::size_t> stride(nt * nsc, 0), vstride(nt, 0), base(nt, 0);
    for (std::size_t k = 0; k < nt; ++k) {
      std::size_t st = 1;
      for (int j = static_cast<int>(touching[k].vars.size()) - 1; j >= 0; --j) {
        const int u = touching[k].vars[j];
        if (u == v) {
          vstride[k] = st;
        } else {
          const auto at = std::lower_bound(best_scope.begin(), best_scope.end(), u) - best_scope.begin();
          stride[k * nsc + static_cast<std::size_t>(at)] = st;
        }
        st *= p.node_cost[u].size();
      }
    }
    std::vector<std::size_t> digit(nsc, 0);
    for (std::size_t idx = 0; idx < best_size; ++idx) {
      double m = kInfCost;
      for (std::size_t s = 0; s < sv; ++s) {
        double c = 0;
        for (std::size_t k = 0; k < nt && !std::isinf(c); ++k) c += touching[k].table[base[k] + s * vstride[k]];
        m = std::min(m, c);
      }
      nf.table[idx] = m;
      for (std::size_t i = nsc; i-- > 0;) {  // next index: the last digit turns fastest
        const std::size_t d = p.node_cost[best_scope[i]].size();
        if (++digit[i] < d) {
          for (std::size_t k = 0; k < nt; ++k) base[k] += stride[k * nsc + i];
          break;
        }
        digit[i] = 0;
        for (std::size_t k = 0; k < nt; ++k) base[k] -= (d - 1) * stride[k * nsc + i];
      }
    }
    rest.push_back(std::move(nf));
    fs = std::move(rest);
    used_[v] = std::move(touching);
    order_.push_back(v);
  }
  // Remaining factors: all over `keep` (or scalars).
  const std::size_t sk = keep >= 0 ? p.node_cost[keep].size() : 1;
  kept_.assign(sk, 0.0);
  std::vector<int> x(n, 0);
  for (std::size_t t = 0; t < sk; ++t) {
    if (keep >= 0) x[keep] = static_cast<int>(t);
    for (const auto& f : fs) kept_[t] += f.vars.empty() ? f.table[0] : eval(f, x);
  }
  ok_ = true;
}

std::vector<int> Elimination::choice_for(int keep_value) const {
  WEFT_ASSERT(ok_, "Elimination::choice_for on a failed elimination");
  const int n = p_.num_nodes();
  std::vector<int> x(n, 0);
  if (keep_ >= 0) x[keep_] = keep_value;
  for (auto it = order_.rbegin(); it != order_.rend(); ++it) {
    const int v = *it;
    double best = kInfCost;
    int arg = 0;
    for (int s = 0; s < static_cast<int>(p_.node_cost[v].size()); ++s) {
      x[v] = s;
      double c = 0;
      for (const auto& f : used_[v]) c += eval(f, x);
      if (c < best) best = c, arg = s;
    }
    x[v] = arg;
  }
  return x;
}

std::optional<ProblemSolution> solve_reduced_elimination(const StrategyProblem& p, std::size_t max_table,
                                                         double dominance_max_work) {
  WEFT_CHECK(p.memory_rows.empty() || std::isinf(p.memory_limit),
             "solve_reduced_elimination: the problem has memory rows (elimination ignores them)");
  const auto t0 = std::chrono::steady_clock::now();
  ProblemSolution s;
  const Reduced red = reduce(p, dominance_max_work);
  if (red.infeasible) {
    s.status = solver::IlpStatus::Infeasible;
    return s;
  }
  StrategyProblem q;
  const int n = p.num_nodes();
  q.node_cost.resize(n);
  for (int v = 0; v < n; ++v) {
    if (red.gone[v]) {  // folded: one placeholder strategy, chosen by lift()
      q.node_cost[v] = {0.0};
      continue;
    }
    // Folding a separable matrix can make a node's costs negative: shift them (the argmin is
    // the same) to keep the problem valid.
    double lo = kInfCost;
    for (int t : red.live[v]) lo = std::min(lo, red.unary[v][t]);
    for (int t : red.live[v]) q.node_cost[v].push_back(red.unary[v][t] - std::min(lo, 0.0));
  }
  for (const auto& e : red.ledges) q.edges.push_back({e.a, e.b, e.m});
  Elimination el(q, -1, max_table);
  if (!el.ok()) return std::nullopt;
  if (std::isinf(el.kept_cost()[0])) {
    s.status = solver::IlpStatus::Infeasible;
    return s;
  }
  const auto local = el.choice_for(0);
  s.choice.resize(n);
  for (int v = 0; v < n; ++v) s.choice[v] = red.gone[v] ? 0 : red.live[v][local[v]];
  red.lift(s.choice, p);
  s.cost = evaluate(p, s.choice).cost;
  s.status = solver::IlpStatus::Optimal;
  s.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return s;
}

ProblemSolution solve_auto(const StrategyProblem& p, const SolveOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  Elimination el(p);
  if (el.ok()) {
    ProblemSolution s;
    if (std::isinf(el.kept_cost()[0])) {
      s.status = solver::IlpStatus::Infeasible;
      return s;
    }
    s.choice = el.choice_for(0);
    s.cost = evaluate(p, s.choice).cost;
    s.status = solver::IlpStatus::Optimal;
    s.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return s;
  }
  return solve_ilp(p, opt);
}

}  // namespace weft::spmd
