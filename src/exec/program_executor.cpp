// CPU executor of lowered programs and the single-device reference (see program_executor.hpp).
#include "weft/exec/program_executor.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <tuple>

#include "row_major.hpp"
#include "weft/core/error.hpp"
#include "weft/exec/ce_fractions.hpp"
#include "weft/exec/init.hpp"
#include "weft/exec/program_layout.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/kernels.hpp"
#include "weft/ir/precision.hpp"
#include "weft/lower/lower.hpp"
#include "weft/sharding/sharding_spec.hpp"

namespace weft::exec {

using detail::strides_of;

std::int64_t RankStats::total_sent() const {
  std::int64_t n = 0;
  for (const auto& [k, v] : bytes_sent) n += v;
  return n;
}

namespace {

using ir::HostTensor;
using lower::Instr;
using lower::InstrKind;
using lower::Program;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The precision each tensor of g is held at when the run's dtype is `run` (ir::held_dtype).
std::vector<DType> held_dtypes(const ir::Graph& g, DType run) {
  const DType base = ir::base_float_dtype(g);
  std::vector<DType> held;
  for (const auto& t : g.tensors()) held.push_back(ir::held_dtype(t.dtype, base, run));
  return held;
}

// Row-major strides of a shape.
template <typename F>
void for_each_index(const std::vector<std::int64_t>& shape, F&& f) {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  if (n == 0) return;
  std::vector<std::int64_t> idx(shape.size(), 0);
  for (std::int64_t k = 0; k < n; ++k) {
    f(idx, k);
    for (std::size_t i = shape.size(); i-- > 0;) {
      if (++idx[i] < shape[i]) break;
      idx[i] = 0;
    }
  }
}

// The program after its verification and static check (lower::check runs lower::verify): the
// executor runs only verified programs, so every id it dereferences below was proven in range
// (the element accesses that depend on a rank's data use .at() or explicit checks as well).
const Program& checked(const Program& p) {
  lower::check(p);
  return p;
}

// A rendezvous per collective instance, keyed by (group, how many collectives this group ran).
struct Slot {
  int arrived = 0, finished = 0;
  std::map<int, const HostTensor*> inputs;  // rank -> its input buffer
};

class Executor {
 public:
  Executor(const Program& p, const ExecuteOptions& opt)
      : p_(p), opt_(opt), init_(p.graph, opt.seed, opt.seed_all_parameters), layout_(checked(p)) {
    WEFT_CHECK(opt.dtype == DType::F64 || opt.dtype == DType::F32,
               "execute: dtype must be f64 or f32, got {}", dtype_name(opt.dtype));
    WEFT_CHECK(opt.steps >= 1, "execute: steps must be >= 1, got {}", opt.steps);
    const int nr = p.num_ranks();
    for (const auto& [name, v] : opt.inputs) {
      auto t = p.graph.find_tensor(name);
      check_input_name(p.graph, name, "execute");
      const auto want = layout_.global_input_shape(*t);
      WEFT_CHECK(v.shape == want && static_cast<std::int64_t>(v.data.size()) == v.numel(),
                 "execute: inputs['{}'] has shape {}, the input has {} (the global batch)", name, v.shape,
                 want);
      inputs_[*t] = &v;
    }
    values_.assign(static_cast<std::size_t>(nr), std::vector<std::optional<HostTensor>>(p.buffers.size()));
    axis_groups_.resize(static_cast<std::size_t>(nr));
    for (int r = 0; r < nr; ++r) {
      const auto& st = p.stages[static_cast<std::size_t>(p.ranks[static_cast<std::size_t>(r)].stage)];
      for (int a = 0; a < static_cast<int>(st.shape.size()); ++a)
        axis_groups_[static_cast<std::size_t>(r)].push_back(p.group_along(r, a));
    }
    // torch's mean cross entropy divides by the step's weighted count of valid labels: each step's
    // fraction, from the labels of every micro-batch and replica, before any rank runs.
    CeValidFractions fractions(layout_);
    if (!fractions.empty())
      for (int step = 1; step <= opt.steps; ++step)
        ce_fraction_.push_back(fractions.compute(init_, inputs_, step));
    stats_.assign(static_cast<std::size_t>(nr), RankStats{});
    const auto held = held_dtypes(p.graph, opt.dtype);
    for (const auto& b : p.buffers)
      held_.push_back(b.tensor >= 0 ? held[static_cast<std::size_t>(b.tensor)] : opt.dtype);
    recv_from_.assign(static_cast<std::size_t>(nr), {});
    losses_.assign(static_cast<std::size_t>(nr), {});
  }

