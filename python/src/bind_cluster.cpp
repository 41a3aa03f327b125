// Bindings of weft/cluster: Cluster, DeviceSpec, Device, NodeSpec, DeviceMesh, AxisLink, α-β.
#include <fmt/format.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <string>

#include "weft/cluster/alpha_beta.hpp"
#include "weft/cluster/cluster.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/dtype.hpp"

namespace py = pybind11;
using namespace weft::cluster;

namespace {

py::dict peak_dict(const DeviceSpec& d) {
  py::dict r;
  for (auto& [t, f] : d.peak_flops) r[py::str(std::string(weft::dtype_name(t)))] = f;
  return r;
}

}  // namespace

void bind_cluster(py::module_& m) {
  py::class_<MatmulEfficiency>(
      m, "MatmulEfficiency",
      "Matmul efficiency against GEMM shape: ceiling x min(1, b*m*n / fill_elements) "
      "x k / (k + half_k) of the datasheet peak, never below floor (a calibration's "
      "smallest fitted shapes).")
      .def(py::init([](double ceiling, double fill, double half_k, double floor) {
             if (!(ceiling > 0 && ceiling <= 1)) throw py::value_error("ceiling must be in (0, 1]");
             if (!(fill >= 0) || !(half_k >= 0))
               throw py::value_error("fill_elements and half_k must be >= 0");
             if (!(floor >= 0 && floor <= ceiling)) throw py::value_error("floor must be in [0, ceiling]");
             return MatmulEfficiency{ceiling, fill, half_k, floor};
           }),
           py::arg("ceiling") = 1.0, py::arg("fill_elements") = 0.0, py::arg("half_k") = 0.0,
           py::arg("floor") = 0.0)
      .def_readonly("ceiling", &MatmulEfficiency::ceiling)
      .def_readonly("fill_elements", &MatmulEfficiency::fill_elements)
      .def_readonly("half_k", &MatmulEfficiency::half_k)
      .def_readonly("floor", &MatmulEfficiency::floor)
      .def(
          "at",
          [](const MatmulEfficiency& e, double m, double k, double n, double batch) {
            if (!(m > 0 && k > 0 && n > 0 && batch > 0)) throw py::value_error("m, k, n, batch must be > 0");
            return e.at(batch * m * n, k);
          },
          py::arg("m"), py::arg("k"), py::arg("n"), py::arg("batch") = 1.0,
          "Fraction of the datasheet peak a (batch x) m x k @ k x n GEMM reaches.")
      .def("__eq__", [](const MatmulEfficiency& a, const MatmulEfficiency& b) { return a == b; })
      .def("__repr__", [](const MatmulEfficiency& e) {
        return fmt::format("MatmulEfficiency(ceiling={}, fill_elements={}, half_k={}{})", e.ceiling,
                           e.fill_elements, e.half_k,
                           e.floor > 0 ? fmt::format(", floor={}", e.floor) : std::string());
      });

  py::class_<DeviceSpec>(m, "DeviceSpec",
                         "A GPU kind: peak FLOP/s per dtype, memory bytes, memory bandwidth, and its efficiency "
                         "model (matmul efficiency per dtype, memory efficiency, kernel overhead).")
      .def(
          py::init([](const std::string& kind, const py::dict& peak, double mem, double bw, double overhead,
                      const py::dict& matmul, double mem_eff) {
            DeviceSpec d;
            d.kind = kind;
            for (auto& [k, v] : peak)
              d.peak_flops[weft::parse_dtype(py::str(k).cast<std::string>())] = v.cast<double>();
            for (auto& [k, v] : matmul)
              d.matmul_efficiency[weft::parse_dtype(py::str(k).cast<std::string>())] = v.cast<MatmulEfficiency>();
            d.memory_bytes = mem;
            d.memory_bandwidth = bw;
            d.kernel_overhead = overhead;
            d.memory_efficiency = mem_eff;
            return d;
          }),
          py::arg("kind"), py::arg("peak_flops"), py::arg("memory_bytes"), py::arg("memory_bandwidth"),
          py::arg("kernel_overhead") = 0.0, py::arg("matmul_efficiency") = py::dict(),
          py::arg("memory_efficiency") = 1.0)
      .def_property_readonly("matmul_efficiency",
                             [](const DeviceSpec& d) {
                               py::dict r;
                               for (auto& [t, e] : d.matmul_efficiency)
                                 r[py::str(std::string(weft::dtype_name(t)))] = e;
                               return r;
                             })
      .def_readonly("memory_efficiency", &DeviceSpec::memory_efficiency,
                    "Fraction of the memory bandwidth memory-bound ops reach.")
      .def(
          "matmul", [](const DeviceSpec& d, const std::string& t) { return d.matmul(weft::parse_dtype(t)); },
          py::arg("dtype"), "The dtype's matmul efficiency (the datasheet's 1, 0, 0 when it has none).")
      .def("datasheet", &DeviceSpec::datasheet, "The same device at 100% of its datasheet.")
      .def_readonly("kind", &DeviceSpec::kind)
      .def_property_readonly("peak_flops", &peak_dict)
      .def_readonly("memory_bytes", &DeviceSpec::memory_bytes)
      .def_readonly("memory_bandwidth", &DeviceSpec::memory_bandwidth)
      .def_readonly("kernel_overhead", &DeviceSpec::kernel_overhead,
                    "Seconds added to every op (kernel launch).")
      .def(
          "peak", [](const DeviceSpec& d, const std::string& t) { return d.peak(weft::parse_dtype(t)); },
          py::arg("dtype"))
      .def("__eq__", [](const DeviceSpec& a, const DeviceSpec& b) { return a == b; })
      .def("__repr__", [](const DeviceSpec& d) { return fmt::format("DeviceSpec('{}')", d.kind); });

  py::class_<Device>(m, "Device", "One GPU of a cluster: global id, node index, spec.")
      .def_readonly("id", &Device::id)
      .def_readonly("node", &Device::node)
      .def_readonly("spec", &Device::spec)
      .def_property_readonly("kind", [](const Device& d) { return d.spec.kind; })
      .def("__repr__", [](const Device& d) {
        return fmt::format("Device(id={}, node={}, {})", d.id, d.node, d.spec.kind);
      });

  py::class_<NodeSpec>(m, "NodeSpec",
                       "A node: GPUs of one kind, intra-node link, NIC shared by the node's GPUs.")
      .def(py::init([](const std::string& name, int n, const DeviceSpec& d, double intra_bw, double intra_lat,
                       double nic_bw, double nic_lat, const std::map<std::string, double>& factors) {
             NodeSpec s{name, n, d, {intra_bw, intra_lat}, {nic_bw, nic_lat}, {}};
             auto& f = s.collective_factors;
             for (const auto& [k, v] : factors) {
               double* slot = k == "all_reduce"       ? &f.all_reduce
                              : k == "all_gather"     ? &f.all_gather
                              : k == "reduce_scatter" ? &f.reduce_scatter
                              : k == "all_to_all"     ? &f.all_to_all
                              : k == "p2p"            ? &f.p2p
                                                      : nullptr;
               if (!slot)
                 throw py::value_error(
                     fmt::format("collective_factors: unknown collective '{}' (all_reduce, "
                                 "all_gather, reduce_scatter, all_to_all, p2p)",
                                 k));
               *slot = v;
             }
             return s;
           }),
           py::arg("name"), py::arg("num_devices"), py::arg("device"), py::arg("intra_bandwidth"),
           py::arg("intra_latency"), py::arg("nic_bandwidth"), py::arg("nic_latency"),
           py::arg("collective_factors") = std::map<std::string, double>{})
      .def_readonly("name", &NodeSpec::name)
      .def_readonly("num_devices", &NodeSpec::num_devices)
      .def_readonly("device", &NodeSpec::device)
      .def_property_readonly("intra_bandwidth", [](const NodeSpec& n) { return n.intra.bandwidth; })
      .def_property_readonly("intra_latency", [](const NodeSpec& n) { return n.intra.latency; })
      .def_property_readonly("nic_bandwidth", [](const NodeSpec& n) { return n.nic.bandwidth; })
      .def_property_readonly("nic_latency", [](const NodeSpec& n) { return n.nic.latency; })
      .def_property_readonly("collective_factors",
                             [](const NodeSpec& n) {
                               const auto& f = n.collective_factors;
                               return std::map<std::string, double>{{"all_reduce", f.all_reduce},
                                                                    {"all_gather", f.all_gather},
                                                                    {"reduce_scatter", f.reduce_scatter},
                                                                    {"all_to_all", f.all_to_all},
                                                                    {"p2p", f.p2p}};
                             })
      .def("__eq__", [](const NodeSpec& a, const NodeSpec& b) { return a == b; })
      .def("__repr__", [](const NodeSpec& n) {
        return fmt::format("NodeSpec('{}', {}x {})", n.name, n.num_devices, n.device.kind);
      });

  py::class_<Cluster>(m, "Cluster", "Nodes of GPUs with intra-node links and shared NICs; presets and JSON.")
      .def(py::init<std::vector<NodeSpec>>(), py::arg("nodes"))
      .def_static("preset", &Cluster::preset, py::arg("name"), py::arg("nodes") = 1,
                  "A preset: M8, S1, p3.8xlarge, DGX-A100, H100, H200, P100, T4 (see docs/modules/cluster.md).")
      .def_static("preset_names", &Cluster::preset_names)
      .def_static("concat", &Cluster::concat, py::arg("a"), py::arg("b"))
      .def_static("from_json", &Cluster::from_json, py::arg("text"))
      .def("to_json", &Cluster::to_json)
      .def("datasheet", &Cluster::datasheet,
           "Every device at its datasheet (no efficiency model, no kernel overhead): the old 100%-of-peak model.")
      .def("__add__", [](const Cluster& a, const Cluster& b) { return Cluster::concat(a, b); })
      .def_property_readonly("devices", &Cluster::devices)
      .def_property_readonly("nodes", &Cluster::nodes)
      .def_property_readonly("num_devices", &Cluster::num_devices)
      .def_property_readonly("num_nodes", &Cluster::num_nodes)
      .def("device", &Cluster::device, py::arg("id"))
      .def("node_of", &Cluster::node_of, py::arg("device_id"))
      .def("devices_of_node", &Cluster::devices_of_node, py::arg("node"))
      .def_property_readonly("homogeneous", &Cluster::homogeneous)
      .def("__len__", &Cluster::num_devices)
      .def("__eq__", [](const Cluster& a, const Cluster& b) { return a == b; })
      .def("__repr__", &Cluster::to_string);

  py::class_<DeviceMesh>(m, "DeviceMesh",
                         "An N-D logical view of devices (row-major ids); immutable, hashable.")
      .def(py::init<std::vector<int64_t>, std::vector<int>, std::vector<std::string>>(), py::arg("shape"),
           py::arg("device_ids"), py::arg("axis_names") = std::vector<std::string>{})
      .def_static("iota", &DeviceMesh::iota, py::arg("shape"), py::arg("first") = 0,
                  py::arg("axis_names") = std::vector<std::string>{})
      .def_property_readonly("ndim", &DeviceMesh::ndim)
      .def_property_readonly("size", &DeviceMesh::size)
      .def_property_readonly("shape", &DeviceMesh::shape)
      .def_property_readonly("axis_names", &DeviceMesh::axis_names)
      .def_property_readonly("device_ids", &DeviceMesh::device_ids)
      .def_property_readonly("is_iota", &DeviceMesh::is_iota)
      .def("device_at", &DeviceMesh::device_at, py::arg("coord"))
      .def("coord_of", &DeviceMesh::coord_of, py::arg("device_id"))
      .def("group_along", &DeviceMesh::group_along, py::arg("coord"), py::arg("axis"))
      .def("reshape", &DeviceMesh::reshape, py::arg("shape"),
           py::arg("axis_names") = std::vector<std::string>{})
      .def(
          "axis_links", [](const DeviceMesh& mesh, const Cluster& c) { return axis_links(c, mesh); },
          py::arg("cluster"), "α (s) and β (s/byte) per mesh axis on a cluster.")
      .def("__eq__", [](const DeviceMesh& a, const DeviceMesh& b) { return a == b; })
      .def("__hash__", &DeviceMesh::hash)
      .def("__repr__", &DeviceMesh::to_string);

  py::class_<AxisLink>(m, "AxisLink", "α-β of one mesh axis (flat-ring bottleneck plus intra/inter parts).")
      .def(py::init([](int n, double alpha, double beta) { return flat_link(n, alpha, beta); }),
           py::arg("size"), py::arg("alpha"), py::arg("beta"),
           "A flat ring of `size` devices inside one node.")
      .def_readonly("alpha", &AxisLink::alpha)
      .def_readonly("beta", &AxisLink::beta)
      .def_readonly("crosses_nodes", &AxisLink::crosses_nodes)
      .def_readonly("devices_per_node_on_axis", &AxisLink::devices_per_node_on_axis)
      .def_readonly("nodes_on_axis", &AxisLink::nodes_on_axis)
      .def_readonly("intra_alpha", &AxisLink::intra_alpha)
      .def_readonly("intra_beta", &AxisLink::intra_beta)
      .def_readonly("inter_alpha", &AxisLink::inter_alpha)
      .def_readonly("inter_beta", &AxisLink::inter_beta)
      .def_readonly("size", &AxisLink::size)
      .def("__eq__", [](const AxisLink& a, const AxisLink& b) { return a == b; })
      .def("__repr__", [](const AxisLink& l) {
        return fmt::format("AxisLink(n={}, alpha={:g}, beta={:g}, crosses_nodes={}, m={}, g={})", l.size,
                           l.alpha, l.beta, l.crosses_nodes, l.devices_per_node_on_axis, l.nodes_on_axis);
      });
  m.def("axis_links", &axis_links, py::arg("cluster"), py::arg("mesh"));
}
