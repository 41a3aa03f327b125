// The fused attention ops: Attention and AttentionGrad (see attention.hpp for the index map and the
// FLOPs, op.hpp / interpreter.hpp for the semantics).
#include "attention.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "weft/core/error.hpp"

namespace weft::ir::attention {
namespace {

bool is_float(DType t) { return is_floating(t); }

bool causal_of(const OpAttrs& a) { return a.ints.at(0) != 0; }

Shape lead_of(const Shape& s) { return Shape(s.begin(), s.end() - 2); }

std::int64_t product(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// The sizes every kernel loops over: n = Π leading dims, s queries, t keys, d = q/k head dim,
// e = v's head dim; and the global position of each local query row (causal masks).
struct Dims {
  std::int64_t n, s, t, d, e;
  std::vector<std::int64_t> qpos;
};

Dims dims_of(const HostTensor& q, const HostTensor& k, const HostTensor& v, const KernelContext& ctx) {
  const std::size_t r = q.shape.size();
  Dims m{product(lead_of(q.shape)), q.shape[r - 2], k.shape[r - 2], q.shape[r - 1], v.shape[r - 1], {}};
  if (!ctx.element_index.empty()) {
    WEFT_CHECK(ctx.element_index.size() >= 2 &&
                   ctx.element_index[ctx.element_index.size() - 2].size() == static_cast<std::size_t>(m.s),
               "attention: element index of {} dims does not give the {} local query rows",
               ctx.element_index.size(), m.s);
    m.qpos = ctx.element_index[ctx.element_index.size() - 2];
  } else {
    m.qpos.resize(static_cast<std::size_t>(m.s));
    for (std::int64_t i = 0; i < m.s; ++i) m.qpos[static_cast<std::size_t>(i)] = i;
  }
  return m;
}

// Keys a query at global position p may read: [0, t) or, causal, [0, min(p + 1, t)).
std::int64_t keys_of(const Dims& m, std::int64_t i, bool causal) {
  return causal ? std::min(m.qpos[static_cast<std::size_t>(i)] + 1, m.t) : m.t;
}

HostTensor zeros(Shape s) {
  const auto n = product(s);
  return HostTensor{std::move(s), std::vector<double>(static_cast<std::size_t>(n), 0.0)};
}

double dot(const double* a, const double* b, std::int64_t n) {
  double acc = 0;
  for (std::int64_t x = 0; x < n; ++x) acc += a[x] * b[x];
  return acc;
}

}  // namespace

double unmasked_pairs(std::int64_t s, std::int64_t t, bool causal) {
  if (!causal) return static_cast<double>(s) * static_cast<double>(t);
  // Σ_{i<s} min(i + 1, t): the triangle up to t queries, then t keys for each later query.
  const std::int64_t tri = std::min(s, t);
  return static_cast<double>(tri) * static_cast<double>(tri + 1) / 2.0 +
         static_cast<double>(s - tri) * static_cast<double>(t);
}

double tile_imbalance(const Op& op, std::int64_t shards, std::int64_t stride) {
  if (shards <= 1 || !causal_of(op.attrs)) return 1.0;
  std::int64_t s = 0, t = 0;
  for (const auto& f : op.index_map.factors) {
    if (f.name == "s") s = f.size;
    if (f.name == "t") t = f.size;
  }
  const double all = unmasked_pairs(s, t, true);
  if (stride <= 0) stride = s / shards;
  if (stride <= 0 || s % (stride * shards) != 0 || all <= 0) return 1.0;
  // Runs of `stride` queries dealt to the tiles in turn: tile c holds runs c, c + n, c + 2n, ...
  // A later query keeps at least as many keys, so the last tile is the busiest.
  const std::int64_t runs = s / (stride * shards);
  double busiest = 0;
  if (t >= s) {  // no query reaches past the keys: run [a, a + w) keeps w·a + w(w + 1)/2 pairs
    const double w = static_cast<double>(stride), n = static_cast<double>(shards),
                 k = static_cast<double>(runs);
    const double c = n - 1;  // Σ_j a_j with a_j = (c + j·n)·w over the tile's k runs
    busiest = w * w * (k * c + n * k * (k - 1) / 2) + k * w * (w + 1) / 2;
  } else {
    for (std::int64_t j = 0; j < runs; ++j) {
      const std::int64_t a = ((shards - 1) + j * shards) * stride;
      busiest += unmasked_pairs(a + stride, t, true) - unmasked_pairs(a, t, true);
    }
  }
  return busiest * static_cast<double>(shards) / all;
}

OpSignature rule(OpKind kind, const OpAttrs& a, const std::vector<Shape>& in, const std::vector<DType>& dt,
                 std::string_view op) {
  const bool grad = kind == OpKind::AttentionGrad;
  const std::string_view kname = grad ? "attention_grad" : "attention";
  WEFT_CHECK(in.size() == (grad ? 6u : 3u), "op '{}' ({}): expected {} operands ({}), got {}", op, kname,
             grad ? 6 : 3, grad ? "q, k, v, out, lse, dout" : "q, k, v", in.size());
  WEFT_CHECK(a.ints.size() == 1 && (a.ints[0] == 0 || a.ints[0] == 1),
             "op '{}': {} needs attrs.ints = {{causal (0 or 1)}}, got {}", op, kname, a.ints);
  const Shape &q = in[0], &k = in[1], &v = in[2];
  WEFT_CHECK(q.size() >= 2, "op '{}': q must be [..., seq, head_dim] (rank >= 2), got {}", op, q);
  WEFT_CHECK(k.size() == q.size() && v.size() == q.size(), "op '{}': q {}, k {} and v {} must have one rank",
             op, q, k, v);
  const std::size_t r = q.size();
  const Shape lead = lead_of(q);
  WEFT_CHECK(lead_of(k) == lead && lead_of(v) == lead,
             "op '{}': q {}, k {} and v {} must share their leading (batch, head) dims; grouped-query "
             "attention repeats k and v first",
             op, q, k, v);
  WEFT_CHECK(k[r - 1] == q[r - 1], "op '{}': q's head dim {} != k's {} ({} vs {})", op, q[r - 1], k[r - 1], q,
             k);
  WEFT_CHECK(v[r - 2] == k[r - 2], "op '{}': k and v have {} and {} keys ({} vs {})", op, k[r - 2], v[r - 2],
             k, v);
  for (std::size_t i = 0; i < 3; ++i)
    WEFT_CHECK(is_float(dt[i]), "op '{}': {} operand {} must be floating point, got {}", op, kname, i,
               dtype_name(dt[i]));
  WEFT_CHECK(dt[1] == dt[0] && dt[2] == dt[0], "op '{}': q, k, v dtypes differ ({}, {}, {})", op,
             dtype_name(dt[0]), dtype_name(dt[1]), dtype_name(dt[2]));
  const std::int64_t s = q[r - 2], t = k[r - 2], d = q[r - 1], e = v[r - 1];
  Shape out = lead, lse = lead;
  out.push_back(s);
  out.push_back(e);
  lse.push_back(s);
  if (grad) {
    WEFT_CHECK(in[3] == out, "op '{}': out shape {} must be {}", op, in[3], out);
    WEFT_CHECK(in[4] == lse, "op '{}': lse shape {} must be {}", op, in[4], lse);
    WEFT_CHECK(in[5] == out, "op '{}': dout shape {} must be {}", op, in[5], out);
    for (std::size_t i = 3; i < 6; ++i)
      WEFT_CHECK(is_float(dt[i]), "op '{}': attention_grad operand {} must be floating point, got {}", op, i,
                 dtype_name(dt[i]));
  }

  IndexMap m;
  auto factor = [&](std::string name, std::int64_t size, FactorKind fk) {
    m.factors.push_back(Factor{std::move(name), size, fk, ReduceKind::None});
    return static_cast<int>(m.factors.size()) - 1;
  };
  std::vector<DimFactors> bd;
  std::vector<int> work;
  for (std::size_t i = 0; i < lead.size(); ++i) {
    bd.push_back({factor("b" + std::to_string(i), lead[i], FactorKind::Parallel)});
    work.push_back(bd.back()[0]);
  }
  // The backward's query sequence is a sum reduction that dq also carries: split, it leaves dq
  // split and dk, dv partial sums over the local queries (context parallelism's reduce-scatter).
  const int fs = factor("s", s, grad ? FactorKind::Reduction : FactorKind::Parallel);
  if (grad) m.factors[static_cast<std::size_t>(fs)].reduce = ReduceKind::Sum;
  const int ft = factor("t", t, FactorKind::NeedReplication);
  const int fd = factor("d", d, FactorKind::NeedReplication);
  const int fe = factor("e", e, FactorKind::NeedReplication);
  work.push_back(fs);
  work.push_back(ft);
  auto with = [&](std::initializer_list<int> tail) {
    std::vector<DimFactors> x = bd;
    for (int f : tail) x.push_back({f});
    return x;
  };
  const auto Q = with({fs, fd}), K = with({ft, fd}), V = with({ft, fe}), O = with({fs, fe}), L = with({fs});
  m.inputs = {Q, K, V};
  if (grad) {
    m.inputs.push_back(O);
    m.inputs.push_back(L);
    m.inputs.push_back(O);
    m.outputs = {Q, K, V};
  } else {
    m.outputs = {O, L};
  }
  // FLOPs per (query, key) point of the loop nest, scaled by the share of pairs a causal mask keeps.
  const double dd = static_cast<double>(d), de = static_cast<double>(e);
  const double keep = unmasked_pairs(s, t, causal_of(a)) / (static_cast<double>(s) * static_cast<double>(t));
  m.flops_per_point = (grad ? 2.0 * (3.0 * dd + 2.0 * de) : 2.0 * (dd + de)) * keep;
  m.work_factors = std::move(work);
  if (grad) return {{q, k, v}, {dt[0], dt[1], dt[2]}, std::move(m)};
  // The log-sum-exp is f32 whatever q's dtype (as torch's flash kernels keep it).
  // lse in f32 for half precision (torch's flash kernels), in q's dtype for f32 / f64
  return {{out, lse}, {dt[0], dt[0] == DType::F64 ? DType::F64 : DType::F32}, std::move(m)};
}

std::vector<HostTensor> forward(const Op& op, const HostTensor& q, const HostTensor& k, const HostTensor& v,
                                const KernelContext& ctx) {
  const Dims m = dims_of(q, k, v, ctx);
  const bool causal = causal_of(op.attrs);
  const double scale = op.attrs.scalar;
  Shape os = lead_of(q.shape), ls = lead_of(q.shape);
  os.push_back(m.s);
  os.push_back(m.e);
  ls.push_back(m.s);
  HostTensor out = zeros(os), lse = zeros(ls);
  std::vector<double> p(static_cast<std::size_t>(m.t));
  for (std::int64_t b = 0; b < m.n; ++b) {
    const double* K = k.data.data() + b * m.t * m.d;
    const double* V = v.data.data() + b * m.t * m.e;
    for (std::int64_t i = 0; i < m.s; ++i) {
      const double* Q = q.data.data() + (b * m.s + i) * m.d;
      const std::int64_t nk = keys_of(m, i, causal);
      double mx = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = 0; j < nk; ++j) {
        p[static_cast<std::size_t>(j)] = scale * dot(Q, K + j * m.d, m.d);
        mx = std::max(mx, p[static_cast<std::size_t>(j)]);
      }
      double sum = 0;
      for (std::int64_t j = 0; j < nk; ++j) sum += std::exp(p[static_cast<std::size_t>(j)] - mx);
      const double l = mx + std::log(sum);
      lse.data[static_cast<std::size_t>(b * m.s + i)] = l;
      double* O = out.data.data() + (b * m.s + i) * m.e;
      for (std::int64_t j = 0; j < nk; ++j) {
        const double w = std::exp(p[static_cast<std::size_t>(j)] - l);
        for (std::int64_t c = 0; c < m.e; ++c) O[c] += w * V[j * m.e + c];
      }
    }
  }
  return {std::move(out), std::move(lse)};
}

std::vector<HostTensor> backward(const Op& op, const std::vector<const HostTensor*>& in,
                                 const KernelContext& ctx) {
  const HostTensor &q = *in[0], &k = *in[1], &v = *in[2], &out = *in[3], &lse = *in[4], &dout = *in[5];
  const Dims m = dims_of(q, k, v, ctx);
  const bool causal = causal_of(op.attrs);
  const double scale = op.attrs.scalar;
  HostTensor dq = zeros(q.shape), dk = zeros(k.shape), dv = zeros(v.shape);
  for (std::int64_t b = 0; b < m.n; ++b) {
    const double* K = k.data.data() + b * m.t * m.d;
    const double* V = v.data.data() + b * m.t * m.e;
    double* dK = dk.data.data() + b * m.t * m.d;
    double* dV = dv.data.data() + b * m.t * m.e;
    for (std::int64_t i = 0; i < m.s; ++i) {
      const std::int64_t row = b * m.s + i;
      const double* Q = q.data.data() + row * m.d;
      const double* dO = dout.data.data() + row * m.e;
      double* dQ = dq.data.data() + row * m.d;
      const double l = lse.data[static_cast<std::size_t>(row)];
      const double D = dot(dO, out.data.data() + row * m.e, m.e);  // rowsum(dout ∘ out) = Σ_j P·dP
      const std::int64_t nk = keys_of(m, i, causal);
      for (std::int64_t j = 0; j < nk; ++j) {
        const double P = std::exp(scale * dot(Q, K + j * m.d, m.d) - l);
        const double dS = P * (dot(dO, V + j * m.e, m.e) - D);
        for (std::int64_t c = 0; c < m.e; ++c) dV[j * m.e + c] += P * dO[c];
        for (std::int64_t c = 0; c < m.d; ++c) {
          dQ[c] += scale * dS * K[j * m.d + c];
          dK[j * m.d + c] += scale * dS * Q[c];
        }
      }
    }
  }
  return {std::move(dq), std::move(dk), std::move(dv)};
}

}  // namespace weft::ir::attention
