// NCCL executor tests. They need a GPU: without CUDA/NCCL in the build, or without a GPU at run
// time, they are reported as skipped. One GPU exercises the pack/unpack kernel, one-rank
// communicators (ncclCommSplit of a one-rank world) and the copy paths.
#include <doctest/doctest.h>

#include "weft/exec/nccl_executor.hpp"

#ifndef WEFT_HAVE_NCCL

TEST_CASE("nccl executor (not built: CUDA toolkit or NCCL not found)" * doctest::skip()) {}

#else

#include <cuda_runtime.h>

#include <cstring>
#include <random>

#include "weft/core/error.hpp"
#include "weft/reshard/plan.hpp"

using namespace weft;
using namespace weft::exec;

namespace {
bool has_gpu() { return cuda_device_count() > 0; }

struct DevBuf {
  void* p = nullptr;
  explicit DevBuf(std::size_t n) { REQUIRE(cudaMalloc(&p, n == 0 ? 1 : n) == cudaSuccess); }
  ~DevBuf() { cudaFree(p); }
};
}  // namespace

TEST_CASE("nccl: device pack/unpack kernel equals the CPU copy" * doctest::skip(!has_gpu())) {
  std::mt19937 rng(5);
  for (int iter = 0; iter < 50; ++iter) {
    std::vector<int64_t> shape{1 + static_cast<int64_t>(rng() % 9), 1 + static_cast<int64_t>(rng() % 40)};
    auto rnd_region = [&] {
      Region r;
      for (int64_t n : shape) {
        std::vector<reshard::Interval> d;
        for (int64_t i = 0; i < n; ++i)
          if (rng() % 3) {
            if (!d.empty() && d.back().end == i)
              d.back().end = i + 1;
            else
              d.push_back({i, i + 1});
          }
        if (d.empty()) d.push_back({0, 1});
        r.dims.push_back(d);
      }
      return r;
    };
    Region st = rnd_region(), dt = rnd_region(), reg = reshard::intersect(st, dt);
    if (reg.empty()) continue;
    const int es = 4;
    std::vector<std::byte> src(static_cast<std::size_t>(st.num_elements() * es));
    for (auto& b : src) b = static_cast<std::byte>(rng());
    std::vector<std::byte> want(static_cast<std::size_t>(dt.num_elements() * es), std::byte{0}), got = want;
    copy_region(src.data(), st, want.data(), dt, reg, es);
    DevBuf ds(src.size()), dd(got.size());
    REQUIRE(cudaMemcpy(ds.p, src.data(), src.size(), cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemset(dd.p, 0, got.size()) == cudaSuccess);
    device_copy_region(ds.p, st, dd.p, dt, reg, es);
    REQUIRE(cudaMemcpy(got.data(), dd.p, got.size(), cudaMemcpyDeviceToHost) == cudaSuccess);
    CHECK(got == want);
  }
}

TEST_CASE("nccl: one-rank communicator moves a strided region through ncclBroadcast" * doctest::skip(!has_gpu())) {
  // Tensor 8x8 f32 held whole by device 0 in both layouts; one unit task with a strided region.
  reshard::ReshardProblem p;
  p.hosts = reshard::HostMap(std::map<int, int>{{0, 0}});
  p.tensors.push_back({{8, 8}, DType::F32});
  Region reg{{{{2, 5}}, {{1, 4}, {6, 8}}}};
  p.tasks.push_back(reshard::UnitTask{0, reg, reg.num_elements() * 4, {0}, {0}});
  auto plan = reshard::plan(p);
  Region full = reshard::full_region({8, 8});
  std::vector<float> host(64), out(64, 0.f), want(64, 0.f);
  for (int i = 0; i < 64; ++i) host[i] = static_cast<float>(i);
  copy_region(reinterpret_cast<const std::byte*>(host.data()), full, reinterpret_cast<std::byte*>(want.data()), full,
              reg, 4);
  DevBuf s(256), d(256);
  REQUIRE(cudaMemcpy(s.p, host.data(), 256, cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemset(d.p, 0, 256) == cudaSuccess);
  NcclExecutor ex(0, {{0, 0}}, nccl_unique_id_hex(), 0);
  ex.prepare(plan);
  NcclStats st = ex.run(plan, {NcclTensorBuffers{full, full, s.p, d.p}});
  REQUIRE(cudaMemcpy(out.data(), d.p, 256, cudaMemcpyDeviceToHost) == cudaSuccess);
  CHECK(out == want);
  CHECK(st.broadcasts == 1);
  CHECK(st.packs == 1);
  CHECK(st.unpacks == 1);
  CHECK(st.communicators == 1);
  CHECK_THROWS_AS(NcclExecutor(0, {{0, 1}}, nccl_unique_id_hex(), 0), Error);  // ranks must be 0..n-1
  CHECK_THROWS_AS(NcclExecutor(0, {{0, 0}}, "zz", 0), Error);
}

#endif
