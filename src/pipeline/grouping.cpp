// Layer grouping (Alpa's layer clustering) of a training graph, and stage extraction.
//
// Math. Let f_1..f_n be the forward ops in one topological order of the forward graph, w_p the
// compute of f_p (its FLOPs plus those of the backward ops it owns) and c_p (p = 1..n−1) the
// bytes of forward activations made at positions < p and read at positions >= p (the bytes that
// cross a cut placed before position p). A grouping into K blocks is a choice of cut positions
// 0 = b_0 < b_1 < ... < b_K = n; it is optimal when it minimises, lexicographically,
//   (1) M = max_k Σ_{p in [b_{k−1}, b_k)} w_p, then
//   (2) C = Σ_{k=1..K−1} c_{b_k}.
// (1) is found by bisection on M with the greedy feasibility test (fill a block while it stays
// <= M; feasible iff at most K blocks result — more cuts never raise the max, so "at most K"
// equals "exactly K" when n >= K); the final M* is the greedy's actual max, a true block sum.
// (2) is the DP  F(k, e) = min_{b < e, W(b, e) <= M*} F(k−1, b) + c_b,  F(1, e) = [W(0, e) <= M*],
// whose window of b is monotone in e, so a monotone deque gives O(K·n).
#include "weft/pipeline/grouping.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>

#include "weft/core/error.hpp"

namespace weft::pipeline {

using ir::Graph;
using ir::kNoOp;
using ir::OpId;
using ir::Role;
using ir::TensorId;

namespace {

bool is_update(ir::OpKind k) { return k == ir::OpKind::SgdUpdate || k == ir::OpKind::AdamUpdate; }

}  // namespace

std::vector<OpPhase> classify_ops(const Graph& g) {
  const auto& ops = g.ops();
  std::vector<OpPhase> phase(ops.size(), OpPhase::Forward);
  std::vector<char> grad_like(g.tensors().size(), 0);
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors().size()); ++t)
    if (g.grad_of(t)) grad_like[t] = 1;
  for (OpId o : g.topo_order()) {
    const auto& op = ops[o];
    bool backward = false;
    for (TensorId t : op.inputs) backward = backward || grad_like[t];
    if (is_update(op.kind))
      phase[o] = OpPhase::Update;
    else if (backward)
      phase[o] = OpPhase::Backward;
    if (phase[o] != OpPhase::Forward)
      for (TensorId t : op.outputs) grad_like[t] = 1;
  }
  return phase;
}

std::vector<char> gradient_sums_into_update(const Graph& g) {
  const auto phase = classify_ops(g);
  std::vector<char> sum(g.ops().size(), 0);
  const auto readers = g.consumer_index();
  const auto order = g.topo_order();
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    const OpId o = *it;
    const auto& op = g.op(o);
    if (phase[o] != OpPhase::Backward || op.kind != ir::OpKind::Binary ||
        op.attrs.binary != ir::BinaryFn::Add || op.outputs.size() != 1)
      continue;
    const auto& shape = g.tensor(op.outputs[0]).shape;
    bool ok = g.tensor(op.inputs[0]).shape == shape && g.tensor(op.inputs[1]).shape == shape;
    const auto& cons = readers[static_cast<std::size_t>(op.outputs[0])];
    ok = ok && !cons.empty();
    for (OpId c : cons) ok = ok && (phase[c] == OpPhase::Update || sum[c]);
    sum[o] = ok ? 1 : 0;
  }
  return sum;
}

