// Program: JSON, readable dumps and the static check (see program.hpp).
#include "weft/lower/program.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "simulate.hpp"
#include "weft/core/error.hpp"
#include "weft/core/json_reader.hpp"
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

constexpr JsonReader kReader("Program JSON");

// Typed field access with the JSON path in the error (integers integral and in range, numbers finite).
template <typename T>
T field(const json& j, const char* key, const std::string& path) {
  return kReader.field<T>(j, key, path);
}

const json& array_field(const json& j, const char* key, const std::string& path) {
  return kReader.array(kReader.at(j, key, path), JsonReader::join(path, key));
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
    for (std::size_t k = 0; k + 1 < d.size(); k += 2)
      s += fmt::format("{}{}:{}", k ? "," : "", d[k], d[k + 1]);
    s += "]";
  }
  return s;
}
}  // namespace

std::string Program::to_json(const ir::JsonValueOptions& values) const {
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
                       {"schedule", s.schedule},
                       {"replica_microbatch", s.replica_microbatch},
                       {"split_fraction", s.split_fraction}});
  // Each distinct list once (the ranks of a stage share theirs).
  json codes = json::array();
  std::map<const std::vector<Instr>*, int> code_index;
  for (const auto& r : ranks) {
    auto [it, fresh] = code_index.emplace(r.code.get(), static_cast<int>(codes.size()));
    if (fresh) {
      json ins = json::array();
      for (const auto& i : *r.code)
        ins.push_back(json{{"kind", instr_kind_name(i.kind)},
                           {"op", i.op},
                           {"in", i.in},
                           {"out", i.out},
                           {"axis", i.axis},
                           {"group", i.group},
                           {"on_rank", i.on_rank},
                           {"reduce", i.reduce == ReduceOp::Sum ? "sum" : "max"},
                           {"axes", i.axes},
                           {"internal", i.internal},
                           {"microbatch", i.microbatch},
                           {"scale", i.scale},
                           {"by_share", i.by_share},
                           {"tag", i.tag},
                           {"bucket", i.bucket},
                           {"region", i.region}});
      codes.push_back(std::move(ins));
    }
    rks.push_back(json{{"rank", r.rank},
                       {"device", r.device},
                       {"stage", r.stage},
                       {"coord", r.coord},
                       {"code", it->second}});
  }
  json j{{"format", "weft.program/2"},
         {"graph", json::parse(ir::graph_to_json(graph, -1, values))},
         {"stages", sts},
         {"buffers", bufs},
         {"codes", codes},
         {"ranks", rks},
         {"leaf_buffers", leaf_buffers},
         {"parameters", parameters},
         {"gradients", gradients},
         {"loss", loss},
         {"graph_fingerprint", graph_fingerprint.empty() ? ir::graph_fingerprint(graph) : graph_fingerprint},
         {"step_fingerprint", step_fingerprint}};
  return j.dump();
}

