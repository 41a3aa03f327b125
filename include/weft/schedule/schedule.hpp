#pragma once
// Pipeline schedules as a static per-device order of compute ops over the pipeline task graph.
//
// A pipeline has S logical stages (S = D·v: D devices, v virtual stages per device) and M
// micro-batches. The schedule carries its stage→device placement: by default logical stage s lives
// on device s mod D (v = 1: stage s on device s; interleaved: chunk c of device d is stage c·D+d);
// ZB-V's V shape puts stages d and 2D−1−d on device d. Per stage s
// and micro-batch m the task graph holds F(s,m); B(s,m) (the whole backward, or only the input
// gradient when the backward is split) and W(s,m) (weight gradient, split schedules only); the
// activation send/recv s→s+1 after F and the gradient send/recv s+1→s after B; and per stage one
// optimizer step after its last backward (Rhino's CG = B/W, LA = the local accumulate fused into
// B/W, AG = the optimizer step). A Schedule fixes the order of the compute ops on each device;
// sends follow their producer's order and receives are posted ahead in the consumer's order.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace weft::schedule {

enum class OpKind : std::uint8_t { F, B, W };
const char* op_kind_name(OpKind k);

struct Op {
  OpKind kind = OpKind::F;
  std::int32_t stage = 0;  // logical stage
  std::int32_t micro = 0;
  bool operator==(const Op&) const = default;
};
std::string to_string(const Op& op);  // "F(s1,m3)"

class Schedule {
 public:
  // Validates shapes and completeness: every (stage, micro) has exactly one F and one B (and one
  // W iff split_backward) on the device of that stage, and nothing else. `placement[s]` is the
  // device of logical stage s; empty means the default s mod D. Every device must hold S/D stages.
  Schedule(std::string name, int num_stages, int num_devices, int num_micro, bool split_backward,
           std::vector<std::vector<Op>> order, std::vector<int> placement = {});

  const std::string& name() const { return name_; }
  int num_stages() const { return num_stages_; }
  int num_devices() const { return num_devices_; }
  int num_micro() const { return num_micro_; }
  int virtual_stages() const { return num_stages_ / num_devices_; }
  bool split_backward() const { return split_; }
  int device_of(int stage) const { return placement_.at(static_cast<std::size_t>(stage)); }
  // The stage→device placement (always S entries) and whether it is the default s mod D.
  const std::vector<int>& placement() const { return placement_; }
  bool default_placement() const;
  // The chunk (0 .. v−1) of a stage on its device: its rank among the device's stages in stage
  // order (s div D under the default placement; 0 or 1 under the V shape).
  int chunk_of(int stage) const;
  const std::vector<std::vector<Op>>& order() const { return order_; }
  const std::vector<Op>& device_order(int d) const { return order_.at(static_cast<std::size_t>(d)); }
  std::size_t num_ops() const;

  // In-flight activations of stage s: micro-batches whose F has run and whose last backward op
  // (B, or W when split) has not. Its maximum over the device's order (independent of timing,
  // since a device runs its ops one at a time).
  std::vector<int> peak_in_flight() const;         // per logical stage
  std::vector<int> peak_in_flight_device() const;  // per device, all its stages together

  std::string to_string() const;  // one line
  std::string to_text() const;    // one line per device: "d0: F0 F1 B0 ..."
  std::string to_json() const;
  static Schedule from_json(const std::string& text);
  bool operator==(const Schedule&) const = default;
  std::size_t hash() const;

 private:
  std::string name_;
  int num_stages_, num_devices_, num_micro_;
  bool split_;
  std::vector<std::vector<Op>> order_;
  std::vector<int> placement_;  // per logical stage, its device
};

// The default placement (stage s on device s mod D) and the V shape of ZB-V (stages d and 2D−1−d
// on device d; S = 2D).
std::vector<int> loop_placement(int S, int D);
std::vector<int> v_placement(int D);

