// Pipeline schedule generators and static checks.
//
// Generators (S stages, M micro-batches, stage i 0-indexed):
//  * GPipe: F(0..M−1) then B(0..M−1) on every stage. Peak in-flight M.
//  * kFkB: groups of k consecutive micro-batches g = 0..G−1, G = ceil(M/k) (the last group holds
//    M − (G−1)·k when k ∤ M). Stage i: w = min(S−i−1, G) warm-up groups of F; then
//    (F group w+j, B group j) for j = 0..G−w−1; then B of the remaining groups. In flight just
//    before B of group j: groups j..min(j+w, G−1), so the peak is min(M, k·(S−i)). k = 1 gives
//    1F1B (warm-up S−i−1 forwards, peak S−i); k >= M gives one group, i.e. GPipe.
//  * Eager-1F1B: w = min(M, 2(S−i)−1) forwards, then (B j, F w+j) pairs, then the remaining B.
//    Peak min(M, 2(S−i)−1) = 1F1B's S−i plus S−i−1 extra (< S−i).
//  * Interleaved 1F1B (Megatron-LM): device d, v chunks, k-th forward is chunk (k mod Dv) div D,
//    micro-batch (k div Dv)·D + k mod D; backwards visit chunks in reverse; warm-up
//    min(Mv, 2(D−d−1) + (v−1)·D) forwards (all Mv when M == D). Bubble (D−1)(tf+tb) per device
//    against M·v·(tf+tb) of work (tf, tb per chunk).
//  * ZB-H1 (Qi et al.): stage i emits, for x = 0..M+S−2, F(x), B(x−(S−1−i)), W(x−(S−1)) when in
//    range. Bubble (S−1)(Tf+Tb−Tw).
//  * ZB-V and DualPipeV: torch's constructions step by step, on the V placement (the header).
// check_order: Kahn's algorithm on (per-device order edges ∪ data edges) finds cycles = deadlocks;
// pairing compares the message sequences of each (src device, dst device, activation|gradient)
// FIFO channel at both ends.
#include "weft/schedule/schedule.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "weft/core/error.hpp"
#include "weft/core/json_reader.hpp"

