// Program: JSON, readable dumps and the static check (see program.hpp).
#include "weft/lower/program.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "weft/core/error.hpp"
#include "weft/ir/json.hpp"

namespace weft::lower {

namespace {

using nlohmann::json;

constexpr std::array<std::pair<InstrKind, std::string_view>, 18> kKindNames{{
    {InstrKind::Compute, "compute"},
    {InstrKind::CeRowMax, "ce-row-max"},
    {InstrKind::CeSumTarget, "ce-sum-target"},
    {InstrKind::CeLoss, "ce-loss"},
    {InstrKind::CeGrad, "ce-grad"},
    {InstrKind::AllReduce, "all-reduce"},
    {InstrKind::AllGather, "all-gather"},
    {InstrKind::ReduceScatter, "reduce-scatter"},
    {InstrKind::AllToAll, "all-to-all"},
    {InstrKind::LocalSlice, "local-slice"},
    {InstrKind::LocalPartial, "local-partial"},
    {InstrKind::Copy, "copy"},
    {InstrKind::Free, "free"},
    {InstrKind::LoadInput, "load-input"},
    {InstrKind::Accumulate, "accumulate"},
    {InstrKind::Scale, "scale"},
    {InstrKind::Send, "send"},
    {InstrKind::Recv, "recv"},
}};

template <typename T>
T field(const json& j, const char* key, const std::string& path) {
  WEFT_CHECK(j.is_object(), "Program JSON: {} must be an object", path);
  auto it = j.find(key);
  WEFT_CHECK(it != j.end(), "Program JSON: missing field {}.{}", path, key);
  try {
    return it->get<T>();
  } catch (const json::exception& e) {
    fail("Program JSON: field {}.{} has the wrong type ({})", path, key, e.what());
  }
}

const json& array_field(const json& j, const char* key, const std::string& path) {
  WEFT_CHECK(j.is_object(), "Program JSON: {} must be an object", path);
  auto it = j.find(key);
  WEFT_CHECK(it != j.end() && it->is_array(), "Program JSON: field {}.{} must be an array", path, key);
  return *it;
}

}  // namespace

std::string_view instr_kind_name(InstrKind k) {
  for (const auto& [kind, name] : kKindNames)
    if (kind == k) return name;
  return "?";
}

InstrKind parse_instr_kind(std::string_view name) {
  for (const auto& [kind, n] : kKindNames)
    if (n == name) return kind;
  fail("unknown instruction kind '{}'", name);
}

bool is_collective(InstrKind k) {
  return k == InstrKind::AllReduce || k == InstrKind::AllGather || k == InstrKind::ReduceScatter ||
         k == InstrKind::AllToAll;
}

bool is_transfer(InstrKind k) { return k == InstrKind::Send || k == InstrKind::Recv; }

namespace {
std::string region_text(const std::vector<std::vector<std::int64_t>>& region) {
  std::string s;
  for (const auto& d : region) {
    s += "[";
    for (std::size_t k = 0; k + 1 < d.size(); k += 2) s += fmt::format("{}{}:{}", k ? "," : "", d[k], d[k + 1]);
    s += "]";
  }
  return s;
}
}  // namespace

std::string Program::to_json() const {
  json bufs = json::array(), rks = json::array(), sts = json::array();
  for (const auto& b : buffers)
    bufs.push_back(json{{"name", b.name},
                        {"tensor", b.tensor},
                        {"shape", b.shape},
                        {"spec", b.spec},
                        {"stage", b.stage},
                        {"element_bytes", b.element_bytes}});
  for (const auto& s : stages)
    sts.push_back(json{{"shape", s.shape},
                       {"ranks", s.ranks},
                       {"replicas", s.replicas},
                       {"microbatches", s.microbatches},
                       {"microbatch_size", s.microbatch_size},
                       {"schedule", s.schedule}});
  for (const auto& r : ranks) {
    json ins = json::array();
    for (const auto& i : r.instrs)
      ins.push_back(json{{"kind", instr_kind_name(i.kind)},
                         {"op", i.op},
                         {"in", i.in},
                         {"out", i.out},
                         {"axis", i.axis},
                         {"group", i.group},
                         {"reduce", i.reduce == ReduceOp::Sum ? "sum" : "max"},
                         {"axes", i.axes},
                         {"internal", i.internal},
                         {"microbatch", i.microbatch},
                         {"scale", i.scale},
                         {"tag", i.tag},
                         {"region", i.region}});
    rks.push_back(
        json{{"rank", r.rank}, {"device", r.device}, {"stage", r.stage}, {"coord", r.coord}, {"instrs", ins}});
  }
  json j{{"format", "weft.program/1"},
         {"graph", json::parse(ir::graph_to_json(graph))},
         {"stages", sts},
         {"buffers", bufs},
         {"ranks", rks},
         {"leaf_buffers", leaf_buffers},
         {"parameters", parameters},
         {"gradients", gradients},
         {"loss", loss}};
  return j.dump();
}

Program Program::from_json(std::string_view text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("Program JSON: not valid JSON ({})", e.what());
  }
  WEFT_CHECK(j.is_object() && j.value("format", "") == "weft.program/1",
             "Program JSON: not a weft program (field format must be \"weft.program/1\")");
  Program p;
  WEFT_CHECK(j.contains("graph"), "Program JSON: missing field graph");
  p.graph = ir::graph_from_json(j["graph"].dump());
  const auto& sts = array_field(j, "stages", "program");
  for (std::size_t i = 0; i < sts.size(); ++i) {
    auto path = fmt::format("stages[{}]", i);
    StageMesh sm;
    sm.shape = field<std::vector<std::int64_t>>(sts[i], "shape", path);
    sm.ranks = field<std::vector<int>>(sts[i], "ranks", path);
    sm.replicas = field<int>(sts[i], "replicas", path);
    sm.microbatches = field<int>(sts[i], "microbatches", path);
    sm.microbatch_size = field<std::int64_t>(sts[i], "microbatch_size", path);
    sm.schedule = sts[i].value("schedule", std::string());
    p.stages.push_back(std::move(sm));
  }
  const auto& bufs = array_field(j, "buffers", "program");
  for (std::size_t i = 0; i < bufs.size(); ++i) {
    auto path = fmt::format("buffers[{}]", i);
    Buffer b;
    b.name = field<std::string>(bufs[i], "name", path);
    b.tensor = field<ir::TensorId>(bufs[i], "tensor", path);
    b.shape = field<std::vector<std::int64_t>>(bufs[i], "shape", path);
    b.spec = field<std::string>(bufs[i], "spec", path);
    b.stage = field<int>(bufs[i], "stage", path);
    b.element_bytes = field<int>(bufs[i], "element_bytes", path);
    p.buffers.push_back(std::move(b));
  }
  const auto& rks = array_field(j, "ranks", "program");
  for (std::size_t r = 0; r < rks.size(); ++r) {
    auto path = fmt::format("ranks[{}]", r);
    RankProgram rp;
    rp.rank = field<int>(rks[r], "rank", path);
    rp.device = field<int>(rks[r], "device", path);
    rp.stage = field<int>(rks[r], "stage", path);
    rp.coord = field<std::vector<std::int64_t>>(rks[r], "coord", path);
    const auto& ins = array_field(rks[r], "instrs", path);
    for (std::size_t k = 0; k < ins.size(); ++k) {
      auto ip = fmt::format("{}.instrs[{}]", path, k);
      Instr in;
      in.kind = parse_instr_kind(field<std::string>(ins[k], "kind", ip));
      in.op = field<ir::OpId>(ins[k], "op", ip);
      in.in = field<std::vector<int>>(ins[k], "in", ip);
      in.out = field<std::vector<int>>(ins[k], "out", ip);
      in.axis = field<int>(ins[k], "axis", ip);
      in.group = field<std::vector<int>>(ins[k], "group", ip);
      auto red = field<std::string>(ins[k], "reduce", ip);
      WEFT_CHECK(red == "sum" || red == "max", "Program JSON: {}.reduce must be sum or max, got '{}'", ip, red);
      in.reduce = red == "sum" ? ReduceOp::Sum : ReduceOp::Max;
      in.axes = field<std::vector<int>>(ins[k], "axes", ip);
      in.internal = field<bool>(ins[k], "internal", ip);
      in.microbatch = field<int>(ins[k], "microbatch", ip);
      in.scale = field<double>(ins[k], "scale", ip);
      if (ins[k].contains("tag")) in.tag = field<int>(ins[k], "tag", ip);
      if (ins[k].contains("region"))
        in.region = field<std::vector<std::vector<std::int64_t>>>(ins[k], "region", ip);
      rp.instrs.push_back(std::move(in));
    }
    p.ranks.push_back(std::move(rp));
  }
  p.leaf_buffers = field<std::vector<int>>(j, "leaf_buffers", "program");
  p.parameters = field<std::map<std::string, int>>(j, "parameters", "program");
  p.gradients = field<std::map<std::string, int>>(j, "gradients", "program");
  p.loss = field<int>(j, "loss", "program");
  check(p);
  return p;
}