std::vector<OpId> owner_forward_op(const Graph& g) {
  const auto& ops = g.ops();
  const auto& ts = g.tensors();
  const auto phase = classify_ops(g);
  const auto order = g.topo_order();
  const auto cons = g.consumer_index();
  std::vector<int> pos(ops.size(), 0);
  for (std::size_t i = 0; i < order.size(); ++i) pos[order[i]] = static_cast<int>(i);

  std::vector<OpId> owner(ops.size(), kNoOp);
  std::unordered_map<std::string_view, OpId> fwd_by_name;
  for (OpId o = 0; o < static_cast<OpId>(ops.size()); ++o)
    if (phase[o] == OpPhase::Forward) {
      owner[o] = o;
      fwd_by_name.emplace(ops[o].name, o);
    }
  // First forward consumer of a leaf (a parameter's block holds the parameter).
  auto first_forward_consumer = [&](TensorId t) {
    OpId best = kNoOp;
    for (OpId c : cons[t])
      if (phase[c] == OpPhase::Forward && (best == kNoOp || pos[c] < pos[best])) best = c;
    return best;
  };
  // The forward op that owns a forward tensor's gradient: its producer, or for a leaf (parameter)
  // its first forward consumer.
  auto owner_of_forward_tensor = [&](TensorId t) {
    if (ts[t].producer != kNoOp && phase[ts[t].producer] == OpPhase::Forward) return ts[t].producer;
    return first_forward_consumer(t);
  };
  auto by_name = [&](const std::string& name) -> OpId {
    if (name.rfind("d:", 0) != 0) return kNoOp;
    // "d:<forward op>/<what>"; op names may contain '/', so try every '/' from the right.
    for (auto slash = name.rfind('/'); slash != std::string::npos && slash >= 2;
         slash = slash == 0 ? std::string::npos : name.rfind('/', slash - 1)) {
      auto it = fwd_by_name.find(std::string_view(name).substr(2, slash - 2));
      if (it != fwd_by_name.end()) return it->second;
      if (slash == 2) break;
    }
    return kNoOp;
  };

  // Pass 1: rules that need no other owner.
  for (OpId o = 0; o < static_cast<OpId>(ops.size()); ++o) {
    if (phase[o] == OpPhase::Forward) continue;
    const auto& op = ops[o];
    // The name first: a backward op of f computes f's input gradients even when such a gradient
    // is the only contribution (and so also carries grad_of of f's input).
    OpId own = is_update(op.kind) ? kNoOp : by_name(op.name);
    for (TensorId t : op.outputs) {
      auto of = g.grad_of(t);
      if (own != kNoOp || !of) continue;
      const auto& oi = ts[*of];
      if (oi.producer == kNoOp || phase[oi.producer] == OpPhase::Forward) own = owner_of_forward_tensor(*of);
    }
    owner[o] = own;
  }
  // Pass 2 (reverse topological order): follow the gradient to the op that reads it; then
  // (forward order) fall back to the producer of an input.
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    OpId o = *it;
    if (owner[o] != kNoOp) continue;
    OpId best = kNoOp;
    for (TensorId t : ops[o].outputs)
      for (OpId c : cons[t])
        if (owner[c] != kNoOp && (best == kNoOp || pos[c] < pos[best])) best = c;
    if (best != kNoOp) owner[o] = owner[best];
  }
  for (OpId o : order) {
    if (owner[o] != kNoOp) continue;
    for (TensorId t : ops[o].inputs) {
      OpId p = ts[t].producer;
      if (p != kNoOp && owner[p] != kNoOp) {
        owner[o] = owner[p];
        break;
      }
      if (p == kNoOp) {
        OpId f = first_forward_consumer(t);
        if (f != kNoOp) {
          owner[o] = f;
          break;
        }
      }
    }
  }
  return owner;
}

std::string Block::to_string() const {
  return fmt::format(
      "Block({} fwd ops, {} ops, fwd {:.4g} bwd {:.4g} upd {:.4g} FLOP, params {} B, boundary {} B)",
      forward_ops.size(), ops.size(), forward_flops, backward_flops, update_flops, param_bytes,
      boundary_bytes);
}

double LayerGrouping::max_block_flops() const {
  double m = 0;
  for (const auto& b : blocks) m = std::max(m, b.compute_flops());
  return m;
}

std::int64_t LayerGrouping::cut_bytes() const {
  std::int64_t c = 0;
  for (auto b : crossing_bytes) c += b;
  return c;
}

std::vector<OpId> LayerGrouping::ops_of_range(int first, int last) const {
  WEFT_CHECK(first >= 0 && first <= last && last < static_cast<int>(blocks.size()),
             "block range [{}, {}] is not inside 0..{}", first, last, static_cast<int>(blocks.size()) - 1);
  std::vector<OpId> out;
  for (int b = first; b <= last; ++b) out.insert(out.end(), blocks[b].ops.begin(), blocks[b].ops.end());
  std::sort(out.begin(), out.end());
  return out;
}