  ExecutionResult run() {
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int r = 0; r < p_.num_ranks(); ++r) threads.emplace_back([this, r] { rank_main(r); });
    for (auto& t : threads) t.join();
    if (error_) std::rethrow_exception(error_);
    ExecutionResult res;
    res.seconds = seconds_since(t0);
    // Bytes sent = what the other ranks received from this one.
    for (int r = 0; r < p_.num_ranks(); ++r)
      for (const auto& [key, n] : recv_from_[static_cast<std::size_t>(r)]) {
        const auto& [src, kind, internal] = key;
        if (internal)
          stats_[static_cast<std::size_t>(src)].internal_bytes_sent += n;
        else {
          stats_[static_cast<std::size_t>(src)].bytes_sent[kind] += n;
          stats_[static_cast<std::size_t>(r)].bytes_received[kind] += n;
        }
      }
    res.ranks = stats_;
    for (int s = 0; s < opt_.steps; ++s) {
      double loss = 0;
      if (p_.loss >= 0) {
        const HostTensor l = assemble_from(p_.loss, [&](int r) -> const HostTensor* {
          const auto& per = losses_[static_cast<std::size_t>(r)];
          return static_cast<std::size_t>(s) < per.size() ? &per[static_cast<std::size_t>(s)] : nullptr;
        });
        WEFT_CHECK(!l.data.empty(), "execute: the loss buffer '{}' holds no value",
                   p_.buffers[static_cast<std::size_t>(p_.loss)].name);
        loss = l.data[0];
      }
      res.losses.push_back(loss);
    }
    for (const auto& [name, b] : p_.parameters) res.parameters[name] = assemble(b);
    for (const auto& [name, b] : p_.gradients) res.gradients[name] = assemble(b);
    return res;
  }

 private:
  const TileIndex& tile(int buffer, int rank) const { return layout_.tile(buffer, rank); }

  // The global value of a buffer: each element from a rank that holds it, summed (or maxed) over
  // the distinct partial terms.
  template <typename Get>
  HostTensor assemble_from(int b, Get get) {
    const auto& buf = p_.buffers[static_cast<std::size_t>(b)];
    const auto& spec = layout_.spec(b);
    const bool is_max = spec.reduce_kind() && *spec.reduce_kind() == sharding::ReduceKind::Max;
    HostTensor out{buf.shape, {}};
    out.data.assign(static_cast<std::size_t>(out.numel()), 0.0);
    std::vector<std::vector<char>> seen(static_cast<std::size_t>(spec.partial_count()),
                                        std::vector<char>(out.data.size(), 0));
    const auto gst = strides_of(buf.shape);
    for (int r = 0; r < p_.num_ranks(); ++r) {
      if (p_.ranks[static_cast<std::size_t>(r)].stage != buf.stage) continue;
      const HostTensor* v = get(r);
      if (!v || v->data.empty()) continue;  // not held on this rank
      const TileIndex& t = tile(b, r);
      std::int64_t n = 1;
      for (auto d : t.local_shape) n *= d;
      WEFT_CHECK(static_cast<std::int64_t>(v->data.size()) == n,
                 "execute: rank {} holds {} elements of '{}', its tile {} has {}", r, v->data.size(),
                 buf.name, t.local_shape, n);
      auto& s = seen[static_cast<std::size_t>(t.partial_index)];
      for_each_index(t.local_shape, [&](const std::vector<std::int64_t>& idx, std::int64_t k) {
        std::int64_t g = 0;
        for (std::size_t d = 0; d < idx.size(); ++d)
          g += t.global[d][static_cast<std::size_t>(idx[d])] * gst[d];
        if (s[static_cast<std::size_t>(g)]) return;
        s[static_cast<std::size_t>(g)] = 1;
        double x = v->data[static_cast<std::size_t>(k)];
        double& o = out.data[static_cast<std::size_t>(g)];
        o = t.partial_index == 0 || !is_max ? (is_max ? x : o + x) : std::max(o, x);
      });
    }
    for (std::size_t q = 0; q < seen.size(); ++q)
      WEFT_CHECK(std::all_of(seen[q].begin(), seen[q].end(), [](char c) { return c != 0; }),
                 "execute: no rank holds all of '{}' at the end of the step (partial term {})", buf.name, q);
    return out;
  }
  HostTensor assemble(int b) {
    return assemble_from(b, [&](int r) -> const HostTensor* {
      auto& v = values_[static_cast<std::size_t>(r)][static_cast<std::size_t>(b)];
      return v ? &*v : nullptr;
    });
  }

