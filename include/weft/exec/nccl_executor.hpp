#pragma once
// NCCL executor of a cross-mesh resharding plan (built only when CUDA and NCCL are found and
// WEFT_ENABLE_NCCL is ON; then WEFT_HAVE_NCCL is defined). One process drives one GPU, which
// plays one device id of the plan; every process runs the same plan:
//   1. the launcher creates an ncclUniqueId on one process (nccl_unique_id_hex) and passes it to
//      all (e.g. an environment variable WEFT_NCCL_ID); each process builds
//      NcclExecutor(device_id, device_rank, id_hex, cuda_device) — collective over all ranks;
//   2. prepare(plan): collective; splits the world communicator into one communicator per
//      distinct group {sender} ∪ receivers of the plan's ops (cached across plans);
//   3. run(...): this device's share: for every op it sends or receives, in the plan's global
//      (start, id) order, the sender packs the region (kernel; skipped when it is one contiguous
//      run), ncclBroadcast inside ncclGroupStart/End on the group's communicator, the receivers
//      unpack into their tile. All work goes to one dedicated non-blocking stream; run() returns
//      after the stream is synchronised.
// Buffers use the CPU executor's layout: a device's tile, dense row-major over its local shape.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "weft/exec/cpu_executor.hpp"
#include "weft/reshard/plan.hpp"

namespace weft::exec {

// True when this build has the NCCL executor.
constexpr bool nccl_available() {
#ifdef WEFT_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

#ifdef WEFT_HAVE_NCCL

// A fresh ncclUniqueId as hex text (to hand to the other processes) and the number of GPUs.
std::string nccl_unique_id_hex();
int cuda_device_count();

// This device's buffers of one tensor: its source and destination tiles (Region as in the CPU
// executor) and device pointers to them (nullptr when it holds no tile of that side).
struct NcclTensorBuffers {
  Region src_tile, dst_tile;
  const void* src = nullptr;
  void* dst = nullptr;
};

struct NcclStats {
  int64_t bytes_sent = 0, bytes_received = 0;  // through NCCL by this rank
  int broadcasts = 0, packs = 0, unpacks = 0;
  int communicators = 0;  // cached groups
};

class NcclExecutor {
 public:
  // device_rank: plan device id -> NCCL rank (all processes pass the same map). Throws weft::Error
  // on a bad map, a bad id text or an NCCL/CUDA failure (with its message).
  NcclExecutor(int device_id, std::map<int, int> device_rank, const std::string& unique_id_hex, int cuda_device);
  ~NcclExecutor();
  NcclExecutor(const NcclExecutor&) = delete;
  NcclExecutor& operator=(const NcclExecutor&) = delete;

  void prepare(const reshard::ReshardPlan& plan);  // collective over all ranks
  NcclStats run(const reshard::ReshardPlan& plan, const std::vector<NcclTensorBuffers>& tensors);
  int device_id() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Single-GPU helpers, also used by the executor: copy `region` between two device buffers laid
// out as src_tile / dst_tile (one kernel over the byte runs; stream 0 when null).
void device_copy_region(const void* src, const Region& src_tile, void* dst, const Region& dst_tile,
                        const Region& region, int64_t elem_size, void* cuda_stream = nullptr);

#endif  // WEFT_HAVE_NCCL

}  // namespace weft::exec
