#pragma once
// SPMD (intra-operator) strategy search on one device mesh (Rhino §4, Alpa's intra-op pass).
//
// Nodes = ops of the graph plus leaf tensors (parameters, optimizer states, inputs) that ops
// read; a leaf's strategies are its block specs (plus strided candidates). Strategies of ops
// come from their index maps (strategy.hpp); node cost = roofline compute time of the op's
// local work (cost::op_cost); edge cost = the cheapest collective sequence from the producer's
// result spec to the consumer's required operand spec (sharding::ReshardPlanner, α-β per mesh
// axis); an update op's new parameter/state feeds back to the leaf it replaces (loop-carried
// edge: the layout must be the same next step, or be resharded every step). Memory: one row per
// maximal live set of a topological order (cost::liveness), per-device bytes of every live
// tensor under its producer's strategy. The problem (problem.hpp) is solved
// within one deadline for the whole search (SearchOptions::time_limit_s), and
//   O3: as one ILP;
//   O2: by segments between critical nodes (coarsen.hpp): a DP over the strategy of the
//       critical node that ends each segment (exact on chains), backward/optimizer ops joining
//       the segment of the forward ops they read, identical segments solved once; then
//       block-coordinate refinement over windows of consecutive segments;
// and the result re-scored by evaluate_plan, which recomputes everything from the chosen specs.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "weft/cluster/cluster.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/stop_token.hpp"
#include "weft/ir/graph.hpp"
#include "weft/sharding/sharding_spec.hpp"
#include "weft/solver/ilp.hpp"
#include "weft/spmd/strategy.hpp"

