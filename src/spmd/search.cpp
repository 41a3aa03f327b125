// SPMD strategy search: graph -> StrategyProblem -> ILP (O3) or segment DP (O2) -> SpmdPlan.
// The model (nodes, strategies, costs, memory rows) is described in search.hpp; the ILP in
// problem.hpp. This file builds the problem, runs candidate generation, the O2 coarsening, the
// memory modes, and the independent evaluator.
#include "weft/spmd/search.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <optional>
#include <set>
#include <unordered_map>

#include "weft/cluster/device_mesh.hpp"
#include "weft/core/error.hpp"
#include "weft/cost/memory.hpp"
#include "weft/cost/op_cost.hpp"
#include "weft/cost/view_ops.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/sharding/reshard.hpp"
#include "weft/spmd/coarsen.hpp"
#include "weft/spmd/problem.hpp"

namespace weft::spmd {

using sharding::ShardingSpec;

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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

}  // namespace

// One cached planner per (mesh links, element size), shared by the searches that hold the cache.
class ReshardCache {
 public:
  sharding::ReshardPlanner& planner(const std::vector<cluster::AxisLink>& links, int elem) {
    std::string key = std::to_string(elem);
    for (const auto& l : links)
      key += fmt::format("|{:a},{:a},{},{},{},{:a},{:a},{:a},{:a},{}", l.alpha, l.beta, l.crosses_nodes,
                         l.devices_per_node_on_axis, l.nodes_on_axis, l.intra_alpha, l.intra_beta,
                         l.inter_alpha, l.inter_beta, l.size);
    auto it = planners_.find(key);
    if (it == planners_.end()) {
      sharding::ReshardOptions o;
      o.strided_intermediates = false;
      it = planners_.emplace(std::move(key), sharding::ReshardPlanner(links, elem, o)).first;
    }
    return it->second;
  }

 private:
  std::unordered_map<std::string, sharding::ReshardPlanner> planners_;
};

std::shared_ptr<ReshardCache> make_reshard_cache() { return std::make_shared<ReshardCache>(); }

namespace {

// Resharding times on one mesh: the planners of a shared cache, or of a cache of its own.
class ReshardCosts {
 public:
  ReshardCosts(std::vector<cluster::AxisLink> links, std::shared_ptr<ReshardCache> cache)
      : links_(std::move(links)), cache_(cache ? std::move(cache) : make_reshard_cache()) {}
  const sharding::ReshardPlan& plan(const ShardingSpec& from, const ShardingSpec& to, int elem) {
    auto it = planners_.find(elem);
    if (it == planners_.end()) it = planners_.emplace(elem, &cache_->planner(links_, elem)).first;
    return it->second->plan(from, to);
  }
  double time(const ShardingSpec& from, const ShardingSpec& to, int elem) {
    if (from == to) return 0;
    return plan(from, to, elem).time;
  }

 private:
  std::vector<cluster::AxisLink> links_;
  std::shared_ptr<ReshardCache> cache_;
  std::map<int, sharding::ReshardPlanner*> planners_;
};

constexpr double kTieBreakPerByte = 1e-15;

double spec_bytes(const ShardingSpec& s, DType t) {
  return static_cast<double>(s.max_local_elements()) * dtype_size(t);
}

struct Use {
  ir::TensorId tensor;
  int producer;  // node
  int out_slot;  // result index (ops) / 0 (leaves)
  int consumer;  // node
  int in_slot;   // operand index; -1 for a loop-carried edge into a leaf
};

// A list shared by the nodes of one strategy-list class, copied on write: the repeated layers
// of a deep model hold one copy of each list instead of one per op (copying and freeing ~10^5
// strategies was a visible share of a fast search).
template <class T>
class SharedList {
 public:
  SharedList() : p_(std::make_shared<std::vector<T>>()) {}
  explicit SharedList(std::vector<T> v) : p_(std::make_shared<std::vector<T>>(std::move(v))) {}
  const T& operator[](std::size_t i) const { return (*p_)[i]; }
  std::size_t size() const { return p_->size(); }
  bool empty() const { return p_->empty(); }
  auto begin() const { return p_->cbegin(); }
  auto end() const { return p_->cend(); }
  void push_back(T x) {
    if (p_.use_count() > 1) p_ = std::make_shared<std::vector<T>>(*p_);
    p_->push_back(std::move(x));
  }

