// Bindings the torch runtime (python/weft/runtime) runs on: a program's layout (exec::ProgramLayout:
// each buffer's tile on each rank, the rank's graph, the per-instruction numbers of the global op)
// and the counter-based leaf values (exec::LeafValues), so the processes of a real run read the
// same tile math and initial values as the CPU reference executor.
#include <fmt/ranges.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "instr_fields.hpp"
#include "weft/core/error.hpp"
#include "weft/exec/ce_fractions.hpp"
#include "weft/exec/init.hpp"
#include "weft/exec/program_layout.hpp"
#include "weft/ir/graph.hpp"
#include "weft/lower/program.hpp"

namespace py = pybind11;
using namespace weft;

namespace {

py::array_t<std::int64_t> int_array(const std::vector<std::int64_t>& v) {
  py::array_t<std::int64_t> a(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

// The layout with its program: the program is copied into the holder so Python's lifetime rules
// cannot leave the layout pointing at a freed program.
struct LayoutHolder {
  lower::Program program;
  std::unique_ptr<exec::ProgramLayout> layout;
  std::unique_ptr<exec::CeValidFractions> ce_fractions;  // made on first use
  explicit LayoutHolder(lower::Program p) : program(std::move(p)) {
    lower::check(program);
    layout = std::make_unique<exec::ProgramLayout>(program);
  }
};

void check_rank(const lower::Program& p, int rank) {
  WEFT_CHECK(rank >= 0 && rank < p.num_ranks(), "rank {} out of range (the program has {} ranks)", rank,
             p.num_ranks());
}

const exec::CeValidFractions& ce_fractions_of(LayoutHolder& h) {
  if (!h.ce_fractions) h.ce_fractions = std::make_unique<exec::CeValidFractions>(*h.layout);
  return *h.ce_fractions;
}

// The global inputs (name -> array) the program's cross entropies make their labels and weights from,
// as f64 host tensors kept in `held` (the others are left out).
std::map<ir::TensorId, const ir::HostTensor*> ce_inputs(LayoutHolder& h,
                                                        const std::map<std::string, py::array>& inputs,
                                                        std::vector<ir::HostTensor>& held) {
  const auto& ce = ce_fractions_of(h);
  held.reserve(inputs.size());
  std::map<ir::TensorId, const ir::HostTensor*> by_id;
  for (const auto& [name, a] : inputs) {
    auto t = h.program.graph.find_tensor(name);
    if (!t || h.program.graph.tensor(*t).role != ir::Role::Input || !ce.reads(*t))
      continue;  // not an input the labels or class weights are made from
    auto f = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(a);
    WEFT_CHECK(f, "inputs['{}'] is not numeric", name);
    ir::HostTensor v;
    for (py::ssize_t d = 0; d < f.ndim(); ++d) v.shape.push_back(f.shape(d));
    WEFT_CHECK(v.shape == h.layout->global_input_shape(*t),
               "inputs['{}'] has shape {}, the input has {} (the global batch)", name, v.shape,
               h.layout->global_input_shape(*t));
    v.data.assign(f.data(), f.data() + f.size());
    held.push_back(std::move(v));
    by_id[*t] = &held.back();
  }
  return by_id;
}

py::dict tile_dict(const exec::TileIndex& t) {
  py::dict d;
  d["local_shape"] = t.local_shape;
  py::list global;
  for (const auto& g : t.global) global.append(int_array(g));
  d["global"] = global;
  d["partial_index"] = t.partial_index;
  d["partial_count"] = t.partial_count;
  return d;
}

// One instruction of a rank with what the layout adds to it.
py::dict rank_instr(const LayoutHolder& h, int rank, int pc, const lower::Instr& i0) {
  const auto& p = h.program;
  const auto& L = *h.layout;
  lower::Instr i = i0;
  i.group = p.group_of(rank, i0);
  py::dict d;
  d["pc"] = pc;  // index in the rank's list (Program.describe)
  put_instr_fields(d, i);
  d["op"] = i.op;
  d["inputs"] = i.in;
  d["outputs"] = i.out;
  switch (i.kind) {
    case lower::InstrKind::Compute:
    case lower::InstrKind::CeSumTarget:
    case lower::InstrKind::CeLoss:
    case lower::InstrKind::CeGrad: {
      const auto ctx = L.kernel_context(rank, i, 1);
      py::dict c;
      c["out_shapes"] = ctx.out_shapes;
      c["mean_count"] = ctx.mean_count;
      c["tokens"] = ctx.tokens;
      c["vocab_index"] =
          ctx.vocab_index.empty() ? py::object(py::none()) : py::object(int_array(ctx.vocab_index));
      c["vocab_size"] = ctx.vocab_size;
      if (!ctx.element_index.empty()) {
        py::list index;
        for (const auto& v : ctx.element_index) index.append(int_array(v));
        c["element_index"] = index;
        c["element_shape"] = ctx.element_shape;
      }
      d["context"] = c;
      if (i.kind == lower::InstrKind::CeLoss) d["contribute"] = L.contributes(rank, i);
      break;
    }
    case lower::InstrKind::LoadInput: d["offset"] = L.load_offset(rank, i); break;
    case lower::InstrKind::Scale: d["factor"] = L.scale_factor(rank, i); break;
    default: break;
  }
  return d;
}

}  // namespace

void bind_runtime(py::module_& m) {
  py::class_<LayoutHolder>(m, "ProgramLayout",
                           "A program's tile math for the torch runtime: buffer tiles per rank, rank graphs, "
                           "per-instruction kernel contexts (exec::ProgramLayout).")
      .def(py::init([](const lower::Program& p) { return std::make_unique<LayoutHolder>(p); }),
           py::arg("program"),
           "Checks the program (ValueError naming the rank and instruction) and wraps it.")
      .def_property_readonly("program", [](const LayoutHolder& h) { return h.program; })
      .def(
          "tile",
          [](const LayoutHolder& h, int buffer, int rank) {
            check_rank(h.program, rank);
            return tile_dict(h.layout->tile(buffer, rank));
          },
          py::arg("buffer"), py::arg("rank"),
          "Rank's tile of a buffer: local_shape, global (per dim, int64 array of the global index of each "
          "local row), partial_index, partial_count.")
      .def(
          "instructions",
          [](const LayoutHolder& h, int rank) {
            check_rank(h.program, rank);
            const auto& rp = h.program.ranks[static_cast<std::size_t>(rank)];
            py::list out;
            for (std::size_t pc = 0; pc < rp.instrs().size(); ++pc)
              if (rp.runs(rp.instrs()[pc]))
                out.append(rank_instr(h, rank, static_cast<int>(pc), rp.instrs()[pc]));
            return out;
          },
          py::arg("rank"),
          "What rank runs, in order, with buffer and op ids: dicts {pc, kind, op, inputs, outputs, axis, "
          "group, "
          "reduce, internal, tag, region} plus context (compute / ce steps: out_shapes, mean_count, tokens, "
          "vocab_index, vocab_size; dropout: element_index, element_shape), contribute (ce-loss), offset "
          "(load-input: samples before the tile), "
          "factor "
          "(scale).")
      .def(
          "collective_groups",
          [](const LayoutHolder& h) {
            // Every rank's collective groups (sorted, distinct): the process groups a run creates, in
            // the same order on every process. Ranks of a stage share one list, so the axes (and
            // explicit groups) are read once per list.
            const auto& p = h.program;
            std::map<const std::vector<lower::Instr>*, std::pair<std::set<int>, std::set<std::vector<int>>>>
                per_list;
            std::set<std::vector<int>> groups;
            for (const auto& rp : p.ranks) {
              auto it = per_list.find(rp.code.get());
              if (it == per_list.end()) {
                std::pair<std::set<int>, std::set<std::vector<int>>> used;
                for (const auto& i : rp.instrs())
                  if (lower::is_collective(i.kind)) {
                    if (i.group.empty())
                      used.first.insert(i.axis);
                    else
                      used.second.insert(i.group);
                  }
                it = per_list.emplace(rp.code.get(), std::move(used)).first;
              }
              for (int a : it->second.first) groups.insert(p.group_along(rp.rank, a));
              groups.insert(it->second.second.begin(), it->second.second.end());
            }
            return std::vector<std::vector<int>>(groups.begin(), groups.end());
          },
          "Every collective group of the program's ranks (sorted, distinct).")
      .def(
          "graph_of",
          [](const LayoutHolder& h, int rank) {
            check_rank(h.program, rank);
            return h.layout->graph_of(rank);
          },
          py::arg("rank"), "The graph rank computes (the program's, or rebatched to its replica's share).")
      .def(
          "global_input_shape",
          [](const LayoutHolder& h, ir::TensorId t) {
            WEFT_CHECK(t >= 0 && t < static_cast<ir::TensorId>(h.program.graph.tensors().size()),
                       "tensor {} out of range", t);
            return h.layout->global_input_shape(t);
          },
          py::arg("tensor"), "The global-batch shape of an Input leaf.")
      .def(
          "global_batch", [](const LayoutHolder& h) { return h.layout->global_batch(); },
          "Samples of the step's global batch.")
      .def(
          "rows_read",
          [](const LayoutHolder& h, int rank) {
            check_rank(h.program, rank);
            return h.layout->rows_read(rank);
          },
          py::arg("rank"),
          "The positions in the global batch (sorted) whose samples the rank's load-input instructions "
          "read: every position when it loads an input without a batch dim, none on a stage that loads "
          "no input.")
      .def(
          "ce_valid_fractions",
          [](LayoutHolder& h, const exec::LeafValues& leaves, const std::map<std::string, py::array>& inputs,
             int step) {
            const auto& ce = ce_fractions_of(h);
            if (ce.empty()) return std::map<ir::OpId, double>{};
            std::vector<ir::HostTensor> held;
            return ce.compute(leaves, ce_inputs(h, inputs, held), step);
          },
          py::arg("leaf_values"), py::arg("inputs"), py::arg("step"),
          "Per cross-entropy op id (those dividing by a weighted count): the step's weighted valid fraction "
          "ρ = Σ w[y]·[y != ignore_index] / tokens over every label of the step (exec::CeValidFractions), "
          "from the global inputs (name -> array) and the leaf values; empty when the program has no such "
          "op.")
      .def(
          "ce_valid_counts",
          [](LayoutHolder& h, const exec::LeafValues& leaves, const std::map<std::string, py::array>& inputs,
             int step, int rank) {
            check_rank(h.program, rank);
            const auto& ce = ce_fractions_of(h);
            std::vector<ir::HostTensor> held;
            return ce.counts(leaves, ce_inputs(h, inputs, held), step, rank);
          },
          py::arg("leaf_values"), py::arg("inputs"), py::arg("step"), py::arg("rank"),
          "[Σ w[y]·[y != ignore_index], labels] per loss group over the parts of the step this rank "
          "counts (each part by one rank that holds its rows: rows_read), from inputs holding at least "
          "those rows; summed over the ranks they give ce_fractions_from_counts the step's fractions.")
      .def(
          "ce_fractions_from_counts",
          [](LayoutHolder& h, const std::vector<double>& counts) {
            return ce_fractions_of(h).fractions(counts);
          },
          py::arg("counts"), "Per cross-entropy op id: ρ from the step's summed ce_valid_counts.")
      .def(
          "ce_unheld_rows", [](LayoutHolder& h) { return ce_fractions_of(h).unheld_rows(); },
          "The global-batch rows of the loss parts no single rank reads whole (usually none): rank 0 "
          "counts those parts from these rows gathered.")
      .def(
          "describe",
          [](const LayoutHolder& h, int rank, int pc) {
            check_rank(h.program, rank);
            return h.program.describe(rank, pc);
          },
          py::arg("rank"), py::arg("pc"));

  py::class_<exec::LeafValues>(
      m, "LeafValues",
      "The values of a step's leaves as every executor reads them: the values the graph carries "
      "(in memory or in a value file, read for the call), else the seeded ones (a pure function of "
      "(seed, tensor, step, global element index)). ValueError naming every leaf that needs a value "
      "and has none.")
      .def(py::init<const ir::Graph&, std::uint64_t, bool>(), py::arg("graph"), py::arg("seed"),
           py::arg("seed_all_parameters") = false, py::keep_alive<1, 2>())
      .def(
          "values",
          [](const exec::LeafValues& v, ir::TensorId t, int step, const py::array_t<std::int64_t>& index) {
            auto idx = py::array_t<std::int64_t, py::array::c_style | py::array::forcecast>::ensure(index);
            py::array_t<double> out(idx.size());
            double* o = out.mutable_data();
            const std::span<const std::int64_t> flat(idx.data(), static_cast<std::size_t>(idx.size()));
            {
              py::gil_scoped_release nogil;
              v.values(t, step, flat, o);
            }
            return out;
          },
          py::arg("tensor"), py::arg("step"), py::arg("index"),
          "Values of leaf `tensor` at `step` (1-based) at the given row-major global element indices.");
}
