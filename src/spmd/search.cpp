// SPMD strategy search: graph -> StrategyProblem -> ILP (O3) or segment DP (O2) -> SpmdPlan.
// The model (nodes, strategies, costs, memory rows) is described in search.hpp; the ILP in
// problem.hpp. This file is the search driver: the solves (O3's ILP, O2's layer-aligned
// segments), the memory modes (rows, O2's memory pricing, Rhino's forced sharding), the deadline's
// fallbacks and the plan with its report. The model and the problem it becomes are built in
// search_model.cpp (search_model.hpp); the independent evaluator is evaluate_plan.cpp.
#include "weft/spmd/search.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "search_model.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/error.hpp"
#include "weft/core/units.hpp"
#include "weft/cost/memory.hpp"
#include "weft/spmd/coarsen.hpp"
#include "weft/spmd/problem.hpp"

namespace weft::spmd {

using sharding::ShardingSpec;
using namespace detail;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string worse_status(const std::string& a, solver::IlpStatus s) {
  auto rank = [](std::string_view x) {
    return x == "optimal" ? 0 : x == "feasible_at_gap" ? 1 : x == "timeout" ? 2 : x.empty() ? -1 : 3;
  };
  std::string b(solver::ilp_status_name(s));
  return rank(b) > rank(a) ? b : a;
}

// O2 under a binding memory limit without memory rows (a Lagrangian price on memory). Each
// strategy pays λ per byte per device of its results (leaves: of the tensor) that are live
// somewhere the all-replicated step would exceed the limit; a row-free O2 solve of the priced
// problem is fast and its identical layers stay identical. The smallest price whose plan fits
// is found by growing λ ×4 from a scale of cost/peak, then bisecting (geometric) between the
// last price that did not fit and the first that did. Among the plans that fit, the cheapest
// in true cost is returned; nullopt when none does (the caller then builds memory rows). A
// heuristic, as O2 is: it cannot prove that no plan fits. Past the deadline of `stop` no further
// price is probed (the best plan that fitted so far is returned).
template <class Peak, class Solve>
std::optional<ProblemSolution> price_memory(const Model& m, const Built& b, double limit,
                                            const ProblemSolution& relaxed, Peak&& peak_of, Solve&& solve,
                                            SearchReport& rep, const StopToken& stop = {}) {
  const auto& g = m.g;
  const auto& lv = b.live;
  const int npos = static_cast<int>(lv.order.size());
  // Positions where the all-replicated live bytes exceed the limit; a tensor is priced when it
  // is live at one of them (exactly the tensors of memory rows that can bind).
  std::vector<double> full_bytes(g.tensors().size());
  for (std::size_t t = 0; t < full_bytes.size(); ++t)
    full_bytes[t] = static_cast<double>(g.tensors()[t].bytes());
  const std::vector<double> full = cost::live_bytes(lv, full_bytes);
  std::vector<int> hot_before(npos + 1, 0);  // hot positions in [0, p)
  for (int p = 0; p < npos; ++p) hot_before[p + 1] = hot_before[p] + (full[p] > limit ? 1 : 0);
  auto hot = [&](ir::TensorId t) {
    if (lv.begin[t] < 0 || lv.begin[t] >= npos) return false;
    return hot_before[std::min(lv.end[t], npos - 1) + 1] - hot_before[lv.begin[t]] > 0;
  };
  const int n = m.num_nodes();
  std::vector<std::vector<double>> bytes(n);
  for (int v = 0; v < n; ++v) {
    bytes[v].assign(m.num_strategies(v), 0.0);
    if (v < m.n_ops) {
      for (int i = 0; i < static_cast<int>(g.op(v).outputs.size()); ++i) {
        const ir::TensorId t = g.op(v).outputs[i];
        if (!hot(t)) continue;
        for (int s = 0; s < m.num_strategies(v); ++s)
          bytes[v][s] += spec_bytes(m.op_strategy(v, s).outputs[i], g.tensor(t).dtype);
      }
    } else {
      const ir::TensorId t = m.leaf_tensor[v - m.n_ops];
      if (!hot(t)) continue;
      for (int s = 0; s < m.num_strategies(v); ++s)
        bytes[v][s] = spec_bytes(m.leaf_spec(v, s), g.tensor(t).dtype);
    }
  }
  std::optional<ProblemSolution> best;
  double best_cost = kInfCost;
  bool out_of_time = false;
  auto probe = [&](double lambda) {  // true when the priced plan fits
    stop.throw_if_cancelled("spmd_search");
    if (out_of_time || stop.expired()) {
      out_of_time = true;
      rep.status = worse_status(rep.status, solver::IlpStatus::Timeout);  // the bisection was cut short
      return false;
    }
    StrategyProblem q = b.problem;
    for (int v = 0; v < n; ++v)
      for (int s = 0; s < m.num_strategies(v); ++s)
        if (!std::isinf(q.node_cost[v][s])) q.node_cost[v][s] += lambda * bytes[v][s];
    ProblemSolution sol = solve(q, rep.memory_price_probes++);
    if (!sol.has_solution() || peak_of(sol.choice) > limit) return false;
    const double c = evaluate(b.problem, sol.choice).cost;
    if (c < best_cost) {
      best_cost = c;
      sol.cost = c;
      best = std::move(sol);
      rep.memory_price = lambda;
    }
    return true;
  };
  const double scale =
      relaxed.has_solution() ? std::max(relaxed.cost, 1e-9) / std::max(peak_of(relaxed.choice), 1.0) : 1e-12;
  // Bracket: lo = a price whose plan does not fit (0 = none found), hi = one whose plan fits.
  double lo = 0, hi = 0, lambda = scale * 1e-2;
  if (probe(lambda)) {
    hi = lambda;
    for (int k = 0; k < 8 && !out_of_time; ++k) {
      lambda /= 4;
      if (!probe(lambda)) {
        lo = lambda;
        break;
      }
      hi = lambda;
    }
  } else {
    lo = lambda;
    for (int k = 0; k < 24 && hi == 0 && !out_of_time; ++k) {
      lambda *= 4;
      (probe(lambda) ? hi : lo) = lambda;
    }
  }
  if (hi == 0) return std::nullopt;
  for (int k = 0; k < 6 && lo > 0 && !out_of_time; ++k) {  // geometric bisection: λ spans decades
    const double mid = std::sqrt(lo * hi);
    (probe(mid) ? hi : lo) = mid;
  }
  return best;
}

// A quick plan that needs no solver, for a search whose deadline left no better one: ops in
// topological order, each the strategy cheapest against the nodes already chosen plus, for each
// leaf it reads that is still open, that leaf's best answer (its own cost and the edge); the leaf
// then takes that answer. Memory is not looked at (the caller prices it). Forced specs
// (fixed_specs) are infinite node costs and output_specs are in the node costs, so both hold
// whenever the plan is finite.
std::vector<int> greedy_plan(const Model& m, const StrategyProblem& p, const std::vector<ir::OpId>& topo) {
  const int n = p.num_nodes();
  std::vector<std::vector<int>> adj(n);
  for (int e = 0; e < static_cast<int>(p.edges.size()); ++e) {
    adj[p.edges[e].u].push_back(e);
    adj[p.edges[e].v].push_back(e);
  }
  std::vector<int> choice(n, -1);
  auto pair_cost = [&](int e, int v, int s, int t) {  // edge e with v at s, its other end at t
    const EdgeCost& ed = p.edges[e];
    const std::size_t sv = p.node_cost[ed.v].size();
    return ed.u == v ? ed.cost[static_cast<std::size_t>(s) * sv + t]
                     : ed.cost[static_cast<std::size_t>(t) * sv + s];
  };
  // The cheapest strategy of v against the chosen nodes (and, with look_ahead, the open leaves').
  auto pick = [&](int v, bool look_ahead) {
    int best_s = -1;
    double best = kInfCost;
    for (int s = 0; s < static_cast<int>(p.node_cost[v].size()); ++s) {
      double c = p.node_cost[v][s];
      if (std::isinf(c)) continue;
      for (int e : adj[v]) {
        const int w = p.edges[e].u == v ? p.edges[e].v : p.edges[e].u;
        if (choice[w] >= 0) {
          c += pair_cost(e, v, s, choice[w]);
        } else if (look_ahead && w >= m.n_ops) {
          double lb = kInfCost;
          for (int t = 0; t < static_cast<int>(p.node_cost[w].size()); ++t)
            lb = std::min(lb, p.node_cost[w][t] + pair_cost(e, v, s, t));
          c += lb;
        }
      }
      if (best_s < 0 || c < best) best = c, best_s = s;
    }
    return best_s < 0 ? 0 : best_s;
  };
  for (ir::OpId o : topo) {
    choice[o] = pick(o, true);
    for (int e : adj[o]) {
      const int w = p.edges[e].u == o ? p.edges[e].v : p.edges[e].u;
      if (w >= m.n_ops && choice[w] < 0) choice[w] = pick(w, false);
    }
  }
  for (int v = 0; v < n; ++v)
    if (choice[v] < 0) choice[v] = pick(v, false);
  return choice;
}

}  // namespace

