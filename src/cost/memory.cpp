// Liveness over a topological order (rules in memory.hpp): one pass to find each tensor's last
// reader, then interval → sets.
#include "weft/cost/memory.hpp"

#include <algorithm>
#include <cmath>

#include "weft/core/error.hpp"

namespace weft::cost {

Liveness liveness(const ir::Graph& g, bool with_sets) {
  Liveness l;
  l.order = g.topo_order();
  const int n = static_cast<int>(l.order.size());
  const int nt = static_cast<int>(g.tensors().size());
  std::vector<int> pos(g.ops().size(), 0);
  for (int p = 0; p < n; ++p) pos[l.order[p]] = p;
  l.begin.assign(nt, -1);
  l.end.assign(nt, -1);
  std::vector<char> keep(nt, 0);
  for (ir::TensorId t : g.outputs()) keep[t] = 1;
  if (g.loss()) keep[*g.loss()] = 1;
  for (int t = 0; t < nt; ++t) {
    const auto& info = g.tensors()[t];
    if (info.producer != ir::kNoOp) l.begin[t] = l.end[t] = pos[info.producer];
  }
  for (int p = 0; p < n; ++p)
    for (ir::TensorId t : g.op(l.order[p]).inputs) {
      if (l.begin[t] < 0) l.begin[t] = 0;  // a leaf: live from the start
      l.end[t] = std::max(l.end[t], p);
    }
  for (int t = 0; t < nt; ++t)
    if (keep[t]) {
      if (l.begin[t] < 0) l.begin[t] = 0;
      l.end[t] = std::max(n - 1, 0);
    }
  if (with_sets) build_live_sets(l);
  return l;
}

void build_live_sets(Liveness& l) {
  const int n = static_cast<int>(l.order.size());
  if (static_cast<int>(l.sets.size()) == n) return;
  l.sets.assign(n, {});
  for (int t = 0; t < static_cast<int>(l.begin.size()); ++t)
    if (l.begin[t] >= 0)
      for (int p = l.begin[t]; p <= l.end[t] && p < n; ++p) l.sets[p].push_back(t);
}

std::vector<int> maximal_positions(const Liveness& l) {
  // Live sets are unions of intervals, so if S_p ⊆ S_q for some q > p then every tensor of S_p
  // is live on [p, q] and S_p ⊆ S_{p+1} (same for q < p): comparing neighbours is exact. Of a
  // run of equal sets the first is kept.
  WEFT_ASSERT(l.sets.size() == l.order.size(), "maximal_positions needs the live sets (build_live_sets)");
  const int n = static_cast<int>(l.sets.size());
  auto subset = [&](int a, int b) {
    return std::includes(l.sets[b].begin(), l.sets[b].end(), l.sets[a].begin(), l.sets[a].end());
  };
  std::vector<int> out;
  for (int p = 0; p < n; ++p) {
    const bool left = p > 0 && subset(p, p - 1);
    const bool right = p + 1 < n && subset(p, p + 1) && l.sets[p] != l.sets[p + 1];
    if (!left && !right) out.push_back(p);
  }
  return out;
}

std::vector<double> live_bytes(const Liveness& l, const std::vector<double>& bytes) {
  const int n = static_cast<int>(l.order.size());
  // Whole bytes (every per-device size is a whole number) sum exactly in a double below 2^53, in
  // any order: then a sweep over the intervals (linear) gives the same sums as adding up each
  // live set (quadratic in depth for a training graph, whose parameters live all step long).
  bool whole = true;
  for (int t = 0; t < static_cast<int>(l.begin.size()) && whole; ++t)
    whole = l.begin[t] < 0 || (bytes[t] == std::floor(bytes[t]) && std::abs(bytes[t]) < 0x1p50);
  std::vector<double> at_pos(n, 0.0);
  if (whole) {
    std::vector<double> delta(n + 1, 0.0);
    for (int t = 0; t < static_cast<int>(l.begin.size()); ++t)
      if (l.begin[t] >= 0 && l.begin[t] < n) {
        delta[l.begin[t]] += bytes[t];
        delta[std::min(l.end[t], n - 1) + 1] -= bytes[t];
      }
    double run = 0;
    for (int p = 0; p < n; ++p) at_pos[p] = run += delta[p];
  } else {
    Liveness with_sets;
    const Liveness* lv = &l;
    if (static_cast<int>(l.sets.size()) != n) {
      with_sets = l;
      build_live_sets(with_sets);
      lv = &with_sets;
    }
    for (int p = 0; p < n; ++p)
      for (ir::TensorId t : lv->sets[p]) at_pos[p] += bytes[t];
  }
  return at_pos;
}

std::pair<double, int> peak_memory(const Liveness& l, const std::vector<double>& bytes) {
  const std::vector<double> at_pos = live_bytes(l, bytes);
  const int n = static_cast<int>(at_pos.size());
  double best = 0;
  int at = -1;
  for (int p = 0; p < n; ++p)
    if (at < 0 || at_pos[p] > best) {
      best = at_pos[p];
      at = p;
    }
  return {best, at};
}

}  // namespace weft::cost
