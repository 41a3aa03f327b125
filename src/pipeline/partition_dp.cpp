// Alpa's stage construction DP (Alpa §5.2) over a chain of L blocks.
//
// Given t(i, j, m) = time of one micro-batch (forward + backward) of blocks i..j on submesh m
// (+∞ when infeasible), B micro-batches and D devices, find stages (i_1..j_1, m_1), ...,
// (i_S..j_S, m_S) covering 0..L−1 in order with Σ_s size(m_s) = D exactly, minimising
//     T = Σ_s t_s + (B − 1) · max_s t_s.
// For a fixed bound t_max on every stage time, the least Σ t_s is the DP
//     G(k, d) = min_{m, j >= k: size(m) <= d, t(k, j, m) <= t_max} t(k, j, m) + G(j + 1, d − size(m)),
//     G(L, 0) = 0, G(L, d > 0) = +∞,
// and T* = min over t_max of G(0, D) + (B − 1)·t_max, t_max ranging over the distinct costs.
// G_t is finite from the first feasible t on (found by bisection, feasibility being monotone in
// t); candidates with B·t_max >= best are dropped, since a solution whose max is t_max or more
// costs at least t_max + (B − 1)·t_max. A solution whose max is below t_max is over-charged at
// t_max but charged exactly at its own max, so the minimum over candidates is exact. Instead of
// Alpa's scan of every candidate, the candidates are searched by branch and bound on intervals
// (G_t non-increasing gives a lower bound per interval; see below): same answer, far fewer DPs.
// The hot loop runs over d as a contiguous vector (only the finite range of the row G(j+1, ·)),
// and skips j once every remaining t(k, j', m), j' >= j, exceeds t_max (suffix minima).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>

#include "weft/core/error.hpp"
#include "weft/pipeline/partition.hpp"

namespace weft::pipeline {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct CostTable {
  int L = 0, M = 0;
  std::vector<double> t;           // [(i * L + j) * M + m]
  std::vector<double> suffix_min;  // min over j' >= j of t(i, j', m)
  std::vector<std::optional<StageCost>> full;
  int calls = 0;
  double at(int i, int j, int m) const { return t[(static_cast<std::size_t>(i) * L + j) * M + m]; }
  double smin(int i, int j, int m) const { return suffix_min[(static_cast<std::size_t>(i) * L + j) * M + m]; }
};

void check_inputs(int L, const std::vector<SubmeshShape>& sub, int D, const DpOptions& o) {
  WEFT_CHECK(L >= 1, "partition_dp: num_blocks = {} must be >= 1", L);
  WEFT_CHECK(!sub.empty(), "partition_dp: no submesh shape");
  WEFT_CHECK(D >= 1, "partition_dp: total_devices = {} must be >= 1", D);
  WEFT_CHECK(o.num_microbatches >= 1, "partition_dp: num_microbatches = {} must be >= 1", o.num_microbatches);
  WEFT_CHECK(std::isfinite(o.t_max_relative_step) && o.t_max_relative_step >= 0,
             "partition_dp: t_max_relative_step must be >= 0");
  WEFT_CHECK(o.time_limit_s > 0, "partition_dp: time_limit_s must be > 0");
}

CostTable build_table(int L, const std::vector<SubmeshShape>& sub, int D, const StageCostFn& cost) {
  WEFT_CHECK(static_cast<bool>(cost), "partition_dp: no cost callback");
  CostTable tb;
  tb.L = L;
  tb.M = static_cast<int>(sub.size());
  const std::size_t n = static_cast<std::size_t>(L) * L * tb.M;
  tb.t.assign(n, kInf);
  tb.suffix_min.assign(n, kInf);
  tb.full.assign(n, std::nullopt);
  for (int i = 0; i < L; ++i)
    for (int j = i; j < L; ++j)
      for (int m = 0; m < tb.M; ++m) {
        if (sub[m].num_devices() > D) continue;  // can never be used: do not ask
        auto c = cost(i, j, m);
        ++tb.calls;
        if (!c) continue;
        WEFT_CHECK(std::isfinite(c->time_s) && c->time_s >= 0,
                   "partition_dp: cost of blocks [{}, {}] on submesh {} is {} (must be finite and >= 0)", i,
                   j, sub[m].to_string(), c->time_s);
        auto idx = (static_cast<std::size_t>(i) * L + j) * tb.M + m;
        tb.full[idx] = c;
        if (c->fits_memory) tb.t[idx] = c->time_s;
      }
  for (int i = 0; i < L; ++i)
    for (int m = 0; m < tb.M; ++m) {
      double run = kInf;
      for (int j = L - 1; j >= i; --j) {
        auto idx = (static_cast<std::size_t>(i) * L + j) * tb.M + m;
        run = std::min(run, tb.t[idx]);
        tb.suffix_min[idx] = run;
      }
    }
  return tb;
}

struct Dp {
  const CostTable& tb;
  std::vector<int> size;  // devices per submesh
  int D;
  std::vector<double> G;    // [(k) * (D+1) + d]
  std::vector<int> lo, hi;  // finite range of row k (lo > hi: empty)
  std::vector<int> choice_j, choice_m;
  std::chrono::steady_clock::time_point deadline;