namespace weft::schedule {

const char* op_kind_name(OpKind k) {
  switch (k) {
    case OpKind::F: return "F";
    case OpKind::B: return "B";
    case OpKind::W: return "W";
  }
  return "?";
}

std::string to_string(const Op& op) {
  return fmt::format("{}(s{},m{})", op_kind_name(op.kind), op.stage, op.micro);
}

namespace {
std::size_t op_index(const Op& op, int M) {
  return (static_cast<std::size_t>(op.stage) * static_cast<std::size_t>(M) +
          static_cast<std::size_t>(op.micro)) *
             3 +
         static_cast<std::size_t>(op.kind);
}
}  // namespace

Schedule::Schedule(std::string name, int num_stages, int num_devices, int num_micro, bool split_backward,
                   std::vector<std::vector<Op>> order, std::vector<int> placement)
    : name_(std::move(name)),
      num_stages_(num_stages),
      num_devices_(num_devices),
      num_micro_(num_micro),
      split_(split_backward),
      order_(std::move(order)),
      placement_(std::move(placement)) {
  WEFT_CHECK(num_stages_ >= 1 && num_devices_ >= 1 && num_micro_ >= 1,
             "Schedule: stages ({}), devices ({}) and micro-batches ({}) must be >= 1", num_stages_,
             num_devices_, num_micro_);
  WEFT_CHECK(num_stages_ % num_devices_ == 0, "Schedule: {} stages do not divide over {} devices",
             num_stages_, num_devices_);
  WEFT_CHECK(static_cast<long long>(num_stages_) * num_micro_ <= 100'000'000LL, "Schedule: too large ({}x{})",
             num_stages_, num_micro_);
  WEFT_CHECK(static_cast<int>(order_.size()) == num_devices_, "Schedule: {} device orders for {} devices",
             order_.size(), num_devices_);
  if (placement_.empty()) placement_ = loop_placement(num_stages_, num_devices_);
  WEFT_CHECK(static_cast<int>(placement_.size()) == num_stages_,
             "Schedule: a placement of {} stages for {} stages", placement_.size(), num_stages_);
  {
    // Every device holds S/D stages: the lowering, the memory model and virtual_stages() assume it.
    std::vector<int> held(static_cast<std::size_t>(num_devices_), 0);
    for (int s = 0; s < num_stages_; ++s) {
      const int d = placement_[static_cast<std::size_t>(s)];
      WEFT_CHECK(d >= 0 && d < num_devices_,
                 "Schedule: the placement puts stage {} on device {} ({} devices)", s, d, num_devices_);
      ++held[static_cast<std::size_t>(d)];
    }
    for (int d = 0; d < num_devices_; ++d)
      WEFT_CHECK(held[static_cast<std::size_t>(d)] == num_stages_ / num_devices_,
                 "Schedule: the placement puts {} stages on device {}; every device must hold {}",
                 held[static_cast<std::size_t>(d)], d, num_stages_ / num_devices_);
  }
  std::vector<std::uint8_t> seen(
      static_cast<std::size_t>(num_stages_) * static_cast<std::size_t>(num_micro_) * 3, 0);
  for (int d = 0; d < num_devices_; ++d) {
    for (const Op& op : order_[static_cast<std::size_t>(d)]) {
      WEFT_CHECK(op.stage >= 0 && op.stage < num_stages_ && op.micro >= 0 && op.micro < num_micro_,
                 "Schedule: {} on device {} is out of range ({} stages, {} micro-batches)",
                 weft::schedule::to_string(op), d, num_stages_, num_micro_);
      WEFT_CHECK(device_of(op.stage) == d, "Schedule: {} is on device {} but stage {} lives on device {}",
                 weft::schedule::to_string(op), d, op.stage, device_of(op.stage));
      WEFT_CHECK(split_ || op.kind != OpKind::W, "Schedule: {} in a schedule without split backward",
                 weft::schedule::to_string(op));
      auto& c = seen[op_index(op, num_micro_)];
      WEFT_CHECK(c == 0, "Schedule: {} appears twice", weft::schedule::to_string(op));
      c = 1;
    }
  }
  for (int s = 0; s < num_stages_; ++s)
    for (int m = 0; m < num_micro_; ++m)
      for (OpKind k : {OpKind::F, OpKind::B, OpKind::W}) {
        if (k == OpKind::W && !split_) continue;
        Op op{k, s, m};
        WEFT_CHECK(seen[op_index(op, num_micro_)], "Schedule: {} is missing", weft::schedule::to_string(op));
      }
}

std::vector<int> loop_placement(int S, int D) {
  WEFT_CHECK(S >= 1 && D >= 1, "loop_placement: need S >= 1 and D >= 1, got S={} D={}", S, D);
  std::vector<int> p(static_cast<std::size_t>(S));
  for (int s = 0; s < S; ++s) p[static_cast<std::size_t>(s)] = s % D;
  return p;
}

std::vector<int> v_placement(int D) {
  WEFT_CHECK(D >= 1, "v_placement: need D >= 1, got {}", D);
  std::vector<int> p(static_cast<std::size_t>(2 * D));
  for (int s = 0; s < 2 * D; ++s) p[static_cast<std::size_t>(s)] = s < D ? s : 2 * D - 1 - s;
  return p;
}

bool Schedule::default_placement() const {
  for (int s = 0; s < num_stages_; ++s)
    if (placement_[static_cast<std::size_t>(s)] != s % num_devices_) return false;
  return true;
}

int Schedule::chunk_of(int stage) const {
  const int d = device_of(stage);
  int c = 0;
  for (int s = 0; s < stage; ++s) c += placement_[static_cast<std::size_t>(s)] == d ? 1 : 0;
  return c;
}

std::size_t Schedule::num_ops() const {
  std::size_t n = 0;
  for (const auto& o : order_) n += o.size();
  return n;
}

std::vector<int> Schedule::peak_in_flight() const {
  std::vector<int> cur(static_cast<std::size_t>(num_stages_), 0), peak(cur);
  const OpKind last = split_ ? OpKind::W : OpKind::B;
  for (const auto& ord : order_)
    for (const Op& op : ord) {
      auto s = static_cast<std::size_t>(op.stage);
      if (op.kind == OpKind::F) peak[s] = std::max(peak[s], ++cur[s]);
      if (op.kind == last) --cur[s];
    }
  return peak;
}

std::vector<int> Schedule::peak_in_flight_device() const {
  std::vector<int> peak(static_cast<std::size_t>(num_devices_), 0);
  const OpKind last = split_ ? OpKind::W : OpKind::B;
  for (int d = 0; d < num_devices_; ++d) {
    int cur = 0;
    for (const Op& op : order_[static_cast<std::size_t>(d)]) {
      if (op.kind == OpKind::F)
        peak[static_cast<std::size_t>(d)] = std::max(peak[static_cast<std::size_t>(d)], ++cur);
      if (op.kind == last) --cur;
    }
  }
  return peak;
}

std::string Schedule::to_string() const {
  return fmt::format("Schedule({}, S={}, D={}, M={}{}, {} ops)", name_, num_stages_, num_devices_, num_micro_,
                     split_ ? ", split B/W" : "", num_ops());
}

std::string Schedule::to_text() const {
  std::string out;
  std::vector<int> chunk(static_cast<std::size_t>(num_stages_));  // chunk_of, once per stage
  for (int s = 0; s < num_stages_; ++s) chunk[static_cast<std::size_t>(s)] = chunk_of(s);
  for (int d = 0; d < num_devices_; ++d) {
    out += fmt::format("d{}:", d);
    for (const Op& op : order_[static_cast<std::size_t>(d)]) {
      if (virtual_stages() > 1)
        out += fmt::format(" {}{}.{}", op_kind_name(op.kind), op.micro,
                           chunk[static_cast<std::size_t>(op.stage)]);
      else
        out += fmt::format(" {}{}", op_kind_name(op.kind), op.micro);
    }
    out += "\n";
  }
  return out;
}

std::string Schedule::to_json() const {
  nlohmann::json j;
  j["name"] = name_;
  j["num_stages"] = num_stages_;
  j["num_devices"] = num_devices_;
  j["num_micro"] = num_micro_;
  j["split_backward"] = split_;
  auto& ord = j["order"] = nlohmann::json::array();
  for (const auto& o : order_) {
    auto a = nlohmann::json::array();
    for (const Op& op : o) a.push_back(nlohmann::json::array({op_kind_name(op.kind), op.stage, op.micro}));
    ord.push_back(std::move(a));
  }
  // Only a placement other than s mod D is written: JSON of the other schedules is unchanged.
  if (!default_placement()) j["placement"] = placement_;
  return j.dump();
}

Schedule Schedule::from_json(const std::string& text) {
  constexpr JsonReader r("Schedule JSON");
  const auto j = r.parse(text);
  std::vector<std::vector<Op>> order;
  const auto& devices = r.array(r.at(j, "order", "$"), "$.order");
  for (std::size_t d = 0; d < devices.size(); ++d) {
    const std::string pd = JsonReader::index("$.order", d);
    auto& o = order.emplace_back();
    const auto& ops = r.array(devices[d], pd);
    for (std::size_t i = 0; i < ops.size(); ++i) {
      const std::string p = JsonReader::index(pd, i);
      const auto& e = r.array(ops[i], p);
      if (e.size() != 3) r.bad(p, "expected [kind, stage, micro-batch]");
      const auto k = r.get<std::string>(e[0], p + "[0]");
      if (k != "F" && k != "B" && k != "W")
        r.bad(p + "[0]", fmt::format("unknown op kind '{}' (F, B or W)", k));
      o.push_back(Op{k == "F" ? OpKind::F : (k == "B" ? OpKind::B : OpKind::W), r.get<int>(e[1], p + "[1]"),
                     r.get<int>(e[2], p + "[2]")});
    }
  }
  return Schedule(r.field<std::string>(j, "name", "$"), r.field<int>(j, "num_stages", "$"),
                  r.field<int>(j, "num_devices", "$"), r.field<int>(j, "num_micro", "$"),
                  r.field<bool>(j, "split_backward", "$"), std::move(order),
                  r.field_or<std::vector<int>>(j, "placement", "$", {}));
}

std::size_t Schedule::hash() const {
  std::size_t h = std::hash<std::string>{}(name_);
  auto mix = [&](std::size_t v) { h ^= v + 0x9E3779B97F4A7C15ULL + (h << 6) + (h >> 2); };
  mix(static_cast<std::size_t>(num_stages_));
  mix(static_cast<std::size_t>(num_devices_));
  mix(static_cast<std::size_t>(num_micro_));
  mix(split_);
  for (const auto& o : order_)
    for (const Op& op : o) mix(op_index(op, num_micro_));
  if (!default_placement())
    for (int d : placement_) mix(static_cast<std::size_t>(d));
  return h;
}

// ---------------------------------------------------------------- generators
namespace {
void check_sm(int S, int M, const char* what) {
  WEFT_CHECK(S >= 1 && M >= 1, "{}: need stages >= 1 and micro-batches >= 1, got S={} M={}", what, S, M);
  WEFT_CHECK(static_cast<long long>(S) * M <= 50'000'000LL, "{}: S·M = {} is too large", what,
             static_cast<long long>(S) * M);
}
// Micro-batches per interleaved round (torch's rule, shared by interleaved 1F1B and interleaved
// zero bubble): M div D rounds when that count divides M, else the largest smaller count that does.
int round_size(int D, int M) {
  int rounds = std::max(1, M / D);
  while (M % rounds != 0) --rounds;
  return M / rounds;
}
}  // namespace

Schedule gpipe(int S, int M) {
  check_sm(S, M, "gpipe");
  std::vector<std::vector<Op>> order(static_cast<std::size_t>(S));
  for (int s = 0; s < S; ++s) {
    auto& o = order[static_cast<std::size_t>(s)];
    for (int m = 0; m < M; ++m) o.push_back({OpKind::F, s, m});
    for (int m = 0; m < M; ++m) o.push_back({OpKind::B, s, m});
  }
  return Schedule("gpipe", S, S, M, false, std::move(order));
}

Schedule kfkb(int S, int M, int k) {
  check_sm(S, M, "kfkb");
  WEFT_CHECK(k >= 1, "kfkb: group size k must be >= 1, got {}", k);
  k = std::min(k, M);
  const int G = (M + k - 1) / k;
  std::vector<std::vector<Op>> order(static_cast<std::size_t>(S));
  for (int s = 0; s < S; ++s) {
    auto& o = order[static_cast<std::size_t>(s)];
    o.reserve(static_cast<std::size_t>(2 * M));
    auto group = [&](OpKind kind, int g) {
      for (int m = g * k; m < std::min(M, (g + 1) * k); ++m) o.push_back({kind, s, m});
    };
    const int w = std::min(S - s - 1, G);
    for (int g = 0; g < w; ++g) group(OpKind::F, g);
    for (int j = 0; j + w < G; ++j) {
      group(OpKind::F, w + j);
      group(OpKind::B, j);
    }
    for (int j = G - w; j < G; ++j) group(OpKind::B, j);
  }
  return Schedule(k == 1 ? "1f1b" : fmt::format("kfkb(k={})", k), S, S, M, false, std::move(order));
}

Schedule one_f_one_b(int S, int M) { return kfkb(S, M, 1); }

Schedule eager_1f1b(int S, int M) {
  check_sm(S, M, "eager_1f1b");
  std::vector<std::vector<Op>> order(static_cast<std::size_t>(S));
  for (int s = 0; s < S; ++s) {
    auto& o = order[static_cast<std::size_t>(s)];
    const int w = std::min(M, 2 * (S - s) - 1);
    for (int m = 0; m < w; ++m) o.push_back({OpKind::F, s, m});
    for (int j = 0; j < M; ++j) {
      o.push_back({OpKind::B, s, j});
      if (w + j < M) o.push_back({OpKind::F, s, w + j});
    }
  }
  return Schedule("eager_1f1b", S, S, M, false, std::move(order));
}

namespace {
// Interleaved 1F1B's per-device orders for any M >= 1 (torch's rule gives one round of M when
// M < D; interleaved_1f1b itself keeps Megatron's M >= D, kFkB × interleaving uses every M).
std::vector<std::vector<Op>> interleaved_orders(int D, int v, int M) {
  // Micro-batches go in rounds of R (Megatron: R = D; torch's rule for any M >= D: M / R rounds,
  // as many as fit, R = M / rounds; when no round count <= M / D divides M, fewer, larger rounds).
  // A device runs chunk 0 of a round's micro-batches, then chunk 1, ...; backwards follow the
  // same rounds with the chunks reversed; warm-up (v − 1)·R + 2·(D − 1 − d) forwards.
  const int R = round_size(D, M);
  const int total = M * v;
  std::vector<std::vector<Op>> order(static_cast<std::size_t>(D));
  for (int d = 0; d < D; ++d) {
    auto& o = order[static_cast<std::size_t>(d)];
    auto op = [&](OpKind kind, int k) {
      int chunk = (k / R) % v;
      if (kind == OpKind::B) chunk = v - 1 - chunk;
      const int micro = (k / (R * v)) * R + k % R;
      o.push_back({kind, chunk * D + d, micro});
    };
    const int warm = std::min(total, 2 * (D - d - 1) + (v - 1) * R);
    for (int k = 0; k < warm; ++k) op(OpKind::F, k);
    for (int j = 0; j + warm < total; ++j) {
      op(OpKind::F, warm + j);
      op(OpKind::B, j);
    }
    for (int j = total - warm; j < total; ++j) op(OpKind::B, j);
  }
  return order;
}
}  // namespace

Schedule interleaved_1f1b(int D, int v, int M) {
  check_sm(D, M, "interleaved_1f1b");
  WEFT_CHECK(v >= 1, "interleaved_1f1b: virtual stages v must be >= 1, got {}", v);
  WEFT_CHECK(M >= D || v == 1, "interleaved_1f1b: micro-batches ({}) must be at least the devices ({})", M,
             D);
  return Schedule(fmt::format("interleaved(v={})", v), D * v, D, M, false, interleaved_orders(D, v, M));
}

Schedule zb_h1(int S, int M) {
  check_sm(S, M, "zb_h1");
  std::vector<std::vector<Op>> order(static_cast<std::size_t>(S));
  for (int s = 0; s < S; ++s) {
    auto& o = order[static_cast<std::size_t>(s)];
    for (int x = 0; x <= M + S - 2; ++x) {
      if (x < M) o.push_back({OpKind::F, s, x});
      const int b = x - (S - 1 - s);
      if (b >= 0 && b < M) o.push_back({OpKind::B, s, b});
      const int w = x - (S - 1);
      if (w >= 0 && w < M) o.push_back({OpKind::W, s, w});
    }
  }
  return Schedule("zb_h1", S, S, M, true, std::move(order));
}

Schedule zb_interleaved(int D, int v, int M) {
  check_sm(D, M, "zb_interleaved");
  WEFT_CHECK(v >= 1, "zb_interleaved: virtual stages v must be >= 1, got {}", v);
  // Interleaved 1F1B's rounds and chunk order, with the backward split: the warm-up is one
  // forward per hop shorter than interleaved 1F1B's (v−1)R + 2(D−1−d), because B alone (without
  // W) comes back twice as fast; device d defers each W by d backwards, so W fills the slots
  // where device d would otherwise wait for the next gradient (the ZB-H1 rule, per device).
  const int R = round_size(D, M);
  const int total = M * v;
  std::vector<std::vector<Op>> order(static_cast<std::size_t>(D));
  for (int d = 0; d < D; ++d) {
    auto& o = order[static_cast<std::size_t>(d)];
    o.reserve(static_cast<std::size_t>(3 * total));
    std::vector<int> fwd(static_cast<std::size_t>(v), 0), bwd(fwd);
    std::vector<Op> backs;  // the B ops in order: the W's follow them
    auto F = [&](int k) {
      const int c = (k / R) % v;
      o.push_back({OpKind::F, c * D + d, fwd[static_cast<std::size_t>(c)]++});
    };
    auto B = [&](int j) {
      const int c = v - 1 - (j / R) % v;
      backs.push_back({OpKind::B, c * D + d, bwd[static_cast<std::size_t>(c)]++});
      o.push_back(backs.back());
    };
    auto W = [&](int j) { o.push_back({OpKind::W, backs[static_cast<std::size_t>(j)].stage,
                                      backs[static_cast<std::size_t>(j)].micro}); };
    const int warm = std::min(total, (v - 1) * R + D - 1 - d);
    for (int k = 0; k < warm; ++k) F(k);
    for (int j = 0; j < total; ++j) {
      if (warm + j < total) F(warm + j);
      B(j);
      if (j >= d) W(j - d);
    }
    for (int j = std::max(0, total - d); j < total; ++j) W(j);
  }
  return Schedule(v == 1 ? std::string("zb_h1") : fmt::format("zb_interleaved(v={})", v), D * v, D, M, true,
                  std::move(order));
}

Schedule zbv(int D, int M) {
  check_sm(D, M, "zbv");
  // Torch's construction (the paper's Fig. 8 for T_F = T_B = T_W): the first chunk (stage d) and
  // the second (stage 2D−1−d) alternate so that the device that holds both ends of the V (device
  // 0: stages 0 and 2D−1) never waits, and B, W of a chunk run together in the steady state.
  // Below 2D−1 micro-batches the order for 2D−1 is kept with the missing micro-batches' ops left
  // out (the steady state needs that many in flight).
  const int S = 2 * D;
  const int n = std::max(2 * D - 1, M);
  std::vector<std::vector<Op>> order(static_cast<std::size_t>(D));
  for (int d = 0; d < D; ++d) {
    auto& o = order[static_cast<std::size_t>(d)];
    o.reserve(static_cast<std::size_t>(6 * M));
    const int c0 = d, c1 = S - 1 - d;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    auto emit = [&](OpKind k, int stage, int m) {
      if (m < M) o.push_back({k, stage, m});
    };
    for (int i = 0; i < 2 * (D - d) - 1; ++i) emit(OpKind::F, c0, f0++);
    for (int i = 0; i < d; ++i) {
      emit(OpKind::F, c1, f1++);
      emit(OpKind::F, c0, f0++);
    }
    for (int i = 0; i < D - d; ++i) {
      emit(OpKind::F, c1, f1);
      emit(OpKind::B, c1, b1);
      emit(OpKind::W, c1, b1);
      ++f1, ++b1;
    }
    while (f1 < f0 || f0 < n) {
      if (f0 < n) emit(OpKind::F, c0, f0++);
      emit(OpKind::B, c0, b0);
      emit(OpKind::W, c0, b0);
      ++b0;
      emit(OpKind::F, c1, f1);
      emit(OpKind::B, c1, b1);
      emit(OpKind::W, c1, b1);
      ++f1, ++b1;
    }
    int w0 = b0, w1 = b1;
    for (int i = 0; i < d; ++i) {
      emit(OpKind::B, c0, b0++);
      emit(OpKind::B, c1, b1++);
    }
    for (int i = 0; i < D - d; ++i) {
      emit(OpKind::B, c0, b0++);
      emit(OpKind::W, c0, w0++);
    }
    while (w1 < b1) emit(OpKind::W, c1, w1++);
    while (w0 < b0) emit(OpKind::W, c0, w0++);
    WEFT_ASSERT(f0 == n && f1 == n && b0 == n && b1 == n && w0 == n && w1 == n,
                fmt::format("zbv: device {} ran {}/{} F, {}/{} B, {}/{} W of {} micro-batches", d, f0,
                            f1, b0, b1, w0, w1, n));
  }
  return Schedule("zbv", S, D, M, true, std::move(order), v_placement(D));
}

Schedule dualpipev(int D, int M) {
  check_sm(D, M, "dualpipev");
  // torch's ScheduleDualPipeV step by step (the header lists the steps). Its counters become
  // f/b per chunk; its FULL_BACKWARD becomes B then W at once (whole()); its BACKWARD_INPUT a B
  // whose W joins the device's FIFO queue (plain()), popped by queued_w(); an OVERLAP_F_B pair
  // becomes its forward then its whole backward. Step 4 runs n − 2D + d + 1 times, at least once
  // only when n >= 2D, hence the order for n = max(M, 2D) with the ops of micro-batches >= M
  // left out (dropping a micro-batch's ops from every device keeps the order acyclic and every
  // FIFO channel's two ends equal; checked over a grid in the tests).
  const int S = 2 * D;
  const int n = std::max(M, 2 * D);
  std::vector<std::vector<Op>> order(static_cast<std::size_t>(D));
  for (int d = 0; d < D; ++d) {
    auto& o = order[static_cast<std::size_t>(d)];
    o.reserve(static_cast<std::size_t>(6 * M));
    const int c0 = d, c1 = S - 1 - d;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    std::vector<Op> queue;  // W's of plain B's, oldest first
    std::size_t popped = 0;
    auto emit = [&](OpKind k, int stage, int m) {
      if (m < M) o.push_back({k, stage, m});
    };
    auto fwd = [&](int c) {
      int& f = c == c0 ? f0 : f1;
      emit(OpKind::F, c, f++);
    };
    auto whole = [&](int c) {
      int& b = c == c0 ? b0 : b1;
      emit(OpKind::B, c, b);
      emit(OpKind::W, c, b++);
    };
    auto plain = [&](int c) {
      int& b = c == c0 ? b0 : b1;
      emit(OpKind::B, c, b);
      queue.push_back({OpKind::W, c, b++});
    };
    auto queued_w = [&]() {
      if (popped < queue.size()) {
        const Op w = queue[popped++];
        emit(OpKind::W, w.stage, w.micro);
      }
    };
    for (int i = 0; i < 2 * (D - 1 - d); ++i) fwd(c0);  // 1
    for (int i = 0; i < d + 1; ++i) fwd(c0), fwd(c1);   // 2
    for (int i = 0; i < D - 1 - d; ++i) {               // 3
      plain(c1);
      queued_w();
      fwd(c1);
    }
    for (int i = 0; i < n - S + d + 1; ++i) {  // 4
      fwd(c0), whole(c1);
      fwd(c1), whole(c0);
    }
    for (int i = 0; i < D - 1 - d; ++i) {  // 5
      whole(c1);
      fwd(c1), whole(c0);
    }
    const int h = (d + 1) / 2;  // 6: the second half of the pairs split their backward (zero bubble)
    for (int i = 0; i < d + 1; ++i) {
      if (i > h || (i == h && d % 2 == 1))
        plain(c1);
      else
        whole(c1);
      if (i >= h)
        plain(c0);
      else
        whole(c0);
    }
    for (int i = 0; i < D - 1 - d; ++i) {  // 7
      queued_w();
      plain(c0);
    }
    for (int i = 0; i < d + 1; ++i) queued_w();  // 8
    WEFT_ASSERT(
        f0 == n && f1 == n && b0 == n && b1 == n && popped == queue.size(),
        fmt::format("dualpipev: device {} ran {}/{} F, {}/{} B and {} of {} queued W of {} micro-batches", d,
                    f0, f1, b0, b1, popped, queue.size(), n));
  }
  return Schedule("dualpipev", S, D, M, true, std::move(order), v_placement(D));
}

Schedule kfkb_interleaved(int D, int v, int M, int k) {
  check_sm(D, M, "kfkb_interleaved");
  WEFT_CHECK(k >= 1, "kfkb_interleaved: group size k must be >= 1, got {}", k);
  WEFT_CHECK(v >= 1, "kfkb_interleaved: virtual stages v must be >= 1, got {}", v);
  if (v == 1) return kfkb(D, M, k);  // Megatron runs v = 1 as the plain (non-interleaved) order
  k = std::min(k, M);
  const int G = (M + k - 1) / k;
  // The interleaved order over the G groups (one round of G when G < D, as torch's rule), each
  // group op expanded into its micro-batches: every dependency and every FIFO message sequence of
  // the group order carries over (a group's ops sit together, micro-batches ascending on both
  // ends of a channel), so it passes the checks iff the group order does (tested for every G).
  const auto groups = interleaved_orders(D, v, G);
  std::vector<std::vector<Op>> order(static_cast<std::size_t>(D));
  for (int d = 0; d < D; ++d)
    for (const Op& op : groups[static_cast<std::size_t>(d)])
      for (int m = op.micro * k; m < std::min(M, (op.micro + 1) * k); ++m)
        order[static_cast<std::size_t>(d)].push_back({op.kind, op.stage, m});
  std::string name =
      k == 1 ? fmt::format("interleaved(v={})", v) : fmt::format("kfkb_interleaved(k={},v={})", k, v);
  return Schedule(std::move(name), D * v, D, M, false, std::move(order));
}

Schedule make_schedule(const std::string& kind, int S, int M, int k, int v) {
  if (kind == "gpipe") return gpipe(S, M);
  if (kind == "1f1b") return one_f_one_b(S, M);
  if (kind == "kfkb") return kfkb(S, M, k);
  if (kind == "eager_1f1b" || kind == "eager") return eager_1f1b(S, M);
  if (kind == "interleaved") return interleaved_1f1b(S, v, M);
  if (kind == "zb_h1" || kind == "zbh1") return zb_h1(S, M);
  if (kind == "zb_interleaved") return zb_interleaved(S, v, M);
  if (kind == "zbv") {
    WEFT_CHECK(v == 1 || v == 2, "zbv: two stages per device in the V shape (v = 2), got v = {}", v);
    return zbv(S, M);
  }
  if (kind == "dualpipev") {
    WEFT_CHECK(v == 1 || v == 2, "dualpipev: two stages per device in the V shape (v = 2), got v = {}", v);
    return dualpipev(S, M);
  }
  if (kind == "kfkb_interleaved") return kfkb_interleaved(S, v, M, k);
  fail(
      "unknown schedule kind '{}' (expected gpipe, 1f1b, kfkb, eager_1f1b, interleaved, zb_h1, "
      "zb_interleaved, zbv, dualpipev, kfkb_interleaved)",
      kind);
}

bool v_shaped(const std::string& kind) { return kind == "zbv" || kind == "dualpipev"; }

bool splits_backward(const std::string& kind) {
  return kind == "zb_h1" || kind == "zbh1" || kind == "zb_interleaved" || v_shaped(kind);
}

// ---------------------------------------------------------------- checks
std::string OrderCheck::to_string() const {
  if (ok) return "OrderCheck(ok)";
  std::string s = fmt::format("OrderCheck({} problem(s):", problems.size());
  for (const auto& p : problems) s += " " + p + ";";
  return s + ")";
}

OrderCheck check_dependencies(const Schedule& sch) {
  OrderCheck res;
  const int S = sch.num_stages(), M = sch.num_micro(), D = sch.num_devices();
  const bool split = sch.split_backward();
  const std::size_t n = static_cast<std::size_t>(S) * static_cast<std::size_t>(M) * 3;
  // Kahn's algorithm over op ids; pos[id] = (device, position) to find the next op of a device.
  std::vector<int> indeg(n, 0);
  std::vector<std::size_t> pos(n, 0);
  for (int d = 0; d < D; ++d) {
    const auto& o = sch.device_order(d);
    for (std::size_t i = 0; i < o.size(); ++i) pos[op_index(o[i], M)] = i;
  }
  auto data_preds = [&](const Op& op, auto&& f) {
    if (op.kind == OpKind::F) {
      if (op.stage > 0) f(Op{OpKind::F, op.stage - 1, op.micro});
    } else if (op.kind == OpKind::B) {
      f(Op{OpKind::F, op.stage, op.micro});
      if (op.stage + 1 < S) f(Op{OpKind::B, op.stage + 1, op.micro});
    } else {
      f(Op{OpKind::B, op.stage, op.micro});
    }
  };
  // successors through data edges, computed on the fly
  auto data_succs = [&](const Op& op, auto&& f) {
    if (op.kind == OpKind::F) {
      if (op.stage + 1 < S) f(Op{OpKind::F, op.stage + 1, op.micro});
      f(Op{OpKind::B, op.stage, op.micro});
    } else if (op.kind == OpKind::B) {
      if (op.stage > 0) f(Op{OpKind::B, op.stage - 1, op.micro});
      if (split) f(Op{OpKind::W, op.stage, op.micro});
    }
  };
  std::vector<Op> ready;
  for (int d = 0; d < D; ++d) {
    const auto& o = sch.device_order(d);
    for (std::size_t i = 0; i < o.size(); ++i) {
      int c = i > 0 ? 1 : 0;
      data_preds(o[i], [&](const Op&) { ++c; });
      indeg[op_index(o[i], M)] = c;
      if (c == 0) ready.push_back(o[i]);
    }
  }
  std::size_t done = 0;
  auto release = [&](const Op& op) {
    if (--indeg[op_index(op, M)] == 0) ready.push_back(op);
  };
  while (!ready.empty()) {
    Op op = ready.back();
    ready.pop_back();
    ++done;
    const auto& o = sch.device_order(sch.device_of(op.stage));
    const std::size_t p = pos[op_index(op, M)];
    if (p + 1 < o.size()) release(o[p + 1]);
    data_succs(op, release);
  }
  if (done != sch.num_ops()) {
    res.ok = false;
    std::string msg =
        fmt::format("deadlock: {} of {} ops can never run;", sch.num_ops() - done, sch.num_ops());
    for (int d = 0; d < D; ++d) {
      for (const Op& op : sch.device_order(d)) {
        if (indeg[op_index(op, M)] == 0) continue;
        std::string waits;
        data_preds(op, [&](const Op& p) {
          if (indeg[op_index(p, M)] != 0) waits += " " + to_string(p);
        });
        msg += fmt::format(" device {} blocked at {}{}{};", d, to_string(op),
                           waits.empty() ? "" : " waiting for", waits);
        break;
      }
    }
    res.problems.push_back(msg);
  }
  return res;
}

OrderCheck check_pairing(const Schedule& sch) {
  OrderCheck res;
  const int S = sch.num_stages(), D = sch.num_devices();
  // Pairing: channel (src, dst, kind 0 = activation, 1 = gradient) → message (sender stage, micro).
  std::map<std::tuple<int, int, int>, std::vector<std::pair<int, int>>> sent, posted;
  for (int d = 0; d < D; ++d) {
    for (const Op& op : sch.device_order(d)) {
      if (op.kind == OpKind::F) {
        if (op.stage + 1 < S && sch.device_of(op.stage + 1) != d)
          sent[{d, sch.device_of(op.stage + 1), 0}].push_back({op.stage, op.micro});
        if (op.stage > 0 && sch.device_of(op.stage - 1) != d)
          posted[{sch.device_of(op.stage - 1), d, 0}].push_back({op.stage - 1, op.micro});
      } else if (op.kind == OpKind::B) {
        if (op.stage > 0 && sch.device_of(op.stage - 1) != d)
          sent[{d, sch.device_of(op.stage - 1), 1}].push_back({op.stage, op.micro});
        if (op.stage + 1 < S && sch.device_of(op.stage + 1) != d)
          posted[{sch.device_of(op.stage + 1), d, 1}].push_back({op.stage + 1, op.micro});
      }
    }
  }
  for (const auto& [ch, msgs] : sent) {
    const auto& rec = posted[ch];
    for (std::size_t i = 0; i < msgs.size(); ++i) {
      if (i >= rec.size() || rec[i] != msgs[i]) {
        res.ok = false;
        res.problems.push_back(
            fmt::format("send/recv mismatch on {} channel device {} -> {}: message {} is sent as stage {} "
                        "micro {} but the "
                        "receiver posts {}",
                        std::get<2>(ch) == 0 ? "activation" : "gradient", std::get<0>(ch), std::get<1>(ch), i,
                        msgs[i].first, msgs[i].second,
                        i < rec.size() ? fmt::format("stage {} micro {}", rec[i].first, rec[i].second)
                                       : std::string("nothing")));
        break;
      }
    }
  }
  return res;
}

OrderCheck check_order(const Schedule& sch) {
  OrderCheck res = check_dependencies(sch);
  OrderCheck p = check_pairing(sch);
  if (!p.ok) {
    res.ok = false;
    res.problems.insert(res.problems.end(), p.problems.begin(), p.problems.end());
  }
  return res;
}

}  // namespace weft::schedule