std::string LayerGrouping::to_string() const {
  std::string s = fmt::format("LayerGrouping({} blocks, max {:.4g} FLOP, cut {} B)\n", blocks.size(),
                              max_block_flops(), cut_bytes());
  for (std::size_t b = 0; b < blocks.size(); ++b) s += fmt::format("  {}: {}\n", b, blocks[b].to_string());
  return s;
}

LayerGrouping group_layers(const Graph& g, int num_blocks) { return group_layers(g, num_blocks, {}); }

LayerGrouping group_layers(const Graph& g, int num_blocks, const std::vector<int>& cut_positions) {
  const auto& ops = g.ops();
  const auto& ts = g.tensors();
  const auto phase = classify_ops(g);
  const auto owner = owner_forward_op(g);
  std::vector<OpId> order;
  for (OpId o : g.topo_order())
    if (phase[o] == OpPhase::Forward) order.push_back(o);
  const int n = static_cast<int>(order.size());
  WEFT_CHECK(n > 0, "group_layers: graph '{}' has no forward op", g.name());
  // Items the blocks are made of: single forward ops, or the runs between the allowed cuts.
  std::vector<int> item_start{0};
  if (cut_positions.empty()) {
    for (int p = 1; p < n; ++p) item_start.push_back(p);
  } else {
    std::vector<int> cp = cut_positions;
    std::sort(cp.begin(), cp.end());
    cp.erase(std::unique(cp.begin(), cp.end()), cp.end());
    for (int p : cp) {
      WEFT_CHECK(p > 0 && p < n, "group_layers: cut position {} must be in 1..{} (forward ops)", p, n - 1);
      item_start.push_back(p);
    }
  }
  const int m = static_cast<int>(item_start.size());
  WEFT_CHECK(num_blocks >= 1 && num_blocks <= m, "group_layers: num_blocks = {} must be in 1..{} ({})",
             num_blocks, m, cut_positions.empty() ? "forward ops" : "runs between the allowed cuts");
  std::vector<int> pos(ops.size(), -1);
  for (int i = 0; i < n; ++i) pos[order[i]] = i;

  // Weights w_p.
  std::vector<double> wp(n, 0);
  for (OpId o = 0; o < static_cast<OpId>(ops.size()); ++o)
    if (owner[o] != kNoOp && phase[o] != OpPhase::Update) wp[pos[owner[o]]] += ops[o].flops();

  // Crossing bytes c_p for p in 1..n-1: a forward activation made at a and last read (by a
  // forward op) at z > a crosses every cut p in (a, z].
  std::vector<std::int64_t> diff(n + 1, 0);
  const auto cons = g.consumer_index();
  for (TensorId t = 0; t < static_cast<TensorId>(ts.size()); ++t) {
    OpId p = ts[t].producer;
    if (p == kNoOp || phase[p] != OpPhase::Forward) continue;
    int z = -1;
    for (OpId c : cons[t])
      if (phase[c] == OpPhase::Forward) z = std::max(z, pos[c]);
    int a = pos[p];
    if (z > a) {
      diff[a + 1] += ts[t].bytes();
      diff[z + 1] -= ts[t].bytes();
    }
  }
  std::vector<std::int64_t> cross(n + 1, 0);  // cross[p] for a cut before position p
  for (int p = 1; p <= n; ++p) cross[p] = cross[p - 1] + diff[p];

  // The cuts below are chosen between items (w: an item's weight, icross: the bytes of a cut
  // before it); positions are items when every cut is allowed.
  item_start.push_back(n);
  std::vector<double> w(m, 0);
  std::vector<std::int64_t> icross(m + 1, 0);
  for (int i = 0; i < m; ++i) {
    for (int p = item_start[i]; p < item_start[i + 1]; ++p) w[i] += wp[p];
    icross[i] = cross[item_start[i]];
  }
  std::vector<double> prefix(m + 1, 0);
  for (int i = 0; i < m; ++i) prefix[i + 1] = prefix[i] + w[i];
  auto seg = [&](int b, int e) { return prefix[e] - prefix[b]; };  // items [b, e)

  // (1) min max by bisection + greedy.
  auto greedy = [&](double cap, double* achieved) {
    int blocks = 1;
    double cur = 0, mx = 0;
    for (int i = 0; i < m; ++i) {
      if (w[i] > cap) return std::numeric_limits<int>::max();
      if (cur + w[i] > cap && i > 0) {
        ++blocks;
        mx = std::max(mx, cur);
        cur = 0;
      }
      cur += w[i];
    }
    mx = std::max(mx, cur);
    if (achieved) *achieved = mx;
    return blocks;
  };
  double lo = 0, hi = prefix[m];
  for (int i = 0; i < m; ++i) lo = std::max(lo, w[i]);
  double mstar = 0;
  if (greedy(lo, &mstar) <= num_blocks) {
    hi = lo;
  } else {
    for (int it = 0; it < 200 && hi > lo; ++it) {
      double mid = lo + (hi - lo) / 2;
      if (mid <= lo || mid >= hi) break;
      if (greedy(mid, nullptr) <= num_blocks)
        hi = mid;
      else
        lo = mid;
    }
  }
  greedy(hi, &mstar);
  // Block sums are recomputed as prefix differences below; allow the rounding of that form.
  const double cap = mstar * (1 + 1e-12) + 1e-300;

  // (2) min cut bytes with K blocks, each <= cap: F(k, e) over e = end position (exclusive).
  constexpr std::int64_t kInf = std::numeric_limits<std::int64_t>::max() / 4;
  const int K = num_blocks;
  std::vector<std::vector<std::int64_t>> F(K + 1, std::vector<std::int64_t>(m + 1, kInf));
  std::vector<std::vector<int>> from(K + 1, std::vector<int>(m + 1, -1));
  for (int e = 1; e <= m; ++e)
    if (seg(0, e) <= cap) F[1][e] = 0;
  for (int k = 2; k <= K; ++k) {
    std::deque<int> dq;  // candidate b (ascending), values F(k-1, b) + cross[b] increasing
    int next_b = k - 1, lo_b = k - 1;
    for (int e = k; e <= m; ++e) {
      for (; next_b < e; ++next_b) {
        std::int64_t v = F[k - 1][next_b] >= kInf ? kInf : F[k - 1][next_b] + icross[next_b];
        while (!dq.empty()) {
          int b = dq.back();
          std::int64_t vb = F[k - 1][b] >= kInf ? kInf : F[k - 1][b] + icross[b];
          if (vb > v)
            dq.pop_back();  // ties keep the earlier cut (deterministic)
          else
            break;
        }
        dq.push_back(next_b);
      }
      while (lo_b < e && seg(lo_b, e) > cap) ++lo_b;
      while (!dq.empty() && dq.front() < lo_b) dq.pop_front();
      if (dq.empty()) continue;
      int b = dq.front();
      if (F[k - 1][b] >= kInf) continue;
      F[k][e] = F[k - 1][b] + icross[b];
      from[k][e] = b;
    }
  }
  if (F[K][m] >= kInf) throw InternalError("group_layers: no grouping under the min-max bound");
  std::vector<int> cuts(K + 1, 0);  // in items, then in positions
  cuts[K] = m;
  for (int k = K; k >= 2; --k) cuts[k - 1] = from[k][cuts[k]];
  for (int& c : cuts) c = item_start[c];

  LayerGrouping out;
  out.forward_order = order;
  out.blocks.resize(K);
  out.block_of_op.assign(ops.size(), -1);
  std::vector<int> block_of_pos(n);
  for (int k = 0; k < K; ++k)
    for (int p = cuts[k]; p < cuts[k + 1]; ++p) {
      block_of_pos[p] = k;
      out.blocks[k].forward_ops.push_back(order[p]);
    }
  for (OpId o = 0; o < static_cast<OpId>(ops.size()); ++o) {
    if (owner[o] == kNoOp) continue;
    int b = block_of_pos[pos[owner[o]]];
    out.block_of_op[o] = b;
    Block& blk = out.blocks[b];
    blk.ops.push_back(o);
    double f = ops[o].flops();
    if (phase[o] == OpPhase::Forward)
      blk.forward_flops += f;
    else if (phase[o] == OpPhase::Backward)
      blk.backward_flops += f;
    else
      blk.update_flops += f;
  }
  for (TensorId t = 0; t < static_cast<TensorId>(ts.size()); ++t) {
    const auto& ti = ts[t];
    if (ti.producer == kNoOp) {
      if (ti.role != Role::Parameter) continue;
      OpId first = kNoOp;
      for (OpId c : cons[t])
        if (phase[c] == OpPhase::Forward && (first == kNoOp || pos[c] < pos[first])) first = c;
      if (first != kNoOp) out.blocks[block_of_pos[pos[first]]].param_bytes += ti.bytes();
      continue;
    }
    if (phase[ti.producer] != OpPhase::Forward) continue;
    int b = block_of_pos[pos[ti.producer]];
    for (OpId c : cons[t])
      if (phase[c] == OpPhase::Forward && block_of_pos[pos[c]] > b) {
        out.blocks[b].boundary_bytes += ti.bytes();
        break;
      }
  }
  out.crossing_bytes.assign(K - 1, 0);
  for (int k = 1; k < K; ++k) out.crossing_bytes[k - 1] = cross[cuts[k]];
  return out;
}

