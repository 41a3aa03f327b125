// Bindings of weft/sharding: Placement, ShardingSpec, tile math (numpy index arrays), enumeration,
// reshape propagation, resharding plans.
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "weft/core/dtype.hpp"
#include "weft/core/error.hpp"
#include "weft/sharding/reshape.hpp"
#include "weft/sharding/reshard.hpp"
#include "weft/sharding/sharding_spec.hpp"
#include "weft/sharding/tile.hpp"

namespace py = pybind11;
using namespace weft::sharding;

namespace {

ReduceKind parse_reduce(const std::string& s) {
  if (s == "sum") return ReduceKind::Sum;
  if (s == "max") return ReduceKind::Max;
  throw weft::Error("unknown reduction '" + s + "' (sum or max)");
}

}  // namespace

void bind_sharding(py::module_& m) {
  py::class_<Placement>(m, "Placement", "Per mesh axis: Shard(dim, stride), Replicate or Partial(sum|max).")
      .def_static("shard", &Placement::shard, py::arg("dim"), py::arg("stride") = 0)
      .def_static("replicate", &Placement::replicate)
      .def_static(
          "partial", [](const std::string& r) { return Placement::partial(parse_reduce(r)); },
          py::arg("reduce") = "sum")
      .def_property_readonly("kind",
                             [](const Placement& p) {
                               return p.kind == Placement::Shard
                                          ? "shard"
                                          : (p.kind == Placement::Partial ? "partial" : "replicate");
                             })
      .def_readonly("dim", &Placement::dim)
      .def_readonly("stride", &Placement::stride)
      .def_property_readonly("reduce",
                             [](const Placement& p) { return p.reduce == ReduceKind::Sum ? "sum" : "max"; })
      .def("__eq__", [](const Placement& a, const Placement& b) { return a == b; })
      .def("__repr__", &Placement::to_string);

  py::class_<ShardingSpec>(
      m, "ShardingSpec",
      "How a tensor lies on a mesh: one placement per mesh axis (see docs/modules/sharding.md).")
      .def(py::init<std::vector<int64_t>, std::vector<int64_t>, std::vector<Placement>, bool>(),
           py::arg("tensor_shape"), py::arg("mesh_shape"), py::arg("placements"),
           py::arg("allow_padding") = false)
      .def_static("parse", &ShardingSpec::parse, py::arg("text"), py::arg("tensor_shape"),
                  py::arg("mesh_shape"), py::arg("allow_padding") = false)
      .def_static("parse_alpa", &ShardingSpec::parse_alpa, py::arg("text"), py::arg("tensor_shape"),
                  py::arg("mesh_shape"))
      .def_static("replicated", &ShardingSpec::replicated, py::arg("tensor_shape"), py::arg("mesh_shape"))
      .def("to_alpa", &ShardingSpec::to_alpa)
      .def("to_dtensor", &ShardingSpec::to_dtensor)
      .def("to_jax", &ShardingSpec::to_jax, py::arg("axis_names") = std::vector<std::string>{})
      .def_property_readonly("tensor_shape", &ShardingSpec::tensor_shape)
      .def_property_readonly("mesh_shape", &ShardingSpec::mesh_shape)
      .def_property_readonly("placements", &ShardingSpec::per_axis)
      .def_property_readonly("allow_padding", &ShardingSpec::allow_padding)
      .def_property_readonly("rank", &ShardingSpec::rank)
      .def_property_readonly("partial_axes", &ShardingSpec::partial_axes)
      .def_property_readonly("reduce",
                             [](const ShardingSpec& s) -> py::object {
                               auto r = s.reduce_kind();
                               if (!r) return py::none();
                               return py::str(*r == ReduceKind::Sum ? "sum" : "max");
                             })
      .def("axes_of_dim", &ShardingSpec::axes_of_dim, py::arg("dim"))
      .def("num_shards", &ShardingSpec::num_shards, py::arg("dim"))
      .def("padded_size", &ShardingSpec::padded_size, py::arg("dim"))
      .def(
          "tile",
          [](const ShardingSpec& s, const std::vector<int64_t>& coord) {
            Tile t = tile_of(s, coord);
            py::list out;
            for (int d = 0; d < s.rank(); ++d) {
              auto idx = t.indices(d);
              py::array_t<int64_t> a(static_cast<py::ssize_t>(idx.size()));
              std::copy(idx.begin(), idx.end(), a.mutable_data());
              out.append(a);
            }
            return out;
          },
          py::arg("coord"),
          "Per tensor dim, the global indices this device holds (int64 arrays, for np.ix_).")
      .def(
          "intervals",
          [](const ShardingSpec& s, const std::vector<int64_t>& coord) {
            std::vector<std::vector<std::pair<int64_t, int64_t>>> r;
            for (const auto& iv : tile_of(s, coord).dims) {
              r.emplace_back();
              for (const auto& x : iv) r.back().emplace_back(x.begin, x.end);
            }
            return r;
          },
          py::arg("coord"))
      .def(
          "partial_index",
          [](const ShardingSpec& s, const std::vector<int64_t>& c) { return tile_of(s, c).partial_index; },
          py::arg("coord"))
      .def("partial_count", &ShardingSpec::partial_count)
      .def(
          "local_shape",
          [](const ShardingSpec& s, const std::vector<int64_t>& c) { return tile_of(s, c).local_shape(); },
          py::arg("coord"))
      .def(
          "global_index",
          [](const ShardingSpec& s, const std::vector<int64_t>& c, int d, int64_t l) {
            return global_index(s, c, d, l);
          },
          py::arg("coord"), py::arg("dim"), py::arg("local"))
      .def(
          "local_index",
          [](const ShardingSpec& s, const std::vector<int64_t>& c, int d, int64_t g) {
            return local_index(s, c, d, g);
          },
          py::arg("coord"), py::arg("dim"), py::arg("global_index"), "Local index, or -1 when not held.")
      .def("with_axis", &ShardingSpec::with_axis, py::arg("axis"), py::arg("placement"))
      .def("__eq__", [](const ShardingSpec& a, const ShardingSpec& b) { return a == b; })
      .def("__lt__", [](const ShardingSpec& a, const ShardingSpec& b) { return a < b; })
      .def("__hash__", &ShardingSpec::hash)
      .def("__str__", &ShardingSpec::to_string)
      .def("__repr__", [](const ShardingSpec& s) {
        return fmt::format("ShardingSpec('{}', shape=[{}], mesh=[{}])", s.to_string(),
                           fmt::join(s.tensor_shape(), ", "), fmt::join(s.mesh_shape(), ", "));
      });

  m.def(
      "enumerate_specs",
      [](const std::vector<int64_t>& shape, const std::vector<int64_t>& mesh, bool strided, bool partial,
         bool allow_padding, std::size_t max_specs) {
        EnumerateOptions o;
        o.strided = strided;
        o.partial = partial;
        o.allow_padding = allow_padding;
        o.max_specs = max_specs;
        return enumerate_specs(shape, mesh, o);
      },
      py::arg("tensor_shape"), py::arg("mesh_shape"), py::arg("strided") = true, py::arg("partial") = true,
      py::arg("allow_padding") = false, py::arg("max_specs") = 1000000);

  m.def(
      "propagate_reshape",
      [](const ShardingSpec& s, const std::vector<int64_t>& out) {
        auto r = propagate_reshape(s, out);
        return py::make_tuple(r.spec ? py::cast(*r.spec) : py::none(), r.reason);
      },
      py::arg("spec"), py::arg("out_shape"),
      "(spec on the output or None, reason): the communication-free spec after a reshape.");

  py::class_<ReshardStep>(m, "ReshardStep", "One collective of a resharding plan.")
      .def_property_readonly("kind",
                             [](const ReshardStep& s) { return std::string(collective_name(s.kind)); })
      .def_readonly("axis", &ReshardStep::axis)
      .def_readonly("src", &ReshardStep::from)
      .def_readonly("dst", &ReshardStep::to)
      .def_readonly("bytes", &ReshardStep::bytes)
      .def_readonly("time", &ReshardStep::time)
      .def("__repr__", &ReshardStep::to_string);
  py::class_<ReshardPlan>(m, "ReshardPlan", "The cheapest sequence of collectives from one spec to another.")
      .def_readonly("steps", &ReshardPlan::steps)
      .def_readonly("time", &ReshardPlan::time)
      .def("__len__", [](const ReshardPlan& p) { return p.steps.size(); })
      .def("__repr__", &ReshardPlan::to_string);
  py::class_<ReshardPlanner>(m, "ReshardPlanner", "Cached resharding search for one mesh's axis links.")
      .def(py::init([](std::vector<weft::cluster::AxisLink> links, const std::string& dtype,
                       std::size_t max_states) {
             ReshardOptions o;
             o.max_states = max_states;
             return std::make_unique<ReshardPlanner>(std::move(links),
                                                     weft::dtype_size(weft::parse_dtype(dtype)), o);
           }),
           py::arg("links"), py::arg("dtype") = "f32", py::arg("max_states") = 200000)
      .def("plan", &ReshardPlanner::plan, py::arg("src"), py::arg("dst"), py::return_value_policy::copy)
      .def_property_readonly("cache_size", &ReshardPlanner::cache_size)
      .def_property_readonly("searches", &ReshardPlanner::searches);
}