Program Program::from_json(std::string_view text, const std::string& base_dir) {
  const json j = kReader.parse(text);
  WEFT_CHECK(j.is_object() && j.value("format", "") == "weft.program/2",
             "Program JSON: not a weft program (field format must be \"weft.program/2\")");
  Program p;
  WEFT_CHECK(j.contains("graph"), "Program JSON: missing field graph");
  p.graph = ir::graph_from_json(j["graph"].dump(), base_dir);
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
    if (sts[i].contains("replica_microbatch"))
      sm.replica_microbatch = field<std::vector<std::int64_t>>(sts[i], "replica_microbatch", path);
    if (sts[i].contains("split_fraction"))
      sm.split_fraction = field<std::vector<double>>(sts[i], "split_fraction", path);
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
  const auto& cds = array_field(j, "codes", "program");
  std::vector<std::shared_ptr<std::vector<Instr>>> codes;
  for (std::size_t c = 0; c < cds.size(); ++c) {
    WEFT_CHECK(cds[c].is_array(), "Program JSON: codes[{}] must be an array", c);
    std::vector<Instr> list;
    for (std::size_t k = 0; k < cds[c].size(); ++k) {
      const auto& x = cds[c][k];
      auto ip = fmt::format("codes[{}][{}]", c, k);
      Instr in;
      in.kind = parse_instr_kind(field<std::string>(x, "kind", ip));
      in.op = field<ir::OpId>(x, "op", ip);
      in.in = field<std::vector<int>>(x, "in", ip);
      in.out = field<std::vector<int>>(x, "out", ip);
      in.axis = field<int>(x, "axis", ip);
      in.group = field<std::vector<int>>(x, "group", ip);
      in.on_rank = field<int>(x, "on_rank", ip);
      auto red = field<std::string>(x, "reduce", ip);
      WEFT_CHECK(red == "sum" || red == "max", "Program JSON: {}.reduce must be sum or max, got '{}'", ip,
                 red);
      in.reduce = red == "sum" ? ReduceOp::Sum : ReduceOp::Max;
      in.axes = field<std::vector<int>>(x, "axes", ip);
      in.internal = field<bool>(x, "internal", ip);
      in.microbatch = field<int>(x, "microbatch", ip);
      in.scale = field<double>(x, "scale", ip);
      in.by_share = field<bool>(x, "by_share", ip);
      in.tag = field<int>(x, "tag", ip);
      in.bucket = kReader.field_or<int>(x, "bucket", ip, -1);  // absent in programs from before buckets
      in.region = field<std::vector<std::vector<std::int64_t>>>(x, "region", ip);
      list.push_back(std::move(in));
    }
    codes.push_back(std::make_shared<std::vector<Instr>>(std::move(list)));
  }
  const auto& rks = array_field(j, "ranks", "program");
  for (std::size_t r = 0; r < rks.size(); ++r) {
    auto path = fmt::format("ranks[{}]", r);
    RankProgram rp;
    rp.rank = field<int>(rks[r], "rank", path);
    rp.device = field<int>(rks[r], "device", path);
    rp.stage = field<int>(rks[r], "stage", path);
    rp.coord = field<std::vector<std::int64_t>>(rks[r], "coord", path);
    const int c = field<int>(rks[r], "code", path);
    WEFT_CHECK(c >= 0 && c < static_cast<int>(codes.size()),
               "Program JSON: {}.code {} is not one of the {} codes", path, c, codes.size());
    rp.code = codes[static_cast<std::size_t>(c)];
    p.ranks.push_back(std::move(rp));
  }
  p.leaf_buffers = field<std::vector<int>>(j, "leaf_buffers", "program");
  p.parameters = field<std::map<std::string, int>>(j, "parameters", "program");
  p.gradients = field<std::map<std::string, int>>(j, "gradients", "program");
  p.loss = field<int>(j, "loss", "program");
  p.graph_fingerprint = field<std::string>(j, "graph_fingerprint", "program");
  WEFT_CHECK(!p.graph_fingerprint.empty(), "Program JSON: program.graph_fingerprint is empty");
  if (j.contains("step_fingerprint")) p.step_fingerprint = field<std::string>(j, "step_fingerprint", "program");
  check(p);
  return p;
}

std::vector<Instr>& RankProgram::edit() {
  if (code.use_count() > 1) code = std::make_shared<std::vector<Instr>>(*code);
  return *code;
}

std::vector<int> Program::group_of(int rank, const Instr& i) const {
  if (!is_collective(i.kind) || !i.group.empty()) return i.group;
  return group_along(rank, i.axis);
}

std::vector<int> Program::group_along(int rank, int axis) const {
  const auto& rp = ranks.at(static_cast<std::size_t>(rank));
  const auto& st = stages.at(static_cast<std::size_t>(rp.stage));
  WEFT_CHECK(axis >= 0 && axis < static_cast<int>(st.shape.size()) && rp.coord.size() == st.shape.size(),
             "program: rank {}'s collective names axis {} of a {}-axis stage mesh", rank, axis,
             st.shape.size());
  std::vector<int> g;
  auto c = rp.coord;
  for (std::int64_t k = 0; k < st.shape[static_cast<std::size_t>(axis)]; ++k) {
    c[static_cast<std::size_t>(axis)] = k;
    std::int64_t idx = 0;
    for (std::size_t d = 0; d < c.size(); ++d) idx = idx * st.shape[d] + c[d];
    g.push_back(st.ranks.at(static_cast<std::size_t>(idx)));
  }
  return g;
}

std::vector<Instr> Program::instructions(int rank) const {
  const auto& rp = ranks.at(static_cast<std::size_t>(rank));
  std::vector<Instr> out;
  for (const auto& i : rp.instrs())
    if (rp.runs(i)) {
      out.push_back(i);
      out.back().group = group_of(rank, i);
    }
  return out;
}

std::size_t Program::num_instructions(int rank) const {
  const auto& rp = ranks.at(static_cast<std::size_t>(rank));
  return static_cast<std::size_t>(
      std::count_if(rp.instrs().begin(), rp.instrs().end(), [&](const Instr& i) { return rp.runs(i); }));
}

