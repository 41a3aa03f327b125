// ZeRO's collectives in buckets (issue 36), passes over a device group's finished instruction
// list run by lower_pipeline.cpp before the frees (buckets_and_frees.hpp): ZeRO-2/3's
// per-micro-batch gradient reduce-scatters grouped by bytes in the order the gradients are made,
// ZeRO-1/2's end-of-step all-gathers of the new parameters grouped by bytes in the order the
// updates make them, and ZeRO-3's parameter gathers grouped per FSDP unit with the next unit's
// gather issued before the current unit's compute. Every move is checked against the instructions
// it crosses (no read or write of what it writes, no write of what it reads), so the program's
// dataflow is the unbucketed one; a collective that cannot move stays where it was, alone.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>

#include "buckets_and_frees.hpp"

namespace weft::lower {

namespace {

// Per buffer, the positions that read or write it (ascending), so that whether a move crosses a
// dependent instruction costs a lookup per buffer of the moved one, not a scan of what it crosses.
class Accesses {
 public:
  explicit Accesses(const std::vector<Instr>& list) : list_(list), moved_(list.size(), 0) {
    for (int k = 0; k < static_cast<int>(list.size()); ++k) {
      for (int b : list[static_cast<std::size_t>(k)].in) at_[b].push_back({k, false});
      for (int b : list[static_cast<std::size_t>(k)].out) at_[b].push_back({k, true});
    }
  }
  // Whether the instructions at `moved` (positions; moved together, in their order) can all go
  // right after position `at` without crossing a dependent instruction that stays: none in
  // between writes what one of them reads or writes, or reads what it writes.
  bool can_move(const std::vector<int>& moved, int at) {
    for (int q : moved) moved_[static_cast<std::size_t>(q)] = 1;
    bool ok = true;
    for (std::size_t n = 0; ok && n < moved.size(); ++n) {
      const int q = moved[n];
      const int lo = std::min(q, at + 1), hi = std::max(q, at + 1);  // crossed: [lo, hi) less q
      const Instr& i = list_[static_cast<std::size_t>(q)];
      for (int b : i.out) ok = ok && !crossed(b, lo, hi, false);
      for (int b : i.in) ok = ok && !crossed(b, lo, hi, true);
    }
    for (int q : moved) moved_[static_cast<std::size_t>(q)] = 0;
    return ok;
  }