namespace weft::spmd {

enum class Level { O2, O3 };
enum class MemoryMode {
  Ilp,           // memory rows in the ILP
  ShardLargest,  // Rhino §4.4: force the k largest parameters sharded, smallest feasible k
};

struct Progress {
  std::string phase;    // "strategies", "edge costs", "solve", "evaluate"
  double fraction = 0;  // 0..1 of the whole search
  std::string message;
};

class ReshardCache;  // resharding times shared across searches (make_reshard_cache)

struct SearchOptions {
  Level level = Level::O3;
  // Bytes per device; 0 = the device's memory from the cluster; < 0 = no memory constraint.
  double memory_limit = 0;
  MemoryMode memory_mode = MemoryMode::Ilp;
  // Seconds for the whole search (strategies, edge costs, every ILP, the O2 DP and refinement,
  // memory pricing, Rhino's memory loop), combined with `stop`, whichever ends first. Every ILP
  // gets what is left. On the deadline the search returns the best plan that fits found so far
  // (at worst a greedy plan, memory priced in) with report.status "timeout"; only when even that
  // plan exceeds the memory limit does it throw weft::Error ("no solution within the time
  // limit"). Building the problem (strategies, edge costs) is not interrupted by the deadline,
  // only by a cancel: a plan needs its costs.
  double time_limit_s = 60;
  double relative_gap = 0;
  bool strided_candidates = true;     // Rhino §4.3.3 candidate generation
  bool reuse_repeated_layers = true;  // O2: solve one of identical repeated segments, reuse it
  int o2_refine_sweeps = 4;           // O2: refinement sweeps after the DP (0 = off)
  // O2 when the plan found without memory rows does not fit: first price memory instead of
  // constraining it — a cost λ per byte on every tensor live where the limit can bind, λ found
  // by bisection (the smallest price whose plan fits), each probe a row-free O2 solve (cached
  // by identical layers) — and fall back to the memory rows only when no price makes it fit.
  bool o2_memory_pricing = true;
  // Shared resharding (autoparallel's alias nodes, made pairwise): a tensor read by several ops
  // may be resharded once into a layout a that several of them need; its producer's strategy s
  // then becomes the pair (s, a), paying the resharding P_s -> a once, and every reader whose
  // operand spec is a reads it for free (the others reshard from P_s as before). Without it each
  // reader pays its own resharding. The lowering shares such layouts anyway (one buffer per
  // distinct layout of a value).
  bool shared_resharding = true;
  int shared_layouts_per_tensor = 2;  // candidate layouts a per tensor (the largest saving first)
  std::map<std::string, std::string> fixed_specs;  // tensor name -> spec text, forced
  // Refuse a mesh no op of the graph can be split over (weft::Error: "use a smaller mesh"). The
  // planner's blocks turn it off: a block of scalar ops (a summed loss's `scale`, a loss times a
  // constant) runs replicated on its stage's devices.
  bool require_split = true;
  // tensor name -> spec text its readers outside the graph need (a block's outputs read by the
  // next block): the producer pays the resharding to it, counted as communication.
  std::map<std::string, std::string> output_specs;
  // Price every op (and take the memory limit) on this device instead of the mesh's, and accept
  // a mesh that mixes device kinds: the planner searches the strategies of an uneven split over
  // mixed GPUs (Whale's `split`) on the slowest kind and re-prices them per device afterwards.
  std::optional<cluster::DeviceSpec> device;
  std::function<void(const Progress&)> progress;  // called from the searching thread
  // Resharding times cached across searches (make_reshard_cache): a caller that runs many
  // searches on meshes with the same links (the planner: every block, variant and micro-batch
  // size) prices each spec pair once. Not thread-safe; null = a cache per search.
  std::shared_ptr<ReshardCache> reshard_cache;
  // The caller's deadline and cancellation (Ctrl-C), on top of time_limit_s: a cancel throws
  // weft::Cancelled (checked in every loop and inside CBC's), a deadline ends the search as
  // time_limit_s does.
  StopToken stop;
};
std::shared_ptr<ReshardCache> make_reshard_cache();

struct ParamRow {
  std::string name;
  std::vector<std::int64_t> shape;
  std::string spec;
  double bytes_per_device = 0;
};

struct SearchReport {
  std::vector<std::pair<std::string, double>> phase_seconds;
  int nodes = 0, strategies = 0, edges = 0;
  int ilp_variables = 0, ilp_constraints = 0, ilp_solves = 0;
  // Worst status over the ILPs solved; "timeout" also when the deadline cut any phase short.
  std::string status;
  // Largest relative gap over the ILPs solved; when the deadline left the greedy plan as the
  // answer, its gap against the best bound known (1 = only the bound 0).
  double gap = 0;
  double compute_time = 0, comm_time = 0;
  double peak_memory = 0, memory_limit = 0;
  int forced_sharded_params = -1;  // ShardLargest: k; -1 otherwise
  int segments = 0, reused_segments = 0;
  std::vector<ParamRow> params;
  int refine_moves = 0;                             // O2: windows improved by the refinement sweeps
  double o2_dp_seconds = 0, o2_refine_seconds = 0;  // O2: the solve phase split
  bool o2_fallback = false;     // O2 found no plan under the memory limit; the whole-graph ILP decided
  int memory_price_probes = 0;  // O2 memory pricing: row-free solves tried (0 = not used)
  double memory_price = 0;      // O2 memory pricing: the price λ chosen, seconds per byte (0 = none)
  double total_seconds() const {
    double t = 0;
    for (const auto& p : phase_seconds) t += p.second;
    return t;
  }
  std::string to_string() const;  // readable multi-line table
};

struct SpmdPlan {
  std::vector<OpStrategy> op_strategies;                            // per op id
  std::vector<std::optional<sharding::ShardingSpec>> tensor_specs;  // per tensor: produced/chosen spec
  // Per tensor: the layout it is resharded to once for every reader that needs exactly it
  // (SearchOptions::shared_resharding); empty = each reader reshards on its own.
  std::vector<std::optional<sharding::ShardingSpec>> shared_specs;
  double cost = 0, compute_time = 0, comm_time = 0, peak_memory = 0;
  SearchReport report;
  // Spec text of a tensor by name (throws weft::Error for an unknown/unused tensor).
  std::string spec_of(const ir::Graph& g, const std::string& tensor) const;
};

SpmdPlan spmd_search(const ir::Graph& g, const cluster::Cluster& cluster, const cluster::DeviceMesh& mesh,
                     const SearchOptions& options = {});

// Independent re-evaluation of chosen strategies: per op an assignment of mesh axes to factors,
// per leaf tensor a spec. Recomputes compute (roofline), every edge's resharding (fresh
// planner), loop-carried edges, and peak memory over all live sets.
struct PlanEvaluation {
  double cost = 0, compute_time = 0, comm_time = 0, peak_memory = 0;
  std::map<std::string, int> collectives;  // collective name -> count over all edges
  std::vector<std::string> edges;          // "producer -> consumer: plan" for non-free edges
  // One entry per edge that reduces partial sums (its source spec is Partial on some axis and
  // its target is not Partial): the tensor reduced. Megatron's layout reduces two forward activations
  // (after attention and after the MLP) and two activation gradients in backward.
  std::vector<ir::TensorId> partial_reductions;
};
// shared_specs (optional): tensor -> the layout it is resharded to once (SpmdPlan::shared_specs);
// readers needing exactly it read it for free.
PlanEvaluation evaluate_plan(const ir::Graph& g, const cluster::Cluster& cluster,
                             const cluster::DeviceMesh& mesh,
                             const std::vector<std::vector<AxisAssign>>& op_axes,
                             const std::map<ir::TensorId, sharding::ShardingSpec>& leaf_specs,
                             const std::map<ir::TensorId, sharding::ShardingSpec>& shared_specs = {});
PlanEvaluation evaluate_plan(const ir::Graph& g, const cluster::Cluster& cluster,
                             const cluster::DeviceMesh& mesh, const SpmdPlan& plan);

}  // namespace weft::spmd
