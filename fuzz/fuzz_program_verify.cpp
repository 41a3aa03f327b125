// Program verification (issue 38): mutated programs go through from_json + verify + execute. Any
// input ends in weft::Error or a run that finishes; a crash, a hang, an InternalError or a sanitizer
// report is a bug (a program the verifier let through that the executor cannot run).
//
// Two kinds of input. Text starting with '{' is a program JSON as it is (libFuzzer's byte mutations
// of the seed program). Anything else is an edit script over the JSON of a tiny lowered GPT program
// (two replicas × two micro-batches on a 2×2 mesh: loads, computes, gradient all-reduces,
// accumulations, scales, resharding collectives): every 4 bytes pick a node of the document and
// change it (at most 64 edits; a number set to an edge value or nudged, a kind / reduce / spec string swapped, an
// array element dropped or duplicated), so that the mutations are valid JSON that reach the verifier.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_target.hpp"
#include "weft/cluster/cluster.hpp"
#include "weft/exec/program_executor.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/lower/lower.hpp"
#include "weft/models/models.hpp"

namespace {

using nlohmann::json;

const std::string& base_program() {
  static const std::string text = [] {
    weft::models::GptConfig c;
    c.layers = 1, c.hidden = 8, c.heads = 2, c.seq = 4, c.vocab = 16, c.batch = 2;
    const auto g = weft::ir::build_training_graph(weft::models::gpt(c));
    const std::vector<std::int64_t> spmd{2};
    weft::lower::SpmdLayout l;
    for (const auto& op : g.ops()) {
      auto st = weft::spmd::enumerate_strategies(g, op, spmd);
      l.op_axes.push_back(st[st.size() / 2].axes);
    }
    weft::lower::StageOptions o;
    o.replicas = 2;
    o.microbatches = 2;
    const auto p = weft::lower::lower_spmd(g, weft::cluster::Cluster::preset("M8", 1),
                                           weft::cluster::DeviceMesh::iota({2, 2}), l, o);
    weft::lower::verify(p);  // the unmutated program must verify (outside run_one: a failure aborts)
    return p.to_json();
  }();
  return text;
}

// Every node of the document (but the graph's, mutated rarely: byte 0 bit 7), in document order.
void collect(json& j, std::vector<json*>& out, bool graph) {
  out.push_back(&j);
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it)
      if (graph || it.key() != "graph") collect(*it, out, graph);
  } else if (j.is_array()) {
    for (auto& v : j) collect(v, out, graph);
  }
}

constexpr std::array<std::int64_t, 14> kEdges{0, 1, -1, 2, 3, 4, 99, 2147483647, -2147483647 - 1,
                                              std::int64_t{1} << 40, std::int64_t{1} << 62, -4, 7, 16};
constexpr std::array<const char*, 18> kKinds{
    "compute", "ce-row-max", "ce-sum-target", "ce-loss", "ce-grad", "all-reduce", "all-gather", "reduce-scatter",
    "all-to-all", "local-slice", "local-partial", "copy", "free", "load-input", "accumulate", "scale", "send", "recv"};
constexpr std::array<const char*, 8> kSpecs{"R R", "R S(0)", "S(0) R", "R P(sum)", "P(sum) R", "R S(1)", "P(max) R", "R"};

std::string edited(const std::uint8_t* data, std::size_t size) {
  static const json base = json::parse(base_program());
  json doc = base;
  std::vector<json*> nodes;
  int nodes_of = -1;  // which node set `nodes` lists (recollected after an array changed)
  size = std::min<std::size_t>(size, 4 * 64);  // at most 64 edits (each may walk the document)
  for (std::size_t at = 0; at + 4 <= size; at += 4) {
    const int want = (data[at] & 0x80) != 0;
    if (nodes_of != want) {
      nodes.clear();
      collect(doc, nodes, want != 0);
      nodes_of = want;
    }
    json& n = *nodes[(static_cast<std::size_t>(data[at + 1]) << 8 | data[at + 2]) % nodes.size()];
    const std::uint8_t how = data[at + 3], what = data[at] & 0x7f;
    if (n.is_number_integer()) {
      const std::int64_t v = n.get<std::int64_t>();
      switch (how % 4) {
        case 0: n = kEdges[what % kEdges.size()]; break;
        case 1: n = v + 1; break;
        case 2: n = v - 1; break;
        default: n = -v; break;
      }
    } else if (n.is_number()) {
      n = how % 2 ? 0.0 : static_cast<double>(kEdges[what % kEdges.size()]);
    } else if (n.is_boolean()) {
      n = !n.get<bool>();
    } else if (n.is_string()) {
      const auto s = n.get<std::string>();
      if (s == "sum" || s == "max")
        n = s == "sum" ? "max" : "sum";
      else if (how % 2)
        n = kKinds[what % kKinds.size()];
      else
        n = kSpecs[what % kSpecs.size()];
    } else if (n.is_array() && !n.empty()) {
      const std::size_t k = what % n.size();
      if (how % 2)
        n.erase(k);
      else
        n.push_back(json(n[k]));
      nodes_of = -1;  // pointers into the document may have moved
    }
  }
  return doc.dump();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)base_program();  // made (and verified) outside run_one: an error there is a bug, not an input
  return weft::fuzz::run_one(data, size, [&](std::string_view text) {
    const std::string program = !text.empty() && text[0] == '{' ? std::string(text) : edited(data, size);
    const auto p = weft::lower::Program::from_json(program);  // verifies
    weft::lower::verify(p, p.graph);
    weft::exec::ExecuteOptions o;
    o.steps = 1;
    o.timeout_s = 5;
    (void)weft::exec::execute_program(p, o);
  });
}