RepeatedLayers repeated_layers(const Graph& g) {
  const auto& ts = g.tensors();
  const auto phase = classify_ops(g);
  std::vector<OpId> order;
  for (OpId o : g.topo_order())
    if (phase[o] == OpPhase::Forward) order.push_back(o);
  const int n = static_cast<int>(order.size());
  RepeatedLayers out;
  out.forward_ops = n;
  if (n < 2) return out;
  std::vector<int> pos(g.ops().size(), -1);
  for (int i = 0; i < n; ++i) pos[order[i]] = i;
  // An op's signature: what it computes on what, without names, seeds or scalars (a layer's
  // dropout seed or a per-layer constant must not hide the repetition): the shapes and dtypes of
  // its operands and results, an operand told apart only as an activation (made by a forward op,
  // or an input: the first layer of a chain reads the model's input where the others read the
  // previous layer) or a leaf of its role (a parameter, a constant).
  std::vector<int> sig(n);
  std::unordered_map<std::string, int> interned;
  for (int i = 0; i < n; ++i) {
    const auto& op = g.op(order[i]);
    std::string k = fmt::format("{}|{}|{}|{}|{}|{}|", static_cast<int>(op.kind), op.attrs.equation,
                                static_cast<int>(op.attrs.unary), static_cast<int>(op.attrs.binary),
                                static_cast<int>(op.attrs.reduce), fmt::join(op.attrs.axes, ","));
    for (TensorId t : op.inputs) {
      const auto& ti = ts[t];
      const bool activation = ti.producer != kNoOp || ti.role == Role::Input || ti.role == Role::Activation;
      k += fmt::format("{}{}:{};",
                       activation ? std::string("a") : fmt::format("l{}", static_cast<int>(ti.role)),
                       fmt::join(ti.shape, "x"), static_cast<int>(ti.dtype));
    }
    for (TensorId t : op.outputs)
      k += fmt::format("o{}:{};", fmt::join(ts[t].shape, "x"), static_cast<int>(ts[t].dtype));
    sig[i] = interned.emplace(k, static_cast<int>(interned.size())).first->second;
  }
  // The period P whose longest back-to-back run covers the most ops (ties: the shortest period —
  // a multiple of the layer covers no more): R consecutive positions i with sig[i] == sig[i + P]
  // make [s, s + R + P) P-periodic, floor((R + P) / P) layers.
  int best_cover = 0, best_p = 0, best_s = 0, best_r = 0;
  for (int P = 1; 2 * P <= n; ++P) {
    int run = 0;
    for (int i = 0; i + P < n; ++i) {
      run = sig[i] == sig[i + P] ? run + 1 : 0;
      if (run < P) continue;
      const int cover = (run + P) / P * P;
      if (cover > best_cover) best_cover = cover, best_p = P, best_s = i - run + 1, best_r = run;
    }
  }
  if (best_p == 0) return out;
  // The layers' phase inside the periodic run: as many whole layers as the run holds, cut where
  // the fewest forward bytes cross (between two transformer layers only the residual stream does).
  std::vector<std::int64_t> diff(n + 1, 0), cross(n + 1, 0);
  const auto cons = g.consumer_index();
  for (TensorId t = 0; t < static_cast<TensorId>(ts.size()); ++t) {
    const OpId p = ts[t].producer;
    if (p == kNoOp || phase[p] != OpPhase::Forward) continue;
    int z = -1;
    for (OpId c : cons[t])
      if (phase[c] == OpPhase::Forward) z = std::max(z, pos[c]);
    if (z > pos[p]) {
      diff[pos[p] + 1] += ts[t].bytes();
      diff[z + 1] -= ts[t].bytes();
    }
  }
  for (int p = 1; p <= n; ++p) cross[p] = cross[p - 1] + diff[p];
  const int end = best_s + best_r + best_p, count = (best_r + best_p) / best_p;
  int phase0 = best_s;
  for (int f = best_s; f < best_s + best_p && f + count * best_p <= end; ++f)
    if (cross[f] < cross[phase0]) phase0 = f;
  out.count = count;
  out.period = best_p;
  for (int k = 0; k < count; ++k) out.starts.push_back(phase0 + k * best_p);
  return out;
}

