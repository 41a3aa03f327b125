#pragma once
// Internals of the SPMD search shared by its translation units: the graph as nodes with
// strategies (Model) and the StrategyProblem built from it (search_model.cpp), the search driver
// (search.cpp: spmd_search) and the independent evaluator (evaluate_plan.cpp). Not installed: the
// public API is weft/spmd/search.hpp.
#include <fmt/format.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "weft/cluster/cluster.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/stop_token.hpp"
#include "weft/cost/memory.hpp"
#include "weft/ir/graph.hpp"
#include "weft/sharding/reshard.hpp"
#include "weft/sharding/sharding_spec.hpp"
#include "weft/spmd/problem.hpp"
#include "weft/spmd/search.hpp"

namespace weft::spmd {

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

namespace detail {

using sharding::ShardingSpec;

// Results that must reach the layout of a state leaf by the end of the step, as (result, leaf):
// the updated states and a None-optimizer graph's parameter gradients (search_model.cpp).
std::vector<std::pair<ir::TensorId, ir::TensorId>> carried_results(const ir::Graph& g);

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

inline double spec_bytes(const ShardingSpec& s, DType t) {
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

// The device of a mesh of one kind (spmd_search does not mix kinds on a mesh).
cluster::DeviceSpec mesh_device(const cluster::Cluster& c, const cluster::DeviceMesh& mesh);
// The graph as nodes with their strategy lists (ops: every strategy; leaves: every spec), in
// strategy-list classes; device: the one to price ops on (default: the mesh's).
Model build_model(const ir::Graph& g, const cluster::Cluster& cl, const cluster::DeviceMesh& mesh,
                  const std::optional<cluster::DeviceSpec>& device, const StopToken& stop);
// Rhino's strided candidates (§4.3.3): restrided strategies that make an edge free; returns how
// many were added.
int generate_strided_candidates(Model& m, const StopToken& stop, int rounds = 4);
// Fails unless some op can be split over every device of the mesh.
void check_mesh_usable(const Model& m);

// The problem of a model, with what reading and extending it needs (build_problem).
struct Built {
  StrategyProblem problem;
  // Per op node and strategy: the part of node_cost that reshards a result to the layout its
  // readers outside the graph need (SearchOptions::output_specs) — communication, not compute.
  std::vector<std::vector<double>> out_conv;
  cost::Liveness live;
  std::vector<int> rows_pos;  // position of each memory row
  int n_edges = 0;
};

// The StrategyProblem of the model: node costs (compute, output_specs, fixed_specs), edge costs
// (resharding), shared-resharding pairs (SearchOptions::shared_resharding) and, with a
// memory_limit > 0, the memory rows.
Built build_problem(Model& m, ReshardCosts& rc, double memory_limit, const SearchOptions& opt,
                    const StopToken& stop = {});
// Adds the memory rows that can bind; false when the deadline passed before they were all built.
bool add_memory_rows(Built& b, const Model& m, double memory_limit, const StopToken& stop = {});
// The problem without the shared-resharding pairs (each node's own strategies, which come first).
StrategyProblem without_pairs(const StrategyProblem& p, const Model& m);
// Why the memory limit cannot be met: the tightest live set and its largest tensors.
std::string explain_memory(const Model& m, const Built& b);

}  // namespace detail
}  // namespace weft::spmd
