// CPU reference executor. Layout of a device buffer: the tile's indices in global order along
// every dim, row-major over the tile's local shape. A region inside two tiles maps, dim by dim,
// to runs (src offset, dst offset, length) where both sides are contiguous; trailing dims that
// both tiles and the region cover fully are folded into the innermost run, so a block reshard of
// a large tensor is a few long memcpy calls.
//
// Threads: one per host that receives anything; each performs the deliveries to its devices in
// order of (simulated start, op id). An op waits for its dependencies (all-gather phases read
// what an earlier op wrote). Dependencies always have a smaller (start, id) key, so the
// unfinished delivery with the smallest key can always proceed: no deadlock.
#include "weft/exec/cpu_executor.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "weft/cluster/device_mesh.hpp"
#include "weft/core/error.hpp"
#include "weft/reshard/decompose.hpp"
#include "weft/sharding/sharding_spec.hpp"

namespace weft::exec {

namespace {

struct Seg {
  int64_t src, dst, len;
};

// Runs of one dim: region intervals mapped into both tiles' local offsets.
std::vector<Seg> dim_segments(const std::vector<reshard::Interval>& st,
                              const std::vector<reshard::Interval>& dt,
                              const std::vector<reshard::Interval>& reg, int dim) {
  auto prefix = [](const std::vector<reshard::Interval>& t) {
    std::vector<int64_t> p(t.size() + 1, 0);
    for (std::size_t i = 0; i < t.size(); ++i) p[i + 1] = p[i] + t[i].size();
    return p;
  };
  auto ps = prefix(st), pd = prefix(dt);
  auto locate = [dim](const std::vector<reshard::Interval>& t, int64_t g) {
    auto it = std::upper_bound(t.begin(), t.end(), g,
                               [](int64_t v, const reshard::Interval& iv) { return v < iv.begin; });
    WEFT_CHECK(it != t.begin() && g < std::prev(it)->end,
               "copy_region: index {} of dim {} is not in the tile", g, dim);
    return static_cast<std::size_t>(std::prev(it) - t.begin());
  };
  std::vector<Seg> out;
  for (const auto& iv : reg) {
    int64_t g = iv.begin;
    while (g < iv.end) {
      std::size_t a = locate(st, g), b = locate(dt, g);
      int64_t len = std::min({iv.end, st[a].end, dt[b].end}) - g;
      Seg s{ps[a] + (g - st[a].begin), pd[b] + (g - dt[b].begin), len};
      if (!out.empty() && out.back().src + out.back().len == s.src &&
          out.back().dst + out.back().len == s.dst)
        out.back().len += len;
      else
        out.push_back(s);
      g += len;
    }
  }
  return out;
}

struct CopyPlan {
  std::vector<std::vector<Seg>> segs;  // dims 0..k (k = innermost kept dim)
  std::vector<int64_t> sstride, dstride;
  int64_t inner_bytes = 0;  // bytes per unit length of the innermost kept dim
};

void copy_rec(const CopyPlan& cp, const std::byte* src, std::byte* dst, std::size_t d, int64_t so,
              int64_t dof) {
  const auto& segs = cp.segs[d];
  if (d + 1 == cp.segs.size()) {
    for (const Seg& s : segs)
      std::memcpy(dst + (dof + s.dst * cp.dstride[d]), src + (so + s.src * cp.sstride[d]),
                  static_cast<std::size_t>(s.len * cp.inner_bytes));
    return;
  }
  for (const Seg& s : segs)
    for (int64_t i = 0; i < s.len; ++i)
      copy_rec(cp, src, dst, d + 1, so + (s.src + i) * cp.sstride[d], dof + (s.dst + i) * cp.dstride[d]);
}

}  // namespace

namespace {
// Returns false when the region is empty (nothing to copy).
bool make_copy_plan(const Region& src_tile, const Region& dst_tile, const Region& region, int64_t elem_size,
                    CopyPlan& cp) {
  const int r = region.rank();
  WEFT_CHECK(src_tile.rank() == r && dst_tile.rank() == r, "copy_region: ranks {} / {} / {} differ", src_tile.rank(),
             dst_tile.rank(), r);
  if (region.empty()) return false;
  if (r == 0) {
    cp.segs = {{Seg{0, 0, 1}}};
    cp.sstride = cp.dstride = {elem_size};
    cp.inner_bytes = elem_size;
    return true;
  }
  auto se = src_tile.extents(), de = dst_tile.extents();
  for (int d = 0; d < r; ++d) cp.segs.push_back(dim_segments(src_tile.dims[d], dst_tile.dims[d], region.dims[d], d));
  // Byte strides of each dim in both layouts.
  std::vector<int64_t> ss(r), ds(r);
  int64_t a = elem_size, b = elem_size;
  for (int d = r - 1; d >= 0; --d) {
    ss[d] = a;
    ds[d] = b;
    a *= se[d];
    b *= de[d];
  }
  // Fold trailing dims covered entirely by the region and both tiles.
  int k = r - 1;
  while (k > 0 && cp.segs[k].size() == 1 && cp.segs[k][0].src == 0 && cp.segs[k][0].dst == 0 &&
         cp.segs[k][0].len == se[k] && cp.segs[k][0].len == de[k])
    --k;
  cp.segs.resize(k + 1);
  cp.sstride.assign(ss.begin(), ss.begin() + k + 1);
  cp.dstride.assign(ds.begin(), ds.begin() + k + 1);
  // Innermost kept dim: a unit of length covers the folded dims; src and dst agree on it.
  cp.inner_bytes = ss[k];
  WEFT_ASSERT(ss[k] == ds[k], "folded dims differ between layouts");
  return true;
}

void runs_rec(const CopyPlan& cp, std::vector<CopyRun>& out, std::size_t d, int64_t so, int64_t dof) {
  if (d + 1 == cp.segs.size()) {
    for (const Seg& s : cp.segs[d])
      out.push_back({so + s.src * cp.sstride[d], dof + s.dst * cp.dstride[d], s.len * cp.inner_bytes});
    return;
  }
  for (const Seg& s : cp.segs[d])
    for (int64_t i = 0; i < s.len; ++i)
      runs_rec(cp, out, d + 1, so + (s.src + i) * cp.sstride[d], dof + (s.dst + i) * cp.dstride[d]);
}
}  // namespace

void copy_region(const std::byte* src, const Region& src_tile, std::byte* dst, const Region& dst_tile,
                 const Region& region, int64_t elem_size) {
  CopyPlan cp;
  if (make_copy_plan(src_tile, dst_tile, region, elem_size, cp)) copy_rec(cp, src, dst, 0, 0, 0);
}

std::vector<CopyRun> copy_runs(const Region& src_tile, const Region& dst_tile, const Region& region,
                               int64_t elem_size) {
  CopyPlan cp;
  std::vector<CopyRun> out;
  if (make_copy_plan(src_tile, dst_tile, region, elem_size, cp)) runs_rec(cp, out, 0, 0, 0);
  return out;
}

std::vector<std::byte> pack(const std::byte* src, const Region& src_tile, const Region& region,
                            int64_t elem_size) {
  std::vector<std::byte> out(static_cast<std::size_t>(region.num_elements() * elem_size));
  copy_region(src, src_tile, out.data(), region, region, elem_size);
  return out;
}

void unpack(const std::vector<std::byte>& packed, std::byte* dst, const Region& dst_tile,
            const Region& region, int64_t elem_size) {
  WEFT_CHECK(static_cast<int64_t>(packed.size()) == region.num_elements() * elem_size,
             "unpack: {} bytes for a region of {} bytes", packed.size(), region.num_elements() * elem_size);
  copy_region(packed.data(), region, dst, dst_tile, region, elem_size);
}

DistributedTensor::DistributedTensor(std::vector<int64_t> shape, DType dtype, std::map<int, Region> tiles)
    : shape_(std::move(shape)), dtype_(dtype), tiles_(std::move(tiles)) {
  Region full = reshard::full_region(shape_);
  for (const auto& [d, t] : tiles_) {
    WEFT_CHECK(t.rank() == static_cast<int>(shape_.size()),
               "DistributedTensor: device {} tile has rank {}, tensor {}", d, t.rank(), shape_.size());
    WEFT_CHECK(full.contains(t), "DistributedTensor: device {} tile {} lies outside the tensor", d,
               t.to_string());
    buffers_[d].assign(static_cast<std::size_t>(t.num_elements() * dtype_size(dtype_)), std::byte{0});
  }
}

DistributedTensor DistributedTensor::from_spec(std::vector<int64_t> shape, DType dtype,
                                               const sharding::ShardingSpec& spec,
                                               const cluster::DeviceMesh& mesh) {
  WEFT_CHECK(spec.tensor_shape() == shape, "DistributedTensor: spec {} is for another shape",
             spec.to_string());
  WEFT_CHECK(spec.mesh_shape() == mesh.shape(), "DistributedTensor: spec {} is for another mesh than {}",
             spec.to_string(), mesh.to_string());
  return DistributedTensor(std::move(shape), dtype, reshard::tiles_by_device(spec, mesh));
}

const Region& DistributedTensor::tile(int device) const {
  auto it = tiles_.find(device);
  WEFT_CHECK(it != tiles_.end(), "DistributedTensor: device {} holds no buffer", device);
  return it->second;
}
std::vector<int64_t> DistributedTensor::local_shape(int device) const { return tile(device).extents(); }
std::vector<std::byte>& DistributedTensor::buffer(int device) {
  tile(device);
  return buffers_.at(device);
}
const std::vector<std::byte>& DistributedTensor::buffer(int device) const {
  tile(device);
  return buffers_.at(device);
}

void DistributedTensor::scatter_from(const void* global, std::size_t global_bytes) {
  Region full = reshard::full_region(shape_);
  const int64_t es = dtype_size(dtype_);
  WEFT_CHECK(static_cast<int64_t>(global_bytes) == full.num_elements() * es,
             "scatter_from: {} bytes given for a tensor of {} bytes", global_bytes, full.num_elements() * es);
  for (auto& [d, buf] : buffers_)
    copy_region(static_cast<const std::byte*>(global), full, buf.data(), tiles_.at(d), tiles_.at(d), es);
}

int DistributedTensor::mismatches(const void* global, std::size_t global_bytes) const {
  Region full = reshard::full_region(shape_);
  const int64_t es = dtype_size(dtype_);
  WEFT_CHECK(static_cast<int64_t>(global_bytes) == full.num_elements() * es,
             "mismatches: {} bytes given for a tensor of {} bytes", global_bytes, full.num_elements() * es);
  int bad = 0;
  for (const auto& [d, buf] : buffers_) {
    auto want = pack(static_cast<const std::byte*>(global), full, tiles_.at(d), es);
    if (want != buf) ++bad;
  }
  return bad;
}

ExecStats run(const reshard::ReshardPlan& plan, const std::vector<const DistributedTensor*>& src,
              const std::vector<DistributedTensor*>& dst, const CpuExecOptions& opt) {
  const auto& p = plan.problem;
  WEFT_CHECK(src.size() == p.tensors.size() && dst.size() == p.tensors.size(),
             "exec::run: the plan moves {} tensors, got {} sources and {} destinations", p.tensors.size(),
             src.size(), dst.size());
  for (std::size_t i = 0; i < src.size(); ++i) {
    WEFT_CHECK(src[i] && dst[i], "exec::run: tensor {} is null", i);
    for (const DistributedTensor* t : {src[i], static_cast<const DistributedTensor*>(dst[i])}) {
      WEFT_CHECK(t->shape() == p.tensors[i].shape, "exec::run: tensor {} has shape [{}], the plan [{}]", i,
                 fmt::join(t->shape(), ","), fmt::join(p.tensors[i].shape, ","));
      WEFT_CHECK(t->dtype() == p.tensors[i].dtype, "exec::run: tensor {} has dtype {}, the plan {}", i,
                 dtype_name(t->dtype()), dtype_name(p.tensors[i].dtype));
    }
  }
  const int n = static_cast<int>(plan.ops.size());
  auto key = [&](int id) { return std::make_pair(plan.ops[id].start, id); };
  for (const auto& op : plan.ops) {
    WEFT_CHECK(op.tensor >= 0 && op.tensor < static_cast<int>(p.tensors.size()), "exec::run: op {} tensor {}",
               op.id, op.tensor);
    const DistributedTensor* from = op.from_destination ? dst[op.tensor] : src[op.tensor];
    from->tile(op.sender);
    for (int d : op.receivers) dst[op.tensor]->tile(d);
    for (int d : op.deps)
      WEFT_CHECK(d >= 0 && d < n && key(d) < key(op.id),
                 "exec::run: op {} depends on op {} which is not earlier", op.id, d);
  }
  // Deliveries per host, in (start, id) order.
  std::map<int, std::vector<int>> work;
  std::vector<int> remaining(n, 0);
  for (const auto& op : plan.ops) {
    std::vector<int> hs;
    for (int d : op.receivers) hs.push_back(p.hosts.host_of(d));
    std::sort(hs.begin(), hs.end());
    hs.erase(std::unique(hs.begin(), hs.end()), hs.end());
    for (int h : hs) work[h].push_back(op.id);
    remaining[op.id] = static_cast<int>(hs.size());
  }
  for (auto& [h, v] : work) std::sort(v.begin(), v.end(), [&](int a, int b) { return key(a) < key(b); });

  std::mutex mu;
  std::condition_variable cv;
  std::vector<char> done(n, 0);
  for (int i = 0; i < n; ++i) done[i] = remaining[i] == 0;
  bool abort = false;
  std::exception_ptr error;
  ExecStats stats;
  const auto t0 = std::chrono::steady_clock::now();

  auto body = [&](int host, const std::vector<int>& ids) {
    ExecStats local;
    try {
      for (int id : ids) {
        const auto& op = plan.ops[id];
        {
          std::unique_lock lk(mu);
          cv.wait(lk, [&] {
            return abort || std::all_of(op.deps.begin(), op.deps.end(), [&](int d) { return done[d] != 0; });
          });
          if (abort) return;
        }
        const DistributedTensor* from = op.from_destination ? dst[op.tensor] : src[op.tensor];
        DistributedTensor* to = dst[op.tensor];
        const int64_t es = dtype_size(p.tensors[op.tensor].dtype);
        const std::byte* sbuf = from->buffer(op.sender).data();
        const Region& stile = from->tile(op.sender);
        std::vector<std::byte> msg;
        if (opt.staged) msg = pack(sbuf, stile, op.region, es);
        const bool remote =
            std::find(op.recv_hosts.begin(), op.recv_hosts.end(), host) != op.recv_hosts.end();
        int copies = 0;
        for (int d : op.receivers) {
          if (p.hosts.host_of(d) != host) continue;
          if (opt.staged)
            unpack(msg, to->buffer(d).data(), to->tile(d), op.region, es);
          else
            copy_region(sbuf, stile, to->buffer(d).data(), to->tile(d), op.region, es);
          ++copies;
        }
        local.bytes_written += op.bytes * copies;
        if (remote) {
          local.bytes_received[host] += op.bytes;
          local.bytes_local += op.bytes * (copies - 1);
        } else {
          local.bytes_local += op.bytes * copies;
        }
        {
          std::lock_guard lk(mu);
          if (--remaining[id] == 0) {
            done[id] = 1;
            if (!op.recv_hosts.empty()) stats.bytes_sent[op.send_host] += op.bytes;
          }
        }
        cv.notify_all();
      }
    } catch (...) {
      std::lock_guard lk(mu);
      if (!error) error = std::current_exception();
      abort = true;
      cv.notify_all();
      return;
    }
    std::lock_guard lk(mu);
    for (auto [h, b] : local.bytes_received) stats.bytes_received[h] += b;
    stats.bytes_local += local.bytes_local;
    stats.bytes_written += local.bytes_written;
  };

  std::vector<std::thread> threads;
  for (const auto& [h, ids] : work) threads.emplace_back(body, h, std::cref(ids));
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
  stats.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return stats;
}

}  // namespace weft::exec
