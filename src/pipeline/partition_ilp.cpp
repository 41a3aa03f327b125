// Rhino §5: pipeline stage partition of a non-linear graph by ILP, with bound tightening.
//
// Input: a DAG of nodes v with compute c_v >= 0 and values (tensors) t with a producer p(t),
// consumers C(t) and bytes b_t; S stages; tolerance ε. τ = Σ_v c_v / S, cap = (1 + ε)·τ.
//
//   x_{v,s} ∈ {0,1}  for s ∈ [l_v, u_v]         (node v runs in stage s; B_v = Σ_s s·x_{v,s})
//   Σ_s x_{v,s} = 1                               (one stage per node)
//   Σ_{s'<=s} x_{c,s'} <= Σ_{s'<=s} x_{p,s'}   ∀ edge p→c, ∀ s  (B_p <= B_c: producers not after
//                                                 consumers; the prefix form is the tight one)
//   (1 − ε)·τ <= Σ_v c_v·x_{v,s} <= (1 + ε)·τ    ∀ s   (balance)
//   y_{t,s} >= x_{c,s} − x_{p(t),s}               ∀ t, c ∈ C(t), s   (t is sent to stage s)
//   minimise Σ_{t,s} b_t·y_{t,s}
// y_{t,s} is continuous in [0, 1]: at an optimum it equals max_c (x_{c,s} − x_{p,s})^+ ∈ {0,1}.
// Counting per (tensor, destination stage) instead of per edge (the paper's F_ij) avoids paying
// twice for a tensor read by two ops of one later stage.
//
// Bound tightening (derived here; the paper's upper bound is wrong). Let A_v / D_v be the total
// compute of v's ancestors / descendants. If v is in stage b, all its ancestors are in stages
// <= b, so A_v + c_v <= Σ_{s<=b} C_s <= (b + 1)·cap, i.e.
//     b >= l_v = ⌈(A_v + c_v) / cap⌉ − 1.
// All its descendants are in stages >= b, so D_v + c_v <= Σ_{s>=b} C_s <= (S − b)·cap, i.e.
//     b <= u_v = S − ⌈(D_v + c_v) / cap⌉.
// Both only use the balance rows, so they never remove a feasible point, hence never the optimum.
// The paper prints B_i <= ⌈(c_i + Σ_{D_i} c) / τ + ε⌉: for an op near the end (few descendants)
// that is ⌈small + ε⌉ = 1, which forces late ops into stage <= 1 — it measures the work AFTER v as
// if it were the work BEFORE v. The correct form counts the stages the descendants need from the
// end: S − (work from v on) / cap. (paper_upper = true reproduces the printed bound, so tests can
// show it cutting off the optimum.)
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <set>

#include "weft/core/error.hpp"
#include "weft/pipeline/partition.hpp"