LayerGrouping group_by_layers(const Graph& g, const RepeatedLayers& layers) {
  WEFT_CHECK(layers.count >= 1 && static_cast<int>(layers.starts.size()) == layers.count,
             "group_by_layers: {} layer starts for {} layers", layers.starts.size(), layers.count);
  return group_layers(g, layers.count, std::vector<int>(layers.starts.begin() + 1, layers.starts.end()));
}

StageGraph extract_stage_mapped(const Graph& g, const std::vector<OpId>& ops_in) {
  WEFT_CHECK(!ops_in.empty(), "extract_stage: empty op list");
  const auto nops = static_cast<OpId>(g.ops().size());
  std::vector<char> in_set(nops, 0);
  for (OpId o : ops_in) {
    WEFT_CHECK(o >= 0 && o < nops, "extract_stage: op id {} is not in graph '{}' ({} ops)", o, g.name(),
               nops);
    WEFT_CHECK(!in_set[o], "extract_stage: op id {} ('{}') is listed twice", o, g.op(o).name);
    in_set[o] = 1;
  }
  const auto& ts = g.tensors();
  std::vector<OpId> order;
  for (OpId o : g.topo_order())
    if (in_set[o]) order.push_back(o);
  std::vector<int> new_op(nops, -1);
  for (std::size_t i = 0; i < order.size(); ++i) new_op[order[i]] = static_cast<int>(i);

  StageGraph out;
  out.graph = Graph(g.name().empty() ? std::string("stage") : g.name() + ".stage");
  std::vector<TensorId> new_id(ts.size(), -1);
  auto map_tensor = [&](TensorId t) {
    if (new_id[t] >= 0) return new_id[t];
    ir::TensorInfo info = ts[t];
    if (info.producer != kNoOp && in_set[info.producer]) {
      info.producer = new_op[info.producer];
    } else {
      info.producer = kNoOp;
      // validate() forbids an Activation leaf: an activation received from another stage is an
      // input of this stage. Gradients, parameters and states keep their role.
      if (info.role == Role::Activation) info.role = Role::Input;
    }
    new_id[t] = out.graph.add_tensor_unchecked(std::move(info));
    out.original_tensor.push_back(t);
    return new_id[t];
  };
  for (OpId o : order) {
    const auto& op = g.op(o);
    for (TensorId t : op.inputs) map_tensor(t);
    for (TensorId t : op.outputs) map_tensor(t);
  }
  for (OpId o : order) {
    ir::Op op = g.op(o);
    for (auto& t : op.inputs) t = new_id[t];
    for (auto& t : op.outputs) t = new_id[t];
    out.graph.add_op_unchecked(std::move(op));
    out.original_op.push_back(o);
  }
  // Outputs: tensors made here and read outside, and the source's outputs made here.
  std::vector<char> is_output(ts.size(), 0);
  for (TensorId t : g.outputs()) is_output[t] = 1;
  if (g.loss()) is_output[*g.loss()] = 1;
  for (OpId o = 0; o < nops; ++o)
    if (!in_set[o])
      for (TensorId t : g.op(o).inputs) is_output[t] = 1;
  for (OpId o : order)
    for (TensorId t : g.op(o).outputs)
      if (is_output[t]) out.graph.mark_output(new_id[t]);
  if (g.loss() && new_id[*g.loss()] >= 0) out.graph.set_loss(new_id[*g.loss()]);
  for (TensorId t = 0; t < static_cast<TensorId>(ts.size()); ++t) {
    if (new_id[t] < 0) continue;
    auto of = g.grad_of(t);
    if (of && new_id[*of] >= 0) out.graph.set_grad_of(new_id[t], new_id[*of]);
  }
  return out;
}

