// ShardingSpec validation, stride resolution, notation (weft, Alpa, DTensor, JAX) and enumeration.
//
// The math (see sharding_spec.hpp): a dim of padded size N' sharded by mesh axes i with k_i shards
// at strides s_i is the mixed-radix number e = ... + c_i * s_i + ...; axis i owns the digit of
// radix k_i at place value s_i, i.e. shard(e) = floor(e / s_i) mod k_i. The digits must not
// overlap: s_i * k_i | N' and, sorted by stride, every major stride is a multiple of s_j * k_j of
// every minor axis j. A stride of 0 asks for the largest valid stride given the explicit strides
// and the zero-stride axes before it in mesh order (all zeros: nested block sharding).
#include "weft/sharding/sharding_spec.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <functional>
#include <optional>

#include "weft/core/error.hpp"

namespace weft::sharding {
namespace {

const char* reduce_name(ReduceKind r) { return r == ReduceKind::Sum ? "sum" : "max"; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Digit {
  int64_t s, k;
};

// Formats the error only when the caller wants it (the search calls validate in a hot loop).
#define WEFT_BAD(...)                         \
  do {                                        \
    if (err) *err = fmt::format(__VA_ARGS__); \
    return false;                             \
  } while (0)

// Checks that the digits (s, k) of one dim do not overlap inside N'; the message goes to *err.
bool check_digits(std::vector<Digit> d, int64_t np, std::string* err) {
  for (const Digit& x : d) {
    if (x.s < 1) WEFT_BAD("stride {} must be >= 1", x.s);
    int64_t span = 0;  // stride x shards: overflow-checked (a fuzzed stride near 2^63 overflowed)
    if (__builtin_mul_overflow(x.s, x.k, &span) || span > np)
      WEFT_BAD("stride {} does not divide: stride x shards = {} x {} exceeds the dim size {}", x.s, x.s, x.k,
               np);
    if (np % span != 0)
      WEFT_BAD("stride {} does not divide: stride x shards = {} x {} must divide the dim size {}", x.s, x.s,
               x.k, np);
  }
  std::sort(d.begin(), d.end(), [](const Digit& a, const Digit& b) { return a.s > b.s; });
  for (std::size_t i = 0; i + 1 < d.size(); ++i)
    if (d[i].s % (d[i + 1].s * d[i + 1].k) != 0)
      WEFT_BAD("strides {} and {} overlap: the larger must be a multiple of {} x {}", d[i].s, d[i + 1].s,
               d[i + 1].s, d[i + 1].k);
  return true;
}

// Validates and resolves strides in place; false (and the message in *err, if given) when invalid.
bool validate(const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh,
              std::vector<Placement>& axes, bool padding, std::string* err) {
  if (mesh.empty()) WEFT_BAD("the mesh shape must have at least one axis");
  for (int64_t m : mesh)
    if (m < 1) WEFT_BAD("mesh axis sizes must be >= 1 (mesh {})", fmt::join(mesh, "x"));
  for (int64_t n : shape)
    if (n < 1) WEFT_BAD("tensor dims must be >= 1 (shape [{}])", fmt::join(shape, ","));
  if (axes.size() != mesh.size())
    WEFT_BAD("{} placements for a {}-D mesh (one per mesh axis)", axes.size(), mesh.size());
  std::optional<ReduceKind> red;
  const int rank = static_cast<int>(shape.size());
  for (std::size_t a = 0; a < axes.size(); ++a) {
    Placement& p = axes[a];
    if (p.kind == Placement::Shard) {
      if (p.dim < 0 || p.dim >= rank)
        WEFT_BAD("mesh axis {}: dim {} out of range for a rank-{} tensor", a, p.dim, rank);
      if (p.stride < 0) WEFT_BAD("mesh axis {}: stride {} must be >= 0", a, p.stride);
      p.reduce = ReduceKind::Sum;
    } else {
      p.dim = -1;
      p.stride = 0;
      if (p.kind == Placement::Partial) {
        if (red && *red != p.reduce) WEFT_BAD("partial axes mix sum and max (one reduction per spec)");
        red = p.reduce;
      } else {
        p.reduce = ReduceKind::Sum;
      }
    }
  }
  for (int d = 0; d < rank; ++d) {
    int64_t K = 1;
    std::vector<std::size_t> on;
    for (std::size_t a = 0; a < axes.size(); ++a)
      if (axes[a].kind == Placement::Shard && axes[a].dim == d) {
        K *= mesh[a];
        on.push_back(a);
      }
    if (on.empty()) continue;
    const int64_t n = shape[static_cast<std::size_t>(d)];
    if (n % K != 0 && !padding)
      WEFT_BAD(
          "dim {} of size {} is not divisible by its {} shards (mesh axes sharding it); pass "
          "allow_padding for torch.chunk-style uneven shards",
          d, n, K);
    const int64_t np = ceil_div(n, K) * K;
    std::vector<Digit> fixed;
    for (std::size_t a : on) {
      if (mesh[a] == 1) {
        if (axes[a].stride != 0 && np % axes[a].stride != 0)
          WEFT_BAD("mesh axis {}: stride {} does not divide dim {} of size {}", a, axes[a].stride, d, np);
        axes[a].stride = 1;  // a radix-1 digit constrains nothing: canonical stride 1
      } else if (axes[a].stride != 0) {
        fixed.push_back({axes[a].stride, mesh[a]});
      }
    }
    if (std::string e; !check_digits(fixed, np, err ? &e : nullptr)) WEFT_BAD("dim {}: {}", d, e);
    for (std::size_t a : on) {
      if (mesh[a] == 1 || axes[a].stride != 0) continue;
      bool found = false;
      for (int64_t s = np / mesh[a]; s >= 1; --s) {
        if ((np / mesh[a]) % s != 0) continue;
        fixed.push_back({s, mesh[a]});
        if (check_digits(fixed, np, nullptr)) {
          axes[a].stride = s;
          found = true;
          break;
        }
        fixed.pop_back();
      }
      if (!found) WEFT_BAD("dim {}: no block stride fits mesh axis {} next to the explicit strides", d, a);
    }
  }
  return true;
}

// Strides of the axes on `dim` when every one of them is written without stride.
std::vector<Placement> default_resolution(const ShardingSpec& s, int dim) {
  std::vector<Placement> p = s.per_axis();
  for (auto& x : p)
    if (x.kind == Placement::Shard && x.dim == dim) x.stride = 0;
  if (!validate(s.tensor_shape(), s.mesh_shape(), p, s.allow_padding(), nullptr)) return {};
  return p;
}

// Axes of a dim with k > 1 in "nested block" form: sorted major first, s_0 = N'/k_0, s_{i+1} = s_i/k_{i+1}.
bool nested_block(const ShardingSpec& s, int dim, std::vector<int>* order) {
  std::vector<int> ax;
  for (int a : s.axes_of_dim(dim))
    if (s.mesh_shape()[static_cast<std::size_t>(a)] > 1) ax.push_back(a);
  int64_t cur = s.padded_size(dim);
  for (int a : ax) {
    cur /= s.mesh_shape()[static_cast<std::size_t>(a)];
    if (s.placement(a).stride != cur) return false;
  }
  if (order) *order = ax;
  return true;
}

std::vector<std::string> split_tokens(std::string_view t) {
  std::vector<std::string> out;
  std::string cur;
  int depth = 0;
  for (char ch : t) {
    if (ch == '(') ++depth;
    if (ch == ')') --depth;
    if (depth == 0 && (std::isspace(static_cast<unsigned char>(ch)) || ch == ',' || ch == '[' || ch == ']')) {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
      continue;
    }
    cur += ch;
  }
  if (!cur.empty()) out.push_back(cur);
  WEFT_CHECK(depth == 0, "unbalanced parentheses in sharding spec '{}'", t);
  return out;
}

int64_t parse_int(const std::string& s, std::string_view whole) {
  std::string t;
  for (char c : s)
    if (!std::isspace(static_cast<unsigned char>(c))) t += c;
  auto eq = t.find('=');
  if (eq != std::string::npos) t = t.substr(eq + 1);
  WEFT_CHECK(!t.empty() && std::all_of(t.begin(), t.end(),
                                       [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }),
             "expected a number, got '{}' in sharding spec '{}'", s, whole);
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
  WEFT_CHECK(ec == std::errc() && end == t.data() + t.size(),
             "number '{}' out of range in sharding spec '{}'", t, whole);
  return v;
}

// One parsed placement word. DTensor's _StridedShard has no weft Placement of its own: its
// split factor is only meaningful together with the axes before it (dtensor_strides below).
struct Token {
  Placement placement;
  int64_t split_factor = 0;  // > 0: _StridedShard(dim, split_factor)
};

Token parse_token(const std::string& tok, std::string_view whole) {
  auto lp = tok.find('(');
  std::string head = tok.substr(0, lp);
  std::string args;
  if (lp != std::string::npos) {
    WEFT_CHECK(tok.back() == ')', "bad token '{}' in sharding spec '{}'", tok, whole);
    args = tok.substr(lp + 1, tok.size() - lp - 2);
  }
  if (head == "R" || head == "Replicate") {
    WEFT_CHECK(args.find_first_not_of(' ') == std::string::npos, "R takes no arguments in '{}'", whole);
    return {Placement::replicate()};
  }
  if (head == "P" || head == "Partial") {
    std::string a;
    for (char c : args)
      if (!std::isspace(static_cast<unsigned char>(c)) && c != '\'' && c != '"') a += c;
    if (a.empty() || a == "sum") return {Placement::partial(ReduceKind::Sum)};
    if (a == "max") return {Placement::partial(ReduceKind::Max)};
    fail("unknown reduction '{}' in sharding spec '{}' (sum or max)", a, whole);
  }
  if (head == "S" || head == "Shard") {
    auto comma = args.find(',');
    WEFT_CHECK(!args.empty(), "S needs a dim, as in S(0), in sharding spec '{}'", whole);
    int64_t dim = parse_int(args.substr(0, comma), whole);
    int64_t stride = comma == std::string::npos ? 0 : parse_int(args.substr(comma + 1), whole);
    return {Placement::shard(static_cast<int>(dim), stride)};
  }
  // DTensor's repr "_StridedShard(dim=0, sf=2)", weft's to_dtensor "_StridedShard(dim=0,
  // split_factor=2)" and DTensor's str "_S(0, 2)".
  if (head == "_StridedShard" || head == "_S") {
    auto comma = args.find(',');
    WEFT_CHECK(comma != std::string::npos,
               "{} needs a dim and a split factor, as in {}(dim=0, split_factor=2), in "
               "sharding spec '{}'",
               head, head, whole);
    int64_t dim = parse_int(args.substr(0, comma), whole);
    int64_t f = parse_int(args.substr(comma + 1), whole);
    WEFT_CHECK(f >= 1, "split factor {} must be >= 1 in sharding spec '{}'", f, whole);
    return {Placement::shard(static_cast<int>(dim)), f};
  }
  fail("unknown placement '{}' in sharding spec '{}' (S(d[,stride]), R, P(sum|max), _StridedShard(d, f))",
       tok, whole);
}

// DTensor reads placements in mesh order, each axis splitting the piece the earlier axes left:
// Shard(d) splits it into k blocks, _StridedShard(d, f) into f runs each split into k blocks
// (shard i = block i of every run), i.e. the axis owns the digit of radix k at place L/(f*k) of
// the piece (length L). The piece is the dim with the earlier axes' digits removed, so a local
// place maps to the global one by re-inserting those digits below it. Sets the global strides of
// the axes sharding `dim`; throws when an axis's shards are no single digit of the dim (weft's
// factor view cannot say that) or the dim is uneven (DTensor's repeated chunking differs from
// weft's padding there).
void dtensor_strides(std::vector<Placement>& axes, const std::vector<int64_t>& split_factor,
                     const std::vector<int64_t>& mesh, int64_t n, int dim, std::string_view whole) {
  int64_t K = 1;
  for (std::size_t a = 0; a < axes.size(); ++a)
    if (axes[a].kind == Placement::Shard && axes[a].dim == dim) K *= mesh[a];
  WEFT_CHECK(n % K == 0,
             "sharding spec '{}': dim {} of size {} is uneven for its {} shards; with _StridedShard DTensor "
             "chunks it repeatedly, which weft's padding rule does not represent",
             whole, dim, n, K);
  std::vector<Digit> removed;  // global digits taken by earlier axes
  int64_t piece = n;
  for (std::size_t a = 0; a < axes.size(); ++a) {
    Placement& p = axes[a];
    if (p.kind != Placement::Shard || p.dim != dim || mesh[a] == 1) continue;
    WEFT_CHECK(
        p.stride == 0,
        "sharding spec '{}': mesh axis {} gives weft stride {} on dim {}, which also has a _StridedShard "
        "(DTensor's sequential reading); write the dim in one notation",
        whole, a, p.stride, dim);
    const int64_t k = mesh[a];
    const int64_t f = split_factor[a] > 0 ? split_factor[a] : 1;
    WEFT_CHECK(piece % (f * k) == 0,
               "sharding spec '{}': mesh axis {} splits a piece of {} elements of dim {} into {} runs of {} "
               "shards, which does not divide",
               whole, a, piece, dim, f, k);
    int64_t place = piece / (f * k);
    std::sort(removed.begin(), removed.end(), [](const Digit& x, const Digit& y) { return x.s < y.s; });
    for (const Digit& r : removed)
      if (r.s <= place) place *= r.k;
    for (const Digit& r : removed)
      WEFT_CHECK(r.s * r.k <= place || r.s >= place * k,
                 "sharding spec '{}': mesh axis {} takes elements of dim {} that are no single digit of it "
                 "(its shards straddle an earlier axis's); weft's strides cannot say that",
                 whole, a, dim);
    p.stride = place;
    removed.push_back({place, k});
    piece /= k;
  }
}

}  // namespace

std::string Placement::to_string() const {
  switch (kind) {
    case Replicate: return "R";
    case Partial: return fmt::format("P({})", reduce_name(reduce));
    case Shard: return stride ? fmt::format("S({},{})", dim, stride) : fmt::format("S({})", dim);
  }
  return "?";
}

ShardingSpec::ShardingSpec(std::vector<int64_t> tensor_shape, std::vector<int64_t> mesh_shape,
                           std::vector<Placement> per_axis, bool allow_padding)
    : shape_(std::move(tensor_shape)),
      mesh_(std::move(mesh_shape)),
      axes_(std::move(per_axis)),
      padding_(allow_padding) {
  std::string e;
  if (!validate(shape_, mesh_, axes_, padding_, &e)) {
    std::vector<std::string> p;
    for (auto& x : axes_) p.push_back(x.to_string());
    fail("invalid sharding spec [{}] for tensor [{}] on mesh {}: {}", fmt::join(p, " "),
         fmt::join(shape_, ","), fmt::join(mesh_, "x"), e);
  }
}

std::optional<ShardingSpec> ShardingSpec::try_make(std::vector<int64_t> tensor_shape,
                                                   std::vector<int64_t> mesh_shape,
                                                   std::vector<Placement> per_axis, bool allow_padding) {
  if (!validate(tensor_shape, mesh_shape, per_axis, allow_padding, nullptr)) return std::nullopt;
  return ShardingSpec(Unchecked{}, std::move(tensor_shape), std::move(mesh_shape), std::move(per_axis),
                      allow_padding);
}

ShardingSpec ShardingSpec::replicated(std::vector<int64_t> tensor_shape, std::vector<int64_t> mesh_shape) {
  std::vector<Placement> p(mesh_shape.size());
  return ShardingSpec(std::move(tensor_shape), std::move(mesh_shape), std::move(p));
}

ShardingSpec ShardingSpec::parse(std::string_view text, std::vector<int64_t> tensor_shape,
                                 std::vector<int64_t> mesh_shape, bool allow_padding) {
  // A DTensor's placements are a tuple: "(Shard(dim=0), Replicate())" reads as "[...]". No
  // placement word starts with '('.
  std::string_view body = text;
  while (!body.empty() && std::isspace(static_cast<unsigned char>(body.front()))) body.remove_prefix(1);
  while (!body.empty() && std::isspace(static_cast<unsigned char>(body.back()))) body.remove_suffix(1);
  if (body.size() >= 2 && body.front() == '(' && body.back() == ')') body = body.substr(1, body.size() - 2);
  std::vector<Placement> p;
  std::vector<int64_t> split_factor;
  for (const auto& tok : split_tokens(body)) {
    Token t = parse_token(tok, text);
    p.push_back(t.placement);
    split_factor.push_back(t.split_factor);
  }
  WEFT_CHECK(p.size() == mesh_shape.size(), "sharding spec '{}' has {} placements for a {}-D mesh", text,
             p.size(), mesh_shape.size());
  // A dim with a _StridedShard is read DTensor's way (all its axes in mesh order); the others
  // keep weft's reading, which equals DTensor's for plain Shard words.
  for (std::size_t a = 0; a < p.size(); ++a) {
    if (split_factor[a] == 0) continue;
    const int d = p[a].dim;
    WEFT_CHECK(d >= 0 && d < static_cast<int>(tensor_shape.size()),
               "sharding spec '{}': mesh axis {}: dim {} out of range for a rank-{} tensor", text, a, d,
               tensor_shape.size());
    bool first = true;
    for (std::size_t b = 0; b < a; ++b)
      if (split_factor[b] > 0 && p[b].dim == d) first = false;
    if (first)
      dtensor_strides(p, split_factor, mesh_shape, tensor_shape[static_cast<std::size_t>(d)], d, text);
  }
  return ShardingSpec(std::move(tensor_shape), std::move(mesh_shape), std::move(p), allow_padding);
}

std::string ShardingSpec::to_string() const {
  std::vector<Placement> out = axes_;
  for (int d = 0; d < rank(); ++d) {
    auto def = default_resolution(*this, d);
    bool same = !def.empty() && def == axes_;
    // Only this dim's axes matter for the comparison.
    if (!def.empty()) {
      same = true;
      for (std::size_t a = 0; a < axes_.size(); ++a)
        if (axes_[a].kind == Placement::Shard && axes_[a].dim == d && def[a].stride != axes_[a].stride)
          same = false;
    }
    if (same)
      for (auto& x : out)
        if (x.kind == Placement::Shard && x.dim == d) x.stride = 0;
  }
  std::vector<std::string> t;
  for (auto& x : out) t.push_back(x.to_string());
  return fmt::format("{}", fmt::join(t, " "));
}

ShardingSpec ShardingSpec::parse_alpa(std::string_view text, std::vector<int64_t> tensor_shape,
                                      std::vector<int64_t> mesh_shape) {
  std::vector<Placement> p(mesh_shape.size());
  std::vector<std::vector<int>> per_dim;
  std::size_t i = 0;
  while (i < text.size()) {
    char c = text[i];
    if (c == 'R') {
      per_dim.push_back({});
      ++i;
    } else if (c == 'S') {
      ++i;
      std::vector<int> ax;
      while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])))
        ax.push_back(text[i++] - '0');
      WEFT_CHECK(!ax.empty(), "Alpa spec '{}': S must be followed by mesh axis digits", text);
      per_dim.push_back(ax);
    } else if (std::isspace(static_cast<unsigned char>(c)) || c == ',') {
      ++i;
    } else {
      fail("Alpa spec '{}': unexpected character '{}' (use R, S0, S1, S01, ...)", text, c);
    }
  }
  WEFT_CHECK(per_dim.size() == tensor_shape.size(), "Alpa spec '{}' has {} dims for a rank-{} tensor", text,
             per_dim.size(), tensor_shape.size());
  for (std::size_t d = 0; d < per_dim.size(); ++d) {
    int64_t K = 1;
    for (int a : per_dim[d]) {
      WEFT_CHECK(a >= 0 && a < static_cast<int>(mesh_shape.size()),
                 "Alpa spec '{}': mesh axis {} out of range", text, a);
      K *= mesh_shape[static_cast<std::size_t>(a)];
    }
    WEFT_CHECK(tensor_shape[d] >= 1 && tensor_shape[d] % K == 0,
               "Alpa spec '{}': dim {} of size {} is not divisible by {} shards", text, d, tensor_shape[d],
               K);
    int64_t cur = tensor_shape[d];
    for (int a : per_dim[d]) {
      auto ua = static_cast<std::size_t>(a);
      WEFT_CHECK(p[ua].kind == Placement::Replicate, "Alpa spec '{}': mesh axis {} used twice", text, a);
      cur /= mesh_shape[ua];
      p[ua] = Placement::shard(static_cast<int>(d), mesh_shape[ua] == 1 ? 1 : cur);
    }
  }
  return ShardingSpec(std::move(tensor_shape), std::move(mesh_shape), std::move(p));
}