  void rank_main(int r) {
    const auto t0 = Clock::now();
    int pc = -1;
    try {
      for (int step = 1; step <= opt_.steps; ++step) {
        init_leaves(r, step);
        const auto& rp = p_.ranks[static_cast<std::size_t>(r)];
        const auto& ins = rp.instrs();
        for (pc = 0; pc < static_cast<int>(ins.size()); ++pc) {
          if (abort_) return;
          const Instr& i = ins[static_cast<std::size_t>(pc)];
          if (!rp.runs(i)) continue;                              // another rank's transfer
          if (lower::is_collective(i.kind) && i.group.empty()) {  // the rank's group along the axis
            Instr with = i;
            with.group = axis_groups_[static_cast<std::size_t>(r)].at(static_cast<std::size_t>(i.axis));
            run_instr(r, pc, with, step);
          } else {
            run_instr(r, pc, i, step);
          }
        }
        pc = -1;
        if (p_.loss >= 0) {
          const auto& v = values_[static_cast<std::size_t>(r)][static_cast<std::size_t>(p_.loss)];
          losses_[static_cast<std::size_t>(r)].push_back(v ? *v : HostTensor{});
        }
      }
    } catch (const std::exception& e) {
      std::lock_guard lock(mu_);
      if (!error_) {
        std::string where = pc >= 0 ? p_.describe(r, pc) : fmt::format("rank {}", r);
        try {
          fail("execute: {}: {}", where, e.what());
        } catch (...) {
          error_ = std::current_exception();
        }
      }
      abort_ = true;
      cv_.notify_all();
    }
    stats_[static_cast<std::size_t>(r)].seconds = seconds_since(t0);
  }

  const HostTensor& read(int r, int b) {
    auto& v = values_.at(static_cast<std::size_t>(r)).at(static_cast<std::size_t>(b));
    WEFT_CHECK(v.has_value(), "buffer '{}' is not held", p_.buffers.at(static_cast<std::size_t>(b)).name);
    return *v;
  }
  void write(int r, int b, HostTensor v) {
    ir::round_to_dtype(v, held_.at(static_cast<std::size_t>(b)));
    values_.at(static_cast<std::size_t>(r)).at(static_cast<std::size_t>(b)) = std::move(v);
    std::int64_t live = 0;
    for (const auto& x : values_[static_cast<std::size_t>(r)])
      if (x) live += static_cast<std::int64_t>(x->data.size()) * 8;
    auto& st = stats_[static_cast<std::size_t>(r)];
    st.peak_bytes = std::max(st.peak_bytes, live);
  }

