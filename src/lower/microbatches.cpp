// check_microbatches (simulate.hpp): which micro-batches each value of a step holds, followed
// through the simulated execution. The per-instruction checks of verify() see an accumulator
// that lost its only accumulate (two micro-batches) as a plain copy of the first micro-batch's
// gradient; only following the values tells the update it reads half the batch.
#include <fmt/format.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "simulate.hpp"
#include "weft/core/error.hpp"

namespace weft::lower {

namespace {

// A set of micro-batch indices (bit m = micro-batch m); empty: the value depends on none (a leaf,
// or what is computed from leaves only).
class MicrobatchSet {
 public:
  static MicrobatchSet of(int m) {
    MicrobatchSet s;
    s.words_.assign(static_cast<std::size_t>(m / 64 + 1), 0);
    s.words_.back() = std::uint64_t{1} << (m % 64);
    return s;
  }
  bool empty() const { return words_.empty(); }
  bool full(int count) const {
    for (int m = 0; m < count; ++m)
      if (!has(m)) return false;
    return true;
  }
  bool has(int m) const {
    const auto w = static_cast<std::size_t>(m / 64);
    return w < words_.size() && ((words_[w] >> (m % 64)) & 1u);
  }
  bool intersects(const MicrobatchSet& o) const {
    for (std::size_t w = 0; w < std::min(words_.size(), o.words_.size()); ++w)
      if (words_[w] & o.words_[w]) return true;
    return false;
  }
  void unite(const MicrobatchSet& o) {
    if (o.words_.size() > words_.size()) words_.resize(o.words_.size(), 0);
    for (std::size_t w = 0; w < o.words_.size(); ++w) words_[w] |= o.words_[w];
  }
  void clear() { words_.clear(); }
  bool operator==(const MicrobatchSet&) const = default;
  // "{0, 1, 3}" (the first 8, then how many more).
  std::string text() const {
    std::string out = "{";
    int shown = 0, count = 0;
    for (std::size_t w = 0; w < words_.size(); ++w)
      for (int bit = 0; bit < 64; ++bit)
        if ((words_[w] >> bit) & 1u) {
          if (shown < 8) out += fmt::format("{}{}", shown++ ? ", " : "", static_cast<int>(w) * 64 + bit);
          ++count;
        }
    if (count > shown) out += fmt::format(", … {} more", count - shown);
    return out + "}";
  }

 private:
  std::vector<std::uint64_t> words_;  // no trailing zero word (so == compares sets)
};

class MicrobatchFlow {
 public:
  explicit MicrobatchFlow(const Program& p)
      : p_(p),
        held_(static_cast<std::size_t>(p.num_ranks()), std::vector<MicrobatchSet>(p.buffers.size())),
        writer_(static_cast<std::size_t>(p.num_ranks()), std::vector<int>(p.buffers.size(), -1)) {}

  void run() {
    SimulationHooks hooks;
    hooks.local = [this](int r, std::size_t k) { local(r, k); };
    hooks.collective = [this](const std::vector<int>& g, const std::vector<std::size_t>& ks) {
      collective(g, ks);
    };
    simulate_execution(p_, hooks);
    at_end();
  }

 private:
  const Program& p_;
  std::vector<std::vector<MicrobatchSet>> held_;  // [rank][buffer]: what the buffer holds now
  std::vector<std::vector<int>> writer_;          // [rank][buffer]: the instruction that wrote it last
  std::map<std::pair<int, int>, MicrobatchSet> messages_;  // (tag, receiver) -> what was sent

  const Instr& instr(int r, std::size_t k) const { return p_.ranks[static_cast<std::size_t>(r)].instrs()[k]; }
  MicrobatchSet& held(int r, int b) {
    return held_[static_cast<std::size_t>(r)][static_cast<std::size_t>(b)];
  }
  const std::string& name(int b) const { return p_.buffers[static_cast<std::size_t>(b)].name; }
  int microbatches(int r) const {
    return p_.stages[static_cast<std::size_t>(p_.ranks[static_cast<std::size_t>(r)].stage)].microbatches;
  }

  void write(int r, std::size_t k, int b, MicrobatchSet s) {
    held(r, b) = std::move(s);
    writer_[static_cast<std::size_t>(r)][static_cast<std::size_t>(b)] = static_cast<int>(k);
  }

