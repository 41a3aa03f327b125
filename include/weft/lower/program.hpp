#pragma once
// lower::Program — what every device (rank) of a plan runs for one training step, as one ordered
// instruction list per rank over buffers that are tiles of graph tensors under sharding specs.
//
// A buffer is (tensor of the program's graph, ShardingSpec on its stage's mesh): rank r holds the
// tile of that spec at its mesh coordinate (exec's layout: dense row-major over the tile's local
// shape, global order inside). Statistics buffers (vocab-parallel cross-entropy) have no tensor.
// Instructions:
//   Compute        op `op` on local tiles: inputs = the strategy's operand layouts, outputs = its
//                  result layouts (a reduction factor split over an axis leaves P(sum|max) there)
//   CeRowMax / CeSumTarget / CeLoss / CeGrad   vocab-parallel cross-entropy in steps (ir/kernels.hpp),
//                  with all-reduces of the per-token statistics over `axes` between them
//   AllReduce / AllGather / ReduceScatter / AllToAll   one mesh axis: `group` lists the ranks of
//                  this rank's group along `axis` in coordinate order (this rank included)
//   LocalSlice (R -> S) / LocalPartial (R -> P: the value on coordinate 0, zeros elsewhere)
//   Copy           out = in (end of step: an updated parameter / optimizer state becomes the leaf)
//   Free           the buffer's memory is released (its last use on this rank was before)
//   LoadInput      out = this rank's tile of micro-batch `microbatch` of an Input leaf: samples
//                  [(microbatch·replicas + replica)·microbatch_size, +microbatch_size) of the
//                  global batch (replica = the rank's coordinate on the replica axis 0); with
//                  uneven shares b_r: [microbatch·Σb + Σ_{r'<r} b_r', +b_r)
//   Accumulate     out = in[0] + in[1] (gradient accumulation over micro-batches; out == in[0])
//   Scale          out = scale · in (the mean over micro-batches and replicas; × b_r / Σb when by_share)
//   Send / Recv    a cross-stage transfer (pipelines): the elements of `region` (global indices)
//                  of buffer in[0] (a tile on the sender's stage) go into buffer out[0] (a tile on
//                  each receiver's stage). Send: group = the receiver ranks; non-blocking (the
//                  bytes are posted, as isend). Recv: group = {the sender rank}; blocks until the
//                  message with the same `tag` has arrived. Several Recvs may fill one buffer.
// Every collective is entered by exactly the ranks of its group, in the same order on each
// (check() proves it, and that the order cannot deadlock, before anything runs).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "weft/ir/graph.hpp"
#include "weft/ir/json.hpp"