 private:
  std::shared_ptr<std::vector<T>> p_;
};

// The graph as nodes with strategies.
struct Model {
  const ir::Graph& g;
  std::vector<std::int64_t> mesh;
  std::vector<std::string> axis_names;
  cluster::DeviceSpec device;
  int n_ops = 0;
  std::vector<char> view;                 // per op: a view, charged no compute (cost/view_ops.hpp)
  std::vector<ir::TensorId> leaf_tensor;  // per node >= n_ops
  std::vector<int> node_of_tensor;        // producer node per tensor (-1 if unused leaf)
  std::vector<int> slot_of_tensor;
  std::vector<SharedList<OpStrategy>> op_strats;
  std::vector<SharedList<ShardingSpec>> leaf_specs;
  std::vector<Use> uses;
  // Strategy-list classes: two nodes with the same class have equal strategy lists (ops: also
  // the same structure, so restriding and pricing treat them alike). Ops start in the class of
  // their first structural twin, leaves in that of the first leaf of the same shape; a list that
  // grows moves to a new class, the same new class for every node of its old class that grows
  // the same way. Candidate generation and edge pricing work once per class, not per node: the
  // repeated layers of a deep model then cost about one layer.
  std::vector<int> list_class;
  int next_class = 0;
  // Shared resharding (share_reshardings): a node's problem strategies past its own list are
  // pairs (base strategy, shared layout of one result). Per node: the pairs' base strategies and
  // layouts (index into shared_layouts); empty = none. Strategy indices below the list's size are
  // the list's own, so everything indexed by a problem strategy goes through base().
  std::vector<std::vector<int>> pair_base, pair_layout;
  std::vector<int> shared_slot;  // per node: the result whose tensor the pairs share (-1 none)
  std::vector<ShardingSpec> shared_layouts;

