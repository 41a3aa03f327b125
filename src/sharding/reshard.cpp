// Resharding search on one mesh (the transitions and costs are listed in reshard.hpp).
// A* (Dijkstra with an admissible heuristic) on the graph whose nodes are valid specs of the tensor and whose
// edges are single-axis collectives; key = (time, steps). Neighbours of a spec are generated per axis from
// the candidate placements of that axis (R, P, Shard(d, s) for the strides allowed).
#include "weft/sharding/reshard.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <queue>
#include <tuple>
#include <unordered_map>

#include "weft/cluster/alpha_beta.hpp"
#include "weft/core/error.hpp"

namespace weft::sharding {
namespace {

using Key = std::pair<double, int>;  // (time, steps)

struct Node {
  ShardingSpec spec;
  Key key;
  int parent;           // index into nodes, -1 for the source
  CollectiveKind kind;  // edge from parent
  int axis;
  double bytes, time;
};

// Fast path of the same A* for unpadded specs with all strides: a state is one option index per
// mesh axis (R, P, or Shard(d, s) with s*k | N_d), packed 8 bits per axis into a uint64. Two
// shard options of different axes on one dim are compatible iff their digits do not overlap;
// for unpadded dims that pairwise test plus s*k | N is exactly ShardingSpec's validity (nested
// digits imply that the product of the shard counts divides N), so no spec is built in the loop.
struct Opt {
  Placement::Kind kind;
  int dim;
  int64_t stride, k;
};

ReshardPlan search_fast(const ShardingSpec& A, const ShardingSpec& B,
                        const std::vector<cluster::AxisLink>& links, int elem, ReduceKind red,
                        std::size_t max_states) {
  const auto& shape = A.tensor_shape();
  const auto& mesh = A.mesh_shape();
  const std::size_t na = mesh.size();
  std::vector<std::vector<Opt>> opts(na);
  for (std::size_t a = 0; a < na; ++a) {
    opts[a].push_back({Placement::Replicate, -1, 0, mesh[a]});
    opts[a].push_back({Placement::Partial, -1, 0, mesh[a]});
    for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
      const int64_t n = shape[static_cast<std::size_t>(d)];
      if (mesh[a] == 1) {
        opts[a].push_back({Placement::Shard, d, 1, 1});
        continue;
      }
      if (n % mesh[a] != 0) continue;
      for (int64_t s = 1; s <= n / mesh[a]; ++s)
        if ((n / mesh[a]) % s == 0) opts[a].push_back({Placement::Shard, d, s, mesh[a]});
    }
    WEFT_ASSERT(opts[a].size() < 256, "too many shard options for the packed search");
  }
  auto compatible = [](const Opt& x, const Opt& y) {
    if (x.kind != Placement::Shard || y.kind != Placement::Shard || x.dim != y.dim || x.k == 1 || y.k == 1)
      return true;
    if (x.stride > y.stride) return x.stride % (y.stride * y.k) == 0;
    if (y.stride > x.stride) return y.stride % (x.stride * x.k) == 0;
    return false;
  };
  auto encode = [&](const ShardingSpec& s) {
    uint64_t st = 0;
    for (std::size_t a = 0; a < na; ++a) {
      const Placement& p = s.per_axis()[a];
      std::size_t i = 0;
      for (; i < opts[a].size(); ++i) {
        const Opt& o = opts[a][i];
        if (o.kind == p.kind && (p.kind != Placement::Shard || (o.dim == p.dim && o.stride == p.stride)))
          break;
      }
      WEFT_ASSERT(i < opts[a].size(), "placement missing from the option table");
      st |= static_cast<uint64_t>(i) << (8 * a);
    }
    return st;
  };
  auto at = [](uint64_t st, std::size_t a) { return static_cast<std::size_t>((st >> (8 * a)) & 0xff); };
  auto bytes_of = [&](uint64_t st) {
    std::vector<int64_t> K(shape.size(), 1);
    for (std::size_t a = 0; a < na; ++a) {
      const Opt& o = opts[a][at(st, a)];
      if (o.kind == Placement::Shard) K[static_cast<std::size_t>(o.dim)] *= o.k;
    }
    double b = elem;
    for (std::size_t d = 0; d < shape.size(); ++d) b *= static_cast<double>(shape[d] / K[d]);
    return b;
  };
  auto to_spec = [&](uint64_t st) {
    std::vector<Placement> p;
    for (std::size_t a = 0; a < na; ++a) {
      const Opt& o = opts[a][at(st, a)];
      p.push_back(o.kind == Placement::Shard     ? Placement::shard(o.dim, o.stride)
                  : o.kind == Placement::Partial ? Placement::partial(red)
                                                 : Placement::replicate());
    }
    return ShardingSpec(shape, mesh, std::move(p));
  };
  const uint64_t src = encode(A), dst = encode(B);
  double total = 1, devices = 1;
  for (int64_t x : shape) total *= static_cast<double>(x);
  for (int64_t x : mesh) devices *= static_cast<double>(x);
  // Heuristic: see the slow path below.
  std::vector<double> h_shard(na), h_partial(na);
  for (std::size_t a = 0; a < na; ++a) {
    const double lo = total / devices * elem, lo_a = lo * static_cast<double>(mesh[a]);
    h_shard[a] = std::min(cluster::all_gather_time(links[a], lo_a), cluster::all_to_all_time(links[a], lo));
    h_partial[a] =
        std::min(cluster::all_reduce_time(links[a], lo_a), cluster::reduce_scatter_time(links[a], lo_a));
  }
  auto h_of = [&](uint64_t st) {
    double h = 0;
    for (std::size_t a = 0; a < na; ++a) {
      const std::size_t i = at(st, a);
      if (mesh[a] > 1 && i != 0 && i != at(dst, a)) h += i == 1 ? h_partial[a] : h_shard[a];
    }
    return h;
  };
  struct N {
    Key key;
    uint64_t parent;
    CollectiveKind kind;
    int axis;
    double bytes, time;
    bool done;
  };
  std::unordered_map<uint64_t, N> nodes;
  using QE = std::tuple<double, double, int, uint64_t>;
  std::priority_queue<QE, std::vector<QE>, std::greater<QE>> pq;
  auto relax = [&](uint64_t s, Key k, uint64_t parent, CollectiveKind kind, int axis, double bytes,
                   double t) {
    auto [it, fresh] = nodes.try_emplace(s, N{k, parent, kind, axis, bytes, t, false});
    if (!fresh) {
      if (it->second.done || !(k < it->second.key)) return;
      it->second = N{k, parent, kind, axis, bytes, t, false};
    }
    const double h = h_of(s);
    pq.push({k.first + h, h, k.second, s});
  };
  relax(src, {0.0, 0}, src, CollectiveKind::LocalSlice, -1, 0, 0);
  std::size_t settled = 0;
  bool found = false;
  while (!pq.empty()) {
    const uint64_t cur = std::get<3>(pq.top());
    pq.pop();
    N& node = nodes.at(cur);
    if (node.done) continue;
    node.done = true;
    if (cur == dst) {
      found = true;
      break;
    }
    WEFT_CHECK(++settled <= max_states, "resharding search from '{}' to '{}' exceeded {} states",
               A.to_string(), B.to_string(), max_states);
    const Key k = node.key;
    const double b_cur = bytes_of(cur);
    for (std::size_t a = 0; a < na; ++a) {
      const std::size_t ci = at(cur, a);
      const Opt& c = opts[a][ci];
      for (std::size_t j = 0; j < opts[a].size(); ++j) {
        if (j == ci) continue;
        const Opt& o = opts[a][j];
        bool ok = true;
        for (std::size_t b = 0; b < na && ok; ++b)
          if (b != a) ok = compatible(o, opts[b][at(cur, b)]);
        if (!ok) continue;
        const uint64_t nxt = (cur & ~(uint64_t{0xff} << (8 * a))) | (static_cast<uint64_t>(j) << (8 * a));
        const auto& link = links[a];
        CollectiveKind kind;
        double bytes = 0, t = 0;
        if (mesh[a] == 1) {
          kind = CollectiveKind::LocalSlice;  // a size-1 axis: relabelling moves no data
        } else if (c.kind == Placement::Replicate) {
          kind = o.kind == Placement::Partial ? CollectiveKind::LocalPartial : CollectiveKind::LocalSlice;
        } else if (c.kind == Placement::Shard) {
          if (o.kind == Placement::Partial) continue;
          if (o.kind == Placement::Replicate) {
            kind = CollectiveKind::AllGather;
            bytes = bytes_of(nxt);
            t = cluster::all_gather_time(link, bytes);
          } else {
            kind = CollectiveKind::AllToAll;
            bytes = b_cur;
            t = cluster::all_to_all_time(link, bytes);
          }
        } else {
          bytes = b_cur;
          if (o.kind == Placement::Replicate) {
            kind = CollectiveKind::AllReduce;
            t = cluster::all_reduce_time(link, bytes);
          } else {
            kind = CollectiveKind::ReduceScatter;
            t = cluster::reduce_scatter_time(link, bytes);
          }
        }
        relax(nxt, {k.first + t, k.second + 1}, cur, kind, static_cast<int>(a), bytes, t);
      }
    }
  }
  WEFT_CHECK(found, "no resharding path from '{}' to '{}'", A.to_string(), B.to_string());
  ReshardPlan plan;
  std::vector<uint64_t> chain;
  for (uint64_t v = dst; v != src; v = nodes.at(v).parent) chain.push_back(v);
  std::reverse(chain.begin(), chain.end());
  uint64_t prev = src;
  for (uint64_t v : chain) {
    const N& n = nodes.at(v);
    plan.steps.push_back(ReshardStep{n.kind, n.axis, to_spec(prev), to_spec(v), n.bytes, n.time});
    prev = v;
  }
  plan.time = nodes.at(dst).key.first;
  return plan;
}

}  // namespace