std::string ShardingSpec::to_alpa() const {
  WEFT_CHECK(!has_partial(), "spec '{}' is partial: Alpa's S/R notation has no partial state", to_string());
  WEFT_CHECK(mesh_ndim() <= 10, "Alpa notation needs single-digit mesh axes");
  std::string out;
  for (int d = 0; d < rank(); ++d) {
    std::vector<int> order;
    WEFT_CHECK(nested_block(*this, d, &order),
               "spec '{}' is strided on dim {}: Alpa's notation is block only", to_string(), d);
    std::vector<int> all = axes_of_dim(d);  // includes size-1 axes, major first
    if (all.empty()) {
      out += "R";
      continue;
    }
    // Size-1 axes carry no digit: put them after the real ones in mesh order.
    for (int a : all)
      if (std::find(order.begin(), order.end(), a) == order.end()) order.push_back(a);
    out += "S";
    for (int a : order) out += std::to_string(a);
  }
  return out;
}

std::string ShardingSpec::to_dtensor() const {
  std::vector<std::string> t;
  for (int a = 0; a < mesh_ndim(); ++a) {
    const Placement& p = axes_[static_cast<std::size_t>(a)];
    if (p.kind == Placement::Replicate) {
      t.push_back("Replicate()");
      continue;
    }
    if (p.kind == Placement::Partial) {
      t.push_back(fmt::format("Partial('{}')", reduce_name(p.reduce)));
      continue;
    }
    const int64_t k = mesh_[static_cast<std::size_t>(a)];
    if (k == 1) {
      t.push_back(fmt::format("Shard({})", p.dim));
      continue;
    }
    // DTensor applies placements in mesh order on the local piece left by earlier axes.
    int64_t L = padded_size(p.dim), sloc = p.stride;
    for (int b = 0; b < a; ++b) {
      const Placement& q = axes_[static_cast<std::size_t>(b)];
      const int64_t kb = mesh_[static_cast<std::size_t>(b)];
      if (q.kind != Placement::Shard || q.dim != p.dim || kb == 1) continue;
      L /= kb;
      if (q.stride < p.stride) sloc /= kb;
    }
    const int64_t f = L / (sloc * k);
    // An uneven dim: weft pads it to N' and splits that, DTensor chunks (ceil) axis after axis,
    // and _StridedShard chunks into runs first. They agree only for one block split (torch.chunk).
    if (padded_size(p.dim) != shape_[static_cast<std::size_t>(p.dim)]) {
      int splitting = 0;
      for (int b : axes_of_dim(p.dim))
        if (mesh_[static_cast<std::size_t>(b)] > 1) ++splitting;
      WEFT_CHECK(
          splitting == 1 && f == 1,
          "spec '{}': dim {} of size {} is uneven and {}; weft pads it to {} before splitting, DTensor "
          "chunks it axis after axis: the two agree only for a single block split",
          to_string(), p.dim, shape_[static_cast<std::size_t>(p.dim)],
          splitting > 1 ? "split by several mesh axes" : "strided", padded_size(p.dim));
    }
    t.push_back(f == 1 ? fmt::format("Shard({})", p.dim)
                       : fmt::format("_StridedShard(dim={}, split_factor={})", p.dim, f));
  }
  return fmt::format("[{}]", fmt::join(t, ", "));
}