  int num_nodes() const { return n_ops + static_cast<int>(leaf_tensor.size()); }
  int num_base(int v) const {
    return static_cast<int>(v < n_ops ? op_strats[v].size() : leaf_specs[v - n_ops].size());
  }
  int num_strategies(int v) const {
    return num_base(v) + (pair_base.empty() ? 0 : static_cast<int>(pair_base[v].size()));
  }
  int base(int v, int s) const { return s < num_base(v) ? s : pair_base[v][s - num_base(v)]; }
  // The layout strategy s of v reshards its shared result to once, or nullptr.
  const ShardingSpec* shared(int v, int s) const {
    return s < num_base(v) ? nullptr : &shared_layouts[pair_layout[v][s - num_base(v)]];
  }
  const OpStrategy& op_strategy(int o, int s) const { return op_strats[o][base(o, s)]; }
  const ShardingSpec& leaf_spec(int v, int s) const { return leaf_specs[v - n_ops][base(v, s)]; }
  const ShardingSpec& produced(int v, int s, int slot) const {
    return v < n_ops ? op_strategy(v, s).outputs[slot] : leaf_spec(v, s);
  }
  const ShardingSpec& required(const Use& u, int s) const {
    return u.in_slot >= 0 ? op_strategy(u.consumer, s).inputs[u.in_slot] : leaf_spec(u.consumer, s);
  }
  std::string node_name(int v) const {
    return v < n_ops ? g.op(v).name : g.tensor(leaf_tensor[v - n_ops]).name;
  }
};

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
int generate_strided_candidates(Model& m, const StopToken& stop, int rounds = 4) {
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

struct Built {
  StrategyProblem problem;
  // Per op node and strategy: the part of node_cost that reshards a result to the layout its
  // readers outside the graph need (SearchOptions::output_specs) — communication, not compute.
  std::vector<std::vector<double>> out_conv;
  cost::Liveness live;
  std::vector<int> rows_pos;  // position of each memory row
  int n_edges = 0;
};

bool add_memory_rows(Built& b, const Model& m, double memory_limit, const StopToken& stop = {});

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

// Past the deadline the problem is still built (a plan needs its costs); a cancel throws.
Built build_problem(Model& m, ReshardCosts& rc, double memory_limit, const SearchOptions& opt,
                    const StopToken& stop = {}) {
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
        p.node_cost[v][s] =
            cost::compute_time(m.g, m.g.op(v), m.device, m.op_strats[v][s].factor_shards, m.view[v] != 0);
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
    names.push_back(fmt::format("{} ({:.3g} MB full)", m.g.tensor(big[i].second).name, big[i].first / 1e6));
  if (worst > p.memory_limit)
    return fmt::format(
        "the live set {} needs at least {:.4g} MB per device under the most sharded layouts "
        "(limit {:.4g} MB); largest tensors there: {}",
        p.memory_rows[wr].label, worst / 1e6, p.memory_limit / 1e6, fmt::join(names, ", "));
  return fmt::format(
      "every live set fits alone under its most sharded layouts, but no single choice of layouts fits "
      "them all (the layouts that shrink one live set grow another; tightest: {} at {:.4g} MB of {:.4g} MB); "
      "largest tensors there: {}",
      p.memory_rows[wr].label, worst / 1e6, p.memory_limit / 1e6, fmt::join(names, ", "));
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
  s += fmt::format("predicted step: {:.6g} s = compute {:.6g} s + communication {:.6g} s\n",
                   compute_time + comm_time, compute_time, comm_time);
  s += fmt::format("peak memory per device: {:.4g} MB (limit {})\n", peak_memory / 1e6,
                   memory_limit > 0 ? fmt::format("{:.4g} MB", memory_limit / 1e6) : std::string("none"));
  if (forced_sharded_params >= 0)
    s += fmt::format("memory loop: {} largest parameters forced sharded\n", forced_sharded_params);
  s += "phases:";
  for (const auto& [n, t] : phase_seconds) s += fmt::format(" {} {:.3f}s", n, t);
  if (segments > 0)
    s += fmt::format(" (O2 DP {:.3f}s, refinement {:.3f}s)", o2_dp_seconds, o2_refine_seconds);
  s += "\n";
  std::size_t w = 9;
  for (const auto& r : params) w = std::max(w, r.name.size());
  s += fmt::format("{:<{}}  {:<18}  {:<24}  {:>12}\n", "parameter", w, "shape", "spec", "MB/device");
  for (const auto& r : params)
    s += fmt::format("{:<{}}  {:<18}  {:<24}  {:>12.4g}\n", r.name, w,
                     fmt::format("[{}]", fmt::join(r.shape, ",")), r.spec, r.bytes_per_device / 1e6);
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
  check_mesh_usable(m);
  phase("strategies");
  if (opt.strided_candidates) {
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
        // Compute-heavy = a forward contraction (einsum / convolution); the heavy fraction is
        // taken relative to the largest one, low enough that a vocabulary projection 100x a
        // layer's matmuls does not hide the layers.
        const auto kind = g.op(o).kind;
        weight[o] =
            fwd[o] && (kind == ir::OpKind::Einsum || kind == ir::OpKind::Conv2d) ? g.op(o).flops() : 0.0;
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
    fail("spmd_search: no solution within the time limit of {} s ({}; even the quick greedy plan does "
         "not fit the memory limit of {:.4g} MB per device)",
         opt.time_limit_s, why, limit / 1e6);
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
        WEFT_CHECK(limit <= 0, "spmd_search: memory limit {:.4g} MB per device cannot be met: {}",
                   limit / 1e6, explain_memory(m, b));
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
                 "spmd_search: memory limit {:.4g} MB per device cannot be met even with all {} "
                 "parameters sharded: {}",
                 limit / 1e6, params.size(), [&] {
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

PlanEvaluation evaluate_plan(const ir::Graph& g, const cluster::Cluster& cl, const cluster::DeviceMesh& mesh,
                             const std::vector<std::vector<AxisAssign>>& op_axes,
                             const std::map<ir::TensorId, ShardingSpec>& leaf_specs,
                             const std::map<ir::TensorId, ShardingSpec>& shared_specs) {
  WEFT_CHECK(op_axes.size() == g.ops().size(), "evaluate_plan: {} op assignments for {} ops", op_axes.size(),
             g.ops().size());
  const auto device = mesh_device(cl, mesh);
  PlanEvaluation out;
  const std::vector<char> view = cost::view_ops(g);
  std::vector<OpStrategy> st;
  for (int o = 0; o < static_cast<int>(g.ops().size()); ++o) {
    auto s = make_strategy(g, g.op(o), mesh.shape(), op_axes[o]);
    WEFT_CHECK(s.has_value(), "evaluate_plan: assignment of op '{}' is not a valid strategy", g.op(o).name);
    out.compute_time += cost::compute_time(g, g.op(o), device, s->factor_shards, view[o] != 0);
    st.push_back(std::move(*s));
  }
  std::vector<std::optional<ShardingSpec>> spec(g.tensors().size());
  for (int o = 0; o < static_cast<int>(g.ops().size()); ++o)
    for (int i = 0; i < static_cast<int>(g.op(o).outputs.size()); ++i)
      spec[g.op(o).outputs[i]] = st[o].outputs[i];
  for (const auto& [t, s] : leaf_specs) spec.at(t) = s;
  const auto links = cluster::axis_links(cl, mesh);
  auto charge = [&](ir::TensorId t, const ShardingSpec& from, const ShardingSpec& to, DType dt,
                    const std::string& what) {
    if (from == to) return;
    if (from.has_partial() && !to.has_partial()) out.partial_reductions.push_back(t);
    sharding::ReshardOptions ro;
    ro.strided_intermediates = false;
    const auto pl = sharding::reshard_on_mesh(from, to, links, dtype_size(dt), ro);
    out.comm_time += pl.time;
    for (const auto& step : pl.steps)
      if (step.time > 0 || step.kind == sharding::CollectiveKind::AllReduce)
        out.collectives[sharding::collective_name(step.kind)]++;
    if (pl.time > 0) out.edges.push_back(fmt::format("{}: {}", what, pl.to_string()));
  };
  // A shared layout is made once; the readers that need exactly it read it for free.
  for (const auto& [t, a] : shared_specs) {
    WEFT_CHECK(t >= 0 && t < static_cast<ir::TensorId>(spec.size()) && spec[t].has_value(),
               "evaluate_plan: shared layout of unknown or unused tensor {}", t);
    charge(t, *spec[t], a, g.tensor(t).dtype,
           fmt::format("{} -> shared {}", g.tensor(t).name, a.to_string()));
  }
  auto read = [&](ir::TensorId t, const ShardingSpec& to, DType dt, const std::string& what) {
    if (auto it = shared_specs.find(t); it != shared_specs.end() && it->second == to) return;
    charge(t, *spec[t], to, dt, what);
  };
  for (int o = 0; o < static_cast<int>(g.ops().size()); ++o) {
    const auto& op = g.op(o);
    for (int i = 0; i < static_cast<int>(op.inputs.size()); ++i) {
      const ir::TensorId t = op.inputs[i];
      WEFT_CHECK(spec[t].has_value(), "evaluate_plan: leaf tensor '{}' has no spec", g.tensor(t).name);
      read(t, st[o].inputs[i], g.tensor(t).dtype, fmt::format("{} -> {}", g.tensor(t).name, op.name));
    }
  }
  for (const auto& [t, leaf] : carried_results(g))
    read(t, *spec[leaf], g.tensor(leaf).dtype,
         fmt::format("{} -> next step {}", g.tensor(t).name, g.tensor(leaf).name));
  std::vector<double> bytes(g.tensors().size(), 0.0);
  for (std::size_t t = 0; t < bytes.size(); ++t)
    bytes[t] =
        spec[t] ? spec_bytes(*spec[t], g.tensors()[t].dtype) : static_cast<double>(g.tensors()[t].bytes());
  out.peak_memory = cost::peak_memory(cost::liveness(g), bytes).first;
  out.cost = out.compute_time + out.comm_time;
  return out;
}

PlanEvaluation evaluate_plan(const ir::Graph& g, const cluster::Cluster& cl, const cluster::DeviceMesh& mesh,
                             const SpmdPlan& plan) {
  std::vector<std::vector<AxisAssign>> axes;
  for (const auto& s : plan.op_strategies) axes.push_back(s.axes);
  std::map<ir::TensorId, ShardingSpec> leaves, shared;
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g.tensors().size()); ++t) {
    if (g.tensor(t).producer == ir::kNoOp && plan.tensor_specs.at(t))
      leaves.emplace(t, *plan.tensor_specs[t]);
    if (static_cast<std::size_t>(t) < plan.shared_specs.size() && plan.shared_specs[t])
      shared.emplace(t, *plan.shared_specs[t]);
  }
  return evaluate_plan(g, cl, mesh, axes, leaves, shared);
}

}  // namespace weft::spmd