  void init_leaves(int r, int step) {
    const auto& rp = p_.ranks[static_cast<std::size_t>(r)];
    if (step > 1) {
      // What the last step kept only as its results (gradients, the loss) is gone when the next
      // one starts, as a framework's gradients are: the peak counts one step's values and the state.
      auto& held = values_[static_cast<std::size_t>(r)];
      std::vector<char> leaf(held.size(), 0);
      for (int b : p_.leaf_buffers) leaf[static_cast<std::size_t>(b)] = 1;
      for (std::size_t b = 0; b < held.size(); ++b)
        if (!leaf[b]) held[b].reset();
    }
    for (int b : p_.leaf_buffers) {
      const auto& buf = p_.buffers[static_cast<std::size_t>(b)];
      if (buf.stage != rp.stage) continue;
      const auto role = p_.graph.tensor(buf.tensor).role;
      const bool persistent = role == ir::Role::Parameter || role == ir::Role::OptimizerState;
      if (role == ir::Role::Input || (persistent && step > 1)) continue;  // inputs: LoadInput
      fill(r, b, step, 0);
    }
  }

  // Rank r's tile of leaf buffer b from the global values, dim 0 shifted by `offset` samples.
  void fill(int r, int b, int step, std::int64_t offset) {
    const auto& buf = p_.buffers[static_cast<std::size_t>(b)];
    const TileIndex& t = tile(b, r);
    const auto gst = strides_of(layout_.global_input_shape(buf.tensor));
    auto in = inputs_.find(buf.tensor);
    HostTensor v{t.local_shape, {}};
    v.data.resize(static_cast<std::size_t>(v.numel()));
    for_each_index(t.local_shape, [&](const std::vector<std::int64_t>& idx, std::int64_t k) {
      std::int64_t g = 0;
      for (std::size_t d = 0; d < idx.size(); ++d)
        g += (t.global[d][static_cast<std::size_t>(idx[d])] + (d == 0 ? offset : 0)) * gst[d];
      v.data[static_cast<std::size_t>(k)] = in != inputs_.end()
                                                ? in->second->data[static_cast<std::size_t>(g)]
                                                : init_.value(buf.tensor, step, g);
    });
    write(r, b, std::move(v));
  }

  ir::KernelContext context(int r, const Instr& i, int step) const {
    ir::KernelContext ctx = layout_.kernel_context(r, i, step);
    if (!ce_fraction_.empty()) {
      const auto& f = ce_fraction_.at(static_cast<std::size_t>(step - 1));
      if (auto it = f.find(i.op); it != f.end()) ctx.ce_valid_fraction = it->second;
    }
    return ctx;
  }

  void run_instr(int r, int pc, const Instr& i, int step) {
    const ir::Graph& graph = layout_.graph_of(r);
    const ir::Op* op = i.op >= 0 ? &graph.op(i.op) : nullptr;
    std::vector<const HostTensor*> in;
    if (i.kind != InstrKind::Free && !lower::is_collective(i.kind))
      for (int b : i.in) in.push_back(&read(r, b));
    switch (i.kind) {
      case InstrKind::Compute: {
        auto outs = ir::run_kernel(graph, *op, in, context(r, i, step));
        WEFT_ASSERT(outs.size() == i.out.size(), "kernel result count");
        for (std::size_t k = 0; k < outs.size(); ++k) {
          WEFT_CHECK(outs[k].shape == tile(i.out[k], r).local_shape,
                     "kernel result shape {} differs from the tile {}", outs[k].shape,
                     tile(i.out[k], r).local_shape);
          write(r, i.out[k], std::move(outs[k]));
        }
        return;
      }
      case InstrKind::CeRowMax: write(r, i.out[0], ir::ce_row_max(*in[0])); return;
      case InstrKind::CeSumTarget:
        write(r, i.out[0],
              ir::ce_row_sum_target(*op, *in[0], *in[1], *in[2], in.size() > 3 ? in[3] : nullptr,
                                    context(r, i, step)));
        return;
      case InstrKind::CeLoss: {
        const std::size_t n = op->inputs.size();  // the op's operands, then the two statistics
        write(r, i.out[0],
              ir::ce_loss(*op, *in[1], *in[n], *in[n + 1], context(r, i, step), layout_.contributes(r, i)));
        return;
      }
      case InstrKind::CeGrad: {
        const std::size_t n = op->inputs.size();
        const HostTensor* weight = ir::cross_entropy_weighted(*op) ? in[3] : nullptr;
        write(r, i.out[0],
              ir::ce_grad(*op, *in[0], *in[1], *in[2], weight, *in[n], *in[n + 1], context(r, i, step)));
        return;
      }
      case InstrKind::Copy: {
        HostTensor v = *in[0];
        write(r, i.out[0], std::move(v));
        return;
      }
      case InstrKind::LoadInput: fill(r, i.out[0], step, layout_.load_offset(r, i)); return;
      case InstrKind::Accumulate: {
        HostTensor v = *in[0];
        WEFT_CHECK(v.data.size() == in[1]->data.size(), "accumulate: sizes differ");
        for (std::size_t k = 0; k < v.data.size(); ++k) v.data[k] += in[1]->data[k];
        write(r, i.out[0], std::move(v));
        return;
      }
      case InstrKind::Scale: {
        HostTensor v = *in[0];
        const double f = layout_.scale_factor(r, i);
        for (auto& x : v.data) x *= f;
        write(r, i.out[0], std::move(v));
        return;
      }
      case InstrKind::Free:
        for (int b : i.in) values_[static_cast<std::size_t>(r)][static_cast<std::size_t>(b)].reset();
        return;
      case InstrKind::LocalSlice:
      case InstrKind::LocalPartial: write(r, i.out[0], regroup(r, i, {{r, in[0]}})); return;
      case InstrKind::Send: send(r, i, *in[0], step); return;
      case InstrKind::Recv: recv(r, i, step); return;
      default: collective(r, pc, i); return;
    }
  }