std::string SearchReport::to_string() const {
  std::string s;
  s += fmt::format(
      "SPMD search: {} nodes, {} strategies, {} edges; ILP {} vars, {} rows over {} solve(s); "
      "status {}, gap {:.3g}\n",
      nodes, strategies, edges, ilp_variables, ilp_constraints, ilp_solves, status, gap);
  if (segments > 0)
    s += fmt::format("O2: {} segments, {} reused from identical layers, {} refinement moves\n", segments,
                     reused_segments, refine_moves);
  if (memory_price_probes > 0)
    s += fmt::format("O2 memory pricing: {} row-free solves, price {:.4g} s per GB{}\n", memory_price_probes,
                     memory_price * 1e9, memory_price > 0 ? "" : " (none fitted: memory rows used)");
  if (o2_fallback) s += "O2 found no plan under the memory limit: solved as one ILP (O3)\n";
  s += fmt::format("predicted step: {} = compute {} + communication {}\n",
                   format_seconds(compute_time + comm_time), format_seconds(compute_time),
                   format_seconds(comm_time));
  s += fmt::format("peak memory per device: {} (limit {})\n", format_bytes(peak_memory),
                   memory_limit > 0 ? format_bytes(memory_limit) : std::string("none"));
  if (forced_sharded_params >= 0)
    s += fmt::format("memory loop: {} largest parameters forced sharded\n", forced_sharded_params);
  s += "phases:";
  for (const auto& [n, t] : phase_seconds) s += fmt::format(" {} {:.3f}s", n, t);
  if (segments > 0)
    s += fmt::format(" (O2 DP {:.3f}s, refinement {:.3f}s)", o2_dp_seconds, o2_refine_seconds);
  s += "\n";
  std::size_t w = 9;
  for (const auto& r : params) w = std::max(w, r.name.size());
  s += fmt::format("{:<{}}  {:<18}  {:<24}  {:>12}\n", "parameter", w, "shape", "spec", "per device");
  for (const auto& r : params)
    s += fmt::format("{:<{}}  {:<18}  {:<24}  {:>12}\n", r.name, w,
                     fmt::format("[{}]", fmt::join(r.shape, ",")), r.spec, format_bytes(r.bytes_per_device));
  return s;
}

