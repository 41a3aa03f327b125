// NCCL executor (see nccl_executor.hpp). Why one world communicator split per group: ncclCommSplit
// is collective over the world, so every rank walks the plan's groups in the same sorted order in
// prepare(); the communicator of a group is then reused by every op of that group and every later
// plan. Ops are issued in the plan's global (start, id) order on every rank, so the per-
// communicator order agrees across ranks and dependencies (all-gather phases reading what an
// earlier op wrote) are satisfied by stream order.
#include "weft/exec/nccl_executor.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "pack_kernels.hpp"
#include "weft/core/error.hpp"

namespace weft::exec {

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA error in {}: {}", what, cudaGetErrorString(e));
}
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) fail("NCCL error in {}: {}", what, ncclGetErrorString(r));
}

std::vector<int> group_of(const reshard::Op& op) {
  std::set<int> g(op.receivers.begin(), op.receivers.end());
  g.insert(op.sender);
  return {g.begin(), g.end()};
}

// Uploads runs and launches the copy kernel on `stream`; `scratch` holds the device run array.
void launch_runs(const std::vector<CopyRun>& runs, const void* src, void* dst, cudaStream_t stream,
                 detail::DevRun*& scratch, std::size_t& scratch_cap) {
  if (runs.empty()) return;
  if (runs.size() > scratch_cap) {
    if (scratch) cuda_check(cudaFreeAsync(scratch, stream), "cudaFreeAsync");
    cuda_check(cudaMallocAsync(reinterpret_cast<void**>(&scratch), runs.size() * sizeof(detail::DevRun), stream),
               "cudaMallocAsync");
    scratch_cap = runs.size();
  }
  static_assert(sizeof(CopyRun) == sizeof(detail::DevRun));
  cuda_check(cudaMemcpyAsync(scratch, runs.data(), runs.size() * sizeof(detail::DevRun), cudaMemcpyHostToDevice, stream),
             "cudaMemcpyAsync(runs)");
  // Pageable source: the copy above is staged before returning, but the next upload must not
  // overwrite `scratch` while this kernel reads it — stream order guarantees that.
  int rc = detail::launch_copy_runs(scratch, static_cast<int>(runs.size()), src, dst, stream);
  cuda_check(static_cast<cudaError_t>(rc), "copy_runs kernel");
}

}  // namespace

std::string nccl_unique_id_hex() {
  ncclUniqueId id;
  nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  std::string s;
  for (char c : id.internal) s += fmt::format("{:02x}", static_cast<unsigned char>(c));
  return s;
}

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