  // The output tile of rank r for a resharding step along one axis, from the inputs of its group.
  HostTensor regroup(int r, const Instr& i, const std::map<int, const HostTensor*>& members) {
    const int src = i.in[0], dst = i.out[0];
    const TileIndex& out_t = tile(dst, r);
    HostTensor out{out_t.local_shape, {}};
    out.data.assign(static_cast<std::size_t>(out.numel()), 0.0);
    const bool reducing = i.kind == InstrKind::AllReduce || i.kind == InstrKind::ReduceScatter;
    const std::string kind(lower::instr_kind_name(i.kind));
    const std::int64_t eb = p_.buffers[static_cast<std::size_t>(src)].element_bytes;
    auto& recv = recv_from_[static_cast<std::size_t>(r)];
    std::vector<std::pair<int, const TileIndex*>> tiles;
    for (const auto& [m, v] : members) tiles.emplace_back(m, &tile(src, m));
    if (i.kind == InstrKind::LocalPartial) {
      const int axis = i.axis;
      const bool keep = i.reduce == lower::ReduceOp::Max ||
                        p_.ranks[static_cast<std::size_t>(r)].coord[static_cast<std::size_t>(axis)] == 0;
      if (keep) out.data = members.at(r)->data;
      return out;
    }
    // Per member and dim, the offset contribution of each output index (-1: not held), and the
    // member's data: the element loop below then only adds and reads.
    const std::size_t nd = out_t.local_shape.size();
    std::vector<std::vector<std::vector<std::int64_t>>> part(tiles.size());
    std::vector<const double*> data(tiles.size());
    for (std::size_t m = 0; m < tiles.size(); ++m) {
      const TileIndex& t = *tiles[m].second;
      data[m] = members.at(tiles[m].first)->data.data();
      part[m].resize(nd);
      for (std::size_t d = 0; d < nd; ++d)
        for (std::int64_t g : out_t.global[d]) {
          const std::int64_t l = t.local[d][static_cast<std::size_t>(g)];
          part[m][d].push_back(l < 0 ? -1 : l * t.strides[d]);
        }
    }
    std::vector<std::int64_t> taken(tiles.size(), 0);  // elements copied from each member
    for_each_index(out_t.local_shape, [&](const std::vector<std::int64_t>& idx, std::int64_t k) {
      double acc = 0;
      bool first = true;
      for (std::size_t m = 0; m < tiles.size(); ++m) {
        std::int64_t o = 0;
        bool held = true;
        for (std::size_t d = 0; d < nd && held; ++d) {
          const std::int64_t c = part[m][d][static_cast<std::size_t>(idx[d])];
          held = c >= 0;
          o += c;
        }
        if (!held) continue;
        const double x = data[m][o];
        if (!reducing) {
          out.data[static_cast<std::size_t>(k)] = x;
          ++taken[m];
          return;
        }
        acc = first ? x : (i.reduce == lower::ReduceOp::Max ? std::max(acc, x) : acc + x);
        first = false;
      }
      WEFT_CHECK(reducing && !first, "no rank of the group holds element {} of '{}'", idx,
                 p_.buffers[static_cast<std::size_t>(src)].name);
      out.data[static_cast<std::size_t>(k)] = acc;
    });
    for (std::size_t m = 0; m < tiles.size(); ++m)
      if (tiles[m].first != r && taken[m] > 0) recv[{tiles[m].first, kind, i.internal}] += taken[m] * eb;
    if (i.kind == InstrKind::ReduceScatter)
      for (const auto& [m, v] : members)
        if (m != r) recv[{m, kind, i.internal}] += out.numel() * eb;
    if (i.kind == InstrKind::AllReduce) {
      // Ring all-reduce: member j owns chunk j of the flat buffer; this rank receives its own
      // chunk's terms from every other member and every other member's reduced chunk.
      const auto k = static_cast<std::int64_t>(i.group.size());
      auto chunk = [&](std::int64_t j) {
        const std::int64_t n = out.numel(), c = (n + k - 1) / k;
        return std::max<std::int64_t>(0, std::min(n, (j + 1) * c) - std::min(n, j * c));
      };
      const std::int64_t me = std::find(i.group.begin(), i.group.end(), r) - i.group.begin();
      for (std::int64_t j = 0; j < k; ++j)
        if (j != me)
          recv[{i.group[static_cast<std::size_t>(j)], kind, i.internal}] += (chunk(me) + chunk(j)) * eb;
    }
    return out;
  }