 private:
  bool crossed(int b, int lo, int hi, bool writes_only) const {
    auto it = at_.find(b);
    if (it == at_.end()) return false;
    const auto& v = it->second;
    for (auto p = std::lower_bound(v.begin(), v.end(), std::pair{lo, false}); p != v.end() && p->first < hi;
         ++p)
      if (!moved_[static_cast<std::size_t>(p->first)] && (p->second || !writes_only)) return true;
    return false;
  }
  const std::vector<Instr>& list_;
  std::vector<char> moved_;
  std::map<int, std::vector<std::pair<int, bool>>> at_;
};

double tile_bytes(int b, const std::vector<sharding::ShardingSpec>& specs,
                  const std::vector<Buffer>& buffers) {
  const auto& spec = specs[static_cast<std::size_t>(b)];
  const auto& buf = buffers[static_cast<std::size_t>(b)];
  double bytes = buf.element_bytes;
  for (std::size_t d = 0; d < buf.shape.size(); ++d) {
    const std::int64_t parts = spec.num_shards(static_cast<int>(d));
    bytes *= static_cast<double>((buf.shape[d] + parts - 1) / parts);
  }
  return bytes;
}

// The last position before `before` that writes buffer b (-1: none).
int last_write(const std::vector<Instr>& list, int b, int before) {
  for (int q = before - 1; q >= 0; --q)
    if (const auto& o = list[static_cast<std::size_t>(q)].out; std::find(o.begin(), o.end(), b) != o.end())
      return q;
  return -1;
}

bool replica_collective(const Instr& i, InstrKind kind) {
  return i.kind == kind && !i.internal && i.axis == 0 && i.group.empty() && i.bucket < 0;
}

// A chain of instructions (positions, in order) that moves as a whole right after the position
// where its input is ready; `bucketed` is the position of its collective.
struct Chain {
  std::vector<int> at;
  int collective = -1;
  int ready = -1;
  double bytes = 0;
  int run = -1;  // the run of one phase it is in (a bucket stays in one)
};

// Greedy buckets of chains in the order they are ready: a bucket closes once it holds `cap` bytes
// or when the next chain cannot join (another run of a phase — another micro-batch —, a dependency);
// each bucket's chains go right after its last chain's ready point, step by step (every chain's
// first instruction, then every chain's second, ...), the collectives marked with a fresh id.
void regroup(std::vector<Instr>& list, std::vector<Chain> chains, double cap, int& next_bucket) {
  if (chains.empty()) return;
  std::stable_sort(chains.begin(), chains.end(),
                   [](const Chain& a, const Chain& b) { return a.ready < b.ready; });
  const int n = static_cast<int>(list.size());
  Accesses acc(list);
  std::map<int, std::vector<Instr>> after;
  std::vector<char> moved(static_cast<std::size_t>(n), 0);
  for (std::size_t a = 0; a < chains.size();) {
    std::vector<int> pos = chains[a].at;
    double bytes = chains[a].bytes;
    std::set<int> reads, writes;  // by the bucket's chains
    auto note = [&](const Chain& c) {
      for (int q : c.at) {
        reads.insert(list[static_cast<std::size_t>(q)].in.begin(),
                     list[static_cast<std::size_t>(q)].in.end());
        writes.insert(list[static_cast<std::size_t>(q)].out.begin(),
                      list[static_cast<std::size_t>(q)].out.end());
      }
    };
    note(chains[a]);
    std::size_t b = a + 1;
    for (; b < chains.size() && bytes < cap; ++b) {
      std::vector<int> with = pos;
      with.insert(with.end(), chains[b].at.begin(), chains[b].at.end());
      std::sort(with.begin(), with.end());
      const Instr& first = list[static_cast<std::size_t>(chains[a].collective)];
      const Instr& next = list[static_cast<std::size_t>(chains[b].collective)];
      // (A chain that touches what the bucket's chains write — the same accumulator, another
      // micro-batch's — starts a new bucket: a bucket never waits for a later micro-batch.)
      bool apart = true;
      for (int x : chains[b].at) {
        for (int t : list[static_cast<std::size_t>(x)].out)
          apart = apart && !reads.count(t) && !writes.count(t);
        for (int t : list[static_cast<std::size_t>(x)].in) apart = apart && !writes.count(t);
      }
      if (!apart || chains[b].run != chains[a].run || next.kind != first.kind ||
          next.reduce != first.reduce || !acc.can_move(with, chains[b].ready))
        break;
      pos = std::move(with);
      bytes += chains[b].bytes;
      note(chains[b]);
    }
    const int at = chains[b - 1].ready;
    std::sort(pos.begin(), pos.end());
    if (b == a + 1 && !acc.can_move(pos, at)) {  // alone and unmovable: stays, unbucketed
      a = b;
      continue;
    }
    auto& out = after[at];
    std::size_t steps = 0;
    for (std::size_t q = a; q < b; ++q) steps = std::max(steps, chains[q].at.size());
    for (std::size_t k = 0; k < steps; ++k)
      for (std::size_t q = a; q < b; ++q) {
        if (k >= chains[q].at.size()) continue;
        const int p = chains[q].at[k];
        Instr i = list[static_cast<std::size_t>(p)];
        if (p == chains[q].collective) i.bucket = next_bucket;
        out.push_back(std::move(i));
        moved[static_cast<std::size_t>(p)] = 1;
      }
    ++next_bucket;
    a = b;
  }
  splice_moved(list, moved, after);
}

}  // namespace

// ZeRO-2/3: each micro-batch's gradient G is scaled into its share of the replicas' mean, reduce-
// scattered into the update's shard and copied / accumulated into the sharded accumulator, right
// after the op that makes G. Those three move, with their bucket's others, right after the op that
// makes the bucket's last gradient (so a bucket's whole gradients live until then: one bucket held).
void bucket_zero_reduce_scatters(std::vector<Instr>& list, const std::vector<int>& segment,
                                 double bucket_bytes, const std::vector<sharding::ShardingSpec>& specs,
                                 const std::vector<Buffer>& buffers, int& next_bucket) {
  if (bucket_bytes <= 0) return;
  const int n = static_cast<int>(list.size());
  std::map<int, std::vector<int>> readers;
  for (int k = 0; k < n; ++k)
    for (int b : list[static_cast<std::size_t>(k)].in) readers[b].push_back(k);
  std::vector<Chain> chains;
  for (int k = 0; k < n; ++k) {
    const Instr& rs = list[static_cast<std::size_t>(k)];
    if (!replica_collective(rs, InstrKind::ReduceScatter)) continue;
    const int sc = last_write(list, rs.in[0], k);
    if (sc < 0 || list[static_cast<std::size_t>(sc)].kind != InstrKind::Scale ||
        readers[rs.in[0]].size() != 1)
      continue;
    const auto& rd = readers[rs.out[0]];
    if (rd.size() != 1) continue;
    const Instr& acc = list[static_cast<std::size_t>(rd[0])];
    const bool into_acc = (acc.kind == InstrKind::Copy && acc.in[0] == rs.out[0]) ||
                          (acc.kind == InstrKind::Accumulate && acc.in.size() == 2 && acc.in[1] == rs.out[0]);
    if (!into_acc || rd[0] < k) continue;
    const int g = list[static_cast<std::size_t>(sc)].in[0];
    const int ready = last_write(list, g, sc);
    if (ready < 0) continue;
    const int run = ready < static_cast<int>(segment.size()) ? segment[static_cast<std::size_t>(ready)] : -1;
    chains.push_back({{sc, k, rd[0]}, k, ready, tile_bytes(rs.in[0], specs, buffers), run});
  }
  regroup(list, std::move(chains), bucket_bytes, next_bucket);
}

// ZeRO-1/2: the update's new sharded parameter is all-gathered straight into its replicated leaf.
// The gathers move, in buckets, right after the update that makes the bucket's last parameter.
void bucket_zero_step_gathers(std::vector<Instr>& list, double bucket_bytes, const std::set<int>& leaves,
                              const std::vector<sharding::ShardingSpec>& specs,
                              const std::vector<Buffer>& buffers, int& next_bucket) {
  if (bucket_bytes <= 0) return;
  const int n = static_cast<int>(list.size());
  std::vector<Chain> chains;
  for (int k = 0; k < n; ++k) {
    const Instr& ag = list[static_cast<std::size_t>(k)];
    if (!replica_collective(ag, InstrKind::AllGather) || !leaves.count(ag.out[0]) || leaves.count(ag.in[0]))
      continue;
    const int ready = last_write(list, ag.in[0], k);
    if (ready < 0) continue;
    chains.push_back({{k}, k, ready, tile_bytes(ag.out[0], specs, buffers), -1});
  }
  regroup(list, std::move(chains), bucket_bytes, next_bucket);
}

// ZeRO-3: in every run of one phase (`segment`: equal ids, contiguous), the spans of consecutive
// ops of one unit; the gathers of the sharded parameter leaves a span's ops read (each emitted
// right before the op it serves) become one bucket, issued at the start of the span before (the
// first two at the start of the first span): the next unit's parameters arrive while this unit
// computes (prefetch depth 1), as FSDP's forward and backward prefetch.
void bucket_zero3_gathers(std::vector<Instr>& list, const std::vector<int>& segment,
                          const std::set<int>& sharded_params,
                          const std::function<long long(ir::OpId)>& unit_of, int& next_bucket) {
  const int n = static_cast<int>(list.size());
  if (sharded_params.empty() || static_cast<int>(segment.size()) != n) return;
  struct Span {
    int start = 0;  // position of its first instruction (after the previous span's last op)
    std::vector<int> gathers;
  };
  std::map<int, std::vector<int>> before;  // position -> gathers issued right before it
  std::vector<char> moved(static_cast<std::size_t>(n), 0);
  std::map<int, int> bucket_of;  // gather position -> its bucket
  Accesses acc(list);
  for (int s0 = 0; s0 < n;) {
    int s1 = s0;
    while (s1 < n && segment[static_cast<std::size_t>(s1)] == segment[static_cast<std::size_t>(s0)]) ++s1;
    // Spans of [s0, s1): a new one at each op of another unit than the last op's.
    std::vector<Span> spans;
    long long cur = 0;
    int last_op = s0 - 1;
    std::vector<int> pending;  // gathers before the next op
    for (int k = s0; k < s1; ++k) {
      const Instr& i = list[static_cast<std::size_t>(k)];
      if (replica_collective(i, InstrKind::AllGather) && sharded_params.count(i.in[0])) {
        pending.push_back(k);
        continue;
      }
      if (i.op < 0) continue;
      const long long u = unit_of(i.op);
      if (spans.empty() || u != cur) {
        spans.push_back({last_op + 1, {}});
        cur = u;
      }
      auto& g = spans.back().gathers;
      g.insert(g.end(), pending.begin(), pending.end());
      pending.clear();
      last_op = k;
    }
    for (std::size_t j = 0; j < spans.size(); ++j) {
      if (spans[j].gathers.empty()) continue;
      const int at = spans[j < 2 ? 0 : j - 1].start;
      std::vector<int> go;
      for (int q : spans[j].gathers)
        if (acc.can_move({q}, at - 1)) go.push_back(q);  // (nothing between reads or writes its copy)
      for (int q : go) {
        before[at].push_back(q);
        moved[static_cast<std::size_t>(q)] = 1;
        bucket_of[q] = next_bucket;
      }
      if (!go.empty()) ++next_bucket;
    }
    s0 = s1;
  }
  if (bucket_of.empty()) return;
  std::vector<Instr> out;
  out.reserve(list.size());
  for (int k = 0; k < n; ++k) {
    if (auto it = before.find(k); it != before.end())
      for (int q : it->second) {
        Instr i = list[static_cast<std::size_t>(q)];
        i.bucket = bucket_of.at(q);
        out.push_back(std::move(i));
      }
    if (!moved[static_cast<std::size_t>(k)]) out.push_back(std::move(list[static_cast<std::size_t>(k)]));
  }
  list = std::move(out);
}

}  // namespace weft::lower
