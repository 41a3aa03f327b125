// Pack/unpack kernel: one block per byte run (grid-stride over runs), 16-byte vector copies when
// both ends and the length are 16-byte aligned, bytes otherwise.
#include <cuda_runtime.h>

#include "pack_kernels.hpp"

namespace weft::exec::detail {

__global__ void copy_runs_kernel(const DevRun* runs, int n, const char* src, char* dst) {
  for (int r = blockIdx.x; r < n; r += gridDim.x) {
    const DevRun x = runs[r];
    const char* s = src + x.src;
    char* d = dst + x.dst;
    if (((reinterpret_cast<uintptr_t>(s) | reinterpret_cast<uintptr_t>(d) | static_cast<uintptr_t>(x.len)) & 15) == 0) {
      const int4* s4 = reinterpret_cast<const int4*>(s);
      int4* d4 = reinterpret_cast<int4*>(d);
      for (int64_t i = threadIdx.x; i < x.len / 16; i += blockDim.x) d4[i] = s4[i];
    } else {
      for (int64_t i = threadIdx.x; i < x.len; i += blockDim.x) d[i] = s[i];
    }
  }
}

int launch_copy_runs(const DevRun* runs, int n, const void* src, void* dst, void* stream) {
  if (n <= 0) return 0;
  int blocks = n < 4096 ? n : 4096;
  copy_runs_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(runs, n, static_cast<const char*>(src),
                                                                          static_cast<char*>(dst));
  return static_cast<int>(cudaGetLastError());
}

}  // namespace weft::exec::detail