  // The global indices of a transfer's region, per dim.
  static std::vector<std::vector<std::int64_t>> region_indices(const Instr& i) {
    std::vector<std::vector<std::int64_t>> idx;
    for (const auto& d : i.region) {
      std::vector<std::int64_t> v;
      for (std::size_t k = 0; k + 1 < d.size(); k += 2)
        for (std::int64_t e = d[k]; e < d[k + 1]; ++e) v.push_back(e);
      idx.push_back(std::move(v));
    }
    return idx;
  }

  // Visits the region's elements in row-major order with their offset in rank r's tile of buffer b.
  template <typename F>
  void for_each_region_element(int r, int b, const Instr& i, F&& f) {
    const TileIndex& t = tile(b, r);
    const auto idx = region_indices(i);
    std::vector<std::int64_t> extents;
    for (const auto& v : idx) extents.push_back(static_cast<std::int64_t>(v.size()));
    for_each_index(extents, [&](const std::vector<std::int64_t>& at, std::int64_t k) {
      std::int64_t o = 0;
      for (std::size_t d = 0; d < at.size(); ++d) {
        const std::int64_t l = t.local[d][static_cast<std::size_t>(idx[d][static_cast<std::size_t>(at[d])])];
        WEFT_CHECK(l >= 0, "element {} of the region is not in this rank's tile of '{}'", at,
                   p_.buffers[static_cast<std::size_t>(b)].name);
        o += l * t.strides[d];
      }
      f(o, k);
    });
  }

  // A Send posts the region's elements to every receiver (non-blocking, as isend).
  void send(int r, const Instr& i, const HostTensor& src, int step) {
    std::vector<double> msg;
    for_each_region_element(r, i.in[0], i, [&](std::int64_t o, std::int64_t) {
      msg.push_back(src.data[static_cast<std::size_t>(o)]);
    });
    std::lock_guard lock(mu_);
    for (int q : i.group) mail_[{step, i.tag, q}] = Message{r, msg};
    cv_.notify_all();
  }