  void local(int r, std::size_t k) {
    const Instr& i = instr(r, k);
    auto what = [&] { return p_.describe(r, static_cast<int>(k)); };
    switch (i.kind) {
      case InstrKind::Free:
        for (int b : i.in) {
          held(r, b).clear();
          writer_[static_cast<std::size_t>(r)][static_cast<std::size_t>(b)] = -1;
        }
        return;
      case InstrKind::LoadInput: write(r, k, i.out[0], MicrobatchSet::of(i.microbatch)); return;
      case InstrKind::Send:
        for (int q : i.group) messages_[{i.tag, q}] = held(r, i.in[0]);
        return;
      case InstrKind::Recv: {  // several receives may fill one buffer: what they carry adds up
        auto it = messages_.find({i.tag, r});
        MicrobatchSet s = held(r, i.out[0]);
        if (it != messages_.end()) {
          s.unite(it->second);
          messages_.erase(it);
        }
        write(r, k, i.out[0], std::move(s));
        return;
      }
      case InstrKind::Accumulate: {
        const MicrobatchSet& acc = held(r, i.in[0]);
        const MicrobatchSet& add = held(r, i.in[1]);
        WEFT_CHECK(
            !acc.intersects(add),
            "program: {} adds micro-batches {} of '{}' into '{}', which already holds {} (a micro-batch "
            "counted twice)",
            what(), add.text(), name(i.in[1]), name(i.in[0]), acc.text());
        MicrobatchSet s = acc;
        s.unite(add);
        write(r, k, i.out[0], std::move(s));
        return;
      }
      case InstrKind::Compute:
      case InstrKind::CeRowMax:
      case InstrKind::CeSumTarget:
      case InstrKind::CeLoss:
      case InstrKind::CeGrad: {  // one micro-batch's op: its inputs hold that one (or none: leaves)
        MicrobatchSet s;
        int from = -1;
        for (int b : i.in) {
          const MicrobatchSet& h = held(r, b);
          if (h.empty()) continue;
          WEFT_CHECK(from < 0 || h == s, "program: {} mixes micro-batches {} of '{}' with {} of '{}'", what(),
                     s.text(), name(from), h.text(), name(b));
          s = h;
          from = b;
        }
        for (int b : i.out) write(r, k, b, s);
        return;
      }
      default: {  // copies, scales, local slices and partials: the value moves
        MicrobatchSet s = i.in.empty() ? MicrobatchSet{} : held(r, i.in[0]);
        for (int b : i.out) write(r, k, b, s);
        return;
      }
    }
  }

  // Every member reduces or gathers the same micro-batches (a replica that lost an accumulation
  // would otherwise be hidden by the others).
  void collective(const std::vector<int>& g, const std::vector<std::size_t>& ks) {
    const Instr& first = instr(g[0], ks[0]);
    const MicrobatchSet s = held(g[0], first.in[0]);
    for (std::size_t j = 1; j < g.size(); ++j) {
      const Instr& i = instr(g[j], ks[j]);
      const MicrobatchSet& h = held(g[j], i.in[0]);
      WEFT_CHECK(h == s, "program: {} meets {} on micro-batches {} against {} of '{}'",
                 p_.describe(g[j], static_cast<int>(ks[j])), p_.describe(g[0], static_cast<int>(ks[0])),
                 h.text(), s.text(), name(i.in[0]));
    }
    for (std::size_t j = 0; j < g.size(); ++j) write(g[j], ks[j], instr(g[j], ks[j]).out[0], s);
  }

  // The step's results: the new leaves, the gradients and the loss hold the whole batch (every
  // micro-batch of the stage) or nothing of it.
  void at_end() {
    std::vector<std::pair<int, const char*>> results;
    for (int b : p_.leaf_buffers) {
      const auto t = p_.buffers[static_cast<std::size_t>(b)].tensor;
      if (t >= 0 && p_.graph.tensor(t).role != ir::Role::Input)
        results.emplace_back(b, "the new value of the leaf");
    }
    for (const auto& [param, b] : p_.gradients) results.emplace_back(b, "the gradient");
    if (p_.loss >= 0) results.emplace_back(p_.loss, "the loss");
    for (int r = 0; r < p_.num_ranks(); ++r) {
      const int M = microbatches(r);
      for (const auto& [b, what] : results) {
        const MicrobatchSet& h = held(r, b);
        const int k = writer_[static_cast<std::size_t>(r)][static_cast<std::size_t>(b)];
        if (k < 0 || h.empty() || h.full(M)) continue;
        fail(
            "program: {} writes {} '{}' from micro-batches {} of the stage's {} (an accumulation is missing)",
            p_.describe(r, k), what, name(b), h.text(), M);
      }
    }
  }
};

}  // namespace

void check_microbatches(const Program& p) { MicrobatchFlow(p).run(); }

}  // namespace weft::lower