// ---- generators (S stages on S devices unless said otherwise; M micro-batches) ----
Schedule gpipe(int S, int M);
Schedule one_f_one_b(int S, int M);
// kFkB (Ada-Grouper): groups of k consecutive micro-batches (the last group holds M mod k when k
// does not divide M); per stage s with G = ceil(M/k) groups and w = min(S−s−1, G): F of groups
// 0..w−1, then (F of group w+i, B of group i) while groups remain, then the remaining B groups.
// k = 1 is exactly one_f_one_b, k >= M exactly gpipe.
Schedule kfkb(int S, int M, int k);
// Eager-1F1B (cross-mesh resharding paper): stage i runs min(M, 2(S−i)−1) forwards before its
// first backward, then alternates one backward and one forward, then the remaining backwards.
Schedule eager_1f1b(int S, int M);
// Megatron interleaved 1F1B: D devices, v virtual stages per device (S = D·v logical stages,
// stage c·D+d on device d). Needs M >= D when v > 1 (rounds as torch, see schedule.md).
Schedule interleaved_1f1b(int D, int v, int M);
// Zero-bubble ZB-H1 (Qi et al.): B split into B (input grad) and W (weight grad). Stage i walks
// x = 0 .. M+S−2 and emits F(x), B(x−(S−1−i)), W(x−(S−1)) when those indices lie in [0, M).
Schedule zb_h1(int S, int M);
// Interleaved zero bubble (Qi et al.'s ZB schedule on Megatron's interleaved placement, torch's
// ScheduleInterleavedZeroBubble): D devices, v chunks (stage c·D+d on device d), B split into B
// and W. Micro-batches in interleaved rounds of R (as interleaved_1f1b); device d warms up with
// min(Mv, (v−1)R + D−1−d) forwards, then runs (F, B) pairs, the j-th B followed by the W of the
// (j−d)-th B, then the remaining B and W. v = 1 is exactly zb_h1. Any M >= 1 (one round of M
// when M < D, as torch).
Schedule zb_interleaved(int D, int v, int M);
// ZB-V (Qi et al. §6, torch's ScheduleZBVZeroBubble): 2D stages in the V placement (device d holds
// stages d and 2D−1−d), B split into B and W. Device d: 2(D−d)−1 forwards of its first chunk;
// d times (F second chunk, F first chunk); D−d times (F, B, W of the second chunk); steady
// (F, B, W first chunk; F, B, W second chunk); cool-down d times (B first, B second), D−d times
// (B, W first chunk), then the remaining W. For M < 2D−1 the same order for 2D−1 micro-batches
// with the ops of the missing ones left out.
Schedule zbv(int D, int M);
// DualPipeV (DeepSeek's DualPipe folded into a V, torch's ScheduleDualPipeV): 2D stages in the V
// placement, split backward. Device d has chunks c0 = d and c1 = 2D−1−d; B̄ below is a whole
// backward, written as B then W of the same (stage, micro) at once; a plain B defers its W to a
// per-device FIFO queue. With n = max(M, 2D) micro-batches, device d runs:
//   1. 2(D−1−d) times F c0;
//   2. d+1 times (F c0, F c1);
//   3. D−1−d times (B c1 then its W at once, F c1);
//   4. n−2D+d+1 times the two overlapped pairs (F c0, B̄ c1), (F c1, B̄ c0);
//   5. D−1−d times B̄ c1, then the overlapped pair (F c1, B̄ c0);
//   6. d+1 times (B c1, B c0): whole backwards (B̄) before pair h = ⌊(d+1)/2⌋, plain B (W
//      queued) after it; in pair h itself c1 is whole iff d is even, c0 plain;
//   7. D−1−d times (W of the oldest queued B, B c0);
//   8. the d+1 queued W's, oldest first.
// torch runs an overlapped pair as one OVERLAP_F_B action (its forward and backward may overlap
// each other's communication); in weft's one-op-at-a-time order a pair is F then B, W of the
// other chunk (torch's device D−1 runs its first pair of step 4 apart: the same ops). Below 2D
// micro-batches (torch refuses them) the order for 2D is kept with the missing ones' ops left
// out, as zbv does.
Schedule dualpipev(int D, int M);
// kFkB × interleaving: interleaved 1F1B over G = ceil(M/k) groups of k consecutive micro-batches
// (the last holds M mod k when k ∤ M), each op of the group order run for the group's micro-batches
// in turn. k = 1 is interleaved_1f1b (for M >= D); v = 1 is kfkb. Any G >= 1 (one round of G
// groups when G < D, as torch's rounds).
Schedule kfkb_interleaved(int D, int v, int M, int k);
// By name: "gpipe", "1f1b", "kfkb" (k), "eager_1f1b", "interleaved" (v; S devices, S·v logical
// stages), "zb_h1", "zb_interleaved" (v), "zbv" and "dualpipev" (2S logical stages, v must be 1 or
// 2), "kfkb_interleaved" (k, v). S is the number of devices.
Schedule make_schedule(const std::string& kind, int S, int M, int k = 1, int v = 1);
// Properties of a kind by name, for the planner and the lowering: two stages per device in the V
// placement (zbv, dualpipev), and the backward split into B and W (zb_h1, zb_interleaved, zbv,
// dualpipev).
bool v_shaped(const std::string& kind);
bool splits_backward(const std::string& kind);

// ---- static checks ----
struct OrderCheck {
  bool ok = true;
  std::vector<std::string> problems;  // empty when ok
  std::string to_string() const;
};
// Dependency check (the per-device orders plus the data edges F(s−1,m)→F(s,m), F(s,m)→B(s,m),
// B(s+1,m)→B(s,m), B(s,m)→W(s,m) must be acyclic, i.e. the order can make progress) and send/recv
// pairing check (for each directed device pair the messages in the sender's order equal the
// messages in the receiver's posting order, as FIFO p2p channels such as NCCL's require).
OrderCheck check_order(const Schedule& s);
OrderCheck check_dependencies(const Schedule& s);  // the cycle part alone
OrderCheck check_pairing(const Schedule& s);       // the send/recv part alone

}  // namespace weft::schedule