std::string Program::describe(int rank, int index) const {
  const Instr& i = ranks.at(static_cast<std::size_t>(rank)).instrs().at(static_cast<std::size_t>(index));
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
  if (is_collective(i.kind)) {
    std::vector<int> g = i.group;
    try {
      g = group_of(rank, i);
    } catch (const Error&) {  // a bad axis: describe what is there
    }
    head += fmt::format(" group {}", g);
  }
  if (i.kind == InstrKind::AllReduce || i.kind == InstrKind::ReduceScatter)
    head += i.reduce == ReduceOp::Sum ? " (sum)" : " (max)";
  if (i.bucket >= 0) head += fmt::format(" bucket {}", i.bucket);
  if (i.kind == InstrKind::Free) return head + " " + names(i.in);
  if (i.kind == InstrKind::LoadInput) head += fmt::format(" micro-batch {}", i.microbatch);
  if (i.kind == InstrKind::Scale)
    head += fmt::format(" ×{:.6g}{}", i.scale, i.by_share ? " × replica share" : "");
  if (i.kind == InstrKind::Send)
    head += fmt::format(" to ranks {} tag {} region {}", i.group, i.tag, region_text(i.region));
  if (i.kind == InstrKind::Recv)
    head += fmt::format(" from rank {} tag {} region {}", i.group.empty() ? -1 : i.group[0], i.tag,
                        region_text(i.region));
  return fmt::format("{} {} -> {}", head, names(i.in), names(i.out));
}

std::string Program::dump_rank(int rank) const {
  const auto& r = ranks.at(static_cast<std::size_t>(rank));
  std::string s = fmt::format("rank {} (device {}, stage {}, coord {}): {} instructions\n", r.rank, r.device,
                              r.stage, r.coord, num_instructions(rank));
  for (int k = 0; k < static_cast<int>(r.instrs().size()); ++k)
    if (r.runs(r.instrs()[static_cast<std::size_t>(k)])) s += "  " + describe(rank, k) + "\n";
  return s;
}

std::string Program::dump() const {
  std::string s = fmt::format("program of '{}': {} ranks, {} stages, {} buffers\n", graph.name(),
                              ranks.size(), stages.size(), buffers.size());
  for (int r = 0; r < num_ranks(); ++r) s += dump_rank(r);
  return s;
}

void check(const Program& p) { verify(p); }

