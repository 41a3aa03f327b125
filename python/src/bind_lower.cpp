// Bindings of weft/lower (lower::Program, lowering of plans and SPMD search results) and of the CPU
// executor of lowered programs (exec::execute_program / execute_reference). The Pythonic layer is
// python/weft/execution.py (weft.lower, weft.lower_spmd, weft.execute, weft.execute_reference).
#include <fmt/format.h>
#include <pybind11/numpy.h>
#include <pybind11/operators.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "instr_fields.hpp"
#include "weft/cluster/cluster.hpp"
#include "weft/cluster/device_mesh.hpp"
#include "weft/core/dtype.hpp"
#include "weft/core/error.hpp"
#include "weft/exec/program_executor.hpp"
#include "weft/ir/graph.hpp"
#include "weft/ir/interpreter.hpp"
#include "weft/lower/lower.hpp"
#include "weft/lower/program.hpp"
#include "weft/plan/plan.hpp"
#include "weft/spmd/search.hpp"

namespace py = pybind11;
using namespace weft;

namespace {

const lower::RankProgram& rank_of(const lower::Program& p, int rank) {
  WEFT_CHECK(rank >= 0 && rank < p.num_ranks(), "Program: rank {} out of range (the program has {} ranks)",
             rank, p.num_ranks());
  return p.ranks[static_cast<std::size_t>(rank)];
}

py::object buffer_name(const lower::Program& p, int b) {
  if (b < 0 || b >= static_cast<int>(p.buffers.size())) return py::none();
  return py::str(p.buffers[static_cast<std::size_t>(b)].name);
}

py::list buffer_names(const lower::Program& p, const std::vector<int>& ids) {
  py::list out;
  for (int b : ids) out.append(buffer_name(p, b));
  return out;
}

py::dict instr_dict(const lower::Program& p, const lower::Instr& i) {
  py::dict d;
  put_instr_fields(d, i);
  const bool has_op = i.op >= 0 && i.op < static_cast<ir::OpId>(p.graph.ops().size());
  d["op"] = has_op ? py::object(py::str(p.graph.op(i.op).name)) : py::object(py::none());
  d["inputs"] = buffer_names(p, i.in);
  d["outputs"] = buffer_names(p, i.out);
  d["axes"] = i.axes;
  d["microbatch"] = i.microbatch;
  return d;
}

py::array_t<double> to_numpy(const ir::HostTensor& h) {
  std::vector<py::ssize_t> shape(h.shape.begin(), h.shape.end());
  py::array_t<double> a(shape);
  std::copy(h.data.begin(), h.data.end(), a.mutable_data());
  return a;
}

ir::HostTensor from_numpy(const std::string& name, const py::handle& v) {
  auto arr = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(v);
  WEFT_CHECK(arr, "execute: inputs['{}'] is not convertible to a float64 array", name);
  ir::HostTensor h;
  for (py::ssize_t d = 0; d < arr.ndim(); ++d) h.shape.push_back(arr.shape(d));
  h.data.assign(arr.data(), arr.data() + arr.size());
  return h;
}

exec::ExecuteOptions make_options(int steps, std::uint64_t seed, const std::string& dtype,
                                  const py::dict& inputs, double timeout_s, bool seed_all_parameters) {
  WEFT_CHECK(steps >= 1, "execute: steps must be at least 1, got {}", steps);
  WEFT_CHECK(dtype == "f64" || dtype == "f32", "execute: dtype must be 'f64' or 'f32', got '{}'", dtype);
  WEFT_CHECK(timeout_s > 0, "execute: timeout_s must be positive, got {}", timeout_s);
  exec::ExecuteOptions o;
  o.steps = steps;
  o.seed = seed;
  o.dtype = parse_dtype(dtype);
  o.timeout_s = timeout_s;
  o.seed_all_parameters = seed_all_parameters;
  for (auto [k, v] : inputs) {
    auto name = py::cast<std::string>(k);
    o.inputs[name] = from_numpy(name, v);
  }
  return o;
}

py::dict result_dict(const exec::ExecutionResult& r) {
  py::dict d;
  d["losses"] = r.losses;
  py::dict params, grads;
  for (const auto& [n, t] : r.parameters) params[py::str(n)] = to_numpy(t);
  for (const auto& [n, t] : r.gradients) grads[py::str(n)] = to_numpy(t);
  d["parameters"] = params;
  d["gradients"] = grads;
  py::list sent, received, internal, peak, seconds;
  for (const auto& s : r.ranks) {
    sent.append(py::cast(s.bytes_sent));
    received.append(py::cast(s.bytes_received));
    internal.append(s.internal_bytes_sent);
    peak.append(s.peak_bytes);
    seconds.append(s.seconds);
  }
  d["bytes_sent"] = sent;
  d["bytes_received"] = received;
  d["internal_bytes_sent"] = internal;
  d["peak_bytes"] = peak;
  d["rank_seconds"] = seconds;
  d["seconds"] = r.seconds;
  return d;
}

}  // namespace