std::string ShardingSpec::to_jax(const std::vector<std::string>& names_in) const {
  std::vector<std::string> names = names_in;
  if (names.empty()) {
    static const char* k[] = {"x", "y", "z", "w"};
    for (int a = 0; a < mesh_ndim(); ++a) names.push_back(mesh_ndim() <= 4 ? k[a] : fmt::format("a{}", a));
  }
  WEFT_CHECK(static_cast<int>(names.size()) == mesh_ndim(), "{} axis names for a {}-D mesh", names.size(),
             mesh_ndim());
  WEFT_CHECK(!has_partial(), "spec '{}' is partial: a JAX PartitionSpec cannot say that", to_string());
  std::vector<std::string> t;
  for (int d = 0; d < rank(); ++d) {
    std::vector<int> order;
    WEFT_CHECK(nested_block(*this, d, &order),
               "spec '{}' is strided on dim {}: a JAX PartitionSpec cannot say that", to_string(), d);
    for (int a : axes_of_dim(d))
      if (std::find(order.begin(), order.end(), a) == order.end()) order.push_back(a);
    if (order.empty()) {
      t.push_back("None");
    } else if (order.size() == 1) {
      t.push_back(fmt::format("'{}'", names[static_cast<std::size_t>(order[0])]));
    } else {
      std::vector<std::string> q;
      for (int a : order) q.push_back(fmt::format("'{}'", names[static_cast<std::size_t>(a)]));
      t.push_back(fmt::format("({})", fmt::join(q, ", ")));
    }
  }
  return fmt::format("P({})", fmt::join(t, ", "));
}

