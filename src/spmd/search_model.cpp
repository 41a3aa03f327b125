// The SPMD search's model (search_model.hpp): the graph as nodes with strategy lists shared by
// classes of identical nodes (build_model), Rhino's strided candidates, and the StrategyProblem
// built from it — node costs, edge costs priced once per class pair, the shared-resharding pairs,
// the memory rows over the maximal live sets and the explanation of a memory limit that cannot be
// met.
#include "search_model.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <unordered_map>

#include "weft/core/error.hpp"
#include "weft/core/units.hpp"
#include "weft/cost/op_cost.hpp"
#include "weft/cost/view_ops.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/spmd/coarsen.hpp"

namespace weft::spmd {

std::shared_ptr<ReshardCache> make_reshard_cache() { return std::make_shared<ReshardCache>(); }

namespace detail {

using ir::is_state_leaf;

// Results that must reach the layout of a state leaf by the end of the step, as (result, leaf):
// the updated states (ir::updated_states), and a parameter's gradient that is itself a graph
// output (Optimizer::None: no update reads it) must end reduced in its parameter's layout, as an
// update would need it — else a data-parallel step would leave it as free unreduced partial sums.
// One list for the search's edges and the evaluator's charges.
std::vector<std::pair<ir::TensorId, ir::TensorId>> carried_results(const ir::Graph& g) {
  std::vector<std::pair<ir::TensorId, ir::TensorId>> out = ir::updated_states(g);
  for (ir::TensorId t : std::set<ir::TensorId>(g.outputs().begin(), g.outputs().end())) {
    const auto& info = g.tensor(t);
    if (info.role != ir::Role::Gradient || info.producer == ir::kNoOp) continue;
    const auto of = g.grad_of(t);
    if (!of || g.tensor(*of).role != ir::Role::Parameter || !is_state_leaf(g.tensor(*of))) continue;
    if (g.tensor(*of).shape != info.shape) continue;
    out.emplace_back(t, *of);
  }
  return out;
}

cluster::DeviceSpec mesh_device(const cluster::Cluster& c, const cluster::DeviceMesh& mesh) {
  const auto& first = c.device(mesh.device_ids().at(0)).spec;
  for (int id : mesh.device_ids())
    WEFT_CHECK(c.device(id).spec.kind == first.kind,
               "spmd_search: the mesh mixes device kinds ({} and {}); SPMD needs one kind per mesh",
               first.kind, c.device(id).spec.kind);
  return first;
}

Model build_model(const ir::Graph& g, const cluster::Cluster& cl, const cluster::DeviceMesh& mesh,
                  const std::optional<cluster::DeviceSpec>& device, const StopToken& stop) {
  Model m{g, mesh.shape(), mesh.axis_names(), device ? *device : mesh_device(cl, mesh)};
  m.n_ops = static_cast<int>(g.ops().size());
  m.view = cost::view_ops(g);
  const int nt = static_cast<int>(g.tensors().size());
  m.node_of_tensor.assign(nt, -1);
  m.slot_of_tensor.assign(nt, 0);
  for (int o = 0; o < m.n_ops; ++o)
    for (int i = 0; i < static_cast<int>(g.op(o).outputs.size()); ++i) {
      m.node_of_tensor[g.op(o).outputs[i]] = o;
      m.slot_of_tensor[g.op(o).outputs[i]] = i;
    }
  for (int o = 0; o < m.n_ops; ++o)
    for (ir::TensorId t : g.op(o).inputs)
      if (m.node_of_tensor[t] < 0) {
        m.node_of_tensor[t] = m.num_nodes();
        m.leaf_tensor.push_back(t);
      }
  // Strategies depend only on the index map (factors with sizes and kinds) and the operand and
  // result shapes: structurally identical ops (the repeated layers) share one enumeration (and
  // start in one list class).
  m.op_strats.resize(m.n_ops);
  std::unordered_map<std::string, int> first_of;
  m.list_class.assign(m.num_nodes(), 0);
  for (int o = 0; o < m.n_ops; ++o) {
    stop.throw_if_cancelled("spmd_search");
    const auto& op = g.op(o);
    std::string key = op.index_map.to_string();
    for (const auto& f : op.index_map.factors) key += fmt::format(",{}", f.size);
    // ... and, for the compute cost shared by a class, the arithmetic and the dtypes.
    key += fmt::format(";{};{};{}", op.index_map.flops_per_point, fmt::join(op.index_map.work_factors, ","),
                       static_cast<int>(m.view[o]));
    for (ir::TensorId t : op.inputs)
      key += fmt::format("|{}:{}", fmt::join(g.tensor(t).shape, ","), dtype_name(g.tensor(t).dtype));
    key += "->";
    for (ir::TensorId t : op.outputs)
      key += fmt::format("|{}:{}", fmt::join(g.tensor(t).shape, ","), dtype_name(g.tensor(t).dtype));
    auto [it, fresh] = first_of.try_emplace(std::move(key), o);
    m.op_strats[o] =
        fresh ? SharedList<OpStrategy>(enumerate_strategies(g, op, m.mesh)) : m.op_strats[it->second];
    m.list_class[o] = it->second;
    WEFT_ASSERT(!m.op_strats[o].empty(), "the all-replicated strategy always exists");
  }
  sharding::EnumerateOptions eo;
  eo.strided = false;
  eo.partial = false;
  std::map<std::vector<std::int64_t>, int> leaf_of_shape;  // first leaf node of each shape
  for (ir::TensorId t : m.leaf_tensor) {
    const int v = m.n_ops + static_cast<int>(m.leaf_specs.size());
    auto [it, fresh] = leaf_of_shape.try_emplace(g.tensor(t).shape, v);
    m.list_class[v] = it->second;
    if (!fresh) {
      m.leaf_specs.push_back(m.leaf_specs[it->second - m.n_ops]);
      continue;
    }
    // A shard over a mesh axis of size 1 is the replicated layout under another name: drop it.
    auto specs = enumerate_specs(g.tensor(t).shape, m.mesh, eo);
    std::erase_if(specs, [&](const ShardingSpec& sp) {
      for (std::size_t a = 0; a < m.mesh.size(); ++a)
        if (m.mesh[a] == 1 && sp.per_axis()[a].kind != sharding::Placement::Replicate) return true;
      return false;
    });
    m.leaf_specs.emplace_back(std::move(specs));
  }
  m.next_class = m.num_nodes();
  for (int o = 0; o < m.n_ops; ++o)
    for (int i = 0; i < static_cast<int>(g.op(o).inputs.size()); ++i) {
      const ir::TensorId t = g.op(o).inputs[i];
      m.uses.push_back({t, m.node_of_tensor[t], m.slot_of_tensor[t], o, i});
    }
  // Loop-carried edges (carried_results): updated states and a None-optimizer graph's gradients.
  for (const auto& [t, leaf] : carried_results(g))
    m.uses.push_back({t, m.node_of_tensor[t], m.slot_of_tensor[t], m.node_of_tensor[leaf], -1});
  return m;
}

// Rhino §4.3.3, with comm-free merging read as: a stride other than the maximum is a candidate
// only when it makes some edge free. Repeatedly, for each edge whose producer makes a spec the
// consumer cannot take for free (or the reverse), add the restrided variant of a strategy that
// makes the two equal. Strategies with default strides are all kept.
// The outcome of one edge depends only on the two strategy lists (and the ops' structure, the
// same within a class), so it is computed once per (producer class, consumer class, slots) and
// replayed on every other edge between nodes of those classes.
// Candidates are optional (every default-stride strategy is kept): past the deadline the
// generation stops where it is, leaving consistent lists and classes.
int generate_strided_candidates(Model& m, const StopToken& stop, int rounds) {
  int added = 0;
  struct Outcome {
    int producer_class, consumer_class;
    int added;
    SharedList<OpStrategy> producer_ops, consumer_ops;  // the lists after the edge (ops)
    SharedList<ShardingSpec> producer_leaf;             // the list after the edge (leaf producer)
  };
  std::map<std::array<int, 4>, Outcome> memo;
  // After computing an edge: remember the lists it left and move a grown list to a new class.
  auto record_outcome = [&](const Use& u, const std::array<int, 4>& key, int np, int nc) {
    Outcome oc{m.list_class[u.producer], m.list_class[u.consumer], 0, {}, {}, {}};
    if (m.num_strategies(u.producer) > np) {
      oc.added += m.num_strategies(u.producer) - np;
      oc.producer_class = m.next_class++;
    }
    if (m.num_strategies(u.consumer) > nc) {
      oc.added += m.num_strategies(u.consumer) - nc;
      oc.consumer_class = m.next_class++;
    }
    if (u.producer < m.n_ops)
      oc.producer_ops = m.op_strats[u.producer];
    else
      oc.producer_leaf = m.leaf_specs[u.producer - m.n_ops];
    if (u.consumer < m.n_ops) oc.consumer_ops = m.op_strats[u.consumer];
    m.list_class[u.producer] = oc.producer_class;
    m.list_class[u.consumer] = oc.consumer_class;
    memo.emplace(key, std::move(oc));
  };
  for (int round = 0; round < rounds; ++round) {
    int before = added;
    for (const Use& u : m.uses) {
      stop.throw_if_cancelled("spmd_search");
      if (stop.expired()) return added;
      const std::array<int, 4> key{m.list_class[u.producer], u.out_slot, m.list_class[u.consumer], u.in_slot};
      if (auto hit = memo.find(key); hit != memo.end()) {
        const Outcome& oc = hit->second;
        if (u.producer < m.n_ops)
          m.op_strats[u.producer] = oc.producer_ops;
        else
          m.leaf_specs[u.producer - m.n_ops] = oc.producer_leaf;
        if (u.consumer < m.n_ops) m.op_strats[u.consumer] = oc.consumer_ops;
        added += oc.added;
        m.list_class[u.producer] = oc.producer_class;
        m.list_class[u.consumer] = oc.consumer_class;
        continue;
      }
      const int np = m.num_strategies(u.producer), nc = m.num_strategies(u.consumer);
      // Only non-block, non-partial specs can ask for a restride; they are few, so they are
      // collected (copied: the strategy lists grow below) and matched by linear scans instead
      // of hashing every spec of every edge.
      auto distinct_nonblock = [](int count, auto&& spec_at) {
        std::vector<ShardingSpec> out;
        for (int s = 0; s < count; ++s) {
          const ShardingSpec& sp = spec_at(s);
          if (sp.is_block() || sp.has_partial()) continue;
          if (std::find(out.begin(), out.end(), sp) == out.end()) out.push_back(sp);
        }
        return out;
      };
      auto produces = [&](const ShardingSpec& sp) {
        for (int s = 0; s < m.num_strategies(u.producer); ++s)
          if (m.produced(u.producer, s, u.out_slot) == sp) return true;
        return false;
      };
      auto requires_ = [&](const ShardingSpec& sp) {
        for (int s = 0; s < m.num_strategies(u.consumer); ++s)
          if (m.required(u, s) == sp) return true;
        return false;
      };
      const auto req_nb = distinct_nonblock(m.num_strategies(u.consumer),
                                            [&](int s) -> const ShardingSpec& { return m.required(u, s); });
      // consumer wants a non-block spec nobody produces -> restride a producer strategy
      for (const auto& spec : req_nb) {
        if (produces(spec)) continue;
        if (u.producer >= m.n_ops) {
          m.leaf_specs[u.producer - m.n_ops].push_back(spec);
          ++added;
          continue;
        }
        for (int p = 0; p < static_cast<int>(m.op_strats[u.producer].size()); ++p) {
          auto v = restride_to(m.g, m.g.op(u.producer), m.mesh, m.op_strats[u.producer][p], true, u.out_slot,
                               spec);
          if (v && std::find(m.op_strats[u.producer].begin(), m.op_strats[u.producer].end(), *v) ==
                       m.op_strats[u.producer].end()) {
            m.op_strats[u.producer].push_back(std::move(*v));
            ++added;
            break;
          }
        }
      }
      // producer makes a non-block spec no consumer strategy takes -> restride a consumer strategy
      if (u.in_slot < 0) {
        record_outcome(u, key, np, nc);
        continue;
      }
      const auto prod_nb = distinct_nonblock(m.num_strategies(u.producer), [&](int s) -> const ShardingSpec& {
        return m.produced(u.producer, s, u.out_slot);
      });
      for (const auto& spec : prod_nb) {
        if (requires_(spec)) continue;
        for (int c = 0; c < static_cast<int>(m.op_strats[u.consumer].size()); ++c) {
          auto v = restride_to(m.g, m.g.op(u.consumer), m.mesh, m.op_strats[u.consumer][c], false, u.in_slot,
                               spec);
          if (v && std::find(m.op_strats[u.consumer].begin(), m.op_strats[u.consumer].end(), *v) ==
                       m.op_strats[u.consumer].end()) {
            m.op_strats[u.consumer].push_back(std::move(*v));
            ++added;
            break;
          }
        }
      }
      record_outcome(u, key, np, nc);
    }
    if (added == before) break;
  }
  return added;
}

constexpr double kTieBreakPerByte = 1e-15;

// The problem without the shared-resharding pairs (each node's own strategies, which come first).
StrategyProblem without_pairs(const StrategyProblem& p, const Model& m) {
  StrategyProblem q;
  q.names = p.names;
  q.memory_limit = p.memory_limit;
  q.node_cost.resize(p.node_cost.size());
  for (int v = 0; v < p.num_nodes(); ++v)
    q.node_cost[v].assign(p.node_cost[v].begin(), p.node_cost[v].begin() + m.num_base(v));
  for (const EdgeCost& e : p.edges) {
    const int su = m.num_base(e.u), sv = m.num_base(e.v);
    const auto full = p.node_cost[e.v].size();
    EdgeCost f{e.u, e.v, std::vector<double>(static_cast<std::size_t>(su) * sv)};
    for (int s = 0; s < su; ++s)
      for (int t = 0; t < sv; ++t)
        f.cost[static_cast<std::size_t>(s) * sv + t] = e.cost[static_cast<std::size_t>(s) * full + t];
    q.edges.push_back(std::move(f));
  }
  for (const MemoryRow& r : p.memory_rows) {
    MemoryRow x{r.label, r.constant, {}};
    for (const MemoryTerm& t : r.terms)
      x.terms.push_back({t.node, std::vector<double>(t.bytes.begin(), t.bytes.begin() + m.num_base(t.node))});
    q.memory_rows.push_back(std::move(x));
  }
  return q;
}

namespace {

// Shared resharding (SearchOptions::shared_resharding), as pairs on the producer so that the
// problem stays pairwise and every solver (O3's ILP, O2's segments, elimination) sees it as more
// strategies of one node. Per node, the result with the most uses (two or more): the layouts a
// that two or more of those uses can require are the candidates, the largest possible saving
// first ((uses that can need it − 1) × the dearest resharding to it), at most per_tensor; each strategy s
// whose result is not a and cannot become a for free gets a pair (s, a) appended to the node's strategies:
// node cost + R(P_s -> a) (communication, kept in out_conv), and on the edges of the shared result's uses a
// reader strategy requiring exactly a costs 0 while the others keep R(P_s -> r). Every other edge of the node
// copies s's row or column. (s, none) is s itself, so no plan gets costlier. The memory model counts
// resharded copies nowhere (as for per-reader resharding): a pair holds the bytes of s.
void share_reshardings(Built& b, Model& m, const std::vector<int>& edge_use,
                       const std::vector<std::vector<std::vector<int>>>& out_ids,
                       const std::vector<std::vector<std::vector<int>>>& in_ids,
                       const std::vector<const ShardingSpec*>& spec_by_id,
                       const std::function<double(int, int, int)>& spec_time, int per_tensor) {
  auto& p = b.problem;
  const int n = m.num_nodes();
  m.pair_base.assign(n, {});
  m.pair_layout.assign(n, {});
  m.shared_slot.assign(n, -1);
  std::vector<std::vector<int>> edges_of(n);
  for (int e = 0; e < static_cast<int>(p.edges.size()); ++e) {
    edges_of[p.edges[e].u].push_back(e);
    edges_of[p.edges[e].v].push_back(e);
  }
  std::vector<std::vector<int>> uses_of(n);  // use indices by producer
  for (int ui = 0; ui < static_cast<int>(m.uses.size()); ++ui) uses_of[m.uses[ui].producer].push_back(ui);
  // The spec id a use requires under its consumer's (problem) strategy t.
  auto req_id = [&](const Use& u, int t) {
    const int bt = m.base(u.consumer, t);
    return u.in_slot >= 0 ? in_ids[u.consumer][u.in_slot][bt] : out_ids[u.consumer][0][bt];
  };
  std::map<int, int> layout_of_id;  // spec id -> index in m.shared_layouts
  for (int v = 0; v < n; ++v) {
    if (per_tensor <= 0 || uses_of[v].size() < 2) continue;
    std::map<int, int> per_slot;
    for (int ui : uses_of[v]) ++per_slot[m.uses[ui].out_slot];
    int slot = -1, most = 1;
    for (const auto& [k, c] : per_slot)
      if (c > most) slot = k, most = c;
    if (slot < 0) continue;
    // Candidate layouts: required by two or more uses.
    std::map<int, int> readers;  // spec id -> uses that can require it
    for (int ui : uses_of[v]) {
      const Use& u = m.uses[ui];
      if (u.out_slot != slot) continue;
      std::set<int> ids;
      for (int t = 0; t < m.num_strategies(u.consumer); ++t) ids.insert(req_id(u, t));
      for (int id : ids) ++readers[id];
    }
    const ir::TensorId t =
        v < m.n_ops ? m.g.op(v).outputs[static_cast<std::size_t>(slot)] : m.leaf_tensor[v - m.n_ops];
    const int elem = dtype_size(m.g.tensor(t).dtype);
    const int nb = m.num_base(v);
    const auto& fid = out_ids[v][static_cast<std::size_t>(slot)];
    // The most a layout can save: every other reader that can need it spared the dearest resharding
    // to it. Layouts every strategy makes for free save nothing.
    std::vector<std::pair<double, int>> cands;  // (-saving, spec id)
    for (const auto& [id, c] : readers) {
      if (c < 2) continue;
      double dearest = 0;
      for (int s = 0; s < nb; ++s)
        if (!std::isinf(p.node_cost[v][s])) dearest = std::max(dearest, spec_time(fid[s], id, elem));
      if (dearest > 0) cands.push_back({-(c - 1) * dearest, id});
    }
    std::sort(cands.begin(), cands.end());
    if (static_cast<int>(cands.size()) > per_tensor) cands.resize(static_cast<std::size_t>(per_tensor));
    std::vector<int> base, layout, layout_id;
    std::vector<double> extra;
    for (const auto& [neg, a] : cands)
      for (int s = 0; s < nb; ++s) {
        if (std::isinf(p.node_cost[v][s]) || fid[s] == a) continue;
        const double r = spec_time(fid[s], a, elem);
        if (!(r > 0)) continue;
        auto [it, fresh] = layout_of_id.try_emplace(a, static_cast<int>(m.shared_layouts.size()));
        if (fresh) m.shared_layouts.push_back(*spec_by_id[a]);
        base.push_back(s), layout.push_back(it->second), layout_id.push_back(a), extra.push_back(r);
      }
    if (base.empty()) continue;
    const int np = static_cast<int>(base.size());
    m.shared_slot[v] = slot;
    m.pair_base[v] = base;
    m.pair_layout[v] = layout;
    auto& conv = b.out_conv[v];
    if (conv.empty()) conv.assign(static_cast<std::size_t>(nb), 0.0);
    for (int i = 0; i < np; ++i) {
      p.node_cost[v].push_back(p.node_cost[v][base[i]] + extra[i]);
      conv.push_back(conv[base[i]] + extra[i]);
    }
    for (int e : edges_of[v]) {
      EdgeCost& ed = p.edges[e];
      const int su = static_cast<int>(p.node_cost[ed.u].size()),
                sv = static_cast<int>(p.node_cost[ed.v].size());
      std::vector<double> c(static_cast<std::size_t>(su) * sv);
      if (ed.u == v) {  // rows grew
        const int old = su - np;
        const Use& u = m.uses[edge_use[e]];
        const bool on_shared = u.producer == v && u.out_slot == slot;
        for (int r = 0; r < su; ++r) {
          const int src = r < old ? r : base[r - old];
          for (int q = 0; q < sv; ++q)
            c[static_cast<std::size_t>(r) * sv + q] =
                r >= old && on_shared && req_id(u, q) == layout_id[r - old]
                    ? 0.0
                    : ed.cost[static_cast<std::size_t>(src) * sv + q];
        }
      } else {  // columns grew
        const int old = sv - np;
        for (int r = 0; r < su; ++r)
          for (int q = 0; q < sv; ++q)
            c[static_cast<std::size_t>(r) * sv + q] =
                ed.cost[static_cast<std::size_t>(r) * old + (q < old ? q : base[q - old])];
      }
      ed.cost = std::move(c);
    }
  }
}

}  // namespace

// Past the deadline the problem is still built (a plan needs its costs); a cancel throws.
Built build_problem(Model& m, ReshardCosts& rc, double memory_limit, const SearchOptions& opt,
                    const StopToken& stop) {
  Built b;
  auto& p = b.problem;
  // A rebuild (explain_memory) starts from the strategy lists alone.
  m.pair_base.clear(), m.pair_layout.clear(), m.shared_slot.clear(), m.shared_layouts.clear();
  const int n = m.num_nodes();
  p.names.resize(n);
  p.node_cost.resize(n);
  std::unordered_map<int, int> first_op_of_class;  // ops of one class cost the same per strategy
  for (int v = 0; v < n; ++v) {
    p.names[v] = m.node_name(v);
    if (v < m.n_ops) {
      if (auto [it, fresh] = first_op_of_class.try_emplace(m.list_class[v], v); !fresh) {
        p.node_cost[v] = p.node_cost[it->second];
        continue;
      }
    }
    p.node_cost[v].assign(m.num_strategies(v), 0.0);
    // Leaves: a negligible cost per byte sharded away (1e-9 s per MB) breaks exact ties toward
    // replicated layouts. Under α-β, reduce-scatter + all-gather costs exactly one all-reduce,
    // so ZeRO-sharding a parameter or optimizer state that memory does not force is a tie; in
    // practice it adds collective launches, so the tie goes to replication.
    if (v >= m.n_ops) {
      const auto& info = m.g.tensor(m.leaf_tensor[v - m.n_ops]);
      for (int s = 0; s < m.num_strategies(v); ++s)
        p.node_cost[v][s] = kTieBreakPerByte * (static_cast<double>(info.bytes()) -
                                                spec_bytes(m.leaf_specs[v - m.n_ops][s], info.dtype));
    }
    if (v < m.n_ops)
      for (int s = 0; s < m.num_strategies(v); ++s)
        p.node_cost[v][s] = cost::compute_time(m.g, m.g.op(v), m.device, m.op_strats[v][s].factor_shards,
                                               m.view[v] != 0, m.op_strats[v][s].factor_stride);
  }
  // A named tensor of fixed_specs / output_specs: its id, its node and the spec asked for.
  auto named = [&](const std::string& name, const std::string& text, const char* option) {
    auto t = m.g.find_tensor(name);
    WEFT_CHECK(t.has_value(), "spmd_search: {} names unknown tensor '{}'", option, name);
    const int v = m.node_of_tensor[*t];
    WEFT_CHECK(v >= 0, "spmd_search: {} tensor '{}' is not used by any op", option, name);
    return std::make_tuple(*t, v, ShardingSpec::parse(text, m.g.tensor(*t).shape, m.mesh));
  };
  // Forced specs.
  for (const auto& [name, text] : opt.fixed_specs) {
    const auto [ti, v, want] = named(name, text, "fixed_specs");
    bool any = false;
    for (int s = 0; s < m.num_strategies(v); ++s) {
      if (m.produced(v, s, m.slot_of_tensor[ti]) == want)
        any = true;
      else
        p.node_cost[v][s] = kInfCost;
    }
    if (!any && v >= m.n_ops) {
      m.leaf_specs[v - m.n_ops].push_back(want);
      m.list_class[v] = m.next_class++;  // its own list now
      p.node_cost[v].push_back(0.0);
      any = true;
    }
    WEFT_CHECK(any, "spmd_search: no strategy of '{}' produces '{}' with spec {}", m.node_name(v), name,
               text);
  }
  // Required output layouts: every strategy of the producer pays the resharding to the layout.
  b.out_conv.assign(n, {});
  for (const auto& [name, text] : opt.output_specs) {
    const auto [ti, v, want] = named(name, text, "output_specs");
    const int elem = dtype_size(m.g.tensor(ti).dtype);
    auto& conv = b.out_conv[v];
    conv.resize(static_cast<std::size_t>(m.num_strategies(v)), 0.0);
    for (int s = 0; s < m.num_strategies(v); ++s) {
      if (std::isinf(p.node_cost[v][s])) continue;
      const double c = rc.time(m.produced(v, s, v < m.n_ops ? m.slot_of_tensor[ti] : 0), want, elem);
      conv[s] += c;
      p.node_cost[v][s] += c;
    }
  }
  // Edges: matrix over (producer strategy, consumer strategy), resharding time of the distinct
  // spec pairs. Every spec is interned once (an id per distinct spec over the whole model), so
  // an edge only hashes integers and each distinct (from, to, element size) is priced once per
  // search: deep graphs repeat the same few hundred specs over thousands of edges.
  struct PtrHash {
    std::size_t operator()(const ShardingSpec* x) const { return x->hash(); }
  };
  struct PtrEq {
    bool operator()(const ShardingSpec* a, const ShardingSpec* c) const { return *a == *c; }
  };
  std::unordered_map<const ShardingSpec*, int, PtrHash, PtrEq> intern;
  std::vector<const ShardingSpec*> spec_by_id;
  auto id_of = [&](const ShardingSpec& sp) {
    auto [it, fresh] = intern.try_emplace(&sp, static_cast<int>(spec_by_id.size()));
    if (fresh) spec_by_id.push_back(&sp);
    return it->second;
  };
  // out_ids[v][slot][s] / in_ids[o][slot][s]: spec ids of results (leaves: slot 0) and operands.
  std::vector<std::vector<std::vector<int>>> out_ids(n), in_ids(m.n_ops);
  std::unordered_map<int, int> first_of_class;
  for (int v = 0; v < n; ++v) {
    const int ns = m.num_strategies(v);
    if (auto [it, fresh] = first_of_class.try_emplace(m.list_class[v], v); !fresh) {
      // Same class = the same strategy list: the same spec ids.
      out_ids[v] = out_ids[it->second];
      if (v < m.n_ops) in_ids[v] = in_ids[it->second];
      continue;
    }
    const int nout = v < m.n_ops ? static_cast<int>(m.g.op(v).outputs.size()) : 1;
    out_ids[v].assign(nout, std::vector<int>(ns));
    for (int s = 0; s < ns; ++s)
      for (int k = 0; k < nout; ++k) out_ids[v][k][s] = id_of(m.produced(v, s, k));
    if (v >= m.n_ops) continue;
    const int nin = static_cast<int>(m.g.op(v).inputs.size());
    in_ids[v].assign(nin, std::vector<int>(ns));
    for (int s = 0; s < ns; ++s)
      for (int k = 0; k < nin; ++k) in_ids[v][k][s] = id_of(m.op_strats[v][s].inputs[k]);
  }
  std::unordered_map<std::uint64_t, double> pair_time;
  auto spec_time = [&](int from, int to, int elem) {  // resharding time between two interned specs
    const std::uint64_t key = (static_cast<std::uint64_t>(from) << 36) |
                              (static_cast<std::uint64_t>(to) << 8) | static_cast<std::uint64_t>(elem);
    auto it = pair_time.find(key);
    if (it == pair_time.end())
      it = pair_time.emplace(key, from == to ? 0.0 : rc.time(*spec_by_id[from], *spec_by_id[to], elem)).first;
    return it->second;
  };
  std::vector<int> local_f(spec_by_id.size(), -1), local_t(spec_by_id.size(), -1);
  // An edge's matrix depends only on the two lists' classes, the slots and the element size:
  // edges between nodes of the same classes (the repeated layers) copy the first one's.
  std::map<std::array<int, 5>, int> edge_of_key;  // -> index in p.edges, -1 = all zero
  std::vector<int> edge_use;                      // per edge: its index in m.uses
  for (std::size_t ui = 0; ui < m.uses.size(); ++ui) {
    const Use& u = m.uses[ui];
    stop.throw_if_cancelled("spmd_search");
    const int su = m.num_strategies(u.producer), sv = m.num_strategies(u.consumer);
    const int elem = dtype_size(m.g.tensor(u.tensor).dtype);
    const std::array<int, 5> ekey{m.list_class[u.producer], u.out_slot, m.list_class[u.consumer], u.in_slot,
                                  elem};
    if (auto hit = edge_of_key.find(ekey); hit != edge_of_key.end()) {
      if (hit->second >= 0) {
        p.edges.push_back({u.producer, u.consumer, p.edges[hit->second].cost});
        edge_use.push_back(static_cast<int>(ui));
        ++b.n_edges;
      }
      continue;
    }
    EdgeCost e{u.producer, u.consumer, std::vector<double>(static_cast<std::size_t>(su) * sv, 0.0)};
    bool nonzero = false;
    const auto& fid = out_ids[u.producer][u.out_slot];
    const auto& tid = u.in_slot >= 0 ? in_ids[u.consumer][u.in_slot] : out_ids[u.consumer][0];
    std::vector<int> fs, ts;  // distinct spec ids on each side
    std::vector<int> fi(su), ti(sv);
    for (int s = 0; s < su; ++s) {
      if (local_f[fid[s]] < 0) local_f[fid[s]] = static_cast<int>(fs.size()), fs.push_back(fid[s]);
      fi[s] = local_f[fid[s]];
    }
    for (int t = 0; t < sv; ++t) {
      if (local_t[tid[t]] < 0) local_t[tid[t]] = static_cast<int>(ts.size()), ts.push_back(tid[t]);
      ti[t] = local_t[tid[t]];
    }
    for (int x : fs) local_f[x] = -1;
    for (int x : ts) local_t[x] = -1;
    std::vector<double> dist(fs.size() * ts.size());
    for (std::size_t a = 0; a < fs.size(); ++a)
      for (std::size_t c = 0; c < ts.size(); ++c) dist[a * ts.size() + c] = spec_time(fs[a], ts[c], elem);
    for (int s = 0; s < su; ++s)
      for (int t = 0; t < sv; ++t) {
        const double c = dist[static_cast<std::size_t>(fi[s]) * ts.size() + ti[t]];
        e.cost[static_cast<std::size_t>(s) * sv + t] = c;
        nonzero |= c != 0;
      }
    edge_of_key.emplace(ekey, nonzero ? static_cast<int>(p.edges.size()) : -1);
    if (nonzero) {
      p.edges.push_back(std::move(e));
      edge_use.push_back(static_cast<int>(ui));
      ++b.n_edges;
    }
  }
  if (opt.shared_resharding)
    share_reshardings(b, m, edge_use, out_ids, in_ids, spec_by_id, spec_time, opt.shared_layouts_per_tensor);
  b.live = cost::liveness(m.g, /*with_sets=*/false);  // sets only if memory rows are built
  if (memory_limit > 0) add_memory_rows(b, m, memory_limit);
  return b;
}

// Memory rows over the maximal live sets (quadratic in depth for deep training graphs, so
// spmd_search only builds them when a plan found without them does not fit). Returns false, with
// the rows built so far, when the deadline passed (the caller then has no time to solve with them).
bool add_memory_rows(Built& b, const Model& m, double memory_limit, const StopToken& stop) {
  auto& p = b.problem;
  cost::build_live_sets(b.live);
  {
    p.memory_limit = memory_limit;
    for (int pos : cost::maximal_positions(b.live)) {
      stop.throw_if_cancelled("spmd_search");
      if (stop.expired()) return false;
      // Every tensor's largest layout is at most its full size: a live set whose full sizes fit
      // cannot bind (checked before building its terms; deep graphs have many such rows).
      double full = 0;
      for (ir::TensorId t : b.live.sets[pos]) full += static_cast<double>(m.g.tensor(t).bytes());
      if (full <= memory_limit) continue;
      MemoryRow row;
      row.label = fmt::format("after {}", m.g.op(b.live.order[pos]).name);
      std::map<int, std::vector<double>> terms;
      for (ir::TensorId t : b.live.sets[pos]) {
        const int v = m.node_of_tensor[t];
        if (v < 0) {  // a leaf nobody reads (only kept as output): replicated
          row.constant += static_cast<double>(m.g.tensor(t).bytes());
          continue;
        }
        auto& vec = terms[v];
        vec.resize(m.num_strategies(v), 0.0);
        for (int s = 0; s < m.num_strategies(v); ++s)
          vec[s] += spec_bytes(m.produced(v, s, m.slot_of_tensor[t]), m.g.tensor(t).dtype);
      }
      double most = row.constant;
      for (auto& [v, vec] : terms) {
        most += *std::max_element(vec.begin(), vec.end());
        row.terms.push_back({v, std::move(vec)});
      }
      // A row that fits even with every tensor at its largest layout cannot bind: dropping it is
      // exact and keeps the ILP and the O2 segments small (peak memory is recomputed from the
      // live sets afterwards, not from the rows).
      if (most <= memory_limit) continue;
      p.memory_rows.push_back(std::move(row));
      b.rows_pos.push_back(pos);
    }
  }
  return true;
}

// Explain an infeasible memory limit: the row whose smallest possible bytes are largest, with
// its biggest tensors.
std::string explain_memory(const Model& m, const Built& b) {
  const auto& p = b.problem;
  double worst = -1;
  int wr = -1;
  for (int r = 0; r < static_cast<int>(p.memory_rows.size()); ++r) {
    double mn = p.memory_rows[r].constant;
    for (const auto& t : p.memory_rows[r].terms) {
      double best = kInfCost;
      for (int s = 0; s < static_cast<int>(t.bytes.size()); ++s)
        if (!std::isinf(p.node_cost[t.node][s])) best = std::min(best, t.bytes[s]);
      mn += best;
    }
    if (mn > worst) worst = mn, wr = r;
  }
  if (wr < 0) return "no memory rows";
  std::vector<std::pair<double, ir::TensorId>> big;
  for (ir::TensorId t : b.live.sets[b.rows_pos[wr]])
    big.push_back({static_cast<double>(m.g.tensor(t).bytes()), t});
  std::sort(big.rbegin(), big.rend());
  std::vector<std::string> names;
  for (std::size_t i = 0; i < std::min<std::size_t>(5, big.size()); ++i)
    names.push_back(fmt::format("{} ({} full)", m.g.tensor(big[i].second).name, format_bytes(big[i].first)));
  if (worst > p.memory_limit)
    return fmt::format(
        "the live set {} needs at least {} per device under the most sharded layouts "
        "(limit {}); largest tensors there: {}",
        p.memory_rows[wr].label, format_bytes(worst), format_bytes(p.memory_limit), fmt::join(names, ", "));
  return fmt::format(
      "every live set fits alone under its most sharded layouts, but no single choice of layouts fits "
      "them all (the layouts that shrink one live set grow another; tightest: {} at {} of {}); "
      "largest tensors there: {}",
      p.memory_rows[wr].label, format_bytes(worst), format_bytes(p.memory_limit), fmt::join(names, ", "));
}

void check_mesh_usable(const Model& m) {
  std::int64_t total = 1;
  for (auto a : m.mesh) total *= a;
  if (total == 1) return;
  std::int64_t best = 1;
  for (int o = 0; o < m.n_ops; ++o)
    for (const auto& s : m.op_strats[o]) {
      std::int64_t k = 1;
      for (std::size_t a = 0; a < m.mesh.size(); ++a)
        if (s.axes[a].factor >= 0) k *= m.mesh[a];
      best = std::max(best, k);
    }
  WEFT_CHECK(best == total,
             "spmd_search: the mesh {} has {} devices but no op of graph '{}' can be split more than {} ways "
             "(every factor — batch included — is too small or indivisible); use a smaller mesh",
             fmt::join(m.mesh, "x"), total, m.g.name(), best);
}

}  // namespace detail
}  // namespace weft::spmd