  Dp(const CostTable& t, const std::vector<SubmeshShape>& sub, int d, double limit_s)
      : tb(t),
        D(d),
        deadline(std::chrono::steady_clock::now() +
                 std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                     std::chrono::duration<double>(limit_s))) {
    for (const auto& s : sub) size.push_back(s.num_devices());
    const std::size_t n = static_cast<std::size_t>(tb.L + 1) * (D + 1);
    G.assign(n, kInf);
    lo.assign(tb.L + 1, 0);
    hi.assign(tb.L + 1, -1);
  }

  // G(0, D) under the bound t_max; with `track`, records the argmin per (k, d).
  double run(double t_max, bool track) {
    const int L = tb.L, M = tb.M, W = D + 1;
    std::fill(G.begin(), G.end(), kInf);
    if (track) {
      choice_j.assign(static_cast<std::size_t>(L + 1) * W, -1);
      choice_m.assign(static_cast<std::size_t>(L + 1) * W, -1);
    }
    G[static_cast<std::size_t>(L) * W + 0] = 0;
    lo[L] = 0;
    hi[L] = 0;
    for (int k = L - 1; k >= 0; --k) {
      if (std::chrono::steady_clock::now() > deadline)
        fail("partition_dp: time limit exceeded (L = {}, {} submeshes, D = {})", L, M, D);
      double* row = &G[static_cast<std::size_t>(k) * W];
      int rlo = W, rhi = -1;
      for (int m = 0; m < M; ++m) {
        const int s = size[m];
        if (s > D) continue;
        for (int j = k; j < L; ++j) {
          if (tb.smin(k, j, m) > t_max) break;
          const double c = tb.at(k, j, m);
          if (c > t_max) continue;
          const int nlo = lo[j + 1], nhi = std::min(hi[j + 1], D - s);
          if (nlo > nhi) continue;
          const double* next = &G[static_cast<std::size_t>(j + 1) * W];
          for (int d = nlo; d <= nhi; ++d) {
            const double v = c + next[d];
            if (v < row[d + s]) {
              row[d + s] = v;
              if (track) {
                choice_j[static_cast<std::size_t>(k) * W + d + s] = j;
                choice_m[static_cast<std::size_t>(k) * W + d + s] = m;
              }
            }
          }
          rlo = std::min(rlo, nlo + s);
          rhi = std::max(rhi, nhi + s);
        }
      }
      // Shrink to the finite range (next[d] may have been +inf inside [nlo, nhi]).
      while (rlo <= rhi && !std::isfinite(row[rlo])) ++rlo;
      while (rhi >= rlo && !std::isfinite(row[rhi])) --rhi;
      lo[k] = rlo;
      hi[k] = rhi;
    }
    return G[D];
  }
};