namespace weft::lower {

enum class InstrKind {
  Compute,
  CeRowMax,
  CeSumTarget,
  CeLoss,
  CeGrad,
  AllReduce,
  AllGather,
  ReduceScatter,
  AllToAll,
  LocalSlice,
  LocalPartial,
  Copy,
  Free,
  LoadInput,
  Accumulate,
  Scale,
  Send,
  Recv
};
std::string_view instr_kind_name(InstrKind k);  // "compute", "all-reduce", ...
InstrKind parse_instr_kind(std::string_view name);
bool is_collective(InstrKind k);  // AllReduce .. AllToAll (data crosses ranks inside a group)
bool is_transfer(InstrKind k);    // Send / Recv (point to point, across stages)

enum class ReduceOp { Sum, Max };

struct Buffer {
  std::string name;                 // "<tensor>@<spec>" (readable; unique)
  ir::TensorId tensor = -1;         // tensor of the program's graph; -1 for a statistics buffer
  std::vector<std::int64_t> shape;  // global shape
  std::string spec;                 // sharding::ShardingSpec text on the stage mesh
  int stage = 0;
  int element_bytes = 4;  // of the graph tensor's dtype (what the cost model charges)
  bool operator==(const Buffer&) const = default;
};

struct Instr {
  InstrKind kind = InstrKind::Compute;
  ir::OpId op = -1;          // compute kinds
  std::vector<int> in, out;  // buffer ids
  int axis = -1;             // collectives / local reshard steps: the mesh axis
  // Collectives: the ranks along `axis`, coordinate order; empty = the running rank's group along
  // `axis` of its stage mesh (Program::group_of), as the lowering writes them so that the ranks of
  // a stage share one list. Send: the receiver ranks. Recv: {the sender rank}.
  std::vector<int> group;
  int on_rank = -1;  // Send / Recv: the one rank that runs it (-1: every rank of the list)
  ReduceOp reduce = ReduceOp::Sum;
  std::vector<int> axes;  // CeLoss/CeGrad: the mesh axes splitting the class dim
  bool internal = false;  // a collective inside one op (vocab-parallel statistics), not a
                          // resharding edge the planner's cost model prices
  int microbatch = -1;    // LoadInput
  double scale = 1;       // Scale
  bool by_share = false;  // Scale: also times the running replica's share of the samples
                          // (uneven data parallelism: the replicas' means weighted by samples)
  int tag = -1;           // Send / Recv: the message (unique in the program)
  // All-reduce / reduce-scatter / all-gather: the bucket it belongs to (-1: none; ids unique in a
  // list). The collectives of one bucket are adjacent in a list, of one kind, on one axis and group
  // with one reduce op: a runtime issues them as one collective over their tiles laid end to end
  // (DDP's flat gradient buckets; FSDP's flat parameter for ZeRO's reduce-scatters and gathers:
  // chunk r of the flat buffer = every tensor's r-th shard); an executor may run them one by one
  // (the same values).
  int bucket = -1;
  // Send / Recv: per dim of the tensor, sorted disjoint [begin, end) intervals of global indices,
  // flattened (begin0, end0, begin1, end1, ...); a union of blocks when a spec is strided.
  std::vector<std::vector<std::int64_t>> region;
  bool operator==(const Instr&) const = default;
};

// A rank's program. The ranks of a stage run the same instructions (SPMD: collective groups come
// from each rank's coordinate, a transfer runs only on its `on_rank`), so the lowering gives them
// one shared list; edit() makes a rank's own copy (copy on write).
struct RankProgram {
  int rank = 0;
  int device = 0;  // cluster device id
  int stage = 0;
  std::vector<std::int64_t> coord;  // on the stage mesh
  // Shared by the ranks of a stage: change it through edit() only.
  std::shared_ptr<std::vector<Instr>> code = std::make_shared<std::vector<Instr>>();

  const std::vector<Instr>& instrs() const { return *code; }
  std::vector<Instr>& edit();  // this rank's own list, to change (copied first when shared)
  // Whether instruction k of the list is this rank's (a transfer of another rank is not).
  bool runs(const Instr& i) const { return i.on_rank < 0 || i.on_rank == rank; }
  bool operator==(const RankProgram& o) const {
    return rank == o.rank && device == o.device && stage == o.stage && coord == o.coord && *code == *o.code;
  }
};

struct StageMesh {
  // Pipeline stage k of a program is stages[k]; its ranks run their stage's ops in the order of
  // the schedule (micro-batch by micro-batch), then the update once per step.
  std::vector<std::int64_t> shape;   // the stage mesh: [replicas] + the SPMD mesh when replicas > 1
  std::vector<int> ranks;            // rank at each mesh position, row-major
  int replicas = 1;                  // data-parallel replicas (mesh axis 0 when > 1)
  int microbatches = 1;              // per step and replica (gradients accumulated)
  std::int64_t microbatch_size = 0;  // samples per micro-batch (the program graph's batch)
  std::string schedule;              // the pipeline schedule the ranks' order follows ("1f1b", ...)
  // Uneven data parallelism (mixed GPUs): samples per micro-batch of each replica (index = the
  // coordinate on the replica axis 0); microbatch_size is their maximum, the program's graph is at
  // that size, and a replica runs the same graph at its own size (plan::rebatch). Empty: even.
  std::vector<std::int64_t> replica_microbatch;
  // Uneven tensor split (Whale's split over mixed GPUs, a 1-D stage mesh): the device at mesh
  // position i holds the piece pipeline::proportional_pieces(size, split_fraction)[i] of every dim
  // a spec shards (a block split; consecutive pieces in position order). Empty: even tiles.
  std::vector<double> split_fraction;
  bool operator==(const StageMesh&) const = default;
};

struct Program {
  ir::Graph graph;  // the (per-micro-batch) training graph the program computes
  std::vector<StageMesh> stages;
  std::vector<Buffer> buffers;
  std::vector<RankProgram> ranks;  // indexed by rank
  // Leaves each rank holds at the start of a step: parameters and optimizer states persist across
  // steps (initialised once), inputs and constants are filled every step.
  std::vector<int> leaf_buffers;
  std::map<std::string, int> parameters;  // parameter name -> its leaf buffer (value after a step)
  std::map<std::string, int> gradients;   // parameter name -> its gradient's produced buffer
  int loss = -1;                          // the loss's produced buffer
  // ir::graph_fingerprint of `graph` as the lowering made it (verify() recomputes and compares: a
  // graph swapped under the instructions is refused); of the training step the plan was made for
  // (the global-batch graph, Plan::graph_fingerprint). Empty: not recorded (hand-made programs).
  std::string graph_fingerprint;
  std::string step_fingerprint;