const Placement& ShardingSpec::placement(int axis) const {
  WEFT_CHECK(axis >= 0 && axis < mesh_ndim(), "mesh axis {} out of range for a {}-D mesh", axis, mesh_ndim());
  return axes_[static_cast<std::size_t>(axis)];
}

std::vector<int> ShardingSpec::axes_of_dim(int dim) const {
  std::vector<int> r;
  for (int a = 0; a < mesh_ndim(); ++a)
    if (axes_[static_cast<std::size_t>(a)].kind == Placement::Shard &&
        axes_[static_cast<std::size_t>(a)].dim == dim)
      r.push_back(a);
  std::stable_sort(r.begin(), r.end(), [&](int a, int b) {
    return axes_[static_cast<std::size_t>(a)].stride > axes_[static_cast<std::size_t>(b)].stride;
  });
  return r;
}

int64_t ShardingSpec::num_shards(int dim) const {
  int64_t K = 1;
  for (int a : axes_of_dim(dim)) K *= mesh_[static_cast<std::size_t>(a)];
  return K;
}

int64_t ShardingSpec::padded_size(int dim) const {
  WEFT_CHECK(dim >= 0 && dim < rank(), "dim {} out of range for a rank-{} tensor", dim, rank());
  const int64_t K = num_shards(dim);
  return ceil_div(shape_[static_cast<std::size_t>(dim)], K) * K;
}

