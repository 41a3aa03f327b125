// Two passes over a device group's finished instruction list, the last steps of
// lower_pipeline.cpp (buckets_and_frees.hpp): the replicas' gradient all-reduces grouped into
// buckets issued as soon as their gradients are final, and a Free after every buffer's last use.
#include "buckets_and_frees.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>

namespace weft::lower {

void splice_moved(std::vector<Instr>& list, const std::vector<char>& moved,
                  std::map<int, std::vector<Instr>>& after) {
  std::vector<Instr> out;
  out.reserve(list.size());
  for (std::size_t k = 0; k < list.size(); ++k) {
    if (!moved[k]) out.push_back(std::move(list[k]));
    if (auto it = after.find(static_cast<int>(k)); it != after.end())
      for (auto& i : it->second) out.push_back(std::move(i));
  }
  list = std::move(out);
}

// Gradient buckets (PipelineOptions::grad_bucket_bytes). A replica all-reduce of a gradient's
// mean (its only reader) and the scale that makes the mean are moved, with the rest of their
// bucket, right after the last write of the accumulator of the bucket's last gradient — where
// the lowering put them, the update phase, waits for every micro-batch's backward.
void bucket_gradient_syncs(std::vector<Instr>& list, double bucket_bytes, const std::set<int>& grad_means,
                           const std::vector<sharding::ShardingSpec>& specs,
                           const std::vector<Buffer>& buffers, int& next_bucket) {
  if (bucket_bytes <= 0 || grad_means.empty()) return;
  const int n = static_cast<int>(list.size());
  std::map<int, int> writer_of_mean, readers;  // mean buffer -> its scale; buffer -> reads
  for (int k = 0; k < n; ++k) {
    const Instr& i = list[static_cast<std::size_t>(k)];
    for (int b : i.in) ++readers[b];
    if (i.kind == InstrKind::Scale && grad_means.count(i.out[0])) writer_of_mean[i.out[0]] = k;
  }
  struct Sync {
    int scale, reduce, ready;  // positions: its scale, its all-reduce, the accumulator's last write
    double bytes;
  };
  std::vector<Sync> syncs;
  for (int k = 0; k < n; ++k) {
    const Instr& i = list[static_cast<std::size_t>(k)];
    // (ZeRO-1: the mean is reduce-scattered into the update's shard, once per step.)
    if ((i.kind != InstrKind::AllReduce && i.kind != InstrKind::ReduceScatter) || i.internal || i.axis != 0 ||
        !i.group.empty())
      continue;
    auto w = writer_of_mean.find(i.in[0]);
    if (w == writer_of_mean.end() || readers[i.in[0]] != 1) continue;
    const int acc = list[static_cast<std::size_t>(w->second)].in[0];
    int ready = -1;
    for (int q = w->second - 1; q >= 0 && ready < 0; --q) {
      const auto& o = list[static_cast<std::size_t>(q)].out;
      if (std::find(o.begin(), o.end(), acc) != o.end()) ready = q;
    }
    if (ready < 0) continue;
    const auto& spec = specs[static_cast<std::size_t>(i.in[0])];
    const auto& buf = buffers[static_cast<std::size_t>(i.in[0])];
    double bytes = buf.element_bytes;
    for (std::size_t d = 0; d < buf.shape.size(); ++d) {
      const std::int64_t parts = spec.num_shards(static_cast<int>(d));
      bytes *= static_cast<double>((buf.shape[d] + parts - 1) / parts);
    }
    syncs.push_back({w->second, k, ready, bytes});
  }
  if (syncs.empty()) return;
  std::stable_sort(syncs.begin(), syncs.end(),
                   [](const Sync& a, const Sync& b) { return a.ready < b.ready; });
  // Buckets in the order the gradients become final; each issued after its last one.
  std::map<int, std::vector<Instr>> after;  // position -> the bucket instructions issued after it
  std::vector<char> moved(static_cast<std::size_t>(n), 0);
  for (std::size_t a = 0; a < syncs.size();) {
    // (A bucket is issued before any of its scales was: a gradient made in the update phase
    // itself — a deferred gradient sum — after another's scale starts a new bucket.)
    std::size_t b = a;
    double bytes = 0;
    int first_scale = n;
    const InstrKind kind = list[static_cast<std::size_t>(syncs[a].reduce)].kind;  // one kind per bucket
    while (b < syncs.size() && bytes < bucket_bytes && syncs[b].ready < first_scale &&
           list[static_cast<std::size_t>(syncs[b].reduce)].kind == kind) {
      first_scale = std::min(first_scale, syncs[b].scale);
      bytes += syncs[b++].bytes;
    }
    auto& out = after[syncs[b - 1].ready];
    for (std::size_t q = a; q < b; ++q) out.push_back(list[static_cast<std::size_t>(syncs[q].scale)]);
    for (std::size_t q = a; q < b; ++q) {
      Instr r = list[static_cast<std::size_t>(syncs[q].reduce)];
      r.bucket = next_bucket;
      out.push_back(std::move(r));
      moved[static_cast<std::size_t>(syncs[q].scale)] = moved[static_cast<std::size_t>(syncs[q].reduce)] = 1;
    }
    ++next_bucket;
    a = b;
  }
  splice_moved(list, moved, after);
}

// Every buffer but the leaves, the loss and the gradients is freed after its last use (a bucket's
// members: after the bucket) — the last use of each of its values: a buffer written afresh (not a recv into
// part of it, nor an accumulation that reads it; a recomputed forward) is freed after its last use before
// that write, and made again by it.
void add_frees(std::vector<Instr>& instrs, const std::set<int>& keep) {
  std::map<int, std::size_t> last;  // buffer -> index of its last use (read or write) so far
  std::vector<std::vector<int>> frees(instrs.size());
  for (std::size_t k = 0; k < instrs.size(); ++k) {
    const Instr& i = instrs[k];
    if (i.kind != InstrKind::Send && i.kind != InstrKind::Recv)
      for (int b : i.out)
        if (std::find(i.in.begin(), i.in.end(), b) == i.in.end())
          if (auto it = last.find(b); it != last.end()) {  // a fresh value: the old one is dead
            if (!keep.count(b)) frees[it->second].push_back(b);
            last.erase(it);
          }
    for (int b : i.in) last[b] = k;
    for (int b : i.out)
      if (i.kind != InstrKind::Send) last[b] = std::max(last[b], k);
  }
  for (auto [b, k] : last)
    if (!keep.count(b)) frees[k].push_back(b);
  // A bucket is one collective: what its members read last is freed after the whole run.
  for (std::size_t k = 0; k + 1 < instrs.size(); ++k)
    if (instrs[k].bucket >= 0 && instrs[k + 1].bucket == instrs[k].bucket && !frees[k].empty()) {
      frees[k + 1].insert(frees[k + 1].end(), frees[k].begin(), frees[k].end());
      frees[k].clear();
    }
  std::vector<Instr> out;
  out.reserve(instrs.size() * 2);
  for (std::size_t k = 0; k < instrs.size(); ++k) {
    out.push_back(std::move(instrs[k]));
    if (frees[k].empty()) continue;
    Instr f;
    f.kind = InstrKind::Free;
    f.in = std::move(frees[k]);
    out.push_back(std::move(f));
  }
  instrs = std::move(out);
}

}  // namespace weft::lower
