// Bindings of weft/exec: the CPU reference executor on global numpy arrays (bytes in, bytes out;
// python/weft/reshard.py turns them back into arrays).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "weft/cluster/device_mesh.hpp"
#include "weft/exec/cpu_executor.hpp"
#include "weft/sharding/sharding_spec.hpp"

namespace py = pybind11;

void bind_exec(py::module_& m) {
  using Args = std::tuple<py::bytes, std::vector<int64_t>, std::string, weft::sharding::ShardingSpec,
                          weft::cluster::DeviceMesh, weft::sharding::ShardingSpec, weft::cluster::DeviceMesh>;
  m.def(
      "_cross_mesh_execute",
      [](const weft::reshard::ReshardPlan& plan, const std::vector<Args>& tensors, bool staged) {
        std::vector<weft::exec::DistributedTensor> src, dst;
        src.reserve(tensors.size());
        dst.reserve(tensors.size());
        for (const auto& [data, shape, dtype, ss, sm, ds, dm] : tensors) {
          auto dt = weft::parse_dtype(dtype);
          src.push_back(weft::exec::DistributedTensor::from_spec(shape, dt, ss, sm));
          dst.push_back(weft::exec::DistributedTensor::from_spec(shape, dt, ds, dm));
          std::string_view v = data;
          src.back().scatter_from(v.data(), v.size());
        }
        std::vector<const weft::exec::DistributedTensor*> sp;
        std::vector<weft::exec::DistributedTensor*> dp;
        for (std::size_t i = 0; i < src.size(); ++i) {
          sp.push_back(&src[i]);
          dp.push_back(&dst[i]);
        }
        weft::exec::ExecStats st;
        {
          py::gil_scoped_release nogil;
          st = weft::exec::run(plan, sp, dp, {staged});
        }
        py::list out;
        for (const auto& t : dst) {
          py::dict devs;
          for (const auto& [d, tile] : t.tiles()) {
            const auto& b = t.buffer(d);
            devs[py::int_(d)] = py::make_tuple(
                py::bytes(reinterpret_cast<const char*>(b.data()), b.size()), t.local_shape(d));
          }
          out.append(devs);
        }
        py::dict stats;
        stats["bytes_sent"] = st.bytes_sent;
        stats["bytes_received"] = st.bytes_received;
        stats["bytes_local"] = st.bytes_local;
        stats["bytes_written"] = st.bytes_written;
        stats["seconds"] = st.seconds;
        return py::make_tuple(out, stats);
      },
      py::arg("plan"), py::arg("tensors"), py::arg("staged") = false);
}