bool ShardingSpec::is_padded() const {
  for (int d = 0; d < rank(); ++d)
    if (padded_size(d) != shape_[static_cast<std::size_t>(d)]) return true;
  return false;
}

bool ShardingSpec::is_replicated() const {
  return std::all_of(axes_.begin(), axes_.end(),
                     [](const Placement& p) { return p.kind == Placement::Replicate; });
}
bool ShardingSpec::has_partial() const { return !partial_axes().empty(); }
std::vector<int> ShardingSpec::partial_axes() const {
  std::vector<int> r;
  for (int a = 0; a < mesh_ndim(); ++a)
    if (axes_[static_cast<std::size_t>(a)].kind == Placement::Partial) r.push_back(a);
  return r;
}
int64_t ShardingSpec::partial_count() const {
  int64_t c = 1;
  for (int a : partial_axes()) c *= mesh_[static_cast<std::size_t>(a)];
  return c;
}
std::optional<ReduceKind> ShardingSpec::reduce_kind() const {
  for (const auto& p : axes_)
    if (p.kind == Placement::Partial) return p.reduce;
  return std::nullopt;
}
bool ShardingSpec::is_block() const {
  for (int d = 0; d < rank(); ++d)
    if (!nested_block(*this, d, nullptr)) return false;
  return true;
}
int64_t ShardingSpec::max_local_elements() const {
  int64_t n = 1;
  for (int d = 0; d < rank(); ++d) n *= padded_size(d) / num_shards(d);
  return n;
}