const char* collective_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::AllGather: return "all-gather";
    case CollectiveKind::ReduceScatter: return "reduce-scatter";
    case CollectiveKind::AllReduce: return "all-reduce";
    case CollectiveKind::AllToAll: return "all-to-all";
    case CollectiveKind::LocalSlice: return "local-slice";
    case CollectiveKind::LocalPartial: return "local-partial";
  }
  return "?";
}

std::string ReshardStep::to_string() const {
  return fmt::format("{}@{}: {} -> {} ({} B, {:.3g} s)", collective_name(kind), axis, from.to_string(),
                     to.to_string(), bytes, time);
}

std::string ReshardPlan::to_string() const {
  if (steps.empty()) return "no-op (0 s)";
  std::vector<std::string> s;
  for (const auto& x : steps) s.push_back(x.to_string());
  return fmt::format("{}; total {:.3g} s", fmt::join(s, "; "), time);
}

ReshardPlanner::ReshardPlanner(std::vector<cluster::AxisLink> links, int element_bytes, ReshardOptions opt)
    : links_(std::move(links)), elem_(element_bytes), opt_(opt) {
  WEFT_CHECK(element_bytes >= 1, "element size must be >= 1 byte (got {})", element_bytes);
  WEFT_CHECK(opt_.max_states >= 1, "max_states must be >= 1");
}