namespace weft::pipeline {

using ir::kNoOp;
using ir::OpId;
using ir::TensorId;

void PartitionDag::validate() const {
  const int n = num_nodes();
  for (int v = 0; v < n; ++v)
    WEFT_CHECK(std::isfinite(compute[v]) && compute[v] >= 0, "PartitionDag: node {} has compute {}", v,
               compute[v]);
  WEFT_CHECK(op_of_node.empty() || static_cast<int>(op_of_node.size()) == n,
             "PartitionDag: {} op ids for {} nodes", op_of_node.size(), n);
  std::vector<std::vector<int>> succ(n);
  std::vector<int> indeg(n, 0);
  for (std::size_t i = 0; i < values.size(); ++i) {
    const auto& val = values[i];
    WEFT_CHECK(val.producer >= 0 && val.producer < n, "PartitionDag: value {} has producer {} (nodes 0..{})",
               i, val.producer, n - 1);
    WEFT_CHECK(val.bytes >= 0, "PartitionDag: value {} has negative bytes", i);
    for (int c : val.consumers) {
      WEFT_CHECK(c >= 0 && c < n, "PartitionDag: value {} has consumer {} (nodes 0..{})", i, c, n - 1);
      WEFT_CHECK(c != val.producer, "PartitionDag: value {} is read by its own producer {}", i, c);
      succ[val.producer].push_back(c);
      ++indeg[c];
    }
  }
  std::vector<int> q;
  for (int v = 0; v < n; ++v)
    if (!indeg[v]) q.push_back(v);
  for (std::size_t h = 0; h < q.size(); ++h)
    for (int c : succ[q[h]])
      if (--indeg[c] == 0) q.push_back(c);
  WEFT_CHECK(static_cast<int>(q.size()) == n, "PartitionDag: the graph has a cycle");
}

namespace {

// Topological order, smallest index first among ready nodes (the node order when it is one).
std::vector<int> topo(const PartitionDag& dag, std::vector<std::vector<int>>* succ_out = nullptr,
                      std::vector<std::vector<int>>* pred_out = nullptr) {
  const int n = dag.num_nodes();
  std::vector<std::set<int>> succ(n), pred(n);
  for (const auto& val : dag.values)
    for (int c : val.consumers) {
      succ[val.producer].insert(c);
      pred[c].insert(val.producer);
    }
  std::vector<int> indeg(n);
  std::set<int> ready;
  for (int v = 0; v < n; ++v) {
    indeg[v] = static_cast<int>(pred[v].size());
    if (!indeg[v]) ready.insert(v);
  }
  std::vector<int> order;
  while (!ready.empty()) {
    int v = *ready.begin();
    ready.erase(ready.begin());
    order.push_back(v);
    for (int c : succ[v])
      if (--indeg[c] == 0) ready.insert(c);
  }
  if (succ_out) {
    succ_out->assign(n, {});
    for (int v = 0; v < n; ++v) (*succ_out)[v].assign(succ[v].begin(), succ[v].end());
  }
  if (pred_out) {
    pred_out->assign(n, {});
    for (int v = 0; v < n; ++v) (*pred_out)[v].assign(pred[v].begin(), pred[v].end());
  }
  return order;
}

void check_options(const PartitionDag& dag, int S, double eps) {
  WEFT_CHECK(S >= 1 && S <= std::max(1, dag.num_nodes()),
             "stage partition: num_stages = {} must be in 1..{} (nodes)", S, dag.num_nodes());
  WEFT_CHECK(std::isfinite(eps) && eps >= 0, "stage partition: epsilon = {} must be >= 0", eps);
}

double total_compute(const PartitionDag& dag) {
  double t = 0;
  for (double c : dag.compute) t += c;
  return t;
}

// Linear baseline used as a MIP start: the best contiguous split of the topological order
// (per-(value, destination stage) cut bytes, same balance rows). Empty when none exists.
std::vector<int> best_linear(const PartitionDag& dag, int S, double eps) {
  const int n = dag.num_nodes();
  auto order = topo(dag);
  std::vector<int> pos(n);
  for (int i = 0; i < n; ++i) pos[order[i]] = i;
  std::vector<double> prefix(n + 1, 0);
  for (int i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + dag.compute[order[i]];
  const double tau = prefix[n] / S, hi = (1 + eps) * tau * (1 + 1e-9) + 1e-12,
               lo = (1 - eps) * tau * (1 - 1e-9) - 1e-12;
  // in_bytes(b, e): distinct values read in positions [b, e) and made before b.
  std::vector<std::vector<std::pair<int, int>>> reads(n);  // position -> (value, producer position)
  for (std::size_t i = 0; i < dag.values.size(); ++i)
    for (int c : dag.values[i].consumers)
      reads[pos[c]].push_back({static_cast<int>(i), pos[dag.values[i].producer]});
  constexpr std::int64_t kInf = std::numeric_limits<std::int64_t>::max() / 4;
  std::vector<std::vector<std::int64_t>> F(S + 1, std::vector<std::int64_t>(n + 1, kInf));
  std::vector<std::vector<int>> from(S + 1, std::vector<int>(n + 1, -1));
  F[0][0] = 0;
  std::vector<int> seen(dag.values.size(), -1);
  for (int b = 0; b < n; ++b) {
    std::int64_t in = 0;
    for (int e = b + 1; e <= n; ++e) {
      for (auto [val, pp] : reads[e - 1])
        if (pp < b && seen[val] != b) {
          seen[val] = b;
          in += dag.values[val].bytes;
        }
      const double w = prefix[e] - prefix[b];
      if (w > hi) break;
      if (w < lo) continue;
      for (int k = 1; k <= S; ++k)
        if (F[k - 1][b] < kInf && F[k - 1][b] + in < F[k][e]) {
          F[k][e] = F[k - 1][b] + in;
          from[k][e] = b;
        }
    }
  }
  if (F[S][n] >= kInf) return {};
  std::vector<int> stage(n);
  for (int k = S, e = n; k >= 1; --k) {
    int b = from[k][e];
    for (int p = b; p < e; ++p) stage[order[p]] = k - 1;
    e = b;
  }
  return stage;
}

}  // namespace

std::int64_t cut_bytes(const PartitionDag& dag, const std::vector<int>& st) {
  WEFT_CHECK(static_cast<int>(st.size()) == dag.num_nodes(), "cut_bytes: {} stages for {} nodes", st.size(),
             dag.num_nodes());
  std::int64_t total = 0;
  for (const auto& val : dag.values) {
    std::set<int> dest;
    for (int c : val.consumers)
      if (st[c] != st[val.producer]) dest.insert(st[c]);
    total += val.bytes * static_cast<std::int64_t>(dest.size());
  }
  return total;
}

std::vector<double> stage_compute(const PartitionDag& dag, const std::vector<int>& st, int S) {
  WEFT_CHECK(static_cast<int>(st.size()) == dag.num_nodes(), "stage_compute: {} stages for {} nodes",
             st.size(), dag.num_nodes());
  std::vector<double> c(S, 0);
  for (int v = 0; v < dag.num_nodes(); ++v) {
    WEFT_CHECK(st[v] >= 0 && st[v] < S, "stage_compute: node {} has stage {} (0..{})", v, st[v], S - 1);
    c[st[v]] += dag.compute[v];
  }
  return c;
}

bool feasible_partition(const PartitionDag& dag, const std::vector<int>& st, int S, double eps) {
  if (static_cast<int>(st.size()) != dag.num_nodes()) return false;
  for (int s : st)
    if (s < 0 || s >= S) return false;
  for (const auto& val : dag.values)
    for (int c : val.consumers)
      if (st[c] < st[val.producer]) return false;
  const double tau = total_compute(dag) / S;
  for (double c : stage_compute(dag, st, S))
    if (c > (1 + eps) * tau * (1 + 1e-9) + 1e-12 || c < (1 - eps) * tau * (1 - 1e-9) - 1e-12) return false;
  return true;
}

int StageBounds::num_fixed() const {
  int k = 0;
  for (std::size_t v = 0; v < lower.size(); ++v) k += lower[v] == upper[v];
  return k;
}

StageBounds stage_bounds(const PartitionDag& dag, int S, double eps, bool paper_upper) {
  dag.validate();
  check_options(dag, S, eps);
  const int n = dag.num_nodes();
  std::vector<std::vector<int>> succ, pred;
  auto order = topo(dag, &succ, &pred);
  const int words = (n + 63) / 64;
  auto sum_bits = [&](const std::vector<std::uint64_t>& bits) {
    double s = 0;
    for (int w = 0; w < words; ++w)
      for (std::uint64_t b = bits[w]; b; b &= b - 1) s += dag.compute[w * 64 + std::countr_zero(b)];
    return s;
  };
  auto closure = [&](const std::vector<int>& ord, const std::vector<std::vector<int>>& into) {
    std::vector<std::vector<std::uint64_t>> set(n, std::vector<std::uint64_t>(words, 0));
    std::vector<double> sum(n, 0);
    for (int v : ord) {
      for (int p : into[v]) {
        for (int w = 0; w < words; ++w) set[v][w] |= set[p][w];
        set[v][p / 64] |= std::uint64_t{1} << (p % 64);
      }
      sum[v] = sum_bits(set[v]);
    }
    return sum;
  };
  std::vector<double> anc = closure(order, pred);
  std::vector<int> rev(order.rbegin(), order.rend());
  std::vector<double> desc = closure(rev, succ);
  const double tau = total_compute(dag) / S;
  const double cap = (1 + eps) * tau;
  StageBounds b;
  b.lower.assign(n, 0);
  b.upper.assign(n, S - 1);
  if (tau <= 0) return b;
  // A relative slack so that rounding in the sums never cuts off an exactly balanced partition.
  constexpr double kSlack = 1e-9;
  for (int v = 0; v < n; ++v) {
    const double c = dag.compute[v];
    int lo = static_cast<int>(std::ceil((anc[v] + c) / cap - kSlack)) - 1;
    int hi = paper_upper ? static_cast<int>(std::ceil((c + desc[v]) / tau + eps))
                         : S - static_cast<int>(std::ceil((desc[v] + c) / cap - kSlack));
    b.lower[v] = std::clamp(lo, 0, S - 1);
    b.upper[v] = std::clamp(hi, 0, S - 1);
  }
  return b;
}

std::string IlpPartition::to_string() const {
  std::string fl;
  for (std::size_t s = 0; s < stage_flops.size(); ++s)
    fl += fmt::format("{}{:.4g}", s ? "," : "", stage_flops[s]);
  return fmt::format(
      "IlpPartition({}, cut {} B, stage flops [{}], {} vars, {} rows, {} fixed, {:.3f} s, gap {:.3g})",
      solver::ilp_status_name(status), cut_bytes, fl, num_variables, num_constraints, num_fixed_nodes, wall_s,
      gap);
}

IlpPartition partition_dag_ilp(const PartitionDag& dag, const IlpPartitionOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  dag.validate();
  const int S = o.num_stages;
  check_options(dag, S, o.epsilon);
  WEFT_CHECK(o.time_limit_s > 0, "partition_ilp: time_limit_s must be > 0");
  const int n = dag.num_nodes();
  StageBounds bounds;
  if (o.bound_tightening) {
    bounds = stage_bounds(dag, S, o.epsilon, o.paper_upper_bound);
  } else {
    bounds.lower.assign(n, 0);
    bounds.upper.assign(n, S - 1);
  }
  for (int v = 0; v < n; ++v)
    WEFT_CHECK(
        bounds.lower[v] <= bounds.upper[v],
        "partition_ilp: node {}{} can take no stage (bounds [{}, {}]): no partition into {} stages balanced "
        "within ε = {} exists",
        v, dag.op_of_node.empty() ? std::string() : fmt::format(" (op {})", dag.op_of_node[v]),
        bounds.lower[v], bounds.upper[v], S, o.epsilon);

  const double tau = total_compute(dag) / S;
  solver::Ilp ilp;
  // x[v][s - lower[v]]
  std::vector<std::vector<int>> x(n);
  for (int v = 0; v < n; ++v) {
    std::vector<solver::Term> one;
    for (int s = bounds.lower[v]; s <= bounds.upper[v]; ++s) {
      int var = ilp.add_binary(0, fmt::format("x{}_{}", v, s));
      x[v].push_back(var);
      one.push_back({var, 1});
    }
    ilp.add_constraint(std::move(one), solver::Sense::Equal, 1, fmt::format("one{}", v));
  }
  auto xv = [&](int v, int s) {
    return s >= bounds.lower[v] && s <= bounds.upper[v] ? x[v][s - bounds.lower[v]] : -1;
  };
  // Precedence, once per (p, c) pair: prefix(c, s) <= prefix(p, s) for s in [l_c, u_p − 1].
  std::set<std::pair<int, int>> edges;
  for (const auto& val : dag.values)
    for (int c : val.consumers) edges.insert({val.producer, c});
  for (auto [p, c] : edges) {
    for (int s = bounds.lower[c]; s <= std::min(bounds.upper[p] - 1, S - 2); ++s) {
      std::vector<solver::Term> t;
      for (int q = bounds.lower[c]; q <= std::min(s, bounds.upper[c]); ++q) t.push_back({xv(c, q), 1});
      for (int q = bounds.lower[p]; q <= std::min(s, bounds.upper[p]); ++q) t.push_back({xv(p, q), -1});
      ilp.add_constraint(std::move(t), solver::Sense::LessEqual, 0, fmt::format("prec{}_{}_{}", p, c, s));
    }
    // s >= u_p: prefix(p) = 1, always satisfied. s < l_c: prefix(c) = 0.
  }
  // Balance, in units of τ to keep the rows well scaled.
  bool empty_stage = false;
  if (tau > 0)
    for (int s = 0; s < S; ++s) {
      std::vector<solver::Term> t;
      for (int v = 0; v < n; ++v)
        if (int var = xv(v, s); var >= 0 && dag.compute[v] > 0) t.push_back({var, dag.compute[v] / tau});
      if (t.empty()) {
        empty_stage = empty_stage || o.epsilon < 1;
        continue;
      }
      ilp.add_constraint(t, solver::Sense::LessEqual, 1 + o.epsilon, fmt::format("cap{}", s));
      ilp.add_constraint(std::move(t), solver::Sense::GreaterEqual, 1 - o.epsilon, fmt::format("floor{}", s));
    }
  // Cut variables; objective in units of the largest value's bytes (well scaled for CBC, whose
  // absolute tolerances would swallow raw bytes / 1e6 differences).
  std::int64_t max_bytes = 1;
  for (const auto& val : dag.values) max_bytes = std::max(max_bytes, val.bytes);
  const double unit = static_cast<double>(max_bytes) / 100.0;
  struct YVar {
    int value, stage, var;
  };
  std::vector<YVar> ys;
  for (std::size_t i = 0; i < dag.values.size(); ++i) {
    const auto& val = dag.values[i];
    if (val.bytes == 0 || val.consumers.empty()) continue;
    const int p = val.producer;
    std::map<int, int> yvar;  // stage -> y
    for (int c : val.consumers)
      for (int s = std::max(bounds.lower[c], bounds.lower[p] + 1); s <= bounds.upper[c]; ++s) {
        // x_{c,s} − x_{p,s} can be 1 only where c may take s and p may sit before s.
        auto it = yvar.find(s);
        if (it == yvar.end()) {
          int var =
              ilp.add_continuous(0, 1, static_cast<double>(val.bytes) / unit, fmt::format("y{}_{}", i, s));
          it = yvar.emplace(s, var).first;
          ys.push_back({static_cast<int>(i), s, var});
        }
        std::vector<solver::Term> t{{it->second, 1}, {xv(c, s), -1}};
        if (int xp = xv(p, s); xp >= 0) t.push_back({xp, 1});
        ilp.add_constraint(std::move(t), solver::Sense::GreaterEqual, 0, fmt::format("cut{}_{}_{}", i, c, s));
      }
  }

  solver::IlpOptions so;
  so.time_limit_s = o.time_limit_s;
  so.relative_gap = o.relative_gap;
  // MIP start: the best contiguous split of the topological order, when it fits the bounds.
  if (auto lin = best_linear(dag, S, o.epsilon); !lin.empty()) {
    bool inside = true;
    for (int v = 0; v < n; ++v) inside = inside && lin[v] >= bounds.lower[v] && lin[v] <= bounds.upper[v];
    if (inside) {
      std::vector<double> start(ilp.num_variables(), 0);
      for (int v = 0; v < n; ++v) start[xv(v, lin[v])] = 1;
      for (const auto& y : ys) {
        const auto& val = dag.values[y.value];
        bool sent = false;
        for (int c : val.consumers) sent = sent || (lin[c] == y.stage && lin[val.producer] != y.stage);
        start[y.var] = sent ? 1 : 0;
      }
      so.warm_start = std::move(start);
    }
  }
  solver::IlpResult res;
  if (empty_stage)
    res.status = solver::IlpStatus::Infeasible;  // no node may take some stage: nothing to solve
  else
    res = solver::solve(ilp, so);

  IlpPartition out;
  out.status = res.status;
  out.gap = res.gap;
  out.solve_s = res.wall_s;
  out.num_variables = ilp.num_variables();
  out.num_constraints = ilp.num_constraints();
  out.num_fixed_nodes = bounds.num_fixed();
  if (res.has_solution() && res.status != solver::IlpStatus::Infeasible &&
      res.status != solver::IlpStatus::Error) {
    out.stage_of_node.assign(n, 0);
    for (int v = 0; v < n; ++v)
      for (int s = bounds.lower[v]; s <= bounds.upper[v]; ++s)
        if (res.values[xv(v, s)] > 0.5) out.stage_of_node[v] = s;
    if (!feasible_partition(dag, out.stage_of_node, S, o.epsilon * (1 + 1e-6) + 1e-9))
      throw InternalError("partition_ilp: the solver's assignment violates the partition constraints");
    out.cut_bytes = cut_bytes(dag, out.stage_of_node);
    out.stage_flops = stage_compute(dag, out.stage_of_node, S);
  }
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

PartitionDag dag_from_graph(const ir::Graph& g) {
  const auto phase = classify_ops(g);
  const auto owner = owner_forward_op(g);
  PartitionDag dag;
  std::vector<int> node_of(g.ops().size(), -1);
  for (OpId o : g.topo_order())
    if (phase[o] == OpPhase::Forward) {
      node_of[o] = dag.num_nodes();
      dag.compute.push_back(0);
      dag.op_of_node.push_back(o);
    }
  WEFT_CHECK(dag.num_nodes() > 0, "partition_ilp: graph '{}' has no forward op", g.name());
  for (OpId o = 0; o < static_cast<OpId>(g.ops().size()); ++o)
    if (owner[o] != kNoOp && phase[o] != OpPhase::Update) dag.compute[node_of[owner[o]]] += g.op(o).flops();
  std::vector<std::vector<int>> cons(g.tensors().size());
  for (OpId o = 0; o < static_cast<OpId>(g.ops().size()); ++o)
    if (node_of[o] >= 0)
      for (TensorId t : g.op(o).inputs)
        if (cons[t].empty() || cons[t].back() != node_of[o]) cons[t].push_back(node_of[o]);
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors().size()); ++t) {
    const auto& ti = g.tensor(t);
    if (ti.producer == kNoOp || node_of[ti.producer] < 0 || cons[t].empty()) continue;
    PartitionDag::Value val;
    val.producer = node_of[ti.producer];
    val.consumers = cons[t];
    val.bytes = ti.bytes();
    dag.values.push_back(std::move(val));
  }
  return dag;
}

IlpPartition partition_ilp(const ir::Graph& g, const IlpPartitionOptions& o) {
  PartitionDag dag = dag_from_graph(g);
  IlpPartition out = partition_dag_ilp(dag, o);
  if (out.has_solution()) {
    const auto owner = owner_forward_op(g);
    std::vector<int> node_of(g.ops().size(), -1);
    for (int v = 0; v < dag.num_nodes(); ++v) node_of[dag.op_of_node[v]] = v;
    out.stage_of_op.assign(g.ops().size(), -1);
    for (OpId op = 0; op < static_cast<OpId>(g.ops().size()); ++op)
      if (owner[op] != kNoOp) out.stage_of_op[op] = out.stage_of_node[node_of[owner[op]]];
  }
  return out;
}

IlpPartition partition_dag_exhaustive(const PartitionDag& dag, int S, double eps) {
  dag.validate();
  check_options(dag, S, eps);
  const int n = dag.num_nodes();
  WEFT_CHECK(n <= 14, "partition_dag_exhaustive: {} nodes is too many for enumeration (max 14)", n);
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<int>> succ, pred;
  auto order = topo(dag, &succ, &pred);
  std::vector<int> st(n, 0), best;
  std::int64_t best_cut = std::numeric_limits<std::int64_t>::max();
  // Nodes in topological order, each at a stage >= its predecessors'; balance checked at the end.
  std::function<void(int)> rec = [&](int i) {
    if (i == n) {
      if (!feasible_partition(dag, st, S, eps)) return;
      auto c = cut_bytes(dag, st);
      if (c < best_cut) {
        best_cut = c;
        best = st;
      }
      return;
    }
    const int v = order[i];
    int lo = 0;
    for (int p : pred[v]) lo = std::max(lo, st[p]);
    for (int s = lo; s < S; ++s) {
      st[v] = s;
      rec(i + 1);
    }
    st[v] = 0;
  };
  rec(0);
  IlpPartition out;
  out.status = best.empty() ? solver::IlpStatus::Infeasible : solver::IlpStatus::Optimal;
  if (!best.empty()) {
    out.stage_of_node = best;
    out.cut_bytes = best_cut;
    out.stage_flops = stage_compute(dag, best, S);
  }
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace weft::pipeline