// The dataflow / group / deadlock part of the check (after verify's structural checks).
void check_dataflow(const Program& p) {
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
  // transfers, over the instructions the rank runs. A Send reads its input here (its output lives
  // on the receivers); a Recv writes its output here.
  // The groups of each rank along each axis of its stage mesh (collectives without an explicit one).
  std::vector<std::vector<std::vector<int>>> axis_group(static_cast<std::size_t>(nr));
  for (int r = 0; r < nr; ++r) {
    const auto& rp = p.ranks[static_cast<std::size_t>(r)];
    WEFT_CHECK(rp.stage >= 0 && rp.stage < static_cast<int>(p.stages.size()),
               "program: rank {} names stage {} of {}", r, rp.stage, p.stages.size());
    const auto& st = p.stages[static_cast<std::size_t>(rp.stage)];
    WEFT_CHECK(rp.coord.size() == st.shape.size(),
               "program: rank {}'s coordinate {} is not on its stage mesh {}", r, rp.coord, st.shape);
    for (int a = 0; a < static_cast<int>(st.shape.size()); ++a)
      axis_group[static_cast<std::size_t>(r)].push_back(p.group_along(r, a));
  }
  auto group = [&](int r, const Instr& i) -> const std::vector<int>& {
    if (!is_collective(i.kind) || !i.group.empty()) return i.group;
    const auto& ag = axis_group[static_cast<std::size_t>(r)];
    WEFT_CHECK(i.axis >= 0 && i.axis < static_cast<int>(ag.size()),
               "program: rank {}: a collective on axis {} of a {}-axis mesh", r, i.axis, ag.size());
    return ag[static_cast<std::size_t>(i.axis)];
  };
  std::vector<char> live(static_cast<std::size_t>(nb), 0);
  for (int r = 0; r < nr; ++r) {
    const auto& rp = p.ranks[static_cast<std::size_t>(r)];
    const auto& ins = rp.instrs();
    std::fill(live.begin(), live.end(), 0);
    for (int b : p.leaf_buffers) live[static_cast<std::size_t>(b)] = 1;
    for (int k = 0; k < static_cast<int>(ins.size()); ++k) {
      const Instr& i = ins[static_cast<std::size_t>(k)];
      if (is_transfer(i.kind))
        WEFT_CHECK(i.on_rank >= 0 && i.on_rank < nr &&
                       p.ranks[static_cast<std::size_t>(i.on_rank)].stage == rp.stage,
                   "program: {}: a transfer runs on one rank of its stage, not on rank {}", p.describe(r, k),
                   i.on_rank);
      if (!rp.runs(i)) continue;
      for (int b : i.in)
        WEFT_CHECK(buf_ok(b), "program: {} reads buffer id {} (out of range)", p.describe(r, k), b);
      for (int b : i.out)
        WEFT_CHECK(buf_ok(b), "program: {} writes buffer id {} (out of range)", p.describe(r, k), b);
      if (i.kind != InstrKind::Recv)
        for (int b : i.in)
          WEFT_CHECK(live[static_cast<std::size_t>(b)],
                     "program: {} reads '{}', which this rank has not written or has freed", p.describe(r, k),
                     p.buffers[static_cast<std::size_t>(b)].name);
      if (i.kind == InstrKind::Free)
        for (int b : i.in) live[static_cast<std::size_t>(b)] = 0;
      else if (i.kind != InstrKind::Send)
        for (int b : i.out) live[static_cast<std::size_t>(b)] = 1;
      if (!is_collective(i.kind) && !is_transfer(i.kind)) continue;
      WEFT_CHECK(i.in.size() == (i.kind == InstrKind::Recv ? 0u : 1u) && i.out.size() == 1,
                 "program: {} must read and write one buffer (a recv: write one)", p.describe(r, k));
      const auto& g = group(r, i);
      std::set<int> uniq(g.begin(), g.end());
      WEFT_CHECK(uniq.size() == g.size(), "program: {}: a rank appears twice in the group", p.describe(r, k));
      for (int m : g)
        WEFT_CHECK(m >= 0 && m < nr, "program: {}: group rank {} does not exist", p.describe(r, k), m);
      if (is_collective(i.kind)) {
        WEFT_CHECK(uniq.count(r), "program: {}: the rank is not in its own group", p.describe(r, k));
        continue;
      }
      // A rank may send to itself (two stages of one device group, ZB-V): its recv must come
      // after its send, which the order check below proves like any other message.
      WEFT_CHECK(!g.empty(), "program: {}: a transfer needs a peer", p.describe(r, k));
      WEFT_CHECK(i.kind == InstrKind::Send || g.size() == 1, "program: {}: a recv has exactly one sender",
                 p.describe(r, k));
      WEFT_CHECK(i.tag >= 0, "program: {}: a transfer needs a tag", p.describe(r, k));
      const auto& shape = p.buffers[static_cast<std::size_t>(i.out[0])].shape;
      WEFT_CHECK(i.region.size() == shape.size(), "program: {}: the region has {} dims, the tensor {}",
                 p.describe(r, k), i.region.size(), shape.size());
      for (std::size_t d = 0; d < shape.size(); ++d) {
        const auto& iv = i.region[d];
        WEFT_CHECK(iv.size() % 2 == 0, "program: {}: region dim {} is not a list of intervals",
                   p.describe(r, k), d);
        for (std::size_t q = 0; q < iv.size(); q += 2)
          WEFT_CHECK(iv[q] >= (q ? iv[q - 1] : 0) && iv[q] < iv[q + 1] && iv[q + 1] <= shape[d],
                     "program: {}: region dim {} interval [{}, {}) is not sorted inside [0, {})",
                     p.describe(r, k), d, iv[q], iv[q + 1], shape[d]);
      }
    }
  }

  simulate_execution(p, {});
}