void bind_lower(py::module_& m) {
  using lower::Program;
  py::class_<Program>(m, "Program",
                      "A lowered plan: one ordered instruction list per rank (device) over buffers that are "
                      "tiles of the training graph's tensors; JSON, readable dumps, a static check.")
      .def_property_readonly("num_ranks", &Program::num_ranks)
      .def_property_readonly(
          "graph", [](const Program& p) { return p.graph; },
          "The (per-micro-batch) training graph it computes.")
      .def_property_readonly(
          "buffers",
          [](const Program& p) {
            py::list out;
            for (const auto& b : p.buffers) {
              py::dict d;
              d["name"] = b.name;
              d["tensor"] =
                  b.tensor >= 0 ? py::object(py::str(p.graph.tensor(b.tensor).name)) : py::object(py::none());
              d["tensor_id"] = b.tensor;
              d["shape"] = b.shape;
              d["spec"] = b.spec;
              d["stage"] = b.stage;
              d["element_bytes"] = b.element_bytes;
              out.append(d);
            }
            return out;
          },
          "Every buffer: name, tensor (None for statistics), tensor_id (-1), global shape, spec, stage, "
          "element_bytes.")
      .def_property_readonly(
          "leaf_buffer_ids", [](const Program& p) { return p.leaf_buffers; },
          "Buffer ids of the leaves ranks hold at the start of a step.")
      .def_property_readonly(
          "parameter_ids", [](const Program& p) { return p.parameters; },
          "Parameter name -> its leaf buffer's id.")
      .def_property_readonly(
          "gradient_ids", [](const Program& p) { return p.gradients; },
          "Parameter name -> its gradient's buffer id.")
      .def_property_readonly(
          "loss_id", [](const Program& p) { return p.loss; }, "The loss's buffer id (-1: none).")
      .def_property_readonly(
          "ranks",
          [](const Program& p) {
            py::list out;
            for (const auto& r : p.ranks) {
              py::dict d;
              d["rank"] = r.rank;
              d["device"] = r.device;
              d["stage"] = r.stage;
              d["coord"] = r.coord;
              d["num_instrs"] = p.num_instructions(r.rank);
              out.append(d);
            }
            return out;
          },
          "Per rank: rank, cluster device id, stage, coordinate on the stage mesh, instruction count.")
      .def_property_readonly(
          "parameters",
          [](const Program& p) {
            py::dict d;
            for (const auto& [n, b] : p.parameters) d[py::str(n)] = buffer_name(p, b);
            return d;
          },
          "Parameter name -> its leaf buffer's name.")
      .def_property_readonly(
          "gradients",
          [](const Program& p) {
            py::dict d;
            for (const auto& [n, b] : p.gradients) d[py::str(n)] = buffer_name(p, b);
            return d;
          },
          "Parameter name -> its gradient's buffer name.")
      .def_property_readonly(
          "loss", [](const Program& p) { return buffer_name(p, p.loss); }, "The loss's buffer name.")
      .def(
          "instructions",
          [](const Program& p, int rank) {
            py::list out;
            rank_of(p, rank);
            for (const auto& i : p.instructions(rank)) out.append(instr_dict(p, i));
            return out;
          },
          py::arg("rank"),
          "Rank's instructions in order, each a dict {kind, op (name or None), inputs, outputs (buffer "
          "names), axis, group (ranks: a collective's group, a send's receivers, a recv's sender), reduce, "
          "axes, internal, microbatch (load-input), tag and region (send / recv: per dim [begin, end, "
          "...])}.")
      .def(
          "to_json",
          [](const Program& p, const std::string& sidecar, const std::string& sidecar_ref,
             std::int64_t inline_limit) {
            ir::JsonValueOptions vo;
            vo.sidecar_path = sidecar, vo.sidecar_ref = sidecar_ref, vo.inline_limit = inline_limit;
            return p.to_json(vo);
          },
          py::arg("sidecar") = "", py::arg("sidecar_ref") = "", py::arg("inline_limit") = 4096,
          "The program as JSON. The graph's values are inline, or, with `sidecar` (a .safetensors path), "
          "those of more than `inline_limit` elements go to that file, named in the JSON as `sidecar_ref` "
          "(default: the path).")
      .def_static(
          "from_json",
          [](const std::string& text, const std::string& base_dir) {
            return Program::from_json(text, base_dir);
          },
          py::arg("text"), py::arg("base_dir") = "",
          "A program from its JSON; `base_dir` resolves relative value-file paths.")
      .def("dump", &Program::dump, "Readable, one line per instruction, per rank.")
      .def(
          "dump_rank",
          [](const Program& p, int rank) {
            rank_of(p, rank);
            return p.dump_rank(rank);
          },
          py::arg("rank"))
      .def(
          "describe",
          [](const Program& p, int rank, int index) {
            const auto& r = rank_of(p, rank);
            WEFT_CHECK(index >= 0 && index < static_cast<int>(r.instrs().size()),
                       "Program: rank {}'s list has {} instructions, no #{}", rank, r.instrs().size(), index);
            return p.describe(rank, index);
          },
          py::arg("rank"), py::arg("index"))
      .def(
          "check", [](const Program& p) { lower::check(p); }, py::call_guard<py::gil_scoped_release>(),
          "Verification (Program.verify) and the static check (buffers, collective groups, no deadlock); "
          "raises ValueError naming the rank, the instruction or the buffer.")
      .def(
          "verify",
          [](const Program& p, const ir::Graph* graph, const plan::Plan* plan) {
            WEFT_CHECK(!plan || graph,
                       "Program.verify: plan= needs graph= (the training step the plan was made for)");
            py::gil_scoped_release release;
            if (plan)
              lower::verify(p, *graph, *plan);
            else if (graph)
              lower::verify(p, *graph);
            else
              lower::verify(p);
          },
          py::arg("graph") = nullptr, py::arg("plan") = nullptr,
          "The program as a contract (docs/modules/lower.md, Verification): its graph's fingerprint, buffer "
          "shapes / tiles, compute operands, collective reductions and groups, counts, which micro-batches "
          "each value holds, results; with graph=, also that it was lowered for that graph; with plan= (and "
          "graph=), that it carries out that plan (stages, devices, micro-batches, micro-batch size, "
          "replicas, "
          "schedule). Raises ValueError naming the rank, the instruction or the buffer.")
      .def_readonly("graph_fingerprint", &Program::graph_fingerprint,
                    "Fingerprint (Graph.fingerprint) of the program's graph, as lowered.")
      .def_readonly(
          "step_fingerprint", &Program::step_fingerprint,
          "Fingerprint of the training step the plan was made for (empty when not lowered from a plan).")
      .def(py::self == py::self)
      .def("__repr__", [](const Program& p) {
        std::size_t instrs = 0;
        for (const auto& r : p.ranks) instrs += p.num_instructions(r.rank);
        return fmt::format("Program('{}': {} ranks, {} stages, {} buffers, {} instructions)", p.graph.name(),
                           p.num_ranks(), p.stages.size(), p.buffers.size(), instrs);
      });

  m.def("_lower", &lower::lower, py::arg("plan"), py::arg("step"), py::arg("cluster"),
        py::call_guard<py::gil_scoped_release>(),
        "Lowers a plan (weft.plan and friends) of the training step on the cluster to a Program: its stages, "
        "schedule, micro-batches, replicas and cross-stage transfers.");
  m.def(
      "_lower_adaptive",
      // The policy as an object: weft.AdaptivePolicy is bound after this module (the stubs would
      // not know its name here).
      [](const plan::Plan& plan, const ir::Graph& step, const cluster::Cluster& c, const py::object& policy_obj) {
        std::optional<plan::AdaptivePolicy> policy;
        if (!policy_obj.is_none()) policy = py::cast<plan::AdaptivePolicy>(policy_obj);
        std::vector<lower::AdaptiveProgram> progs;
        {
          py::gil_scoped_release release;
          progs = policy ? lower::lower_adaptive(plan, *policy, step, c) : lower::lower_adaptive(plan, step, c);
        }
        py::list out;
        for (auto& a : progs) {
          py::dict d;
          d["k"] = a.k;
          d["microbatch_size"] = a.microbatch_size;
          d["num_microbatches"] = a.num_microbatches;
          d["windows"] = a.windows;
          d["program"] = std::move(a.program);
          out.append(std::move(d));
        }
        return out;
      },
      py::arg("plan"), py::arg("step"), py::arg("cluster"), py::arg("policy") = py::none(),
      "Lowers an adaptive plan (Plan.adaptive, or policy=) to one Program per kFkB group size of its frontier.");
  m.def(
      "_lower_spmd",
      [](const ir::Graph& g, const cluster::Cluster& c, const cluster::DeviceMesh& mesh,
         const spmd::SpmdPlan& plan) { return lower::lower_spmd(g, c, mesh, lower::layout_of(g, plan)); },
      py::arg("graph"), py::arg("cluster"), py::arg("mesh"), py::arg("spmd_plan"),
      py::call_guard<py::gil_scoped_release>(), "Lowers the layout an SPMD search chose to a Program.");
  m.def(
      "_lower_random",
      [](const ir::Graph& g, const cluster::Cluster& c, const cluster::DeviceMesh& mesh, std::uint32_t seed) {
        return lower::lower_spmd(g, c, mesh, lower::random_layout(g, mesh.shape(), seed));
      },
      py::arg("graph"), py::arg("cluster"), py::arg("mesh"), py::arg("seed"),
      py::call_guard<py::gil_scoped_release>(),
      "Lowers a random valid layout (every op a random strategy, every leaf a random spec) to a Program.");
  m.def(
      "_execute_program",
      [](const Program& p, int steps, std::uint64_t seed, const std::string& dtype, const py::dict& inputs,
         double timeout_s, bool seed_all_parameters) {
        const auto o = make_options(steps, seed, dtype, inputs, timeout_s, seed_all_parameters);
        exec::ExecutionResult r;
        {
          py::gil_scoped_release nogil;
          r = exec::execute_program(p, o);
        }
        return result_dict(r);
      },
      py::arg("program"), py::arg("steps") = 3, py::arg("seed") = 0, py::arg("dtype") = "f64",
      py::arg("inputs") = py::dict(), py::arg("timeout_s") = 30.0, py::arg("seed_all_parameters") = false);
  m.def(
      "_execute_reference",
      [](const ir::Graph& g, int steps, std::uint64_t seed, const std::string& dtype, const py::dict& inputs,
         bool seed_all_parameters) {
        const auto o = make_options(steps, seed, dtype, inputs, 30.0, seed_all_parameters);
        exec::ExecutionResult r;
        {
          py::gil_scoped_release nogil;
          r = exec::execute_reference(g, o);
        }
        return result_dict(r);
      },
      py::arg("step"), py::arg("steps") = 3, py::arg("seed") = 0, py::arg("dtype") = "f64",
      py::arg("inputs") = py::dict(), py::arg("seed_all_parameters") = false);
}