ShardingSpec ShardingSpec::with_axis(int axis, Placement p) const {
  placement(axis);
  std::vector<Placement> q = axes_;
  q[static_cast<std::size_t>(axis)] = p;
  return ShardingSpec(shape_, mesh_, std::move(q), padding_);
}

ShardingSpec ShardingSpec::reduced() const {
  if (!has_partial()) return *this;
  std::vector<Placement> q = axes_;
  for (auto& p : q)
    if (p.kind == Placement::Partial) p = Placement::replicate();
  return ShardingSpec(shape_, mesh_, std::move(q), padding_);
}

bool ShardingSpec::operator<(const ShardingSpec& o) const {
  auto key = [](const ShardingSpec& s) {
    std::vector<int64_t> k(s.shape_);
    k.push_back(-1);
    k.insert(k.end(), s.mesh_.begin(), s.mesh_.end());
    k.push_back(-1);
    for (const auto& p : s.axes_) {
      k.push_back(p.kind);
      k.push_back(p.dim);
      k.push_back(p.stride);
      k.push_back(static_cast<int64_t>(p.reduce));
    }
    k.push_back(s.padding_);
    return k;
  };
  return key(*this) < key(o);
}

std::size_t ShardingSpec::hash() const {
  std::size_t h = 0xcbf29ce484222325ULL;
  auto mix = [&h](uint64_t v) {
    h = (h ^ v) * 0x100000001b3ULL;
    h ^= h >> 29;
  };
  for (int64_t x : shape_) mix(static_cast<uint64_t>(x));
  mix(0xff);
  for (int64_t x : mesh_) mix(static_cast<uint64_t>(x));
  for (const auto& p : axes_) {
    mix(static_cast<uint64_t>(p.kind) * 131 + static_cast<uint64_t>(p.reduce));
    mix(static_cast<uint64_t>(p.dim + 1));
    mix(static_cast<uint64_t>(p.stride));
  }
  mix(padding_);
  return h;
}