DpPartition finish(const CostTable& tb, const std::vector<SubmeshShape>& sub,
                   const std::vector<DpStage>& stages, int B) {
  DpPartition out;
  out.stages = stages;
  for (const auto& s : stages) {
    out.sum_stage_s += s.cost.time_s;
    out.max_stage_s = std::max(out.max_stage_s, s.cost.time_s);
  }
  out.latency_s = out.sum_stage_s + (B - 1) * out.max_stage_s;
  out.cost_calls = tb.calls;
  (void)sub;
  return out;
}

std::string no_partition_message(int L, const std::vector<SubmeshShape>& sub, int D) {
  std::string sizes;
  for (std::size_t i = 0; i < sub.size(); ++i) sizes += (i ? ", " : "") + sub[i].to_string();
  return fmt::format(
      "partition_dp: no partition of {} blocks into stages on submeshes {{{}}} uses exactly {} devices with "
      "feasible stage costs",
      L, sizes, D);
}

}  // namespace

std::string DpPartition::to_string() const {
  std::string s =
      fmt::format("DpPartition({} stages, latency {:.6g} s, max {:.6g} s, sum {:.6g} s:", stages.size(),
                  latency_s, max_stage_s, sum_stage_s);
  for (const auto& st : stages)
    s += fmt::format(" [{}-{}]@{}:{:.4g}", st.first_block, st.last_block, st.submesh_index, st.cost.time_s);
  return s + ")";
}

