// Gradient buckets (lower.md step 5): the replicas' gradient all-reduces grouped in buckets, each
// issued right after its last gradient is final, before any update; ZeRO's reduce-scatters and
// gathers in buckets too.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <map>
#include <set>

#include "weft/cluster/cluster.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/lower/lower.hpp"
#include "weft/models/models.hpp"
#include "weft/plan/planner.hpp"

using namespace weft;
using lower::InstrKind;

namespace {

lower::Program two_replicas(double bucket_bytes) {
  models::GptConfig c;
  c.layers = 2, c.hidden = 16, c.heads = 2, c.seq = 4, c.vocab = 32, c.batch = 4;
  const auto g = ir::build_training_graph(models::gpt(c));
  lower::SpmdLayout l;
  for (const auto& op : g.ops()) {
    auto st = spmd::enumerate_strategies(g, op, {1});
    l.op_axes.push_back(st.front().axes);
  }
  lower::StageOptions o;
  o.replicas = 2;
  o.microbatches = 2;
  o.grad_bucket_bytes = bucket_bytes;
  return lower::lower_spmd(g, cluster::Cluster::preset("M8", 1), cluster::DeviceMesh::iota({2, 1}), l, o);
}

struct Buckets {
  std::map<int, std::vector<int>> members;  // bucket -> positions
  int first_update = -1;
  int syncs = 0;  // all-reduces on the replica axis
};

Buckets buckets_of(const lower::Program& p) {
  Buckets b;
  const auto& ins = p.ranks[0].instrs();
  for (int k = 0; k < static_cast<int>(ins.size()); ++k) {
    const auto& i = ins[static_cast<std::size_t>(k)];
    if (i.kind == InstrKind::AllReduce && i.axis == 0 && !i.internal) ++b.syncs;
    if (i.bucket >= 0) b.members[i.bucket].push_back(k);
    if (b.first_update < 0 && i.kind == InstrKind::Compute && p.graph.op(i.op).kind == ir::OpKind::AdamUpdate)
      b.first_update = k;
  }
  return b;
}

}  // namespace

TEST_CASE("lower: gradient buckets by size, adjacent, issued before the first update") {
  const auto none = two_replicas(0);
  lower::verify(none);
  CHECK(buckets_of(none).members.empty());
  const int params = static_cast<int>(none.parameters.size());
  for (double cap : {1.0, 4096.0, 1e12}) {
    CAPTURE(cap);
    const auto p = two_replicas(cap);
    lower::verify(p);
    const auto b = buckets_of(p);
    int bucketed = 0;
    for (const auto& [id, pos] : b.members) {
      bucketed += static_cast<int>(pos.size());
      for (std::size_t q = 1; q < pos.size(); ++q) CHECK(pos[q] == pos[q - 1] + 1);  // adjacent
      CHECK(pos.back() < b.first_update);  // in the backward, not the update phase
    }
    CHECK(bucketed == params);  // every parameter's gradient sync
    if (cap == 1.0) CHECK(static_cast<int>(b.members.size()) == params);
    if (cap == 1e12) CHECK(b.members.size() == 1);
    if (cap == 4096.0) CHECK((b.members.size() > 1 && static_cast<int>(b.members.size()) < params));
    CHECK(b.syncs == buckets_of(none).syncs);  // the same all-reduces, moved
  }
}

namespace {

// Per kind of replica collective: the buckets (id -> positions) and the ones left alone.
struct ZeroCollectives {
  std::map<InstrKind, std::map<int, std::vector<int>>> buckets;
  std::map<InstrKind, int> alone;
};

ZeroCollectives zero_collectives(const lower::Program& p) {
  ZeroCollectives z;
  const auto& ins = p.ranks[0].instrs();
  for (int k = 0; k < static_cast<int>(ins.size()); ++k) {
    const auto& i = ins[static_cast<std::size_t>(k)];
    if ((i.kind != InstrKind::ReduceScatter && i.kind != InstrKind::AllGather) || i.axis != 0) continue;
    if (i.bucket >= 0)
      z.buckets[i.kind][i.bucket].push_back(k);
    else
      ++z.alone[i.kind];
  }
  return z;
}

lower::Program zero_program(int zero, double bucket_bytes) {
  models::GptConfig c;
  c.layers = 2, c.hidden = 32, c.heads = 2, c.seq = 4, c.vocab = 32, c.batch = 8;
  const auto step = ir::build_training_graph(models::gpt(c));
  const auto cl = cluster::Cluster::preset("p3.8xlarge", 1);
  plan::PlanOptions po;
  po.num_microbatches = 2;
  po.zero = zero;
  po.num_blocks = 4;
  po.recompute = plan::Recompute::None;
  po.memory_fraction = 1.0;
  auto p = plan::megatron_plan(step, cl, {1, 1, 4}, po);
  p.grad_bucket_bytes = bucket_bytes;
  return lower::lower(p, step, cl);
}

}  // namespace

TEST_CASE("lower: ZeRO's reduce-scatters and gathers in buckets, the same collectives moved") {
  for (int zero : {1, 2, 3}) {
    CAPTURE(zero);
    const auto none = zero_program(zero, 0);
    const auto whole = zero_program(zero, 1e12);
    lower::verify(whole);
    auto a = zero_collectives(none), b = zero_collectives(whole);
    CHECK(a.buckets.empty());
    int moved_rs = 0, moved_ag = 0;
    for (const auto& [kind, runs] : b.buckets)
      for (const auto& [id, pos] : runs) {
        for (std::size_t q = 1; q < pos.size(); ++q) CHECK(pos[q] == pos[q - 1] + 1);  // adjacent
        (kind == InstrKind::ReduceScatter ? moved_rs : moved_ag) += static_cast<int>(pos.size());
      }
    // Every collective of the unbucketed program is still there, now in buckets.
    CHECK(moved_rs + b.alone[InstrKind::ReduceScatter] == a.alone[InstrKind::ReduceScatter]);
    CHECK(moved_ag + b.alone[InstrKind::AllGather] == a.alone[InstrKind::AllGather]);
    CHECK(b.alone[InstrKind::ReduceScatter] == 0);
    const auto nrs = b.buckets[InstrKind::ReduceScatter].size(), nag = b.buckets[InstrKind::AllGather].size();
    if (zero == 1) CHECK((nrs == 1 && nag == 1));  // once per step: the whole stage's in one bucket each
    if (zero == 2) CHECK((nrs == 2 && nag == 1));  // per micro-batch in its backward; the step's gathers
    // ZeRO-3: per unit (4 blocks), forward and backward of 2 micro-batches; fewer than the tensors.
    if (zero == 3)
      CHECK((nrs == 2 && nag >= 2 * 2 * 2 && static_cast<int>(nag) < a.alone[InstrKind::AllGather]));
    MESSAGE(fmt::format("ZeRO-{}: {} reduce-scatters in {} buckets, {} all-gathers in {} buckets", zero,
                        a.alone[InstrKind::ReduceScatter], nrs, a.alone[InstrKind::AllGather], nag));
  }
}