std::string Program::describe(int rank, int index) const {
  const Instr& i = ranks.at(static_cast<std::size_t>(rank)).instrs.at(static_cast<std::size_t>(index));
  auto names = [&](const std::vector<int>& ids) {
    std::vector<std::string> n;
    for (int b : ids)
      n.push_back(b >= 0 && b < static_cast<int>(buffers.size()) ? buffers[static_cast<std::size_t>(b)].name
                                                                  : fmt::format("<bad buffer {}>", b));
    return fmt::format("{}", fmt::join(n, ", "));
  };
  std::string head = fmt::format("rank {} #{} {}", rank, index, instr_kind_name(i.kind));
  if (i.op >= 0 && i.op < static_cast<ir::OpId>(graph.ops().size())) head += " " + graph.op(i.op).name;
  if (i.axis >= 0) head += fmt::format("@{}", i.axis);
  if (is_collective(i.kind)) head += fmt::format(" group {}", i.group);
  if (i.kind == InstrKind::AllReduce || i.kind == InstrKind::ReduceScatter)
    head += i.reduce == ReduceOp::Sum ? " (sum)" : " (max)";
  if (i.kind == InstrKind::Free) return head + " " + names(i.in);
  if (i.kind == InstrKind::LoadInput) head += fmt::format(" micro-batch {}", i.microbatch);
  if (i.kind == InstrKind::Scale) head += fmt::format(" ×{:.6g}", i.scale);
  if (i.kind == InstrKind::Send) head += fmt::format(" to ranks {} tag {} region {}", i.group, i.tag, region_text(i.region));
  if (i.kind == InstrKind::Recv)
    head += fmt::format(" from rank {} tag {} region {}", i.group.empty() ? -1 : i.group[0], i.tag, region_text(i.region));
  return fmt::format("{} {} -> {}", head, names(i.in), names(i.out));
}