DpPartition partition_dp(int L, const std::vector<SubmeshShape>& sub, int D, const StageCostFn& cost,
                         const DpOptions& options) {
  check_inputs(L, sub, D, options);
  const auto t0 = std::chrono::steady_clock::now();
  CostTable tb = build_table(L, sub, D, cost);
  std::vector<double> vals;
  for (double v : tb.t)
    if (std::isfinite(v)) vals.push_back(v);
  std::sort(vals.begin(), vals.end());
  vals.erase(std::unique(vals.begin(), vals.end()), vals.end());
  WEFT_CHECK(!vals.empty(), "{}", no_partition_message(L, sub, D));
  Dp dp(tb, sub, D, options.time_limit_s);
  int runs = 0;
  // First feasible bound (feasibility is monotone in t_max).
  std::size_t lo = 0, hi = vals.size() - 1;
  ++runs;
  WEFT_CHECK(std::isfinite(dp.run(vals[hi], false)), "{}", no_partition_message(L, sub, D));
  while (lo < hi) {
    std::size_t mid = lo + (hi - lo) / 2;
    ++runs;
    if (std::isfinite(dp.run(vals[mid], false)))
      hi = mid;
    else
      lo = mid + 1;
  }
  const int B = options.num_microbatches;
  // Candidate bounds from the first feasible one on: every distinct cost, or with r > 0 a
  // geometric thinning (next = the largest value <= t·(1 + r), so every skipped value v has a
  // candidate in [v, v·(1 + r)]).
  std::vector<double> cand;
  for (std::size_t idx = lo; idx < vals.size();) {
    cand.push_back(vals[idx]);
    if (options.t_max_relative_step > 0) {
      const double next = vals[idx] * (1 + options.t_max_relative_step);
      auto nxt =
          static_cast<std::size_t>(std::upper_bound(vals.begin(), vals.end(), next) - vals.begin()) - 1;
      idx = std::max(nxt, idx + 1);
    } else {
      ++idx;
    }
  }
  // Branch and bound over candidate intervals instead of a scan of every candidate: G_t is
  // non-increasing in t, so on an interval (a, b) of candidates every interior f(t) = G_t + (B−1)·t
  // is >= G_b + (B−1)·t_{a+1}; an interval whose bound is >= the best is dropped, and one with
  // G_a == G_b holds nothing better than f(a). Exact: the same minimum as the full scan.
  double best = kInf, best_t = kInf;
  std::vector<double> G(cand.size(), std::numeric_limits<double>::quiet_NaN());
  auto eval = [&](std::size_t i) {
    if (std::isnan(G[i])) {
      ++runs;
      G[i] = dp.run(cand[i], false);
      if (std::isfinite(G[i]) && G[i] + (B - 1) * cand[i] < best) {
        best = G[i] + (B - 1) * cand[i];
        best_t = cand[i];
      }
    }
    return G[i];
  };
  eval(0);
  if (!options.branch_and_bound) {  // Alpa's scan: every candidate in ascending order
    for (std::size_t i = 1; i < cand.size() && B * cand[i] < best; ++i) eval(i);
  }
  // Candidates with B·t >= best cannot win (a solution with max t costs >= B·t).
  auto last = static_cast<std::size_t>(std::lower_bound(cand.begin(), cand.end(), best / B) - cand.begin());
  if (last > 0) --last;
  if (options.branch_and_bound && last > 0) {
    eval(last);
    std::vector<std::pair<std::size_t, std::size_t>> stack{{0, last}};
    while (!stack.empty()) {
      auto [a, b] = stack.back();
      stack.pop_back();
      if (b - a <= 1 || G[a] == G[b]) continue;
      if (G[b] + (B - 1) * cand[a + 1] >= best) continue;
      const std::size_t mid = a + (b - a) / 2;
      eval(mid);
      stack.push_back({mid, b});
      stack.push_back({a, mid});
    }
  }
  if (!std::isfinite(best)) throw InternalError("partition_dp: feasible bound found but no solution");
  ++runs;
  dp.run(best_t, true);
  std::vector<DpStage> stages;
  const int W = D + 1;
  for (int k = 0, d = D; k < L;) {
    const int j = dp.choice_j[static_cast<std::size_t>(k) * W + d];
    const int m = dp.choice_m[static_cast<std::size_t>(k) * W + d];
    if (j < 0) throw InternalError("partition_dp: broken choice table");
    DpStage st;
    st.first_block = k;
    st.last_block = j;
    st.submesh_index = m;
    st.cost = *tb.full[(static_cast<std::size_t>(k) * L + j) * tb.M + m];
    stages.push_back(st);
    d -= dp.size[m];
    k = j + 1;
  }
  DpPartition out = finish(tb, sub, stages, B);
  out.t_max_evaluated = runs;
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

DpPartition partition_dp_exhaustive(int L, const std::vector<SubmeshShape>& sub, int D,
                                    const StageCostFn& cost, const DpOptions& options) {
  check_inputs(L, sub, D, options);
  WEFT_CHECK(L <= 12, "partition_dp_exhaustive: {} blocks is too many for enumeration (max 12)", L);
  const auto t0 = std::chrono::steady_clock::now();
  CostTable tb = build_table(L, sub, D, cost);
  const int B = options.num_microbatches;
  double best = kInf;
  std::vector<DpStage> best_stages, cur;
  // Every composition of 0..L-1 into runs, every submesh per run.
  std::function<void(int, int, double, double)> rec = [&](int k, int used, double sum, double mx) {
    if (k == L) {
      if (used != D) return;
      double lat = sum + (B - 1) * mx;
      if (lat < best) {
        best = lat;
        best_stages = cur;
      }
      return;
    }
    for (int j = k; j < L; ++j)
      for (int m = 0; m < tb.M; ++m) {
        const double c = tb.at(k, j, m);
        const int s = sub[m].num_devices();
        if (!std::isfinite(c) || used + s > D) continue;
        cur.push_back({k, j, m, *tb.full[(static_cast<std::size_t>(k) * L + j) * tb.M + m]});
        rec(j + 1, used + s, sum + c, std::max(mx, c));
        cur.pop_back();
      }
  };
  rec(0, 0, 0, 0);
  WEFT_CHECK(std::isfinite(best), "{}", no_partition_message(L, sub, D));
  DpPartition out = finish(tb, sub, best_stages, B);
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

}  // namespace weft::pipeline
