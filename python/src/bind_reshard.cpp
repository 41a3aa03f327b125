// Bindings of weft/reshard: cross-mesh resharding plans. Python names carry a CrossMesh prefix
// (weft.sharding already binds the intra-mesh ReshardPlan); python/weft/reshard.py wraps them.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "weft/cluster/cluster.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/reshard/decompose.hpp"
#include "weft/reshard/plan.hpp"
#include "weft/sharding/sharding_spec.hpp"

namespace py = pybind11;
using namespace weft::reshard;

namespace {
py::list region_py(const Region& r) {
  py::list out;
  for (const auto& d : r.dims) {
    py::list dl;
    for (const auto& iv : d) dl.append(py::make_tuple(iv.begin, iv.end));
    out.append(dl);
  }
  return out;
}
using TensorArgs =
    std::tuple<std::vector<int64_t>, std::string, weft::sharding::ShardingSpec, weft::cluster::DeviceMesh,
               weft::sharding::ShardingSpec, weft::cluster::DeviceMesh>;
}  // namespace

void bind_reshard(py::module_& m) {
  py::class_<UnitTask>(m, "CrossMeshUnitTask", "One (destination tile ∩ source tile) region of a tensor.")
      .def_readonly("tensor", &UnitTask::tensor)
      .def_property_readonly("region", [](const UnitTask& t) { return region_py(t.region); })
      .def_readonly("bytes", &UnitTask::bytes)
      .def_readonly("senders", &UnitTask::senders)
      .def_readonly("receivers", &UnitTask::receivers)
      .def("__repr__", &UnitTask::to_string);

  py::class_<Op>(m, "CrossMeshOp", "One transfer (or intra-host copy when recv_hosts is empty).")
      .def_readonly("id", &Op::id)
      .def_readonly("task", &Op::task)
      .def_readonly("tensor", &Op::tensor)
      .def_readonly("sender", &Op::sender)
      .def_readonly("from_destination", &Op::from_destination)
      .def_readonly("receivers", &Op::receivers)
      .def_property_readonly("region", [](const Op& o) { return region_py(o.region); })
      .def_readonly("bytes", &Op::bytes)
      .def_readonly("send_host", &Op::send_host)
      .def_readonly("recv_hosts", &Op::recv_hosts)
      .def_readonly("deps", &Op::deps)
      .def_readonly("start", &Op::start)
      .def_readonly("duration", &Op::duration);

  py::class_<ReshardPlan>(m, "CrossMeshPlan", "A cross-mesh resharding plan: per-host ordered transfers.")
      .def_readonly("completion_time", &ReshardPlan::completion_time)
      .def_property_readonly("lower_bound", [](const ReshardPlan& p) { return p.bound.value; })
      .def_property_readonly("lower_bound_per_host", [](const ReshardPlan& p) { return p.bound.per_host; })
      .def_property_readonly(
          "lower_bound_parts",
          [](const ReshardPlan& p) {
            return std::map<std::string, double>{{"per_host", p.bound.per_host},
                                                 {"sender_sets", p.bound.sender_sets},
                                                 {"cliques", p.bound.cliques},
                                                 {"whole_tasks", p.bound.whole_tasks}};
          },
          "The lower bound's parts in seconds (the bound is their max).")
      .def_property_readonly("ratio", &ReshardPlan::ratio)
      .def_readonly("balancer_used", &ReshardPlan::balancer_used)
      .def_property_readonly("strategy", [](const ReshardPlan& p) { return to_string(p.options.strategy); })
      .def_property_readonly("unit_tasks", [](const ReshardPlan& p) { return p.problem.tasks; })
      .def_readonly("ops", &ReshardPlan::ops)
      .def_readonly("order", &ReshardPlan::order)
      .def("nic_bytes_sent", &ReshardPlan::nic_bytes_sent)
      .def("nic_bytes_received", &ReshardPlan::nic_bytes_received)
      .def("to_json", &ReshardPlan::to_json)
      .def(
          "resimulate", [](ReshardPlan p) { return simulate(p); }, "Re-runs the host-level simulator.")
      .def("__repr__", &ReshardPlan::summary);

  m.def(
      "_cross_mesh_plan",
      [](const std::vector<TensorArgs>& tensors, const std::map<int, int>& device_host,
         const std::map<int, double>& bandwidth, double default_bandwidth, const std::string& strategy,
         const std::string& balancer, uint64_t seed, int64_t dfs_node_limit, double time_limit_s,
         int greedy_restarts, int broadcast_chunks) {
        std::vector<TensorReshard> ts;
        for (const auto& [shape, dtype, ss, sm, ds, dm] : tensors)
          ts.emplace_back(shape, weft::parse_dtype(dtype), ss, sm, ds, dm);
        PlanOptions o;
        o.strategy = parse_strategy(strategy);
        o.balancer = parse_balancer(balancer);
        o.seed = seed;
        o.dfs_node_limit = dfs_node_limit;
        o.time_limit_s = time_limit_s;
        o.greedy_restarts = greedy_restarts;
        o.broadcast_chunks = broadcast_chunks;
        py::gil_scoped_release nogil;
        return plan(make_problem(ts, HostMap(device_host, bandwidth, default_bandwidth)), o);
      },
      py::arg("tensors"), py::arg("device_host"), py::arg("bandwidth"), py::arg("default_bandwidth"),
      py::arg("strategy"), py::arg("balancer"), py::arg("seed"), py::arg("dfs_node_limit"),
      py::arg("time_limit_s"), py::arg("greedy_restarts"), py::arg("broadcast_chunks"));

  m.def(
      "_cross_mesh_rows_hosts",
      [](const std::vector<weft::cluster::DeviceMesh>& meshes) {
        return HostMap::mesh_rows(meshes).device_host();
      },
      py::arg("meshes"), "device -> host with each mesh row (all axes but the last) a host.");
  m.def(
      "_cross_mesh_cluster_hosts",
      [](const weft::cluster::Cluster& c) {
        HostMap h = HostMap::from_cluster(c);
        std::map<int, double> bw;
        for (int x : h.hosts()) bw[x] = h.bandwidth(x);
        return std::make_pair(h.device_host(), bw);
      },
      py::arg("cluster"), "(device -> node, node -> NIC bandwidth) of a Cluster.");
}
