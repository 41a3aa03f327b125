// The step's weighted valid fraction of each cross entropy of a program (ce_fractions.hpp).
#include "weft/exec/ce_fractions.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <set>
#include <tuple>

#include "row_major.hpp"
#include "weft/core/error.hpp"
#include "weft/ir/kernels.hpp"

namespace weft::exec {

using detail::strides_of;

CeValidFractions::CeValidFractions(const ProgramLayout& layout) : layout_(layout) {
  const auto& p = layout.program();
  const ir::Graph& g = p.graph;
  std::map<std::tuple<ir::TensorId, ir::TensorId, std::int64_t>, std::size_t> index;
  std::vector<std::size_t> topo_pos(g.ops().size(), 0);
  bool have_topo = false;
  for (ir::OpId o = 0; o < static_cast<ir::OpId>(g.ops().size()); ++o) {
    const ir::Op& op = g.op(o);
    if (op.kind != ir::OpKind::CrossEntropy && op.kind != ir::OpKind::CrossEntropyGrad) continue;
    const auto attrs = ir::cross_entropy_attrs(op);
    if (attrs.token_mean) continue;
    const ir::TensorId w = ir::cross_entropy_weighted(op) ? op.inputs.back() : -1;
    const auto key = std::make_tuple(op.inputs[1], w, attrs.ignore_index);
    auto it = index.find(key);
    if (it != index.end()) {
      groups_[it->second].ops.push_back(o);
      continue;
    }
    if (!have_topo) {
      const auto order = g.topo_order();
      for (std::size_t k = 0; k < order.size(); ++k) topo_pos[static_cast<std::size_t>(order[k])] = k;
      have_topo = true;
    }
    Group grp;
    grp.ops = {o};
    grp.labels = op.inputs[1];
    grp.weight = w;
    grp.ignore_index = attrs.ignore_index;
    // The ops that make the labels and weights (a causal LM's shift), and the leaves they read.
    std::set<ir::TensorId> seen;
    std::set<ir::OpId> cone;
    std::vector<ir::TensorId> todo{grp.labels};
    if (w >= 0) todo.push_back(w);
    while (!todo.empty()) {
      const ir::TensorId t = todo.back();
      todo.pop_back();
      if (!seen.insert(t).second) continue;
      const auto& info = g.tensor(t);
      if (info.producer == ir::kNoOp) {
        WEFT_CHECK(info.role != ir::Role::Parameter && info.role != ir::Role::OptimizerState,
                   "cross entropy '{}': its labels or class weights depend on '{}', a {}: they must be data "
                   "(inputs, constants, buffers)",
                   op.name, info.name, info.role == ir::Role::Parameter ? "parameter" : "optimizer state");
        grp.leaves.push_back(t);
        continue;
      }
      if (!cone.insert(info.producer).second) continue;
      for (ir::TensorId in : g.op(info.producer).inputs) todo.push_back(in);
    }
    grp.cone.assign(cone.begin(), cone.end());
    std::sort(grp.cone.begin(), grp.cone.end(), [&](ir::OpId a, ir::OpId b) {
      return topo_pos[static_cast<std::size_t>(a)] < topo_pos[static_cast<std::size_t>(b)];
    });
    // The stage that runs the loss (its result's buffer), and one rank per replica of it.
    int stage = -1;
    for (const auto& b : p.buffers)
      if (b.tensor == op.outputs[0]) {
        stage = b.stage;
        break;
      }
    WEFT_CHECK(stage >= 0, "cross entropy '{}': no stage holds its result", op.name);
    const auto& st = p.stages[static_cast<std::size_t>(stage)];
    std::map<std::int64_t, int> by_replica;
    for (const auto& rp : p.ranks)
      if (rp.stage == stage) by_replica.emplace(st.replicas > 1 ? rp.coord.at(0) : 0, rp.rank);
    for (const auto& [q, r] : by_replica) grp.part_ranks.push_back(r);
    index.emplace(key, groups_.size());
    groups_.push_back(std::move(grp));
  }
}

bool CeValidFractions::reads(ir::TensorId t) const {
  for (const auto& grp : groups_)
    if (std::find(grp.leaves.begin(), grp.leaves.end(), t) != grp.leaves.end()) return true;
  return false;
}

std::map<ir::OpId, double> CeValidFractions::compute(
    const LeafValues& leaves, const std::map<ir::TensorId, const ir::HostTensor*>& inputs, int step) const {
  return fractions(counts(leaves, inputs, step));
}

std::map<ir::OpId, double> CeValidFractions::fractions(const std::vector<double>& counts) const {
  WEFT_CHECK(counts.size() == 2 * groups_.size(), "cross-entropy counts: {} numbers for {} losses (2 each)",
             counts.size(), groups_.size());
  std::map<ir::OpId, double> out;
  for (std::size_t k = 0; k < groups_.size(); ++k) {
    const double rho = counts[2 * k] / counts[2 * k + 1];
    for (ir::OpId o : groups_[k].ops) out[o] = rho;
  }
  return out;
}

void CeValidFractions::assign_parts() const {
  std::call_once(assigned_, [this] {
    const auto& p = layout_.program();
    const std::int64_t batch = layout_.global_batch();
    std::vector<std::vector<char>> held;  // per rank: whether it reads each row
    for (int r = 0; r < p.num_ranks(); ++r) {
      held.emplace_back(static_cast<std::size_t>(batch), 0);
      for (std::int64_t k : layout_.rows_read(r)) held.back()[static_cast<std::size_t>(k)] = 1;
    }
    std::vector<char> unheld(static_cast<std::size_t>(batch), 0);
    for (const auto& grp : groups_) {
      grp.counter.clear();
      for (int r : grp.part_ranks) {
        const auto& st = p.stages[static_cast<std::size_t>(p.ranks[static_cast<std::size_t>(r)].stage)];
        const ir::Graph& g = layout_.graph_of(r);
        for (int m = 0; m < st.microbatches; ++m) {
          // The rows the part's labels are made from: its samples of each batched input, every row
          // when an input has no batch dim (a rank holds it whole only with every row), none without
          // an input (the leaves' values: any rank, so the part's own).
          std::vector<std::int64_t> rows;
          bool inputs = false;
          for (ir::TensorId t : grp.leaves) {
            const auto& info = g.tensor(t);
            const auto& pinfo = p.graph.tensor(t);
            if (info.role != ir::Role::Input) continue;
            inputs = true;
            const bool batched = pinfo.rank() >= 1 && pinfo.shape[0] == st.microbatch_size;
            const std::int64_t off = batched ? layout_.sample_offset(r, m) : 0;
            const std::int64_t n = batched ? info.shape[0] : batch;
            for (std::int64_t k = off; k < off + n; ++k) rows.push_back(k);
          }
          int counter = inputs ? -1 : r;
          for (int c = 0; inputs && c < p.num_ranks() && counter < 0; ++c)
            if (std::all_of(rows.begin(), rows.end(), [&](std::int64_t k) {
                  return held[static_cast<std::size_t>(c)][static_cast<std::size_t>(k)];
                }))
              counter = c;
          if (counter < 0)
            for (std::int64_t k : rows) unheld[static_cast<std::size_t>(k)] = 1;
          grp.counter.push_back(counter);
        }
      }
    }
    for (std::int64_t k = 0; k < batch; ++k)
      if (unheld[static_cast<std::size_t>(k)]) unheld_.push_back(k);
  });
}

std::vector<std::int64_t> CeValidFractions::unheld_rows() const {
  assign_parts();
  return unheld_;
}

std::vector<double> CeValidFractions::counts(const LeafValues& leaves,
                                             const std::map<ir::TensorId, const ir::HostTensor*>& inputs,
                                             int step, int rank) const {
  const auto& p = layout_.program();
  if (rank >= 0) {
    WEFT_CHECK(rank < p.num_ranks(), "cross-entropy counts: rank {} of {}", rank, p.num_ranks());
    assign_parts();
  }
  std::vector<double> out;
  for (const auto& grp : groups_) {
    const ir::Op& first = p.graph.op(grp.ops.front());
    double weighted = 0, tokens = 0;
    std::size_t part = 0;
    for (int r : grp.part_ranks) {
      const auto& st = p.stages[static_cast<std::size_t>(p.ranks[static_cast<std::size_t>(r)].stage)];
      const ir::Graph& g = layout_.graph_of(r);
      const std::int64_t classes = g.tensor(first.inputs[0]).shape.back();
      for (int m = 0; m < st.microbatches; ++m, ++part) {
        if (rank >= 0) {
          const int counter = grp.counter[part];
          if (counter != rank && !(counter < 0 && rank == 0)) continue;
        }
        // This part's leaves: an Input's rows of the part (as its load-input reads them), others whole.
        std::map<ir::TensorId, ir::HostTensor> val;
        for (ir::TensorId t : grp.leaves) {
          const auto& info = g.tensor(t);
          const auto& pinfo = p.graph.tensor(t);
          ir::HostTensor v{info.shape, {}};
          v.data.resize(static_cast<std::size_t>(v.numel()));
          const bool input = info.role == ir::Role::Input;
          const bool batched = input && pinfo.rank() >= 1 && pinfo.shape[0] == st.microbatch_size;
          const std::int64_t off = batched ? layout_.sample_offset(r, m) : 0;
          const auto gshape = input ? layout_.global_input_shape(t) : info.shape;
          const auto gst = strides_of(gshape), lst = strides_of(info.shape);
          auto in = input ? inputs.find(t) : inputs.end();
          for (std::int64_t k = 0; k < v.numel(); ++k) {
            std::int64_t gi = 0;
            for (std::size_t d = 0; d < info.shape.size(); ++d)
              gi += ((k / lst[d]) % info.shape[d] + (d == 0 ? off : 0)) * gst[d];
            v.data[static_cast<std::size_t>(k)] = in != inputs.end()
                                                      ? in->second->data.at(static_cast<std::size_t>(gi))
                                                      : leaves.value(t, step, gi);
          }
          val.emplace(t, std::move(v));
        }
        for (ir::OpId o : grp.cone) {
          const ir::Op& op = g.op(o);
          std::vector<const ir::HostTensor*> ins;
          for (ir::TensorId t : op.inputs) ins.push_back(&val.at(t));
          ir::KernelContext ctx;
          ctx.step = step;
          auto res = ir::run_kernel(g, op, ins, ctx);
          for (std::size_t k = 0; k < res.size(); ++k) val[op.outputs[k]] = std::move(res[k]);
        }
        const ir::HostTensor& lab = val.at(grp.labels);
        const ir::HostTensor* w = grp.weight >= 0 ? &val.at(grp.weight) : nullptr;
        for (double y : lab.data) {
          tokens += 1;
          if (y == static_cast<double>(grp.ignore_index)) continue;
          const auto c = static_cast<std::int64_t>(y);
          WEFT_CHECK(static_cast<double>(c) == y && c >= 0 && c < classes,
                     "op '{}': label {} is not an integer in [0, {}) nor the ignore_index {}", first.name, y,
                     classes, grp.ignore_index);
          weighted += w ? w->data[static_cast<std::size_t>(c)] : 1.0;
        }
      }
    }
    out.push_back(weighted);
    out.push_back(tokens);
  }
  return out;
}

}  // namespace weft::exec