std::vector<ShardingSpec> enumerate_specs(const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh,
                                          const EnumerateOptions& opt) {
  // Per axis: R, P(sum), S(d, s) for every s with s * k | N' (block only: the nesting decides).
  std::vector<std::vector<Placement>> options(mesh.size());
  for (std::size_t a = 0; a < mesh.size(); ++a) {
    options[a].push_back(Placement::replicate());
    if (opt.partial && mesh[a] > 1) options[a].push_back(Placement::partial());
    for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
      if (!opt.strided || mesh[a] == 1) {
        options[a].push_back(Placement::shard(d, 0));
        continue;
      }
      const int64_t n = shape[static_cast<std::size_t>(d)];
      // Strides are validated against N' of the final spec; candidates are all divisors of n/k
      // (even case) — padded dims only get block (stride 0) candidates.
      if (n % mesh[a] != 0) {
        if (opt.allow_padding) options[a].push_back(Placement::shard(d, 0));
        continue;
      }
      for (int64_t s = 1; s <= n / mesh[a]; ++s)
        if ((n / mesh[a]) % s == 0) options[a].push_back(Placement::shard(d, s));
      if (opt.allow_padding) options[a].push_back(Placement::shard(d, 0));
    }
  }
  std::vector<ShardingSpec> out;
  std::vector<Placement> cur(mesh.size());
  std::function<void(std::size_t)> rec = [&](std::size_t a) {
    if (a == mesh.size()) {
      std::vector<Placement> p = cur;
      if (validate(shape, mesh, p, opt.allow_padding, nullptr)) {
        out.push_back(*ShardingSpec::try_make(shape, mesh, p, opt.allow_padding));
        WEFT_CHECK(out.size() <= opt.max_specs,
                   "more than {} sharding specs: raise max_specs or restrict the options", opt.max_specs);
      }
      return;
    }
    for (const Placement& p : options[a]) {
      cur[a] = p;
      rec(a + 1);
    }
  };
  rec(0);
  // Stride 0 (block mode) and an explicit stride can resolve to the same spec: dedupe.
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

}  // namespace weft::sharding
