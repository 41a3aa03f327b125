// The last passes over a device group's instruction list (buckets_and_frees.cpp), run by
// lower_pipeline.cpp. Private to src/lower.
#pragma once

#include <set>
#include <vector>

#include "weft/lower/program.hpp"
#include "weft/sharding/sharding_spec.hpp"

namespace weft::lower {

// Gradient buckets of bucket_bytes (PipelineOptions::grad_bucket_bytes; <= 0: none): the replica
// all-reduces of the gradient means in grad_means (buffers; specs and buffers describe every
// buffer) moved, with their scales, right after the last write of their bucket's last gradient.
void bucket_gradient_syncs(std::vector<Instr>& list, double bucket_bytes, const std::set<int>& grad_means,
                           const std::vector<sharding::ShardingSpec>& specs,
                           const std::vector<Buffer>& buffers);
// A Free after the last use of each value of every buffer not in `keep`.
void add_frees(std::vector<Instr>& instrs, const std::set<int>& keep);

}  // namespace weft::lower
