#pragma once
// Megatron-LM's tensor-parallel layout of a graph's parameters, recognised from the graph's
// structure (never from names: an imported graph names its tensors as its module does), as fixed
// specs on a 1-D mesh of t devices — what plan::megatron_plan forces on its stages' SPMD searches.
//
// A weight matmul is a forward einsum reading a 2-D Parameter leaf and an activation; its weight's
// output-feature dim is the one whose factor survives into the result, its input-feature dim the
// contracted one (read from the op's index map, so a [in, out] zoo weight and a torch [out, in]
// Linear weight both get the right dim). In topological order, each weight matmul W looks at the
// weight matmuls its activation input depends on since the last layer norm, stopping at each one
// found (its "upstream" U):
//   - U not empty and every member still a column candidate: W is row-parallel (attention-out,
//     MLP-2: split along its input-feature dim, bias replicated) and the members are
//     column-parallel (QKV fused or separate, MLP-1 and a SwiGLU gate: split along their
//     output-feature dim, bias split the same way);
//   - otherwise (the first matmul after a norm, or after a row-parallel one through a residual
//     stream an RMS norm written by hand does not cut) W is a column candidate.
// A candidate left without a row partner is the LM head when its result reaches the loss's
// logits through shape-only ops (split along the vocabulary, tied to the embedding or not), else
// replicated (an MoE gate, BERT's MLM dense). The token embedding table (an embedding op's table)
// is split along the vocabulary; position embeddings, norms and everything else are replicated.
// A fused QKV whose output is cut into k equal parts (a reshape to [..., k, c] and slices of the
// k axis, or slices of the dim itself) is split part by part, as Megatron lays it out: a strided
// shard with stride c/t, so every device keeps its own heads of Q, K and V. A column/row group
// whose split dim t does not divide, or a vocabulary t does not divide, stays replicated (with a
// note): Megatron pads; weft's specs do not.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "weft/ir/graph.hpp"

namespace weft::plan {

enum class MegatronRole : std::uint8_t {
  Column,          // QKV, MLP-1, SwiGLU gate: split along the output-feature dim
  ColumnBias,      // a column-parallel matmul's bias: split as that output
  Row,             // attention-out, MLP-2: split along the input-feature (contracted) dim
  RowBias,         // added after the row-parallel all-reduce: replicated
  VocabEmbedding,  // the token embedding table (tied LM head included): split along the vocabulary
  VocabHead,       // an untied LM head weight: split along the vocabulary
  VocabHeadBias,   // the LM head's bias: split along the vocabulary
  Replicated,      // norms' scales and biases, position embeddings, anything else
};
std::string_view megatron_role_name(MegatronRole r);  // "column", "row_bias", "vocab_embedding", ...

struct MegatronParam {
  MegatronRole role = MegatronRole::Replicated;
  int dim = -1;             // the split dim of the parameter (-1: replicated)
  std::int64_t stride = 0;  // 0: block split; else strided (a fused projection split part by part)
  std::string spec = "R";   // sharding::ShardingSpec text on a 1-D mesh of t devices
  std::string note;         // why a parameter its role would split stays replicated
};

struct MegatronSpecs {
  int t = 1;
  std::map<std::string, MegatronParam> params;  // every Parameter leaf, by name
  // The results Megatron's layout determines, by tensor name, spec on t devices: a split weight
  // matmul's result (column: split as its output features; row: the partial sums its all-reduce
  // resolves, "P(sum)"; LM head: split along the vocabulary), the vocabulary-parallel embedding's
  // result (partial sums), and the gradient an update reads for a split parameter (its spec).
  std::map<std::string, std::string> results;
  // The fixed specs of a search (spmd::SearchOptions::fixed_specs): every parameter at its spec,
  // the optimizer states an update op keeps beside it (master copy, moments) at the same one, so
  // that the states and the loop-carried updates follow the parameter's layout, and `results`, so
  // that the ops run Megatron's strategies (no weight gathered for a batch-split op instead).
  std::map<std::string, std::string> fixed;
  // The activations between a split column-parallel matmul and its row-parallel one (attention's
  // heads, the MLP's hidden features) get the spec Megatron's layout gives them — the column's
  // split carried op by op through the index maps (the first strategy of each op that reads the
  // split operands as they are and everything else replicated) — in `results`.
  // boundaries: the spec a planner block boundary carries for a tensor Megatron's layout splits
  // (by name): the split results above, their gradients, and a split parameter's gradient
  // contributions (a tied embedding's two), instead of the replicated one of the residual stream.
  std::map<std::string, std::string> boundaries;
  // Some parameter is split by a Megatron role (column, row or vocabulary). False: nothing
  // GPT-like was found (a conv net), and megatron_plan keeps the free search, saying so.
  bool recognised = false;
  // Sequence parallelism: the residual stream between a partial result and the next weight matmul
  // (bias adds, dropout, residual adds, norms) split along its token dim, by name (also in
  // `results`, `boundaries` and `fixed`). Empty without sequence_parallel.
  bool sequence_parallel = false;
  std::map<std::string, std::string> sequence;
  int count(MegatronRole r) const;
  std::string summary() const;  // "24 column, 8 row, ... (t=4)"
};

// The roles and specs of `graph`'s parameters on t devices (t >= 1; t = 1: every spec "R" but the
// roles still recognised). `graph` may be a forward graph or a training step.
// sequence_parallel: also Megatron's sequence parallelism (MegatronSpecs::sequence).
MegatronSpecs megatron_specs(const ir::Graph& graph, int t, bool sequence_parallel = false);

}  // namespace weft::plan