  int num_ranks() const { return static_cast<int>(ranks.size()); }
  // The ranks of a collective of `rank` (its explicit group, or its group along the axis of its
  // stage mesh); the peers of a transfer.
  std::vector<int> group_of(int rank, const Instr& i) const;
  // The ranks that share every coordinate of `rank` on its stage mesh but the one along `axis`.
  std::vector<int> group_along(int rank, int axis) const;
  // What `rank` runs, in order: its list without other ranks' transfers, collective groups filled in.
  std::vector<Instr> instructions(int rank) const;
  std::size_t num_instructions(int rank) const;
  // The graph's values (ir/json.hpp): inline, or the large ones in a value file (`values`).
  std::string to_json(const ir::JsonValueOptions& values = {}) const;
  // weft::Error naming the bad field; `base_dir` resolves relative value files (the JSON's folder).
  static Program from_json(std::string_view text, const std::string& base_dir = {});
  std::string dump() const;                         // readable, one line per instruction, per rank
  std::string dump_rank(int rank) const;
  // Instruction `index` of the rank's list: "rank 3 #12 all-reduce@1 group [1, 3] (sum) h@P(sum) -> h@R".
  std::string describe(int rank, int index) const;
  bool operator==(const Program&) const = default;
};

// Static check before execution: buffer ids in range, every buffer read on a rank was written (or
// is a leaf) there and not freed, every rank's own coordinate is in its collective groups, and a
// simulated execution in which a collective completes once all of its group stand at it reaches
// the end on every rank (same kind, axis, buffers and reduce op in every member). Transfers: a
// Send posts its message to each receiver (never blocks), a Recv waits for the Send of its tag from
// its sender with the same buffers and region; every message is received exactly once by each of
// its receivers. Throws weft::Error naming the rank and the instruction.
// The dataflow / group / deadlock part alone (what check() proved before verify existed).
void check_dataflow(const Program& p);
// check() runs verify(), which ends with check_dataflow() (so every caller of check — the executors, the runtime's layout,
// Program.check() in Python — runs only verified programs).
void check(const Program& p);

// The contract between planning and running, checked independently of how the program was made
// (docs/modules/lower.md, "Verification"): the graph's fingerprint equals the recorded one; the
// graph is valid; ranks, stages and meshes agree (counts positive: micro-batches, replicas,
// micro-batch size = the graph's batch, shares, split fractions); every buffer's tensor exists, its
// shape is the tensor's, its element size the tensor dtype's and its spec a valid tiling of that
// shape on its stage's mesh; every instruction reads and writes buffers of its rank's stage, in the
// right number: a compute's op exists and its operands / results are the buffers of the op's
// inputs / outputs (tensor ids match), cross-entropy steps read the op's logits / labels and
// statistics, every collective moves one tensor along an axis of the mesh with an explicit group
// equal to the mesh's group along that axis, an all-reduce / reduce-scatter reduces with the
// partial kind of its source spec (sum of P(sum), max of P(max)) into R / S on that axis, an
// all-gather goes S -> R, a local slice R -> S, a local partial R -> P of its kind; a load reads an
// Input leaf for a micro-batch in [0, micro-batches); every op of the graph is run by some rank;
// the leaves, the loss, the parameters and the gradients the result reports are the graph's
// (tensor ids and names match) and are produced by some instruction (or are leaves). Then the
// dataflow / deadlock check above. weft::Error naming the rank, the instruction (pc) or the buffer.
void verify(const Program& p);
// The same, and the program was made for `graph`: its fingerprint equals the program graph's or
// the training step's it was lowered from (the plan's); weft::Error naming both otherwise.
void verify(const Program& p, const ir::Graph& graph);

}  // namespace weft::lower