  // A Recv waits for its message and writes it into its part of the output tile.
  void recv(int r, const Instr& i, int step) {
    Message m;
    {
      std::unique_lock lock(mu_);
      const auto deadline = Clock::now() + std::chrono::duration<double>(opt_.timeout_s);
      for (;;) {
        auto it = mail_.find({step, i.tag, r});
        if (it != mail_.end()) {
          m = std::move(it->second);
          mail_.erase(it);
          break;
        }
        if (abort_) throw Error("stopped: another rank failed");
        if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !mail_.count({step, i.tag, r}))
          fail("waited {} s for message {} from rank {} (deadlock or a failed rank)", opt_.timeout_s, i.tag,
               i.group.at(0));
      }
    }
    WEFT_CHECK(m.sender == i.group.at(0), "message {} came from rank {}, expected rank {}", i.tag, m.sender,
               i.group.at(0));
    const int dst = i.out[0];
    auto& held = values_[static_cast<std::size_t>(r)][static_cast<std::size_t>(dst)];
    HostTensor out = held ? *held : HostTensor{tile(dst, r).local_shape, {}};
    if (!held) out.data.assign(static_cast<std::size_t>(out.numel()), 0.0);
    std::int64_t n = 0;
    for_each_region_element(r, dst, i, [&](std::int64_t o, std::int64_t k) {
      WEFT_CHECK(k < static_cast<std::int64_t>(m.data.size()), "message {} is shorter than its region",
                 i.tag);
      out.data[static_cast<std::size_t>(o)] = m.data[static_cast<std::size_t>(k)];
      ++n;
    });
    WEFT_CHECK(n == static_cast<std::int64_t>(m.data.size()), "message {} has {} elements, its region {}",
               i.tag, m.data.size(), n);
    recv_from_[static_cast<std::size_t>(r)]
              [{m.sender, std::string(lower::instr_kind_name(InstrKind::Send)), false}] +=
        n * p_.buffers[static_cast<std::size_t>(dst)].element_bytes;
    write(r, dst, std::move(out));
  }

  void collective(int r, int pc, const Instr& i) {
    std::unique_lock lock(mu_);
    auto& count = seq_[{r, i.group}];
    const std::pair<std::vector<int>, int> key{i.group, count++};
    Slot& slot = slots_[key];
    slot.inputs[r] = &read(r, i.in[0]);
    ++slot.arrived;
    cv_.notify_all();
    const int k = static_cast<int>(i.group.size());
    auto wait = [&](auto ready) {
      const auto deadline = Clock::now() + std::chrono::duration<double>(opt_.timeout_s);
      while (!ready()) {
        if (abort_) throw Error("stopped: another rank failed");
        if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && !ready()) {
          std::vector<int> missing;
          for (int g : i.group)
            if (!slot.inputs.count(g)) missing.push_back(g);
          fail("waited {} s at this collective for ranks {} of its group (deadlock or a failed rank)",
               opt_.timeout_s, missing);
        }
      }
    };
    wait([&] { return slot.arrived == k; });
    std::map<int, const HostTensor*> members = slot.inputs;
    lock.unlock();
    HostTensor out = regroup(r, i, members);  // reads the others' inputs: they wait below
    lock.lock();
    ++slot.finished;
    cv_.notify_all();
    wait([&] { return slot.finished == k; });
    if (++slot.arrived == 2 * k) slots_.erase(key);  // the last one to leave
    lock.unlock();
    write(r, i.out[0], std::move(out));
    (void)pc;
  }

  const Program& p_;
  const ExecuteOptions& opt_;
  LeafValues init_;
  ProgramLayout layout_;
  std::map<ir::TensorId, const HostTensor*> inputs_;
  std::vector<std::vector<std::optional<HostTensor>>> values_;
  std::vector<std::map<ir::OpId, double>> ce_fraction_;  // per step: op -> CeValidFractions' ρ
  std::vector<RankStats> stats_;
  std::vector<DType> held_;  // per buffer: the precision its values are held at (ir::held_dtype)
  std::vector<std::vector<std::vector<int>>> axis_groups_;  // per rank and stage-mesh axis
  std::vector<std::map<std::tuple<int, std::string, bool>, std::int64_t>> recv_from_;
  std::vector<std::vector<HostTensor>> losses_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<std::vector<int>, int>, Slot> slots_;
  struct Message {
    int sender = -1;
    std::vector<double> data;
  };
  std::map<std::tuple<int, int, int>, Message> mail_;  // (step, tag, receiver) -> posted message
  std::map<std::pair<int, std::vector<int>>, int> seq_;
  std::atomic<bool> abort_{false};
  std::exception_ptr error_;
};

}  // namespace

