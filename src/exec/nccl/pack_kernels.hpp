#pragma once
// Internal: the byte-run copy kernel (compiled by nvcc into weft_exec_nccl_kernels).
#include <cstdint>

namespace weft::exec::detail {
struct DevRun {
  int64_t src, dst, len;
};
// Copies n runs (device array `runs`) from src to dst on `stream` (a cudaStream_t).
int launch_copy_runs(const DevRun* runs, int n, const void* src, void* dst, void* stream);
}  // namespace weft::exec::detail