const ReshardPlan& ReshardPlanner::plan(const ShardingSpec& from, const ShardingSpec& to) {
  auto key = std::make_pair(from, to);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  ReshardPlan p = search(from, to);
  ++searches_;
  return cache_.emplace(std::move(key), std::move(p)).first->second;
}

ReshardPlan ReshardPlanner::search(const ShardingSpec& A, const ShardingSpec& B) const {
  WEFT_CHECK(A.tensor_shape() == B.tensor_shape(), "resharding needs the same tensor shape ([{}] vs [{}])",
             fmt::join(A.tensor_shape(), ","), fmt::join(B.tensor_shape(), ","));
  WEFT_CHECK(A.mesh_shape() == B.mesh_shape(), "resharding on one mesh needs the same mesh shape ({} vs {})",
             fmt::join(A.mesh_shape(), "x"), fmt::join(B.mesh_shape(), "x"));
  WEFT_CHECK(static_cast<int>(links_.size()) == A.mesh_ndim(), "{} axis links for a {}-D mesh", links_.size(),
             A.mesh_ndim());
  for (int a = 0; a < A.mesh_ndim(); ++a)
    WEFT_CHECK(links_[static_cast<std::size_t>(a)].size == A.mesh_shape()[static_cast<std::size_t>(a)],
               "axis link {} has size {} but the mesh axis has {}", a,
               links_[static_cast<std::size_t>(a)].size, A.mesh_shape()[static_cast<std::size_t>(a)]);
  const auto rA = A.reduce_kind(), rB = B.reduce_kind();
  WEFT_CHECK(!rA || !rB || *rA == *rB, "cannot reshard a partial-{} spec into a partial-{} spec",
             *rA == ReduceKind::Sum ? "sum" : "max", *rB == ReduceKind::Sum ? "sum" : "max");
  const ReduceKind red = rA ? *rA : (rB ? *rB : ReduceKind::Sum);
  const bool padding = A.allow_padding() || B.allow_padding();
  if (opt_.packed && !padding && opt_.strided_intermediates && A.mesh_ndim() <= 8)
    return search_fast(A, B, links_, elem_, red, opt_.max_states);

  // Candidate shard placements per axis.
  const auto& shape = A.tensor_shape();
  const auto& mesh = A.mesh_shape();
  std::vector<std::vector<Placement>> shard_opts(mesh.size());
  for (std::size_t a = 0; a < mesh.size(); ++a) {
    for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
      std::vector<int64_t> strides{0};
      const int64_t n = shape[static_cast<std::size_t>(d)];
      if (opt_.strided_intermediates && n % mesh[a] == 0)
        for (int64_t s = 1; s <= n / mesh[a]; ++s)
          if ((n / mesh[a]) % s == 0) strides.push_back(s);
      for (const auto* S : {&A, &B})
        for (const auto& p : S->per_axis())
          if (p.kind == Placement::Shard && p.dim == d) strides.push_back(p.stride);
      std::sort(strides.begin(), strides.end());
      strides.erase(std::unique(strides.begin(), strides.end()), strides.end());
      for (int64_t s : strides) shard_opts[a].push_back(Placement::shard(d, s));
    }
  }

  auto bytes_of = [&](const ShardingSpec& s) { return static_cast<double>(s.max_local_elements()) * elem_; };
  std::vector<Node> nodes;
  std::unordered_map<ShardingSpec, int> index;
  // A*: h(spec) = sum over mesh axes a (size > 1) whose placement is Shard or Partial and differs
  // from the target's of a lower bound on the one collective on a that must leave it. With
  // lo = elements/devices × element size (no tile is smaller) and lo_a = lo × n_a (no tile is
  // smaller while axis a does not shard): leaving Shard costs >= min(all_gather(lo_a),
  // all_to_all(lo)) (all-gather is charged on the tile after, in which a no longer shards),
  // leaving Partial costs >= min(all_reduce(lo_a), reduce_scatter(lo_a)) (charged on the tile
  // before, in which a is partial). Times grow with bytes, distinct axes need distinct
  // collectives, so h is admissible; an edge changes only its own axis' term and by at most its
  // own cost, so h is consistent and the first pop of the target is optimal.
  double total_elems = 1, devices = 1;
  for (int64_t x : shape) total_elems *= static_cast<double>(x);
  for (int64_t x : mesh) devices *= static_cast<double>(x);
  std::vector<double> h_shard(mesh.size()), h_partial(mesh.size());
  for (std::size_t a = 0; a < mesh.size(); ++a) {
    const double lo = total_elems / devices * elem_, lo_a = lo * static_cast<double>(mesh[a]);
    h_shard[a] = std::min(cluster::all_gather_time(links_[a], lo_a), cluster::all_to_all_time(links_[a], lo));
    h_partial[a] =
        std::min(cluster::all_reduce_time(links_[a], lo_a), cluster::reduce_scatter_time(links_[a], lo_a));
  }
  auto h_of = [&](const ShardingSpec& s) {
    double h = 0;
    for (std::size_t a = 0; a < mesh.size(); ++a) {
      const Placement& p = s.per_axis()[a];
      if (mesh[a] > 1 && p.kind != Placement::Replicate && !(p == B.per_axis()[a]))
        h += p.kind == Placement::Partial ? h_partial[a] : h_shard[a];
    }
    return h;
  };
  // Queue entry: (f = g + h, h, steps, node). Among equal f, smaller h (deeper) first.
  using QE = std::tuple<double, double, int, int>;
  std::priority_queue<QE, std::vector<QE>, std::greater<QE>> pq;
  auto relax = [&](ShardingSpec s, Key k, int parent, CollectiveKind kind, int axis, double bytes,
                   double time) {
    auto it = index.find(s);
    if (it != index.end()) {
      Node& n = nodes[static_cast<std::size_t>(it->second)];
      if (!(k < n.key)) return;
      n.key = k;
      n.parent = parent;
      n.kind = kind;
      n.axis = axis;
      n.bytes = bytes;
      n.time = time;
      const double h = h_of(n.spec);
      pq.push({k.first + h, h, k.second, it->second});
      return;
    }
    int id = static_cast<int>(nodes.size());
    index.emplace(s, id);
    const double h = h_of(s);
    nodes.push_back(Node{std::move(s), k, parent, kind, axis, bytes, time});
    pq.push({k.first + h, h, k.second, id});
  };
  // Normalise the source's padding flag so both ends live in one graph.
  ShardingSpec src(A.tensor_shape(), A.mesh_shape(), A.per_axis(), padding);
  ShardingSpec dst(B.tensor_shape(), B.mesh_shape(), B.per_axis(), padding);
  relax(src, {0.0, 0}, -1, CollectiveKind::LocalSlice, -1, 0, 0);
  std::size_t settled = 0;
  int goal = -1;
  std::vector<char> done;
  while (!pq.empty()) {
    const int id = std::get<3>(pq.top());
    pq.pop();
    if (static_cast<std::size_t>(id) < done.size() && done[static_cast<std::size_t>(id)]) continue;
    if (done.size() < nodes.size()) done.resize(nodes.size(), 0);
    done[static_cast<std::size_t>(id)] = 1;
    if (nodes[static_cast<std::size_t>(id)].spec == dst) {
      goal = id;
      break;
    }
    WEFT_CHECK(++settled <= opt_.max_states, "resharding search from '{}' to '{}' exceeded {} states",
               A.to_string(), B.to_string(), opt_.max_states);
    const ShardingSpec cur = nodes[static_cast<std::size_t>(id)].spec;
    const Key k = nodes[static_cast<std::size_t>(id)].key;
    const double b_cur = bytes_of(cur);
    auto go_free = [&](int a, Placement q, auto cost_fn) {
      std::vector<Placement> v = cur.per_axis();
      v[static_cast<std::size_t>(a)] = q;
      auto nxt = ShardingSpec::try_make(shape, mesh, std::move(v), padding);
      if (!nxt || *nxt == cur) return;  // invalid (strides overlap with other axes) or no change
      auto [bytes, t] = cost_fn(*nxt);
      relax(std::move(*nxt), {k.first + t, k.second + 1}, id, CollectiveKind::LocalSlice, a, bytes, t);
    };
    for (int a = 0; a < cur.mesh_ndim(); ++a) {
      const auto& link = links_[static_cast<std::size_t>(a)];
      const Placement& p = cur.placement(a);
      if (mesh[static_cast<std::size_t>(a)] == 1) {  // a size-1 axis: relabelling moves no data
        auto free = [](const ShardingSpec&) { return std::pair{0.0, 0.0}; };
        if (p.kind != Placement::Replicate) go_free(a, Placement::replicate(), free);
        if (p.kind != Placement::Partial) go_free(a, Placement::partial(red), free);
        for (const auto& q : shard_opts[static_cast<std::size_t>(a)]) go_free(a, q, free);
        continue;
      }
      auto go = [&](Placement q, CollectiveKind kind, auto cost_fn) {
        std::vector<Placement> v = cur.per_axis();
        v[static_cast<std::size_t>(a)] = q;
        auto nxt = ShardingSpec::try_make(shape, mesh, std::move(v), padding);
        if (!nxt || *nxt == cur) return;
        auto [bytes, t] = cost_fn(*nxt);
        relax(std::move(*nxt), {k.first + t, k.second + 1}, id, kind, a, bytes, t);
      };
      if (p.kind == Placement::Shard) {
        go(Placement::replicate(), CollectiveKind::AllGather, [&](const ShardingSpec& n) {
          const double b = bytes_of(n);
          return std::pair{b, cluster::all_gather_time(link, b)};
        });
        for (const auto& q : shard_opts[static_cast<std::size_t>(a)])
          go(q, CollectiveKind::AllToAll, [&](const ShardingSpec&) {
            return std::pair{b_cur, cluster::all_to_all_time(link, b_cur)};
          });
      } else if (p.kind == Placement::Partial) {
        go(Placement::replicate(), CollectiveKind::AllReduce, [&](const ShardingSpec&) {
          return std::pair{b_cur, cluster::all_reduce_time(link, b_cur)};
        });
        for (const auto& q : shard_opts[static_cast<std::size_t>(a)])
          go(q, CollectiveKind::ReduceScatter, [&](const ShardingSpec&) {
            return std::pair{b_cur, cluster::reduce_scatter_time(link, b_cur)};
          });
      } else {
        for (const auto& q : shard_opts[static_cast<std::size_t>(a)])
          go(q, CollectiveKind::LocalSlice, [&](const ShardingSpec&) { return std::pair{0.0, 0.0}; });
        go(Placement::partial(red), CollectiveKind::LocalPartial, [&](const ShardingSpec&) {
          return std::pair{0.0, 0.0};
        });
      }
    }
  }
  WEFT_CHECK(goal >= 0, "no resharding path from '{}' to '{}'", A.to_string(), B.to_string());
  ReshardPlan plan;
  for (int v = goal; nodes[static_cast<std::size_t>(v)].parent >= 0;
       v = nodes[static_cast<std::size_t>(v)].parent) {
    const Node& n = nodes[static_cast<std::size_t>(v)];
    plan.steps.push_back(
        ReshardStep{n.kind, n.axis, nodes[static_cast<std::size_t>(n.parent)].spec, n.spec, n.bytes, n.time});
  }
  std::reverse(plan.steps.begin(), plan.steps.end());
  plan.time = nodes[static_cast<std::size_t>(goal)].key.first;
  return plan;
}

ReshardPlan reshard_on_mesh(const ShardingSpec& from, const ShardingSpec& to,
                            const std::vector<cluster::AxisLink>& links, int element_bytes,
                            const ReshardOptions& opt) {
  ReshardPlanner p(links, element_bytes, opt);
  return p.plan(from, to);
}

}  // namespace weft::sharding