ExecutionResult execute_program(const lower::Program& program, const ExecuteOptions& options) {
  return Executor(program, options).run();
}

ExecutionResult execute_reference(const ir::Graph& g, const ExecuteOptions& opt) {
  g.validate();
  WEFT_CHECK(opt.dtype == DType::F64 || opt.dtype == DType::F32,
             "execute_reference: dtype must be f64 or f32, got {}", dtype_name(opt.dtype));
  WEFT_CHECK(opt.steps >= 1, "execute_reference: steps must be >= 1, got {}", opt.steps);
  const auto t0 = Clock::now();
  LeafValues init(g, opt.seed, opt.seed_all_parameters);
  for (const auto& [name, v] : opt.inputs) check_input_name(g, name, "execute_reference");
  const auto n = g.tensors().size();
  std::vector<HostTensor> val(n);
  const auto held = held_dtypes(g, opt.dtype);
  auto fill = [&](ir::TensorId t, int step) {
    const auto& info = g.tensor(t);
    HostTensor v{info.shape, {}};
    auto it = opt.inputs.find(info.name);
    if (it != opt.inputs.end() && info.role == ir::Role::Input) {
      WEFT_CHECK(it->second.shape == info.shape,
                 "execute_reference: inputs['{}'] has shape {}, the input has {}", info.name,
                 it->second.shape, info.shape);
      v = it->second;
    } else {
      v.data.resize(static_cast<std::size_t>(v.numel()));
      for (std::int64_t k = 0; k < v.numel(); ++k)
        v.data[static_cast<std::size_t>(k)] = init.value(t, step, k);
    }
    ir::round_to_dtype(v, held[static_cast<std::size_t>(t)]);
    val[static_cast<std::size_t>(t)] = std::move(v);
  };
  const auto carries = ir::updated_states(g);
  const auto order = g.topo_order();
  ExecutionResult res;
  for (int step = 1; step <= opt.steps; ++step) {
    for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(n); ++t) {
      const auto& info = g.tensor(t);
      if (info.producer != ir::kNoOp) continue;
      const bool persistent = info.role == ir::Role::Parameter || info.role == ir::Role::OptimizerState;
      if (!persistent || step == 1) fill(t, step);
    }
    for (ir::OpId o : order) {
      const auto& op = g.op(o);
      std::vector<const HostTensor*> in;
      for (ir::TensorId t : op.inputs) in.push_back(&val[static_cast<std::size_t>(t)]);
      ir::KernelContext ctx;
      ctx.step = step;
      auto outs = ir::run_kernel(g, op, in, ctx);
      for (std::size_t k = 0; k < outs.size(); ++k) {
        ir::round_to_dtype(outs[k], held[static_cast<std::size_t>(op.outputs[k])]);
        val[static_cast<std::size_t>(op.outputs[k])] = std::move(outs[k]);
      }
    }
    res.losses.push_back(g.loss() ? val[static_cast<std::size_t>(*g.loss())].data.at(0) : 0.0);
    if (step == opt.steps)
      for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(n); ++t) {
        const auto& info = g.tensor(t);
        if (info.producer != ir::kNoOp || info.role != ir::Role::Parameter) continue;
        auto grad = g.grad(t);
        if (grad && g.tensor(*grad).producer != ir::kNoOp)
          res.gradients[info.name] = val[static_cast<std::size_t>(*grad)];
      }
    for (auto [out, leaf] : carries) val[static_cast<std::size_t>(leaf)] = val[static_cast<std::size_t>(out)];
  }
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(n); ++t) {
    const auto& info = g.tensor(t);
    if (info.producer == ir::kNoOp && info.role == ir::Role::Parameter)
      res.parameters[info.name] = val[static_cast<std::size_t>(t)];
  }
  res.seconds = seconds_since(t0);
  return res;
}

}  // namespace weft::exec