Graph extract_stage(const Graph& g, const std::vector<OpId>& ops) {
  return extract_stage_mapped(g, ops).graph;
}

namespace {

// Canonical byte string of a graph without names: tensors renumbered by first appearance in op
// order (leaves described by shape/dtype/role, produced tensors by (op position, result slot)).
std::string canonical_form(const Graph& g) {
  std::string out;
  auto put = [&](const void* p, std::size_t n) { out.append(static_cast<const char*>(p), n); };
  auto put_i = [&](std::int64_t v) { put(&v, sizeof v); };
  auto put_d = [&](double v) { put(&v, sizeof v); };
  auto put_s = [&](const std::string& s) {
    put_i(static_cast<std::int64_t>(s.size()));
    out += s;
  };
  std::vector<std::int64_t> local(g.tensors().size(), -1);
  std::int64_t next = 0;
  auto tensor = [&](TensorId t) {
    const auto& ti = g.tensor(t);
    if (local[t] < 0) {
      local[t] = next++;
      put_i(-1);
      put_i(static_cast<std::int64_t>(ti.shape.size()));
      for (auto d : ti.shape) put_i(d);
      put_i(static_cast<std::int64_t>(ti.dtype));
      put_i(static_cast<std::int64_t>(ti.role));
    } else {
      put_i(local[t]);
    }
  };
  for (OpId o : g.topo_order()) {
    const auto& op = g.op(o);
    put_i(static_cast<std::int64_t>(op.kind));
    const auto& a = op.attrs;
    put_s(a.equation);
    put_i(static_cast<std::int64_t>(a.unary));
    put_i(static_cast<std::int64_t>(a.binary));
    put_i(static_cast<std::int64_t>(a.reduce));
    put_i(static_cast<std::int64_t>(a.axes.size()));
    for (int x : a.axes) put_i(x);
    put_i(static_cast<std::int64_t>(a.ints.size()));
    for (auto x : a.ints) put_i(x);
    put_d(a.scalar);
    put_i(static_cast<std::int64_t>(a.scalars.size()));
    for (double x : a.scalars) put_d(x);
    put_i(static_cast<std::int64_t>(op.inputs.size()));
    for (TensorId t : op.inputs) tensor(t);
    put_i(static_cast<std::int64_t>(op.outputs.size()));
    for (TensorId t : op.outputs) tensor(t);
  }
  auto mark = [&](TensorId t) { put_i(t >= 0 && t < static_cast<TensorId>(local.size()) ? local[t] : -2); };
  put_i(static_cast<std::int64_t>(g.outputs().size()));
  for (TensorId t : g.outputs()) mark(t);
  mark(g.loss() ? *g.loss() : -3);
  std::vector<std::pair<std::int64_t, std::int64_t>> grads;  // sorted: independent of tensor ids
  for (TensorId t = 0; t < static_cast<TensorId>(g.tensors().size()); ++t)
    if (auto of = g.grad_of(t)) grads.push_back({local[t], local[*of]});
  std::sort(grads.begin(), grads.end());
  for (auto [a, b] : grads) {
    put_i(a);
    put_i(b);
  }
  return out;
}

}  // namespace

bool structurally_equal(const Graph& a, const Graph& b) { return canonical_form(a) == canonical_form(b); }

std::uint64_t structural_hash(const Graph& g) {
  // FNV-1a over the canonical form.
  std::uint64_t h = 1469598103934665603ull;
  for (unsigned char c : canonical_form(g)) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace weft::pipeline
