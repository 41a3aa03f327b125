// The op kernels: every op kind on f64 with plain loops. The semantics of each kind are in
// include/weft/ir/interpreter.hpp; they are the ones autodiff's rules differentiate, so the two
// files must change together. One implementation serves the reference interpreter (whole
// tensors) and the program executor (local shards, with the global normalisers in the context).
#include "weft/ir/kernels.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numbers>

#include "attention.hpp"
#include "routing.hpp"
#include "weft/core/error.hpp"
#include "weft/ir/op_rules.hpp"

namespace weft::ir {

namespace {

using Index = std::vector<std::int64_t>;

std::int64_t numel_of(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

std::vector<std::int64_t> strides_of(const Shape& s) {
  std::vector<std::int64_t> st(s.size(), 1);
  for (std::size_t i = s.size(); i-- > 1;) st[i - 1] = st[i] * s[i];
  return st;
}

// Advances a row-major multi-index; false after the last one.
bool next_index(Index& idx, const Shape& s) {
  for (std::size_t i = s.size(); i-- > 0;) {
    if (++idx[i] < s[i]) return true;
    idx[i] = 0;
  }
  return false;
}

template <typename F>
void for_each_index(const Shape& s, F&& f) {
  if (numel_of(s) == 0) return;
  Index idx(s.size(), 0);
  do f(idx);
  while (next_index(idx, s));
}

HostTensor zeros(const Shape& s) { return HostTensor{s, std::vector<double>(numel_of(s), 0.0)}; }

constexpr double kGeluC = 0.7978845608028654;  // √(2/π)
constexpr double kGeluA = 0.044715;
constexpr double kSqrtHalf = 0.7071067811865476;    // 1/√2
constexpr double kInvSqrt2Pi = 0.3989422804014327;  // 1/√(2π)

double unary_value(UnaryFn f, double x, double scalar) {
  switch (f) {
    case UnaryFn::Identity: return x;
    case UnaryFn::Neg: return -x;
    case UnaryFn::Relu: return x > 0 ? x : 0.0;
    case UnaryFn::Gelu: return 0.5 * x * (1 + std::tanh(kGeluC * (x + kGeluA * x * x * x)));
    case UnaryFn::Tanh: return std::tanh(x);
    case UnaryFn::Exp: return std::exp(x);
    case UnaryFn::Log: return std::log(x);
    case UnaryFn::Sigmoid: return 1 / (1 + std::exp(-x));
    case UnaryFn::Sqrt: return std::sqrt(x);
    case UnaryFn::Rsqrt: return 1 / std::sqrt(x);
    case UnaryFn::Square: return x * x;
    case UnaryFn::Scale: return scalar * x;
    case UnaryFn::GeluErf: return 0.5 * x * (1 + std::erf(x * kSqrtHalf));
  }
  return x;
}

double unary_derivative(UnaryFn f, double x, double scalar) {
  switch (f) {
    case UnaryFn::Identity: return 1;
    case UnaryFn::Neg: return -1;
    case UnaryFn::Relu: return x > 0 ? 1.0 : 0.0;
    case UnaryFn::Gelu: {
      double u = kGeluC * (x + kGeluA * x * x * x);
      double th = std::tanh(u);
      double du = kGeluC * (1 + 3 * kGeluA * x * x);
      return 0.5 * (1 + th) + 0.5 * x * (1 - th * th) * du;
    }
    case UnaryFn::Tanh: {
      double t = std::tanh(x);
      return 1 - t * t;
    }
    case UnaryFn::Exp: return std::exp(x);
    case UnaryFn::Log: return 1 / x;
    case UnaryFn::Sigmoid: {
      double s = 1 / (1 + std::exp(-x));
      return s * (1 - s);
    }
    case UnaryFn::Sqrt: return 0.5 / std::sqrt(x);
    case UnaryFn::Rsqrt: return -0.5 / (x * std::sqrt(x));
    case UnaryFn::Square: return 2 * x;
    case UnaryFn::Scale: return scalar;
    case UnaryFn::GeluErf:  // Φ(x) + x·φ(x)
      return 0.5 * (1 + std::erf(x * kSqrtHalf)) + x * std::exp(-0.5 * x * x) * kInvSqrt2Pi;
  }
  return 1;
}

double binary_value(BinaryFn f, double a, double b) {
  switch (f) {
    case BinaryFn::Add: return a + b;
    case BinaryFn::Sub: return a - b;
    case BinaryFn::Mul: return a * b;
    case BinaryFn::Div: return a / b;
    case BinaryFn::Max: return std::max(a, b);
  }
  return a;
}

// An integral value of an int tensor in [0, n).
std::int64_t as_index(double v, std::int64_t n, const Op& op, const char* what) {
  auto i = static_cast<std::int64_t>(v);
  WEFT_CHECK(static_cast<double>(i) == v && i >= 0 && i < n, "op '{}': {} {} is not an integer in [0, {})",
             op.name, what, v, n);
  return i;
}

int axis_of(int a, std::size_t rank) { return a < 0 ? a + static_cast<int>(rank) : a; }

// ---- kernels; each gets the op and its operand values and returns its results

HostTensor run_einsum(const Op& op, const std::vector<const HostTensor*>& in, const Shape& out_shape) {
  const auto parsed = split_einsum(op.attrs.equation, op.name);
  const auto& terms = parsed.inputs;  // not a structured binding: lambdas below capture it
  const auto& rhs = parsed.output;
  // Letters of the loop nest: the output's first (so the output offset is cheap), then the rest.
  std::string letters = rhs;
  Shape sizes(out_shape.begin(), out_shape.end());
  for (std::size_t t = 0; t < terms.size(); ++t)
    for (std::size_t d = 0; d < terms[t].size(); ++d)
      if (letters.find(terms[t][d]) == std::string::npos) {
        letters += terms[t][d];
        sizes.push_back(in[t]->shape[d]);
      }
  // Per tensor, the stride of each loop letter (0 where the tensor lacks it).
  auto strides_for = [&](const std::string& term, const Shape& shape) {
    auto st = strides_of(shape);
    std::vector<std::int64_t> per(letters.size(), 0);
    for (std::size_t d = 0; d < term.size(); ++d) per[letters.find(term[d])] = st[d];
    return per;
  };
  std::vector<std::vector<std::int64_t>> ist;
  for (std::size_t t = 0; t < terms.size(); ++t) ist.push_back(strides_for(terms[t], in[t]->shape));
  auto ost = strides_for(rhs, out_shape);
  HostTensor out = zeros(out_shape);
  // The loop nest runs as an odometer over every letter but the last, with running offsets, and a
  // tight loop over the last letter: the same row-major order (so the same sums, bit for bit) as a
  // per-element multi-index, without recomputing each offset from the whole index.
  const std::size_t nl = sizes.size(), nt = terms.size();
  for (auto s : sizes)
    if (s == 0) return out;
  std::vector<const double*> base(nt);
  for (std::size_t t = 0; t < nt; ++t) base[t] = in[t]->data.data();
  double* obase = out.data.data();
  if (nl == 0) {  // every operand a scalar
    double p = 1;
    for (std::size_t t = 0; t < nt; ++t) p *= base[t][0];
    obase[0] += p;
    return out;
  }
  const std::int64_t n_inner = sizes[nl - 1], so = ost[nl - 1];
  std::vector<std::int64_t> si(nt), offs(nt, 0), idx(nl - 1, 0);
  for (std::size_t t = 0; t < nt; ++t) si[t] = ist[t][nl - 1];
  std::int64_t o = 0;
  for (;;) {
    if (nt == 2) {
      const double *a = base[0] + offs[0], *b = base[1] + offs[1];
      const std::int64_t sa = si[0], sb = si[1];
      double* y = obase + o;
      for (std::int64_t k = 0; k < n_inner; ++k) y[k * so] += a[k * sa] * b[k * sb];
    } else {
      for (std::int64_t k = 0; k < n_inner; ++k) {
        double p = 1;
        for (std::size_t t = 0; t < nt; ++t) p *= base[t][offs[t] + k * si[t]];
        obase[o + k * so] += p;
      }
    }
    std::size_t l = nl - 1;  // advance the odometer over letters [0, nl - 1)
    for (; l-- > 0;) {
      ++idx[l];
      o += ost[l];
      for (std::size_t t = 0; t < nt; ++t) offs[t] += ist[t][l];
      if (idx[l] < sizes[l]) break;
      o -= sizes[l] * ost[l];
      for (std::size_t t = 0; t < nt; ++t) offs[t] -= sizes[l] * ist[t][l];
      idx[l] = 0;
    }
    if (l == static_cast<std::size_t>(-1)) return out;
  }
}

HostTensor run_binary(BinaryFn f, const HostTensor& a, const HostTensor& b, const Shape& out_shape) {
  // Broadcast strides: trailing alignment, stride 0 on size-1 / missing dims.
  auto bstrides = [&](const HostTensor& x) {
    auto st = strides_of(x.shape);
    std::vector<std::int64_t> per(out_shape.size(), 0);
    std::size_t shift = out_shape.size() - x.shape.size();
    for (std::size_t d = 0; d < x.shape.size(); ++d) per[d + shift] = x.shape[d] == 1 ? 0 : st[d];
    return per;
  };
  auto sa = bstrides(a), sb = bstrides(b);
  HostTensor out = zeros(out_shape);
  std::int64_t k = 0;
  for_each_index(out_shape, [&](const Index& idx) {
    std::int64_t oa = 0, ob = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) oa += idx[d] * sa[d], ob += idx[d] * sb[d];
    out.data[k++] = binary_value(f, a.data[oa], b.data[ob]);
  });
  return out;
}

HostTensor run_reduce(ReduceFn f, const HostTensor& x, const std::vector<int>& axes_in,
                      const Shape& out_shape, double mean_count) {
  std::vector<bool> red(x.shape.size(), false);
  std::int64_t count = 1;
  for (int a : axes_in) {
    int ax = axis_of(a, x.shape.size());
    red[ax] = true;
    count *= x.shape[ax];
  }
  // Output offset of an input index: drop the reduced dims.
  auto ost = strides_of(out_shape);
  std::vector<std::int64_t> per(x.shape.size(), 0);
  for (std::size_t d = 0, k = 0; d < x.shape.size(); ++d)
    if (!red[d]) per[d] = ost[k++];
  HostTensor out = zeros(out_shape);
  if (f == ReduceFn::Max)
    std::fill(out.data.begin(), out.data.end(), -std::numeric_limits<double>::infinity());
  std::int64_t i = 0;
  for_each_index(x.shape, [&](const Index& idx) {
    std::int64_t o = 0;
    for (std::size_t d = 0; d < idx.size(); ++d) o += idx[d] * per[d];
    double v = x.data[i++];
    if (f == ReduceFn::Max)
      out.data[o] = std::max(out.data[o], v);
    else
      out.data[o] += v;
  });
  if (f == ReduceFn::Mean)
    for (auto& v : out.data) v /= mean_count > 0 ? mean_count : static_cast<double>(count);
  return out;
}

// Splits a shape around `axis` into (outer, axis size, inner) for row-major loops along one dim.
struct AxisSplit {
  std::int64_t outer = 1, n = 1, inner = 1;
  std::int64_t at(std::int64_t o, std::int64_t i, std::int64_t in) const { return (o * n + i) * inner + in; }
};
AxisSplit split_at(const Shape& s, int axis) {
  AxisSplit sp;
  for (int d = 0; d < static_cast<int>(s.size()); ++d) {
    if (d < axis)
      sp.outer *= s[d];
    else if (d == axis)
      sp.n = s[d];
    else
      sp.inner *= s[d];
  }
  return sp;
}

HostTensor run_softmax(const HostTensor& x, int axis) {
  auto sp = split_at(x.shape, axis);
  HostTensor y = zeros(x.shape);
  for (std::int64_t o = 0; o < sp.outer; ++o)
    for (std::int64_t in = 0; in < sp.inner; ++in) {
      double m = -std::numeric_limits<double>::infinity();
      for (std::int64_t i = 0; i < sp.n; ++i) m = std::max(m, x.data[sp.at(o, i, in)]);
      double s = 0;
      for (std::int64_t i = 0; i < sp.n; ++i)
        s += (y.data[sp.at(o, i, in)] = std::exp(x.data[sp.at(o, i, in)] - m));
      for (std::int64_t i = 0; i < sp.n; ++i) y.data[sp.at(o, i, in)] /= s;
    }
  return y;
}

HostTensor run_softmax_grad(const HostTensor& y, const HostTensor& dy, int axis) {
  auto sp = split_at(y.shape, axis);
  HostTensor dx = zeros(y.shape);
  for (std::int64_t o = 0; o < sp.outer; ++o)
    for (std::int64_t in = 0; in < sp.inner; ++in) {
      double dot = 0;
      for (std::int64_t i = 0; i < sp.n; ++i) dot += y.data[sp.at(o, i, in)] * dy.data[sp.at(o, i, in)];
      for (std::int64_t i = 0; i < sp.n; ++i) {
        auto k = sp.at(o, i, in);
        dx.data[k] = y.data[k] * (dy.data[k] - dot);
      }
    }
  return dx;
}

// Per row of the last dim: mean and 1/√(var + eps).
void ln_stats(const HostTensor& x, double eps, std::int64_t row, std::int64_t h, double& mu, double& rstd) {
  mu = 0;
  for (std::int64_t j = 0; j < h; ++j) mu += x.data[row * h + j];
  mu /= static_cast<double>(h);
  double var = 0;
  for (std::int64_t j = 0; j < h; ++j) var += (x.data[row * h + j] - mu) * (x.data[row * h + j] - mu);
  var /= static_cast<double>(h);
  rstd = 1 / std::sqrt(var + eps);
}

struct ConvDims {
  std::int64_t n, c, H, W, o, r, t, P, Q, s, pad;
};

// Visits every (n, o, c, p, q, r, t) with an in-bounds input pixel: f(x offset, w offset, y offset).
template <typename F>
void conv_loop(const ConvDims& d, F&& f) {
  for (std::int64_t n = 0; n < d.n; ++n)
    for (std::int64_t o = 0; o < d.o; ++o)
      for (std::int64_t c = 0; c < d.c; ++c)
        for (std::int64_t p = 0; p < d.P; ++p)
          for (std::int64_t q = 0; q < d.Q; ++q)
            for (std::int64_t r = 0; r < d.r; ++r)
              for (std::int64_t t = 0; t < d.t; ++t) {
                std::int64_t h = p * d.s + r - d.pad, w = q * d.s + t - d.pad;
                if (h < 0 || h >= d.H || w < 0 || w >= d.W) continue;
                f(((n * d.c + c) * d.H + h) * d.W + w, ((o * d.c + c) * d.r + r) * d.t + t,
                  ((n * d.o + o) * d.P + p) * d.Q + q);
              }
}

// Visits every pool window: f(x plane offset base, y offset, list of in-bounds x offsets).
template <typename F>
void pool_loop(const Shape& xs, const Shape& ys, std::int64_t k, std::int64_t s, std::int64_t pad, F&& f) {
  std::vector<std::int64_t> win;
  for (std::int64_t nc = 0; nc < xs[0] * xs[1]; ++nc)
    for (std::int64_t p = 0; p < ys[2]; ++p)
      for (std::int64_t q = 0; q < ys[3]; ++q) {
        win.clear();
        for (std::int64_t r = 0; r < k; ++r)
          for (std::int64_t t = 0; t < k; ++t) {
            std::int64_t h = p * s + r - pad, w = q * s + t - pad;
            if (h >= 0 && h < xs[2] && w >= 0 && w < xs[3]) win.push_back((nc * xs[2] + h) * xs[3] + w);
          }
        f((nc * ys[2] + p) * ys[3] + q, win);
      }
}

// The local row of each global id of a vocabulary of `n` rows held as `index` (empty = identity).
struct VocabRows {
  std::vector<std::int64_t> local;  // global id -> local row or -1; empty = identity
  std::int64_t global = 0;
  VocabRows(const std::vector<std::int64_t>& index, std::int64_t n_local, std::int64_t n_global) {
    global = n_global > 0 ? n_global : n_local;
    if (index.empty()) return;
    WEFT_CHECK(static_cast<std::int64_t>(index.size()) == n_local, "vocab index has {} rows, the shard {}",
               index.size(), n_local);
    local.assign(static_cast<std::size_t>(global), -1);
    for (std::size_t r = 0; r < index.size(); ++r)
      local[static_cast<std::size_t>(index[r])] = static_cast<std::int64_t>(r);
  }
  std::int64_t row(std::int64_t id) const { return local.empty() ? id : local[static_cast<std::size_t>(id)]; }
};

Shape lead_shape(const HostTensor& logits) { return Shape(logits.shape.begin(), logits.shape.end() - 1); }

HostTensor run_dropout(const Op& op, const HostTensor& x, const KernelContext& ctx) {
  const double p = op.attrs.scalar;
  const auto seed = op.attrs.ints.at(0);
  const auto step = static_cast<std::int64_t>(ctx.step > 0 ? ctx.step : 1);
  const std::size_t rank = x.shape.size();
  const Shape& gshape = ctx.element_shape.empty() ? x.shape : ctx.element_shape;
  WEFT_CHECK(gshape.size() == rank && (ctx.element_index.empty() || ctx.element_index.size() == rank),
             "dropout '{}': element index of rank {} for a tile of rank {}", op.name,
             ctx.element_index.size(), rank);
  const auto gstride = strides_of(gshape);
  auto global = [&](std::size_t d, std::int64_t i) {
    return ctx.element_index.empty() ? i : ctx.element_index[d].at(static_cast<std::size_t>(i));
  };
  HostTensor y{x.shape, std::vector<double>(x.data.size())};
  const double scale = 1.0 / (1.0 - p);
  Index at(rank, 0);
  for (std::size_t k = 0; k < x.data.size(); ++k) {
    std::int64_t flat = 0;
    for (std::size_t d = 0; d < rank; ++d) flat += global(d, at[d]) * gstride[d];
    y.data[k] = dropout_keep(seed, step, flat, p) ? x.data[k] * scale : 0.0;
    for (std::size_t d = rank; d-- > 0;) {  // row-major increment
      if (++at[d] < x.shape[d]) break;
      at[d] = 0;
    }
  }
  return y;
}

std::vector<HostTensor> run_op(const Graph& g, const Op& op, const std::vector<const HostTensor*>& in,
                               const KernelContext& ctx) {
  const OpAttrs& a = op.attrs;
  auto out_shape = [&](std::size_t i) {
    return ctx.out_shapes.empty() ? g.tensor(op.outputs[i]).shape : ctx.out_shapes.at(i);
  };
  switch (op.kind) {
    case OpKind::Einsum: return {run_einsum(op, in, out_shape(0))};
    case OpKind::Unary: {
      HostTensor y = *in[0];
      for (auto& v : y.data) v = unary_value(a.unary, v, a.scalar);
      return {y};
    }
    case OpKind::Binary: return {run_binary(a.binary, *in[0], *in[1], out_shape(0))};
    case OpKind::Dropout: return {run_dropout(op, *in[0], ctx)};
    // The values unchanged: an executor holds every result at its dtype's precision
    // (ir::held_dtype), which is where a cast rounds.
    case OpKind::Cast: return {*in[0]};
    case OpKind::Gather: return {routing::gather(op, *in[0], *in[1])};
    case OpKind::ScatterAdd:
      if (in.size() == 2) return {routing::scatter_add(op, nullptr, *in[0], *in[1], out_shape(0))};
      return {routing::scatter_add(op, in[0], *in[1], *in[2], out_shape(0))};
    case OpKind::TopK: return routing::topk(op, *in[0]);
    case OpKind::Attention: return attention::forward(op, *in[0], *in[1], *in[2], ctx);
    case OpKind::AttentionGrad: return attention::backward(op, in, ctx);
    case OpKind::Reduce: return {run_reduce(a.reduce, *in[0], a.axes, out_shape(0), ctx.mean_count)};
    case OpKind::Softmax: return {run_softmax(*in[0], axis_of(a.axes[0], in[0]->shape.size()))};
    case OpKind::SoftmaxGrad:
      return {run_softmax_grad(*in[0], *in[1], axis_of(a.axes[0], in[0]->shape.size()))};
    case OpKind::LayerNorm:
    case OpKind::LayerNormGrad: {
      const HostTensor &x = *in[0], &gamma = *in[1];
      std::int64_t h = x.shape.back(), rows = x.numel() / h;
      HostTensor y = zeros(x.shape);
      for (std::int64_t row = 0; row < rows; ++row) {
        double mu, rstd;
        ln_stats(x, a.scalar, row, h, mu, rstd);
        if (op.kind == OpKind::LayerNorm) {
          for (std::int64_t j = 0; j < h; ++j)
            y.data[row * h + j] = (x.data[row * h + j] - mu) * rstd * gamma.data[j] + in[2]->data[j];
          continue;
        }
        const HostTensor& dy = *in[2];
        double mg = 0, mgx = 0;
        for (std::int64_t j = 0; j < h; ++j) {
          double gj = dy.data[row * h + j] * gamma.data[j], xh = (x.data[row * h + j] - mu) * rstd;
          mg += gj;
          mgx += gj * xh;
        }
        mg /= static_cast<double>(h);
        mgx /= static_cast<double>(h);
        for (std::int64_t j = 0; j < h; ++j) {
          double gj = dy.data[row * h + j] * gamma.data[j], xh = (x.data[row * h + j] - mu) * rstd;
          y.data[row * h + j] = rstd * (gj - mg - xh * mgx);
        }
      }
      return {y};
    }
    case OpKind::LayerNormParamGrad: {
      const HostTensor &x = *in[0], &dy = *in[1];
      std::int64_t h = x.shape.back(), rows = x.numel() / h;
      HostTensor dg = zeros({h}), db = zeros({h});
      for (std::int64_t row = 0; row < rows; ++row) {
        double mu, rstd;
        ln_stats(x, a.scalar, row, h, mu, rstd);
        for (std::int64_t j = 0; j < h; ++j) {
          dg.data[j] += dy.data[row * h + j] * (x.data[row * h + j] - mu) * rstd;
          db.data[j] += dy.data[row * h + j];
        }
      }
      return {dg, db};
    }
    case OpKind::Embedding: {
      // A vocab-sharded table: ids of rows held elsewhere read zeros (a partial sum).
      const HostTensor &table = *in[0], &ids = *in[1];
      std::int64_t h = table.shape[1];
      VocabRows rows(ctx.vocab_index, table.shape[0], ctx.vocab_size);
      HostTensor y = zeros(out_shape(0));
      for (std::int64_t i = 0; i < ids.numel(); ++i) {
        std::int64_t r = rows.row(as_index(ids.data[i], rows.global, op, "id"));
        if (r >= 0) std::copy_n(table.data.begin() + r * h, h, y.data.begin() + i * h);
      }
      return {y};
    }
    case OpKind::EmbeddingGrad: {
      const HostTensor &ids = *in[0], &dy = *in[1];
      Shape ts = out_shape(0);
      std::int64_t h = ts[1];
      VocabRows rows(ctx.vocab_index, ts[0], ctx.vocab_size > 0 ? ctx.vocab_size : a.ints[0]);
      HostTensor dt = zeros(ts);
      // ints[2] (optional): torch's padding_idx, whose row gets no gradient from the lookup
      const std::int64_t pad = a.ints.size() > 2 ? a.ints[2] : -1;
      for (std::int64_t i = 0; i < ids.numel(); ++i) {
        const std::int64_t id = as_index(ids.data[i], rows.global, op, "id");
        std::int64_t r = rows.row(id);
        if (r < 0 || id == pad) continue;
        for (std::int64_t j = 0; j < h; ++j) dt.data[r * h + j] += dy.data[i * h + j];
      }
      return {dt};
    }
    case OpKind::CrossEntropy:
    case OpKind::CrossEntropyGrad: {
      const HostTensor &lg = *in[0], &lab = *in[1];
      const bool grad = op.kind == OpKind::CrossEntropyGrad;
      const HostTensor* w = cross_entropy_weighted(op) ? in[grad ? 3 : 2] : nullptr;
      KernelContext c = ctx;  // the class count C of label smoothing, on whole tensors
      if (c.vocab_size <= 0) c.vocab_size = lg.shape.back();
      HostTensor m = ce_row_max(lg), st = ce_row_sum_target(op, lg, lab, m, w, c);
      if (!grad) return {ce_loss(op, lab, m, st, c, true)};
      return {ce_grad(op, lg, lab, *in[2], w, m, st, c)};
    }
    case OpKind::Transpose: {
      const HostTensor& x = *in[0];
      auto xs = strides_of(x.shape);
      HostTensor y = zeros(out_shape(0));
      std::int64_t k = 0;
      for_each_index(y.shape, [&](const Index& idx) {
        std::int64_t off = 0;
        for (std::size_t i = 0; i < idx.size(); ++i) off += idx[i] * xs[a.axes[i]];
        y.data[k++] = x.data[off];
      });
      return {y};
    }
    case OpKind::Reshape: return {HostTensor{out_shape(0), in[0]->data}};
    case OpKind::Concat: {
      Shape os = out_shape(0);
      int ax = axis_of(a.axes[0], os.size());
      auto so = split_at(os, ax);
      HostTensor y = zeros(os);
      std::int64_t base = 0;
      for (const HostTensor* x : in) {
        auto sx = split_at(x->shape, ax);
        for (std::int64_t o = 0; o < sx.outer; ++o)
          for (std::int64_t i = 0; i < sx.n; ++i)
            for (std::int64_t j = 0; j < sx.inner; ++j)
              y.data[so.at(o, base + i, j)] = x->data[sx.at(o, i, j)];
        base += sx.n;
      }
      return {y};
    }
    case OpKind::Slice:
    case OpKind::Pad: {
      const HostTensor& x = *in[0];
      Shape os = out_shape(0);
      int ax = axis_of(a.axes[0], os.size());
      auto sx = split_at(x.shape, ax), so = split_at(os, ax);
      HostTensor y = zeros(os);
      std::int64_t b = a.ints[0];
      for (std::int64_t o = 0; o < so.outer; ++o)
        for (std::int64_t j = 0; j < so.inner; ++j) {
          if (op.kind == OpKind::Slice)
            for (std::int64_t i = 0; i < so.n; ++i) y.data[so.at(o, i, j)] = x.data[sx.at(o, b + i, j)];
          else
            for (std::int64_t i = 0; i < sx.n; ++i) y.data[so.at(o, b + i, j)] = x.data[sx.at(o, i, j)];
        }
      return {y};
    }
    case OpKind::Conv2d: {
      const HostTensor &x = *in[0], &w = *in[1];
      Shape ys = out_shape(0);
      ConvDims d{x.shape[0], x.shape[1], x.shape[2], x.shape[3], w.shape[0], w.shape[2],
                 w.shape[3], ys[2],      ys[3],      a.ints[0],  a.ints[1]};
      HostTensor y = zeros(ys);
      conv_loop(d, [&](std::int64_t xi, std::int64_t wi, std::int64_t yi) {
        y.data[yi] += x.data[xi] * w.data[wi];
      });
      return {y};
    }
    case OpKind::Conv2dGradInput: {
      const HostTensor &dy = *in[0], &w = *in[1];
      ConvDims d{dy.shape[0], w.shape[1],  a.ints[2],   a.ints[3], w.shape[0], w.shape[2],
                 w.shape[3],  dy.shape[2], dy.shape[3], a.ints[0], a.ints[1]};
      HostTensor dx = zeros({d.n, d.c, d.H, d.W});
      conv_loop(d, [&](std::int64_t xi, std::int64_t wi, std::int64_t yi) {
        dx.data[xi] += dy.data[yi] * w.data[wi];
      });
      return {dx};
    }
    case OpKind::Conv2dGradWeight: {
      const HostTensor &x = *in[0], &dy = *in[1];
      ConvDims d{x.shape[0], x.shape[1],  x.shape[2],  x.shape[3], dy.shape[1], a.ints[2],
                 a.ints[3],  dy.shape[2], dy.shape[3], a.ints[0],  a.ints[1]};
      HostTensor dw = zeros({d.o, d.c, d.r, d.t});
      conv_loop(d, [&](std::int64_t xi, std::int64_t wi, std::int64_t yi) {
        dw.data[wi] += x.data[xi] * dy.data[yi];
      });
      return {dw};
    }
    case OpKind::Pool2d:
    case OpKind::Pool2dGrad: {
      const HostTensor& x = *in[0];
      bool grad = op.kind == OpKind::Pool2dGrad;
      Shape ys = grad ? in[1]->shape : out_shape(0);
      std::int64_t k = a.ints[0];
      HostTensor out = zeros(grad ? x.shape : ys);
      bool mx = a.reduce == ReduceFn::Max;
      double inv = 1.0 / static_cast<double>(k * k);
      pool_loop(x.shape, ys, k, a.ints[1], a.ints[2],
                [&](std::int64_t yi, const std::vector<std::int64_t>& win) {
                  if (win.empty()) return;
                  std::int64_t arg = win[0];
                  double acc = mx ? x.data[arg] : 0.0;
                  for (auto xi : win) {
                    if (mx && x.data[xi] > acc) acc = x.data[arg = xi];
                    if (!mx) acc += x.data[xi];
                  }
                  if (!grad) {
                    out.data[yi] = mx ? acc : acc * inv;
                    return;
                  }
                  double g = in[2]->data[yi];
                  if (mx)
                    out.data[arg] += g;
                  else
                    for (auto xi : win) out.data[xi] += g * inv;
                });
      return {out};
    }
    case OpKind::Opaque: fail("op '{}' is opaque: the interpreter cannot execute it", op.name);
    case OpKind::UnaryGrad: {
      HostTensor dx = *in[1];
      for (std::size_t i = 0; i < dx.data.size(); ++i)
        dx.data[i] *= unary_derivative(a.unary, in[0]->data[i], a.scalar);
      return {dx};
    }
    case OpKind::BroadcastTo: {
      const HostTensor& x = *in[0];
      Shape os = out_shape(0);
      std::vector<bool> inserted(os.size(), false);
      for (int ax : a.axes) inserted[axis_of(ax, os.size())] = true;
      auto xs = strides_of(x.shape);
      std::vector<std::int64_t> per(os.size(), 0);
      for (std::size_t d = 0, k = 0; d < os.size(); ++d)
        if (!inserted[d]) {
          per[d] = x.shape[k] == 1 ? 0 : xs[k];
          ++k;
        }
      HostTensor y = zeros(os);
      std::int64_t k = 0;
      for_each_index(os, [&](const Index& idx) {
        std::int64_t off = 0;
        for (std::size_t d = 0; d < idx.size(); ++d) off += idx[d] * per[d];
        y.data[k++] = x.data[off];
      });
      return {y};
    }
    case OpKind::SgdUpdate: {
      // (p, g[, master][, buf]): the update runs on the master copy when there is one, and the
      // parameter is its value (the cast to the parameter's dtype is the executor's rounding).
      const double lr = a.scalars[0];
      const bool mom = a.scalars.size() == 2;
      const bool master = in.size() == (mom ? 4u : 3u);
      HostTensor w = *in[master ? 2 : 0];
      HostTensor buf = mom ? *in[in.size() - 1] : HostTensor{};
      for (std::size_t i = 0; i < w.data.size(); ++i) {
        double step_i = in[1]->data[i];
        if (mom) step_i = buf.data[i] = a.scalars[1] * buf.data[i] + step_i;
        w.data[i] -= lr * step_i;
      }
      std::vector<HostTensor> out = {w};
      if (master) out.push_back(w);
      if (mom) out.push_back(std::move(buf));
      return out;
    }
    case OpKind::AdamUpdate: {
      double lr = a.scalars[0], b1 = a.scalars[1], b2 = a.scalars[2], eps = a.scalars[3],
             step = ctx.step > 0 ? ctx.step : a.scalars[4];
      const bool master = in.size() == 5;
      const std::size_t k = master ? 3 : 2;  // m's operand
      HostTensor w = *in[master ? 2 : 0], m = *in[k], v = *in[k + 1];
      double c1 = 1 - std::pow(b1, step), c2 = 1 - std::pow(b2, step);
      for (std::size_t i = 0; i < w.data.size(); ++i) {
        double gi = in[1]->data[i];
        m.data[i] = b1 * m.data[i] + (1 - b1) * gi;
        v.data[i] = b2 * v.data[i] + (1 - b2) * gi * gi;
        w.data[i] -= lr * (m.data[i] / c1) / (std::sqrt(v.data[i] / c2) + eps);
      }
      if (master) return {w, w, m, v};
      return {w, m, v};
    }
  }
  throw InternalError("op kind without an interpreter kernel");
}

}  // namespace

std::vector<HostTensor> run_kernel(const Graph& g, const Op& op, const std::vector<const HostTensor*>& in,
                                   const KernelContext& ctx) {
  return run_op(g, op, in, ctx);
}

HostTensor ce_row_max(const HostTensor& logits) {
  std::int64_t v = logits.shape.back();
  HostTensor m = zeros(lead_shape(logits));
  for (std::int64_t t = 0; t < m.numel(); ++t) {
    const double* row = logits.data.data() + t * v;
    m.data[t] = v > 0 ? *std::max_element(row, row + v) : -std::numeric_limits<double>::infinity();
  }
  return m;
}

std::int64_t ce_stat_width(const Op& op) {
  return cross_entropy_weighted(op) || cross_entropy_attrs(op).label_smoothing != 0 ? 5 : 2;
}

namespace {

// Whether token t's label counts (it is not the ignore_index); a counted label must be a class.
bool ce_counted(const Op& op, const CrossEntropyAttrs& c, double label, std::int64_t classes) {
  if (label == static_cast<double>(c.ignore_index)) return false;
  as_index(label, classes, op, "label");
  return true;
}

// D, what the summed loss is divided by (CrossEntropyAttrs): the token count with token_mean, else
// the weighted valid count — the step's share from the executor (tokens · ce_valid_fraction), or,
// on whole tensors, `local_weighted` (Σ w[y]·[y ≠ ii] of these labels).
double ce_denominator(const Op& op, const CrossEntropyAttrs& c, double local_tokens, double local_weighted,
                      const KernelContext& ctx) {
  const double tokens = ctx.tokens > 0 ? ctx.tokens : local_tokens;
  if (c.token_mean) return tokens;
  if (ctx.ce_valid_fraction >= 0) return tokens * ctx.ce_valid_fraction;
  WEFT_CHECK(ctx.tokens <= 0 || ctx.tokens == local_tokens,
             "cross entropy '{}': a tile of {} of the op's {} tokens needs the step's valid fraction "
             "(KernelContext::ce_valid_fraction) to divide by the weighted count of valid labels",
             op.name, local_tokens, ctx.tokens);
  return local_weighted;
}

// Σ w[y]·[y ≠ ii] over the tokens, from the statistics (their column 2 is w_y, 0 for an ignored
// label) or, for the plain form, from the labels.
double ce_local_weighted(const CrossEntropyAttrs& c, const HostTensor& labels, const HostTensor& stats) {
  const std::int64_t width = stats.shape.back();
  double n = 0;
  for (std::int64_t t = 0; t < labels.numel(); ++t)
    if (width == 2)
      n += labels.data[t] == static_cast<double>(c.ignore_index) ? 0.0 : 1.0;
    else
      n += stats.data[t * width + 2];
  return n;
}

}  // namespace

HostTensor ce_row_sum_target(const Op& op, const HostTensor& logits, const HostTensor& labels,
                             const HostTensor& row_max, const HostTensor* weight, const KernelContext& ctx) {
  const CrossEntropyAttrs c = cross_entropy_attrs(op);
  const std::int64_t v = logits.shape.back(), width = ce_stat_width(op);
  VocabRows rows(ctx.vocab_index, v, ctx.vocab_size);
  WEFT_CHECK(!weight || weight->numel() == v, "cross entropy '{}': {} class weights for {} local classes",
             op.name, weight ? weight->numel() : 0, v);
  Shape s = lead_shape(logits);
  s.push_back(width);
  HostTensor out = zeros(s);
  // Σ_c w_c over the local classes (the same for every token)
  double w_sum = 0;
  for (std::int64_t k = 0; k < v; ++k) w_sum += weight ? weight->data[k] : 1.0;
  for (std::int64_t t = 0; t < row_max.numel(); ++t) {
    const double* row = logits.data.data() + t * v;
    double* o = out.data.data() + t * width;
    double sum = 0;
    for (std::int64_t k = 0; k < v; ++k) sum += std::exp(row[k] - row_max.data[t]);
    o[0] = sum;
    const bool counted = ce_counted(op, c, labels.data[t], rows.global);
    const std::int64_t r = counted ? rows.row(static_cast<std::int64_t>(labels.data[t])) : -1;
    if (width == 2) {
      o[1] = r >= 0 ? row[r] : 0.0;
      continue;
    }
    const double wy = r >= 0 ? (weight ? weight->data[r] : 1.0) : 0.0;
    o[1] = r >= 0 ? wy * row[r] : 0.0;
    o[2] = wy;
    double wx = 0;
    for (std::int64_t k = 0; k < v; ++k) wx += (weight ? weight->data[k] : 1.0) * row[k];
    o[3] = wx;
    o[4] = w_sum;
  }
  return out;
}

HostTensor ce_loss(const Op& op, const HostTensor& labels, const HostTensor& row_max, const HostTensor& stats,
                   const KernelContext& ctx, bool contribute) {
  if (!contribute) return HostTensor{{}, {0.0}};
  const CrossEntropyAttrs c = cross_entropy_attrs(op);
  const std::int64_t width = stats.shape.back();
  WEFT_CHECK(ctx.vocab_size > 0 || c.label_smoothing == 0,
             "cross entropy '{}': label smoothing needs the class count", op.name);
  const double n_classes = static_cast<double>(ctx.vocab_size);
  const double eps = c.label_smoothing;
  double loss = 0;
  for (std::int64_t t = 0; t < row_max.numel(); ++t) {
    if (labels.data[t] == static_cast<double>(c.ignore_index)) continue;
    const double* o = stats.data.data() + t * width;
    const double lse = row_max.data[t] + std::log(o[0]);
    if (width == 2) {
      loss += lse - o[1];
      continue;
    }
    // (1 − ε)·w_y·(lse − z) + ε/C·Σ_c w_c·(lse − x_c)
    double l = (1 - eps) * (o[2] * lse - o[1]);
    if (eps != 0) l += eps / n_classes * (o[4] * lse - o[3]);
    loss += l;
  }
  const double d =
      ce_denominator(op, c, static_cast<double>(row_max.numel()), ce_local_weighted(c, labels, stats), ctx);
  return HostTensor{{}, {loss / d}};
}

HostTensor ce_grad(const Op& op, const HostTensor& logits, const HostTensor& labels, const HostTensor& dloss,
                   const HostTensor* weight, const HostTensor& row_max, const HostTensor& stats,
                   const KernelContext& ctx) {
  const CrossEntropyAttrs c = cross_entropy_attrs(op);
  const std::int64_t v = logits.shape.back(), width = stats.shape.back();
  VocabRows rows(ctx.vocab_index, v, ctx.vocab_size);
  const double d =
      ce_denominator(op, c, static_cast<double>(row_max.numel()), ce_local_weighted(c, labels, stats), ctx);
  const double scale = dloss.data[0] / d;
  const double eps = c.label_smoothing;
  const double n_classes = static_cast<double>(rows.global);
  HostTensor out = zeros(logits.shape);
  for (std::int64_t t = 0; t < row_max.numel(); ++t) {
    const double* row = logits.data.data() + t * v;
    if (!ce_counted(op, c, labels.data[t], rows.global)) continue;  // an ignored label: no gradient
    const double* o = stats.data.data() + t * width;
    const std::int64_t r = rows.row(static_cast<std::int64_t>(labels.data[t]));
    double* g = out.data.data() + t * v;
    if (width == 2) {
      for (std::int64_t k = 0; k < v; ++k)
        g[k] = scale * (std::exp(row[k] - row_max.data[t]) / o[0] - (k == r ? 1.0 : 0.0));
      continue;
    }
    // (1 − ε)·w_y·(p_c − [c = y]) + ε/C·(W·p_c − w_c), W = Σ_c w_c
    const double a = (1 - eps) * o[2], b = eps / n_classes;
    for (std::int64_t k = 0; k < v; ++k) {
      const double p = std::exp(row[k] - row_max.data[t]) / o[0];
      const double wk = weight ? weight->data[k] : 1.0;
      g[k] = scale * (a * (p - (k == r ? 1.0 : 0.0)) + b * (o[4] * p - wk));
    }
  }
  return out;
}

namespace {
std::uint32_t mix32(std::uint32_t x) {  // a bijective integer hash (two rounds of xorshift-multiply)
  x = ((x >> 16) ^ x) * 0x45d9f3bU;
  x = ((x >> 16) ^ x) * 0x45d9f3bU;
  return (x >> 16) ^ x;
}
}  // namespace

std::uint32_t dropout_hash(std::int64_t seed, std::int64_t step, std::int64_t index) {
  const auto lo = static_cast<std::uint32_t>(index & 0xffffffff);
  const auto hi = static_cast<std::uint32_t>((index >> 32) & 0xffffffff);
  const std::uint32_t key = mix32(static_cast<std::uint32_t>(seed & 0xffffffff) ^
                                  mix32(static_cast<std::uint32_t>(step & 0xffffffff)));
  return mix32(lo ^ mix32(hi ^ key));
}

bool dropout_keep(std::int64_t seed, std::int64_t step, std::int64_t index, double p) {
  return static_cast<double>(dropout_hash(seed, step, index)) >= std::floor(p * 4294967296.0);
}

}  // namespace weft::ir