std::string Program::dump_rank(int rank) const {
  const auto& r = ranks.at(static_cast<std::size_t>(rank));
  std::string s = fmt::format("rank {} (device {}, stage {}, coord {}): {} instructions\n", r.rank, r.device,
                              r.stage, r.coord, r.instrs.size());
  for (int k = 0; k < static_cast<int>(r.instrs.size()); ++k) s += "  " + describe(rank, k) + "\n";
  return s;
}

std::string Program::dump() const {
  std::string s = fmt::format("program of '{}': {} ranks, {} stages, {} buffers\n", graph.name(), ranks.size(),
                              stages.size(), buffers.size());
  for (int r = 0; r < num_ranks(); ++r) s += dump_rank(r);
  return s;
}

void check(const Program& p) {
  const int nb = static_cast<int>(p.buffers.size()), nr = p.num_ranks();
  for (int r = 0; r < nr; ++r)
    WEFT_CHECK(p.ranks[static_cast<std::size_t>(r)].rank == r, "program: ranks[{}] says it is rank {}", r,
               p.ranks[static_cast<std::size_t>(r)].rank);
  auto buf_ok = [&](int b) { return b >= 0 && b < nb; };
  for (int b : p.leaf_buffers) WEFT_CHECK(buf_ok(b), "program: leaf buffer id {} out of range", b);
  for (const auto& [n, b] : p.parameters) WEFT_CHECK(buf_ok(b), "program: parameter '{}' has no buffer", n);
  for (const auto& [n, b] : p.gradients) WEFT_CHECK(buf_ok(b), "program: gradient of '{}' has no buffer", n);
  WEFT_CHECK(p.loss == -1 || buf_ok(p.loss), "program: loss buffer id {} out of range", p.loss);
  for (const auto& b : p.buffers)
    WEFT_CHECK(b.tensor >= -1 && b.tensor < static_cast<ir::TensorId>(p.graph.tensors().size()),
               "program: buffer '{}' names tensor id {}, which does not exist", b.name, b.tensor);

  // Per rank: dataflow (read after write, not after free) and the groups of collectives and
  // transfers. A Send reads its input here (its output lives on the receivers); a Recv writes its
  // output here (its input lives on the sender).
  for (int r = 0; r < nr; ++r) {
    const auto& rp = p.ranks[static_cast<std::size_t>(r)];
    std::vector<char> live(static_cast<std::size_t>(nb), 0);
    for (int b : p.leaf_buffers) live[static_cast<std::size_t>(b)] = 1;
    for (int k = 0; k < static_cast<int>(rp.instrs.size()); ++k) {
      const Instr& i = rp.instrs[static_cast<std::size_t>(k)];
      for (int b : i.in) WEFT_CHECK(buf_ok(b), "program: {} reads buffer id {} (out of range)", p.describe(r, k), b);
      for (int b : i.out) WEFT_CHECK(buf_ok(b), "program: {} writes buffer id {} (out of range)", p.describe(r, k), b);
      if (i.kind != InstrKind::Recv)
        for (int b : i.in)
          WEFT_CHECK(live[static_cast<std::size_t>(b)],
                     "program: {} reads '{}', which this rank has not written or has freed", p.describe(r, k),
                     p.buffers[static_cast<std::size_t>(b)].name);
      if (i.kind == InstrKind::Free)
        for (int b : i.in) live[static_cast<std::size_t>(b)] = 0;
      else if (i.kind != InstrKind::Send)
        for (int b : i.out) live[static_cast<std::size_t>(b)] = 1;
      if (is_collective(i.kind) || is_transfer(i.kind)) {
        WEFT_CHECK(i.in.size() == (i.kind == InstrKind::Recv ? 0u : 1u) && i.out.size() == 1,
                   "program: {} must read and write one buffer (a recv: write one)", p.describe(r, k));
        std::set<int> uniq(i.group.begin(), i.group.end());
        WEFT_CHECK(uniq.size() == i.group.size(), "program: {}: a rank appears twice in the group", p.describe(r, k));
        for (int g : i.group) WEFT_CHECK(g >= 0 && g < nr, "program: {}: group rank {} does not exist", p.describe(r, k), g);
      }
      if (is_collective(i.kind))
        WEFT_CHECK(std::find(i.group.begin(), i.group.end(), r) != i.group.end(),
                   "program: {}: the rank is not in its own group", p.describe(r, k));
      if (is_transfer(i.kind)) {
        WEFT_CHECK(!i.group.empty() && std::find(i.group.begin(), i.group.end(), r) == i.group.end(),
                   "program: {}: a transfer needs peers other than the rank itself", p.describe(r, k));
        WEFT_CHECK(i.kind == InstrKind::Send || i.group.size() == 1, "program: {}: a recv has exactly one sender",
                   p.describe(r, k));
        WEFT_CHECK(i.tag >= 0, "program: {}: a transfer needs a tag", p.describe(r, k));
        const auto& shape = p.buffers[static_cast<std::size_t>(i.out[0])].shape;
        WEFT_CHECK(i.region.size() == shape.size(), "program: {}: the region has {} dims, the tensor {}",
                   p.describe(r, k), i.region.size(), shape.size());
        for (std::size_t d = 0; d < shape.size(); ++d) {
          const auto& iv = i.region[d];
          WEFT_CHECK(iv.size() % 2 == 0, "program: {}: region dim {} is not a list of intervals", p.describe(r, k), d);
          for (std::size_t q = 0; q < iv.size(); q += 2)
            WEFT_CHECK(iv[q] >= (q ? iv[q - 1] : 0) && iv[q] < iv[q + 1] && iv[q + 1] <= shape[d],
                       "program: {}: region dim {} interval [{}, {}) is not sorted inside [0, {})", p.describe(r, k),
                       d, iv[q], iv[q + 1], shape[d]);
        }
      }
    }
  }

  // Simulated execution: every rank runs until it stands at a collective or at a Recv whose
  // message has not been posted; a Send posts its message to each receiver; a collective completes
  // when every member of its group stands at a matching one. No progress before the end = a deadlock.
  std::vector<std::size_t> pc(static_cast<std::size_t>(nr), 0);
  std::map<std::pair<int, int>, std::pair<int, const Instr*>> posted;  // (tag, receiver) -> (sender, send)
  auto advance = [&](int r) {
    const auto& ins = p.ranks[static_cast<std::size_t>(r)].instrs;
    auto& k = pc[static_cast<std::size_t>(r)];
    for (; k < ins.size() && !is_collective(ins[k].kind); ++k) {
      const Instr& i = ins[k];
      if (i.kind == InstrKind::Send) {
        for (int q : i.group)
          WEFT_CHECK(posted.emplace(std::pair{i.tag, q}, std::pair{r, &i}).second,
                     "program: {}: tag {} is sent to rank {} twice", p.describe(r, static_cast<int>(k)), i.tag, q);
      } else if (i.kind == InstrKind::Recv) {
        auto it = posted.find({i.tag, r});
        if (it == posted.end()) break;
        const Instr& s = *it->second.second;
        WEFT_CHECK(it->second.first == i.group[0] && s.out == i.out && s.region == i.region,
                   "program: transfer mismatch: {} meets a send of tag {} from rank {} with other buffers or region",
                   p.describe(r, static_cast<int>(k)), i.tag, it->second.first);
        posted.erase(it);
      }
    }
  };
  for (;;) {
    bool done = true, progress = false;
    for (int r = 0; r < nr; ++r) {
      const std::size_t before = pc[static_cast<std::size_t>(r)];
      advance(r);
      progress = progress || pc[static_cast<std::size_t>(r)] != before;
      done = done && pc[static_cast<std::size_t>(r)] >= p.ranks[static_cast<std::size_t>(r)].instrs.size();
    }
    if (done) break;
    for (int r = 0; r < nr; ++r) {
      const auto& ins = p.ranks[static_cast<std::size_t>(r)].instrs;
      std::size_t k = pc[static_cast<std::size_t>(r)];
      if (k >= ins.size() || !is_collective(ins[k].kind)) continue;
      const Instr& i = ins[k];
      if (i.group.front() != r) continue;  // the group's first rank decides
      bool ready = true;
      for (int g : i.group) {
        const auto& gi = p.ranks[static_cast<std::size_t>(g)].instrs;
        std::size_t gk = pc[static_cast<std::size_t>(g)];
        if (gk >= gi.size() || gi[gk].group != i.group) {
          ready = false;
          break;
        }
        const Instr& o = gi[gk];
        WEFT_CHECK(o.kind == i.kind && o.axis == i.axis && o.in == i.in && o.out == i.out && o.reduce == i.reduce,
                   "program: collective mismatch: {} meets {}", p.describe(r, static_cast<int>(k)),
                   p.describe(g, static_cast<int>(gk)));
      }
      if (!ready) continue;
      for (int g : i.group) ++pc[static_cast<std::size_t>(g)];
      progress = true;
    }
    if (!progress) {
      for (int r = 0; r < nr; ++r) {
        const auto& ins = p.ranks[static_cast<std::size_t>(r)].instrs;
        std::size_t k = pc[static_cast<std::size_t>(r)];
        if (k < ins.size())
          fail("program: deadlock: {} waits for {}, which never comes", p.describe(r, static_cast<int>(k)),
               ins[k].kind == InstrKind::Recv ? "its message" : "its group");
      }
    }
  }
  for (const auto& [key, send] : posted)
    fail("program: rank {} sends tag {} to rank {}, which never receives it", send.first, key.first, key.second);
}

}  // namespace weft::lower
