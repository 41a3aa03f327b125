// The last passes over a device group's instruction list (buckets_and_frees.cpp), run by
// lower_pipeline.cpp. Private to src/lower.
#pragma once

#include <functional>
#include <map>
#include <set>
#include <vector>

#include "weft/lower/program.hpp"
#include "weft/sharding/sharding_spec.hpp"

namespace weft::lower {

// `list` without the instructions marked in `moved` (one flag per position), each `after[k]`
// (instructions moved there) inserted right after position k: how the bucket passes re-lay a list.
void splice_moved(std::vector<Instr>& list, const std::vector<char>& moved,
                  std::map<int, std::vector<Instr>>& after);

// Gradient buckets of bucket_bytes (PipelineOptions::grad_bucket_bytes; <= 0: none): the replica
// all-reduces of the gradient means in grad_means (buffers; specs and buffers describe every
// buffer) moved, with their scales, right after the last write of their bucket's last gradient.
// (ZeRO-1's once-per-step reduce-scatters of the means are such buckets too; one kind per bucket.)
// Bucket ids from next_bucket on (unique in the list).
void bucket_gradient_syncs(std::vector<Instr>& list, double bucket_bytes, const std::set<int>& grad_means,
                           const std::vector<sharding::ShardingSpec>& specs,
                           const std::vector<Buffer>& buffers, int& next_bucket);
// ZeRO's collectives in buckets (zero_buckets.cpp; bucket_bytes <= 0: none), each bucket a run of
// adjacent collectives of one kind marked with a fresh id from next_bucket:
// ZeRO-2/3's per-micro-batch gradient reduce-scatters (each with its scale and its copy /
// accumulate into the sharded accumulator) grouped by bytes of gradient in the order the
// gradients are made, each bucket right after the op that makes its last gradient.
// `segment` as for bucket_zero3_gathers: a bucket stays in one run of a phase (one micro-batch).
void bucket_zero_reduce_scatters(std::vector<Instr>& list, const std::vector<int>& segment,
                                 double bucket_bytes, const std::vector<sharding::ShardingSpec>& specs,
                                 const std::vector<Buffer>& buffers, int& next_bucket);
// ZeRO-1/2's end-of-step all-gathers of the new parameters into their leaves (`leaves`: the leaf
// buffers) grouped by bytes of parameter, each bucket right after the update of its last one.
void bucket_zero_step_gathers(std::vector<Instr>& list, double bucket_bytes, const std::set<int>& leaves,
                              const std::vector<sharding::ShardingSpec>& specs,
                              const std::vector<Buffer>& buffers, int& next_bucket);
// ZeRO-3's gathers of the sharded parameter leaves (`sharded_params`) per run of one unit's ops
// (`unit_of` an op) inside each run of one phase (`segment`: per instruction of the list, equal
// ids contiguous), each run's bucket issued at the start of the run before it (prefetch depth 1).
void bucket_zero3_gathers(std::vector<Instr>& list, const std::vector<int>& segment,
                          const std::set<int>& sharded_params,
                          const std::function<long long(ir::OpId)>& unit_of, int& next_bucket);
// A Free after the last use of each value of every buffer not in `keep` (after a bucket: its run).
void add_frees(std::vector<Instr>& instrs, const std::set<int>& keep);

}  // namespace weft::lower