// The simulated execution of check_dataflow (simulate.hpp): every rank runs until it stands at a
// collective or at a Recv whose message has not been posted; a Send posts its message to each
// receiver; a collective completes when every member of its group stands at a matching one. No
// progress before the end = a deadlock.
void simulate_execution(const Program& p, const SimulationHooks& hooks) {
  const int nr = p.num_ranks();
  std::vector<std::vector<std::vector<int>>> axis_group(static_cast<std::size_t>(nr));
  for (int r = 0; r < nr; ++r) {
    const auto& st = p.stages[static_cast<std::size_t>(p.ranks[static_cast<std::size_t>(r)].stage)];
    for (int a = 0; a < static_cast<int>(st.shape.size()); ++a)
      axis_group[static_cast<std::size_t>(r)].push_back(p.group_along(r, a));
  }
  auto group = [&](int r, const Instr& i) -> const std::vector<int>& {
    if (!is_collective(i.kind) || !i.group.empty()) return i.group;
    return axis_group[static_cast<std::size_t>(r)][static_cast<std::size_t>(i.axis)];
  };
  std::vector<std::size_t> pc(static_cast<std::size_t>(nr), 0);
  std::map<std::pair<int, int>, std::pair<int, const Instr*>> posted;  // (tag, receiver) -> (sender, send)
  auto advance = [&](int r) {
    const auto& rp = p.ranks[static_cast<std::size_t>(r)];
    const auto& ins = rp.instrs();
    auto& k = pc[static_cast<std::size_t>(r)];
    for (; k < ins.size(); ++k) {
      const Instr& i = ins[k];
      if (!rp.runs(i)) continue;
      if (is_collective(i.kind)) break;
      if (i.kind == InstrKind::Send) {
        for (int q : i.group)
          WEFT_CHECK(posted.emplace(std::pair{i.tag, q}, std::pair{r, &i}).second,
                     "program: {}: tag {} is sent to rank {} twice", p.describe(r, static_cast<int>(k)),
                     i.tag, q);
      } else if (i.kind == InstrKind::Recv) {
        auto it = posted.find({i.tag, r});
        if (it == posted.end()) break;
        const Instr& snd = *it->second.second;
        WEFT_CHECK(
            it->second.first == i.group[0] && snd.out == i.out && snd.region == i.region,
            "program: transfer mismatch: {} meets a send of tag {} from rank {} with other buffers or region",
            p.describe(r, static_cast<int>(k)), i.tag, it->second.first);
        posted.erase(it);
      }
      if (hooks.local) hooks.local(r, k);
    }
  };
  auto at_end = [&](int r) {
    return pc[static_cast<std::size_t>(r)] >= p.ranks[static_cast<std::size_t>(r)].instrs().size();
  };
  for (;;) {
    bool done = true, progress = false;
    for (int r = 0; r < nr; ++r) {
      const std::size_t before = pc[static_cast<std::size_t>(r)];
      advance(r);
      progress = progress || pc[static_cast<std::size_t>(r)] != before;
      done = done && at_end(r);
    }
    if (done) break;
    for (int r = 0; r < nr; ++r) {
      if (at_end(r)) continue;
      const auto& ins = p.ranks[static_cast<std::size_t>(r)].instrs();
      const std::size_t k = pc[static_cast<std::size_t>(r)];
      const Instr& i = ins[k];
      if (!is_collective(i.kind)) continue;
      const auto& g = group(r, i);
      if (g.front() != r) continue;  // the group's first rank decides
      bool ready = true;
      for (int m : g) {
        if (at_end(m)) {
          ready = false;
          break;
        }
        const auto& mi = p.ranks[static_cast<std::size_t>(m)].instrs();
        const std::size_t mk = pc[static_cast<std::size_t>(m)];
        const Instr& o = mi[mk];
        if (!is_collective(o.kind) || group(m, o) != g) {
          ready = false;
          break;
        }
        WEFT_CHECK(
            o.kind == i.kind && o.axis == i.axis && o.in == i.in && o.out == i.out && o.reduce == i.reduce,
            "program: collective mismatch: {} meets {}", p.describe(r, static_cast<int>(k)),
            p.describe(m, static_cast<int>(mk)));
      }
      if (!ready) continue;
      if (hooks.collective) {
        std::vector<std::size_t> ks;
        for (int m : g) ks.push_back(pc[static_cast<std::size_t>(m)]);
        hooks.collective(g, ks);
      }
      for (int m : g) ++pc[static_cast<std::size_t>(m)];
      progress = true;
    }
    if (!progress) {
      for (int r = 0; r < nr; ++r) {
        if (at_end(r)) continue;
        const std::size_t k = pc[static_cast<std::size_t>(r)];
        fail("program: deadlock: {} waits for {}, which never comes", p.describe(r, static_cast<int>(k)),
             p.ranks[static_cast<std::size_t>(r)].instrs()[k].kind == InstrKind::Recv ? "its message"
                                                                                      : "its group");
      }
    }
  }
  for (const auto& [key, send] : posted)
    fail("program: rank {} sends tag {} to rank {}, which never receives it", send.first, key.first,
         key.second);
}

}  // namespace weft::lower
