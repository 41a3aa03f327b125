// The values of a step's leaves (see init.hpp).
#include "weft/exec/init.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "weft/core/error.hpp"
#include "weft/core/random.hpp"
#include "weft/ir/autodiff.hpp"

namespace weft::exec {
namespace {

// fn(k) for k in [0, n), over the machine's cores when n is large (the seeded values of a large
// tensor: tens of nanoseconds per element, a GPT-1.3B's 1.3 billion in a minute and a half on one).
template <class Fn>
void for_each_index(std::size_t n, Fn fn) {
  constexpr std::size_t kPerThread = std::size_t{1} << 20;
  const std::size_t cores = std::max(1u, std::thread::hardware_concurrency());
  const std::size_t workers = std::min(cores, n / kPerThread);
  if (workers <= 1) {
    for (std::size_t k = 0; k < n; ++k) fn(k);
    return;
  }
  std::vector<std::jthread> pool;
  pool.reserve(workers);
  for (std::size_t w = 0; w < workers; ++w)
    pool.emplace_back([w, workers, n, &fn] {
      for (std::size_t k = n * w / workers; k < n * (w + 1) / workers; ++k) fn(k);
    });
}

bool is_dloss_seed(const ir::Graph& g, ir::TensorId t) {
  const auto& info = g.tensor(t);
  return info.role == ir::Role::Constant && g.loss() && g.grad_of(t) == g.loss() && info.shape.empty();
}

}  // namespace

std::vector<std::string> leaves_without_values(const ir::Graph& g, bool seed_all_parameters) {
  std::vector<std::string> out;
  for (ir::TensorId t = 0; t < static_cast<ir::TensorId>(g.tensors().size()); ++t) {
    const auto& info = g.tensor(t);
    if (info.producer != ir::kNoOp || g.value(t)) continue;
    const bool needs = info.role == ir::Role::Buffer ||
                       (info.role == ir::Role::Constant && !is_dloss_seed(g, t)) ||
                       (info.role == ir::Role::Parameter && !g.seed_parameters() && !seed_all_parameters);
    if (needs) out.push_back(fmt::format("'{}' ({})", info.name, ir::role_name(info.role)));
  }
  return out;
}

void check_input_name(const ir::Graph& g, const std::string& name, std::string_view who) {
  auto t = g.find_tensor(name);
  if (t && g.tensor(*t).role == ir::Role::Input && g.tensor(*t).producer == ir::kNoOp) return;
  std::string inputs;
  for (const auto& info : g.tensors())
    if (info.role == ir::Role::Input && info.producer == ir::kNoOp)
      inputs += (inputs.empty() ? "" : ", ") + info.name;
  fail(
      "{}: inputs['{}'] is not an Input leaf of the graph{} (its Inputs: {}; parameters, buffers and "
      "constants "
      "carry their values in the graph: weft.load_values)",
      who, name, t ? fmt::format(" (it is a {})", ir::role_name(g.tensor(*t).role)) : "",
      inputs.empty() ? "none" : inputs);
}

LeafValues::LeafValues(const ir::Graph& g, std::uint64_t seed, bool seed_all_parameters)
    : g_(g), seed_(seed) {
  if (auto missing = leaves_without_values(g, seed_all_parameters); !missing.empty()) {
    bool folded = false;
    for (const auto& m : missing) folded = folded || m.ends_with("(constant)");
    std::string names;
    for (std::size_t i = 0; i < missing.size() && i < 12; ++i) names += (i ? ", " : "") + missing[i];
    if (missing.size() > 12) names += fmt::format(", ... ({} in all)", missing.size());
    fail(
        "graph '{}': {} leaves need a value and have none: {}. Give the module's values "
        "(weft.load_values(graph, "
        "state_dict or a .safetensors file), or import a module whose tensors are real){}{}",
        g.name(), missing.size(), names,
        g.seed_parameters() || seed_all_parameters
            ? ""
            : ", or init=\"seed\" to initialise the parameters from the seed",
        folded
            ? "; constants folded at import from a meta module's buffers: import with weft.from_torch(..., "
              "values=state_dict)"
            : "");
  }
  const auto n = g.tensors().size();
  int_range_.assign(n, 0);
  master_of_.assign(n, -1);
  unit_scale_.assign(n, 0);
  for (const auto& t : g.tensors()) {
    key_.push_back(stable_key(t.name));
  }
  for (std::size_t t = 0; t < n; ++t) {
    const auto& name = g.tensors()[t].name;
    if (name.size() > 6 && name.ends_with(".gamma")) unit_scale_[t] = 1;
  }
  for (const auto& op : g.ops()) {
    // A master copy starts as its parameter: mixed-precision training copies the weights once.
    if (ir::TensorId m = ir::master_copy(op); m >= 0) master_of_[static_cast<std::size_t>(m)] = op.inputs[0];
    auto bound = [&](std::size_t input, std::int64_t k) {
      if (op.inputs.size() > input) int_range_[static_cast<std::size_t>(op.inputs[input])] = k;
    };
    switch (op.kind) {
      case ir::OpKind::Embedding: bound(1, g.tensor(op.inputs[0]).shape[0]); break;
      case ir::OpKind::EmbeddingGrad: bound(0, op.attrs.ints[0]); break;
      case ir::OpKind::CrossEntropy:
      case ir::OpKind::CrossEntropyGrad: bound(1, g.tensor(op.inputs[0]).shape.back()); break;
      // A seeded index leaf of a routing op stays within the routed axis.
      case ir::OpKind::Gather: {
        const auto& xs = g.tensor(op.inputs[0]).shape;
        const int ax = op.attrs.axes.at(0);
        bound(1, xs[static_cast<std::size_t>(ax < 0 ? ax + static_cast<int>(xs.size()) : ax)]);
        break;
      }
      case ir::OpKind::ScatterAdd: {
        const auto& os = g.tensor(op.outputs[0]).shape;
        const int ax = op.attrs.axes.at(0);
        bound(op.inputs.size() == 2 ? 0 : 1,
              os[static_cast<std::size_t>(ax < 0 ? ax + static_cast<int>(os.size()) : ax)]);
        break;
      }
      case ir::OpKind::LayerNorm:
        if (op.inputs.size() > 1) unit_scale_[static_cast<std::size_t>(op.inputs[1])] = 1;
        break;
      default: break;
    }
  }
  // Labels reach the loss through views (a causal LM shifts them: labels[:, 1:]; a classifier reads
  // labels[:, 0]): an integer leaf read through slices, reshapes, transposes, concats and broadcasts
  // takes the bound of what reads the view.
  for (bool changed = true; changed;) {
    changed = false;
    for (const auto& op : g.ops()) {
      switch (op.kind) {
        case ir::OpKind::Slice:
        case ir::OpKind::Reshape:
        case ir::OpKind::Transpose:
        case ir::OpKind::Concat:
        case ir::OpKind::BroadcastTo:
        case ir::OpKind::Pad: break;
        default: continue;
      }
      const std::int64_t n = int_range_[static_cast<std::size_t>(op.outputs[0])];
      if (n <= 0) continue;
      for (ir::TensorId in : op.inputs) {
        auto& b = int_range_[static_cast<std::size_t>(in)];
        if (!is_floating(g.tensor(in).dtype) && (b == 0 || n < b)) b = n, changed = true;
      }
    }
  }
}

const ir::HostTensor* LeafValues::kept(ir::TensorId t) const {
  const ir::LeafValue* v = g_.value(t);
  if (!v) return nullptr;
  if (v->in_memory()) return v->data.get();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = read_.find(t);
  return it == read_.end() ? nullptr : it->second.get();
}

namespace {
ir::HostTensor checked_read(const ir::Graph& g, ir::TensorId t, const ir::LeafValue& v) {
  ir::HostTensor h = v.load();
  const auto& info = g.tensor(t);
  WEFT_CHECK(h.shape == info.shape, "the value of '{}' in '{}' (key '{}') has shape {}, the tensor has {}",
             info.name, v.file, v.key, h.shape, info.shape);
  return h;
}
}  // namespace

double LeafValues::value(ir::TensorId t, int step, std::int64_t index) const {
  const auto& info = g_.tensor(t);
  if (const ir::LeafValue* v = g_.value(t)) {
    const ir::HostTensor* h = kept(t);
    if (!h) {
      auto read = std::make_shared<const ir::HostTensor>(checked_read(g_, t, *v));
      std::lock_guard<std::mutex> lock(mu_);
      h = read_.emplace(t, std::move(read)).first->second.get();
    }
    return h->data.at(static_cast<std::size_t>(index));
  }
  const auto i = static_cast<std::uint64_t>(index);
  const std::uint64_t key = key_[static_cast<std::size_t>(t)];
  switch (info.role) {
    case ir::Role::Parameter: {
      if (unit_scale_[static_cast<std::size_t>(t)]) return 1;
      if (info.rank() <= 1) return 0;
      return 0.02 * normal01(seed_, key, i);
    }
    case ir::Role::OptimizerState: {
      const ir::TensorId p = master_of_[static_cast<std::size_t>(t)];
      return p >= 0 ? value(p, step, index) : 0;
    }
    case ir::Role::Constant:  // only the dloss seed gets here (the constructor checked)
      return 1;
    default: break;
  }
  // Inputs: a fresh draw every step (the step mixed into the stream key).
  const std::uint64_t skey = key ^ (0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(step));
  if (!is_floating(info.dtype)) {
    const std::int64_t n = int_range_[static_cast<std::size_t>(t)];
    WEFT_CHECK(n > 0,
               "input '{}' is an integer tensor that no embedding or cross-entropy reads: give its values",
               info.name);
    auto v = static_cast<std::int64_t>(uniform01(seed_, skey, i) * static_cast<double>(n));
    return static_cast<double>(std::min(v, n - 1));
  }
  return normal01(seed_, skey, i);
}

void LeafValues::values(ir::TensorId t, int step, std::span<const std::int64_t> index, double* out) const {
  const ir::LeafValue* v = g_.value(t);
  if (v && !kept(t)) {  // read for this call only
    const ir::HostTensor h = checked_read(g_, t, *v);
    for (std::size_t k = 0; k < index.size(); ++k) out[k] = h.data.at(static_cast<std::size_t>(index[k]));
    return;
  }
  // The per-tensor decisions once, then one draw per element: a GPT-1.3B's seeded parameters are
  // 1.3 billion of them (value() per element spent most of its time on the lookups).
  if (const ir::HostTensor* h = v ? kept(t) : nullptr) {
    for (std::size_t k = 0; k < index.size(); ++k) out[k] = h->data.at(static_cast<std::size_t>(index[k]));
    return;
  }
  const auto& info = g_.tensor(t);
  if (!v && info.role == ir::Role::Parameter && !unit_scale_[static_cast<std::size_t>(t)] &&
      info.rank() > 1) {
    const std::uint64_t key = key_[static_cast<std::size_t>(t)];
    for_each_index(index.size(), [&](std::size_t k) {
      out[k] = 0.02 * normal01(seed_, key, static_cast<std::uint64_t>(index[k]));
    });
    return;
  }
  if (!v && info.role == ir::Role::Input && is_floating(info.dtype)) {
    const std::uint64_t skey =
        key_[static_cast<std::size_t>(t)] ^ (0x9E3779B97F4A7C15ULL * static_cast<std::uint64_t>(step));
    for_each_index(index.size(), [&](std::size_t k) {
      out[k] = normal01(seed_, skey, static_cast<std::uint64_t>(index[k]));
    });
    return;
  }
  for (std::size_t k = 0; k < index.size(); ++k) out[k] = value(t, step, index[k]);
}

}  // namespace weft::exec