std::string SpmdPlan::spec_of(const ir::Graph& g, const std::string& name) const {
  auto t = g.find_tensor(name);
  WEFT_CHECK(t.has_value(), "spec_of: unknown tensor '{}'", name);
  WEFT_CHECK(*t < static_cast<int>(tensor_specs.size()) && tensor_specs[*t].has_value(),
             "spec_of: tensor '{}' has no spec in this plan", name);
  return tensor_specs[*t]->to_string();
}

SpmdPlan spmd_search(const ir::Graph& g, const cluster::Cluster& cl, const cluster::DeviceMesh& mesh,
                     const SearchOptions& opt) {
  WEFT_CHECK(!g.ops().empty(), "spmd_search: graph '{}' has no ops", g.name());
  WEFT_CHECK(opt.time_limit_s > 0, "spmd_search: time_limit must be > 0 seconds, got {}", opt.time_limit_s);
  WEFT_CHECK(
      !std::isnan(opt.memory_limit) && opt.memory_limit < std::numeric_limits<double>::infinity() &&
          (opt.memory_limit <= 0 || opt.memory_limit >= 1),
      "spmd_search: memory_limit must be a finite number of bytes, at least 1 (0 = the device's memory, "
      "< 0 = none), got {}",
      opt.memory_limit);
  WEFT_CHECK(opt.relative_gap >= 0 && opt.relative_gap < 1,
             "spmd_search: relative_gap must be in [0, 1), got {}", opt.relative_gap);
  for (int id : mesh.device_ids())
    WEFT_CHECK(id < cl.num_devices(), "spmd_search: mesh device {} is not in the cluster ({} devices)", id,
               cl.num_devices());
  auto progress = [&](const std::string& phase, double f, const std::string& msg) {
    if (opt.progress) opt.progress({phase, f, msg});
  };
  SpmdPlan plan;
  auto& rep = plan.report;
  double t = now_s();
  auto phase = [&](const std::string& name) {
    const double n = now_s();
    rep.phase_seconds.push_back({name, n - t});
    t = n;
  };
  // One deadline for the whole search (time_limit_s and the caller's token, whichever is first):
  // every phase below asks it, and every ILP gets what is left of it.
  const StopToken stop = opt.stop.within(opt.time_limit_s);
  stop.throw_if_cancelled("spmd_search");
  progress("strategies", 0.0, "enumerating strategies");
  Model m = build_model(g, cl, mesh, opt.device, stop);
  if (opt.require_split) check_mesh_usable(m);
  phase("strategies");
  if (opt.strided_candidates) {
    // A fixed leaf spec the enumeration lacks (a strided one) joins its leaf's list first, so that
    // the candidates give its readers the strategies that read it as it is.
    // Leaves of one class seeded with one spec share the grown list and its new class.
    std::map<std::pair<int, std::string>, std::pair<int, SharedList<ShardingSpec>>> seeded;
    for (const auto& [name, text] : opt.fixed_specs) {
      const auto t = g.find_tensor(name);
      if (!t || m.node_of_tensor[*t] < m.n_ops) continue;  // build_problem reports a bad name
      const int v = m.node_of_tensor[*t];
      const auto want = ShardingSpec::parse(text, g.tensor(*t).shape, m.mesh);
      auto& list = m.leaf_specs[v - m.n_ops];
      if (std::find(list.begin(), list.end(), want) != list.end()) continue;
      const auto key = std::make_pair(m.list_class[v], want.to_string());
      if (auto it = seeded.find(key); it != seeded.end()) {
        m.list_class[v] = it->second.first;
        list = it->second.second;
        continue;
      }
      list.push_back(want);
      m.list_class[v] = m.next_class++;  // its own list now
      seeded.emplace(key, std::make_pair(m.list_class[v], list));
    }
    generate_strided_candidates(m, stop);
    phase("strided candidates");
  }
  const double limit = opt.memory_limit < 0   ? 0
                       : opt.memory_limit > 0 ? opt.memory_limit
                                              : m.device.memory_bytes;
  rep.memory_limit = limit;
  progress("edge costs", 0.1, "resharding costs");
  ReshardCosts rc(cluster::axis_links(cl, mesh), opt.reshard_cache);
  Built b = build_problem(m, rc, 0, opt, stop);
  phase("edge costs");
  rep.nodes = m.num_nodes();
  for (int v = 0; v < m.num_nodes(); ++v) rep.strategies += m.num_strategies(v);
  rep.edges = b.n_edges;

  std::vector<int> choice;
  const auto topo = g.topo_order();
  if (stop.expired()) rep.status = "timeout";  // candidate generation was cut short
  // Peak memory per device of a choice, from the live sets (no rows needed).
  auto peak_of = [&](const std::vector<int>& ch) {
    std::vector<double> bytes(g.tensors().size(), 0.0);
    for (std::size_t ti = 0; ti < bytes.size(); ++ti)
      bytes[ti] = static_cast<double>(g.tensors()[ti].bytes());
    for (int o = 0; o < m.n_ops; ++o)
      for (int i = 0; i < static_cast<int>(g.op(o).outputs.size()); ++i) {
        const ir::TensorId ti = g.op(o).outputs[i];
        bytes[ti] = spec_bytes(m.op_strategy(o, ch[o]).outputs[i], g.tensor(ti).dtype);
      }
    for (int v = m.n_ops; v < m.num_nodes(); ++v) {
      const ir::TensorId ti = m.leaf_tensor[v - m.n_ops];
      bytes[ti] = spec_bytes(m.leaf_spec(v, ch[v]), g.tensor(ti).dtype);
    }
    return cost::peak_memory(b.live, bytes).first;
  };

  // A plan that fits, whatever the solvers manage in the time left: greedy_plan, with memory
  // priced in (price_memory over greedy plans instead of O2 solves) when it does not fit. Built
  // on first use, once; null when even it does not fit. It runs past the deadline (it is the
  // answer of last resort, and fast: one pass over the edges per price), never past a cancel.
  std::optional<std::vector<int>> quick;
  auto quick_plan = [&]() -> const std::vector<int>* {
    if (!quick) {
      auto fits = [&](const std::vector<int>& ch) {
        return std::isfinite(evaluate(b.problem, ch).cost) && (limit <= 0 || peak_of(ch) <= limit);
      };
      std::vector<int> h = greedy_plan(m, b.problem, topo);
      if (limit > 0 && peak_of(h) > limit) {
        ProblemSolution relaxed;
        relaxed.choice = h;
        relaxed.cost = evaluate(b.problem, h).cost;
        SearchReport scratch;  // its probes are not the search's
        auto priced = price_memory(
            m, b, limit, relaxed, peak_of,
            [&](const StrategyProblem& q, int) {
              stop.throw_if_cancelled("spmd_search");
              ProblemSolution ps;
              ps.choice = greedy_plan(m, q, topo);
              ps.cost = evaluate(q, ps.choice).cost;
              ps.status = solver::IlpStatus::FeasibleAtGap;
              return ps;
            },
            scratch);
        h = priced ? priced->choice : std::vector<int>{};
      }
      quick = !h.empty() && fits(h) ? std::move(h) : std::vector<int>{};
    }
    return quick->empty() ? nullptr : &*quick;
  };

  auto run_solve_rows = [&](const StrategyProblem& p, double base, double span, Level level) {
    progress("solve", base, level == Level::O3 ? "ILP (O3)" : "segments (O2)");
    ProblemSolution sol;
    if (level == Level::O3) {
      SolveOptions so;
      so.time_limit_s = std::min(opt.time_limit_s, 1e9);  // the token holds the deadline
      so.relative_gap = opt.relative_gap;
      so.stop = stop;
      // With memory rows the ILP's own greedy start ignores memory: start from the quick plan
      // that fits, so that a timeout still holds an incumbent.
      if (!p.memory_rows.empty() && !std::isinf(p.memory_limit))
        if (const auto* h = quick_plan(); h != nullptr && evaluate(p, *h).feasible()) so.warm_start = *h;
      sol = solve_ilp(p, so);
      rep.ilp_variables = sol.ilp_variables;
      rep.ilp_constraints = sol.ilp_constraints;
      rep.ilp_solves += 1;
      rep.status = worse_status(rep.status, sol.status);
      rep.gap = std::max(rep.gap, sol.gap);
    } else {
      O2Options oo;
      oo.time_limit_s = std::min(opt.time_limit_s, 1e9);
      oo.relative_gap = opt.relative_gap;
      oo.stop = stop;
      oo.reuse_repeated = opt.reuse_repeated_layers;
      oo.heavy_fraction = 1e-3;
      oo.refine_sweeps = opt.o2_refine_sweeps;
      oo.progress = [&](double f) { progress("solve", base + span * f, "segments (O2)"); };
      std::vector<double> weight(m.num_nodes(), 0.0);
      std::vector<int> order_pos(m.num_nodes(), 0);
      std::vector<int> topo_pos(m.n_ops, 0);
      for (int i = 0; i < static_cast<int>(topo.size()); ++i) topo_pos[topo[i]] = i;
      // Consumers of every tensor, in op order, each op once (Graph::consumers is a scan of all
      // ops: quadratic in depth when called per tensor).
      std::vector<std::vector<ir::OpId>> consumers(g.tensors().size());
      for (int o = 0; o < m.n_ops; ++o)
        for (ir::TensorId ti : g.op(o).inputs)
          if (consumers[ti].empty() || consumers[ti].back() != o) consumers[ti].push_back(o);
      std::vector<std::vector<int>> succ(m.n_ops);
      for (int o = 0; o < m.n_ops; ++o) {
        for (ir::TensorId ti : g.op(o).outputs)
          for (ir::OpId c : consumers[ti]) succ[o].push_back(c);
      }
      // Layer-aligned segments: backward and optimizer ops join the segment of the forward ops
      // they read (anchor = the earliest forward position among their forward-derived inputs,
      // else the earliest anchor among their producers), so one segment holds a layer's forward,
      // backward and update, and the forward layout is chosen knowing the backward costs. Only
      // forward ops cut segments (are critical). order_pos = 4 * anchor + rank with rank leaf 0,
      // backward 1, forward 2: a segment ending at a critical forward op keeps the leaves and
      // backward ops anchored to it.
      std::vector<char> fwd(m.n_ops, 1);
      bool any_fwd = false;
      for (int o = 0; o < m.n_ops; ++o) {
        for (ir::TensorId ti : g.op(o).outputs) {
          const auto r = g.tensor(ti).role;
          if (r == ir::Role::Gradient || r == ir::Role::Parameter || r == ir::Role::OptimizerState)
            fwd[o] = 0;
        }
        any_fwd |= fwd[o] != 0;
      }
      if (!any_fwd) std::fill(fwd.begin(), fwd.end(), 1);  // a backward-only stage: plain order
      const int big = static_cast<int>(topo.size());
      std::vector<int> tensor_anchor(g.tensors().size(), -1);  // forward-derived anchor per tensor
      std::vector<int> op_anchor(m.n_ops, 0);
      for (int v = m.n_ops; v < m.num_nodes(); ++v) {  // leaves: first forward consumer
        const ir::TensorId ti = m.leaf_tensor[v - m.n_ops];
        int first = big;
        for (ir::OpId c : consumers[ti])
          if (fwd[c]) first = std::min(first, topo_pos[c]);
        if (first < big) tensor_anchor[ti] = first;
      }
      for (ir::OpId o : topo) {
        if (fwd[o]) {
          op_anchor[o] = topo_pos[o];
        } else {
          int a = big, b = big;
          for (ir::TensorId ti : g.op(o).inputs) {
            if (tensor_anchor[ti] >= 0) a = std::min(a, tensor_anchor[ti]);
            const ir::OpId pr = g.tensor(ti).producer;
            if (pr != ir::kNoOp) b = std::min(b, op_anchor[pr]);
          }
          op_anchor[o] = a < big ? a : b < big ? b : topo_pos[o];
        }
        for (ir::TensorId ti : g.op(o).outputs)
          if (fwd[o]) tensor_anchor[ti] = topo_pos[o];
        order_pos[o] = 4 * op_anchor[o] + (fwd[o] ? 2 : 1);
        // Compute-heavy = a forward contraction (einsum / convolution / fused attention); the heavy
        // fraction is taken relative to the largest one, low enough that a vocabulary projection
        // 100x a layer's matmuls does not hide the layers.
        const auto kind = g.op(o).kind;
        weight[o] = fwd[o] && (kind == ir::OpKind::Einsum || kind == ir::OpKind::Conv2d ||
                               kind == ir::OpKind::Attention)
                        ? g.op(o).flops()
                        : 0.0;
      }
      for (int v = m.n_ops; v < m.num_nodes(); ++v) {
        int first = big;
        for (ir::OpId c : consumers[m.leaf_tensor[v - m.n_ops]]) first = std::min(first, op_anchor[c]);
        order_pos[v] = 4 * first;
      }
      auto account = [&](const O2Stats& st) {
        rep.ilp_variables = std::max(rep.ilp_variables, st.max_ilp_variables);
        rep.ilp_constraints = std::max(rep.ilp_constraints, st.max_ilp_constraints);
        rep.ilp_solves += st.ilp_solves;
        rep.segments = st.segments;
        if (oo.start.empty())
          rep.reused_segments = st.reused_segments;  // the DP's (a refinement reuses none)
        rep.refine_moves += st.refine_moves;
        rep.o2_dp_seconds += st.dp_seconds;
        rep.o2_refine_seconds += st.refine_seconds;
        rep.status = worse_status(rep.status, st.worst_status);
        rep.gap = std::max(rep.gap, st.max_gap);
      };
      O2Stats st;
      if (m.shared_layouts.empty()) {  // no shared-resharding pair (every pair has a layout)
        sol = solve_o2(p, m.n_ops, succ, weight, order_pos, oo, &st);
        account(st);
      } else {
        // Shared-resharding pairs: the DP stitches segments by their end node's strategy, and a
        // pair chosen for the readers of one segment is a poor guess for a tensor read across
        // many (GPT 1 layer, 2x4: 1.55x the plan without pairs). So the DP runs without the
        // pairs, and the refinement then re-solves its windows with them, starting from that plan:
        // never costlier than the search without shared resharding.
        sol = solve_o2(without_pairs(p, m), m.n_ops, succ, weight, order_pos, oo, &st);
        account(st);
        if (sol.has_solution()) {
          oo.start = sol.choice;
          O2Stats rs;
          ProblemSolution r = solve_o2(p, m.n_ops, succ, weight, order_pos, oo, &rs);
          account(rs);
          if (r.has_solution() && r.cost <= sol.cost) sol = std::move(r);
        }
      }
    }
    return sol;
  };
  // Memory rows that can bind (in the all-replicated worst case) make every segment an ILP.
  // Solve without them first: a plan that fits anyway is optimal for the constrained problem
  // too (for O3 exactly; for O2 as the same heuristic); only a plan over the limit pays for the
  // rows.
  auto run_solve = [&](const StrategyProblem& p, double base, double span, Level level) {
    if (p.memory_rows.empty()) return run_solve_rows(p, base, span, level);
    StrategyProblem relaxed = p;
    relaxed.memory_rows.clear();
    relaxed.memory_limit = kInfCost;
    ProblemSolution sol = run_solve_rows(relaxed, base, span / 2, level);
    if (sol.has_solution() && evaluate(p, sol.choice).feasible()) return sol;
    if (stop.expired()) return sol;  // no time for the rows: the caller checks the fit
    return run_solve_rows(p, base + span / 2, span / 2, level);
  };

  // The deadline passed: of the plan the solvers found (`found`, possibly none or over the
  // memory limit) and the quick plan, the cheaper one that fits; empty when neither does. The
  // status becomes timeout; the gap is what the found plan's ILP bound says about the quick plan
  // when that one is taken (O3), else 1 (no bound but 0: every cost is >= 0).
  auto best_by_deadline = [&](const std::vector<int>& found, double found_gap, bool ilp_bound) {
    // A solve cut short can end without a proof either way (even "infeasible" from a phase CBC
    // left early): whatever the solves said, a plan returned at the deadline is a timeout.
    rep.status = "timeout";
    const bool found_fits = !found.empty() && std::isfinite(evaluate(b.problem, found).cost) &&
                            (limit <= 0 || peak_of(found) <= limit);
    const std::vector<int>* h = quick_plan();
    if (h == nullptr) return found_fits ? found : std::vector<int>{};
    const double hc = evaluate(b.problem, *h).cost;
    if (found_fits) {
      const double fc = evaluate(b.problem, found).cost;
      if (fc <= hc) return found;
      const double bound = fc * (1 - found_gap);  // the ILP's bound on the optimum
      rep.gap = ilp_bound && found_gap < 1 ? std::max(0.0, (hc - bound) / std::max(hc, 1e-300)) : 1.0;
    } else {
      rep.gap = 1.0;
    }
    return *h;
  };
  auto no_plan_in_time = [&](const std::string& why) {
    fail(
        "spmd_search: no solution within the time limit of {} s ({}; even the quick greedy plan does "
        "not fit the memory limit of {} per device)",
        opt.time_limit_s, why, format_bytes(limit));
  };

  if (opt.memory_mode == MemoryMode::Ilp) {
    // Without memory rows first: a plan that fits anyway is optimal under the limit too (exact
    // for O3); the rows are built and solved with only when it does not fit.
    ProblemSolution sol = run_solve(b.problem, 0.2, 0.35, opt.level);
    bool priced = false;
    if (limit > 0 && (!sol.has_solution() || peak_of(sol.choice) > limit) && opt.level == Level::O2 &&
        opt.o2_memory_pricing && !stop.expired()) {
      phase("solve without memory rows");
      if (auto p = price_memory(
              m, b, limit, sol, peak_of,
              [&](const StrategyProblem& q, int k) {
                return run_solve_rows(q, 0.55 + 0.02 * std::min(k, 15), 0.02, Level::O2);
              },
              rep, stop)) {
        sol = std::move(*p);
        priced = true;
      }
      phase("memory pricing");
    }
    if (!priced && limit > 0 && (!sol.has_solution() || peak_of(sol.choice) > limit) && !stop.expired()) {
      if (rep.memory_price_probes == 0) phase("solve without memory rows");
      if (add_memory_rows(b, m, limit, stop)) {
        phase("memory rows");
        sol = run_solve_rows(b.problem, 0.55, 0.35, opt.level);
      } else {  // the deadline came while building them: no time to solve with them
        b.problem.memory_rows.clear();
        b.problem.memory_limit = kInfCost;
        b.rows_pos.clear();
        phase("memory rows");
      }
    }
    if (!sol.has_solution() && opt.level == Level::O2 && !stop.expired() && rep.status != "timeout") {
      // The segment DP fixes memory of other segments heuristically and can miss a feasible
      // plan under a tight limit: fall back to the whole-graph ILP, which decides feasibility.
      rep.o2_fallback = true;
      sol = run_solve_rows(b.problem, 0.6, 0.3, Level::O3);
    }
    if (rep.status == "timeout" ||
        (stop.expired() && (!sol.has_solution() || (limit > 0 && peak_of(sol.choice) > limit)))) {
      // Out of time before a plan was proven: the best plan that fits so far.
      sol.choice = best_by_deadline(sol.choice, sol.gap, opt.level == Level::O3);
      if (!sol.has_solution()) no_plan_in_time(fmt::format("status {}", rep.status));
    }
    if (!sol.has_solution()) {
      if (sol.status == solver::IlpStatus::Infeasible) {
        WEFT_CHECK(limit <= 0, "spmd_search: memory limit {} per device cannot be met: {}",
                   format_bytes(limit), explain_memory(m, b));
      }
      fail("spmd_search: no strategy found ({}) within {} s", rep.status, opt.time_limit_s);
    }
    choice = sol.choice;
  } else {
    // Rhino §4.4: parameters by size, largest first; force the k largest to be sharded (no
    // replicated layout) for k = 0, 1, 2, ... and stop at the first k whose plan fits (binary
    // search over k: feasibility is monotone in k in practice, and every probe is checked).
    std::vector<ir::TensorId> params;
    for (ir::TensorId ti : m.leaf_tensor)
      if (g.tensor(ti).role == ir::Role::Parameter) params.push_back(ti);
    std::stable_sort(params.begin(), params.end(), [&](ir::TensorId a, ir::TensorId c) {
      return g.tensor(a).bytes() > g.tensor(c).bytes();
    });
    // Each probe's fit is checked from the live intervals (peak_of); memory rows are built only
    // to explain an infeasible limit.
    auto attempt = [&](int k) -> std::optional<std::vector<int>> {
      if (stop.expired()) return std::nullopt;
      StrategyProblem p = b.problem;
      for (int i = 0; i < k; ++i) {
        const int v = m.node_of_tensor[params[i]];
        for (int s = 0; s < m.num_strategies(v); ++s)
          if (m.produced(v, s, 0).is_replicated()) p.node_cost[v][s] = kInfCost;
      }
      auto sol = run_solve(p, 0.2, 0.1, opt.level);
      if (!sol.has_solution()) return std::nullopt;
      if (limit > 0 && peak_of(sol.choice) > limit) return std::nullopt;
      return sol.choice;
    };
    int lo = 0, hi = static_cast<int>(params.size());
    std::optional<std::vector<int>> best;
    if (auto c0 = attempt(0)) {
      best = c0;
      hi = 0;
    } else if (auto chi = attempt(hi); !chi && (stop.expired() || rep.status == "timeout")) {
      // Out of time before any k fitted: handled below.
    } else {
      WEFT_CHECK(chi.has_value(),
                 "spmd_search: memory limit {} per device cannot be met even with all {} "
                 "parameters sharded: {}",
                 format_bytes(limit), params.size(), [&] {
                   Built rows = build_problem(m, rc, limit, opt);
                   return explain_memory(m, rows);
                 }());
      best = chi;
      while (hi - lo > 1 && !stop.expired()) {  // invariant: lo infeasible, hi feasible
        const int mid = (lo + hi) / 2;
        if (auto c = attempt(mid)) {
          hi = mid;
          best = c;
        } else {
          lo = mid;
        }
      }
    }
    rep.forced_sharded_params = hi;
    if (stop.expired() || rep.status == "timeout") {
      // The deadline cut the loop (or a probe's ILP): its smallest fitting k so far, or the
      // quick plan when that is cheaper or no k fitted in time.
      const std::vector<int> found = best ? *best : std::vector<int>{};
      choice = best_by_deadline(found, 1.0, false);
      if (choice.empty()) no_plan_in_time(fmt::format("status {}", rep.status));
      if (choice != found) rep.forced_sharded_params = -1;
    } else {
      choice = *best;
    }
  }
  phase("solve");

  // ---- the plan
  progress("evaluate", 0.95, "evaluating");
  plan.op_strategies.resize(m.n_ops);
  plan.tensor_specs.assign(g.tensors().size(), std::nullopt);
  std::map<ir::TensorId, ShardingSpec> leaf_specs;
  std::vector<std::vector<AxisAssign>> op_axes(m.n_ops);
  plan.shared_specs.assign(g.tensors().size(), std::nullopt);
  for (int o = 0; o < m.n_ops; ++o) {
    plan.op_strategies[o] = m.op_strategy(o, choice[o]);
    op_axes[o] = plan.op_strategies[o].axes;
    for (int i = 0; i < static_cast<int>(g.op(o).outputs.size()); ++i)
      plan.tensor_specs[g.op(o).outputs[i]] = plan.op_strategies[o].outputs[i];
  }
  for (int v = m.n_ops; v < m.num_nodes(); ++v) {
    const ir::TensorId ti = m.leaf_tensor[v - m.n_ops];
    plan.tensor_specs[ti] = m.leaf_spec(v, choice[v]);
    leaf_specs.emplace(ti, *plan.tensor_specs[ti]);
  }
  for (int v = 0; v < m.num_nodes(); ++v)
    if (const ShardingSpec* a = m.shared(v, choice[v]))
      plan.shared_specs[v < m.n_ops ? g.op(v).outputs[static_cast<std::size_t>(m.shared_slot[v])]
                                    : m.leaf_tensor[v - m.n_ops]] = *a;
  const Evaluation ev = evaluate(b.problem, choice);
  // Node costs hold compute (ops only; a leaf's is a tie-break) and out_conv's resharding (any
  // node: output_specs, shared layouts), which is communication.
  plan.compute_time = 0;
  double out_conv = 0;
  for (int v = 0; v < m.num_nodes(); ++v) {
    const double conv = b.out_conv[v].empty() ? 0.0 : b.out_conv[v][choice[v]];
    out_conv += conv;
    if (v < m.n_ops) plan.compute_time += b.problem.node_cost[v][choice[v]] - conv;
  }
  plan.comm_time = ev.edge_cost + out_conv;
  plan.cost = plan.compute_time + plan.comm_time;
  {
    std::vector<double> bytes(g.tensors().size(), 0.0);
    for (std::size_t ti = 0; ti < bytes.size(); ++ti)
      bytes[ti] = plan.tensor_specs[ti] ? spec_bytes(*plan.tensor_specs[ti], g.tensors()[ti].dtype)
                                        : static_cast<double>(g.tensors()[ti].bytes());
    plan.peak_memory = cost::peak_memory(b.live, bytes).first;
  }
  rep.compute_time = plan.compute_time;
  rep.comm_time = plan.comm_time;
  rep.peak_memory = plan.peak_memory;
  for (ir::TensorId ti = 0; ti < static_cast<ir::TensorId>(g.tensors().size()); ++ti) {
    const auto& info = g.tensor(ti);
    if (info.role != ir::Role::Parameter || info.producer != ir::kNoOp || !plan.tensor_specs[ti]) continue;
    rep.params.push_back({info.name, info.shape, plan.tensor_specs[ti]->to_string(),
                          spec_bytes(*plan.tensor_specs[ti], info.dtype)});
  }
  phase("report");
  progress("evaluate", 1.0, "done");
  return plan;
}

}  // namespace weft::spmd