void device_copy_region(const void* src, const Region& src_tile, void* dst, const Region& dst_tile,
                        const Region& region, int64_t elem_size, void* cuda_stream) {
  auto runs = copy_runs(src_tile, dst_tile, region, elem_size);
  detail::DevRun* scratch = nullptr;
  std::size_t cap = 0;
  auto stream = static_cast<cudaStream_t>(cuda_stream);
  launch_runs(runs, src, dst, stream, scratch, cap);
  if (scratch) cuda_check(cudaFreeAsync(scratch, stream), "cudaFreeAsync");
  cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

struct NcclExecutor::Impl {
  int device = 0, cuda_device = 0;
  std::map<int, int> rank_of;
  ncclComm_t world = nullptr;
  std::map<std::vector<int>, ncclComm_t> comms;  // group (sorted device ids) -> communicator
  cudaStream_t stream = nullptr;
  void* staging = nullptr;
  std::size_t staging_cap = 0;
  detail::DevRun* runs = nullptr;
  std::size_t runs_cap = 0;

  void* stage(std::size_t bytes) {
    if (bytes > staging_cap) {
      if (staging) cuda_check(cudaFreeAsync(staging, stream), "cudaFreeAsync");
      cuda_check(cudaMallocAsync(&staging, bytes, stream), "cudaMallocAsync(staging)");
      staging_cap = bytes;
    }
    return staging;
  }
};

NcclExecutor::NcclExecutor(int device_id, std::map<int, int> device_rank, const std::string& hex, int cuda_device)
    : impl_(std::make_unique<Impl>()) {
  auto& m = *impl_;
  m.device = device_id;
  m.cuda_device = cuda_device;
  m.rank_of = std::move(device_rank);
  WEFT_CHECK(m.rank_of.count(device_id), "NcclExecutor: device {} has no rank", device_id);
  std::set<int> ranks;
  for (auto [d, r] : m.rank_of) ranks.insert(r);
  const int n = static_cast<int>(m.rank_of.size());
  WEFT_CHECK(static_cast<int>(ranks.size()) == n && *ranks.begin() == 0 && *ranks.rbegin() == n - 1,
             "NcclExecutor: ranks must be 0..{} once each", n - 1);
  ncclUniqueId id;
  WEFT_CHECK(hex.size() == 2 * sizeof(id.internal), "NcclExecutor: unique id must be {} hex characters, got {}",
             2 * sizeof(id.internal), hex.size());
  for (std::size_t i = 0; i < sizeof(id.internal); ++i)
    id.internal[i] = static_cast<char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  cuda_check(cudaSetDevice(cuda_device), "cudaSetDevice");
  cuda_check(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  nccl_check(ncclCommInitRank(&m.world, n, id, m.rank_of.at(device_id)), "ncclCommInitRank");
}

NcclExecutor::~NcclExecutor() {
  auto& m = *impl_;
  cudaSetDevice(m.cuda_device);
  if (m.stream) cudaStreamSynchronize(m.stream);
  for (auto& [g, c] : m.comms) ncclCommDestroy(c);
  if (m.world) ncclCommDestroy(m.world);
  if (m.staging) cudaFree(m.staging);
  if (m.runs) cudaFree(m.runs);
  if (m.stream) cudaStreamDestroy(m.stream);
}

int NcclExecutor::device_id() const { return impl_->device; }

void NcclExecutor::prepare(const reshard::ReshardPlan& plan) {
  auto& m = *impl_;
  cuda_check(cudaSetDevice(m.cuda_device), "cudaSetDevice");
  std::set<std::vector<int>> groups;
  for (const auto& op : plan.ops) {
    auto g = group_of(op);
    for (int d : g) WEFT_CHECK(m.rank_of.count(d), "NcclExecutor: plan device {} has no rank", d);
    groups.insert(g);
  }
  for (const auto& g : groups) {  // same sorted order on every rank: ncclCommSplit is collective
    if (m.comms.count(g)) continue;
    const bool member = std::binary_search(g.begin(), g.end(), m.device);
    // Key = position in the group, so a group's rank r is its r-th smallest device id.
    int key = member ? static_cast<int>(std::lower_bound(g.begin(), g.end(), m.device) - g.begin()) : 0;
    ncclComm_t c = nullptr;
    nccl_check(ncclCommSplit(m.world, member ? 1 : NCCL_SPLIT_NOCOLOR, key, &c, nullptr), "ncclCommSplit");
    if (member) m.comms[g] = c;
    else m.comms[g] = nullptr;  // remember that the split for this group was done
  }
}

NcclStats NcclExecutor::run(const reshard::ReshardPlan& plan, const std::vector<NcclTensorBuffers>& tensors) {
  auto& m = *impl_;
  const auto& p = plan.problem;
  WEFT_CHECK(tensors.size() == p.tensors.size(), "NcclExecutor::run: the plan moves {} tensors, got {}",
             p.tensors.size(), tensors.size());
  cuda_check(cudaSetDevice(m.cuda_device), "cudaSetDevice");
  std::vector<int> ids(plan.ops.size());
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int>(i);
  std::sort(ids.begin(), ids.end(), [&](int a, int b) {
    return std::make_pair(plan.ops[a].start, a) < std::make_pair(plan.ops[b].start, b);
  });
  NcclStats st;
  for (int id : ids) {
    const auto& op = plan.ops[id];
    auto g = group_of(op);
    if (!std::binary_search(g.begin(), g.end(), m.device)) continue;
    auto it = m.comms.find(g);
    WEFT_CHECK(it != m.comms.end() && it->second, "NcclExecutor::run: call prepare(plan) first (group of op {})", id);
    const auto& tb = tensors[op.tensor];
    const int64_t es = dtype_size(p.tensors[op.tensor].dtype);
    const bool sends = op.sender == m.device;
    const bool recvs = std::find(op.receivers.begin(), op.receivers.end(), m.device) != op.receivers.end();
    const std::size_t bytes = static_cast<std::size_t>(op.region.num_elements() * es);
    const Region& from_tile = op.from_destination ? tb.dst_tile : tb.src_tile;
    const void* from_ptr = op.from_destination ? tb.dst : tb.src;
    if (sends) WEFT_CHECK(from_ptr, "NcclExecutor::run: device {} has no buffer to send op {} from", m.device, id);
    if (recvs) WEFT_CHECK(tb.dst, "NcclExecutor::run: device {} has no destination buffer (op {})", m.device, id);
    // Sender: a contiguous region is broadcast in place, otherwise packed into staging first.
    auto send_runs = sends ? copy_runs(from_tile, op.region, op.region, es) : std::vector<CopyRun>{};
    auto recv_runs = recvs ? copy_runs(op.region, tb.dst_tile, op.region, es) : std::vector<CopyRun>{};
    void* buf = m.stage(bytes);
    const void* sendbuf = buf;
    if (sends) {
      if (send_runs.size() == 1) {
        sendbuf = static_cast<const char*>(from_ptr) + send_runs[0].src;
      } else {
        launch_runs(send_runs, from_ptr, buf, m.stream, m.runs, m.runs_cap);
        ++st.packs;
      }
    }
    void* recvbuf = buf;
    if (recvs && recv_runs.size() == 1) recvbuf = static_cast<char*>(tb.dst) + recv_runs[0].dst;
    const int root = static_cast<int>(std::lower_bound(g.begin(), g.end(), op.sender) - g.begin());
    nccl_check(ncclGroupStart(), "ncclGroupStart");
    nccl_check(ncclBroadcast(sendbuf, sends ? (recvs ? recvbuf : const_cast<void*>(sendbuf)) : recvbuf, bytes, ncclUint8,
                             root, it->second, m.stream),
               "ncclBroadcast");
    nccl_check(ncclGroupEnd(), "ncclGroupEnd");
    ++st.broadcasts;
    if (sends) st.bytes_sent += static_cast<int64_t>(bytes);
    if (recvs) {
      st.bytes_received += static_cast<int64_t>(bytes);
      if (recvbuf == buf) {
        launch_runs(recv_runs, buf, tb.dst, m.stream, m.runs, m.runs_cap);
        ++st.unpacks;
      }
    }
  }
  cuda_check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");
  for (const auto& [g, c] : m.comms) st.communicators += c != nullptr;
  return st;
}

}  // namespace weft::exec
