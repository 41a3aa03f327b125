// JSON save/load of a graph. The format (docs/modules/ir.md):
//   {"format": "weft.ir.graph", "version": 1, "name": str,
//    "tensors": [{"name", "shape": [int], "dtype", "role", "producer": op id | -1, "grad_of"?: id}],
//    "ops": [{"name", "kind", "inputs": [id], "outputs": [id], "attrs": {non-default fields},
//             "index_map": {"factors": [{"name", "size", "kind", "reduce"}], "inputs": [[[fid]]],
//                           "outputs": [[[fid]]], "flops_per_point", "work_factors": [fid]}}],
//    "outputs": [id], "loss": id | null}
// The stored index maps are loaded as they are and Graph::validate() re-derives every op's map
// from its rule, so an edited map, shape or dtype is reported, as are dangling ids and cycles.
// Reading errors name the JSON path of the problem ("$.ops[3].attrs.axes").
#include "weft/ir/json.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

#include "weft/core/error.hpp"
#include "weft/core/json_reader.hpp"
#include "weft/ir/value_file.hpp"

namespace weft::ir {
namespace {

using nlohmann::json;

constexpr const char* kFormat = "weft.ir.graph";
constexpr int kVersion = 1;

json index_map_json(const IndexMap& m) {
  json factors = json::array();
  for (const auto& f : m.factors)
    factors.push_back({{"name", f.name},
                       {"size", f.size},
                       {"kind", factor_kind_name(f.kind)},
                       {"reduce", reduce_kind_name(f.reduce)}});
  json j = json::object();
  j["factors"] = std::move(factors);
  j["inputs"] = m.inputs;
  j["outputs"] = m.outputs;
  j["flops_per_point"] = m.flops_per_point;
  j["work_factors"] = m.work_factors;
  return j;
}

json attrs_json(const OpAttrs& a) {
  json j = json::object();
  const OpAttrs d;
  if (a.equation != d.equation) j["equation"] = a.equation;
  if (a.unary != d.unary) j["unary"] = unary_fn_name(a.unary);
  if (a.binary != d.binary) j["binary"] = binary_fn_name(a.binary);
  if (a.reduce != d.reduce) j["reduce"] = reduce_fn_name(a.reduce);
  if (a.axes != d.axes) j["axes"] = a.axes;
  if (a.ints != d.ints) j["ints"] = a.ints;
  if (a.scalar != d.scalar) j["scalar"] = a.scalar;
  if (a.scalars != d.scalars) j["scalars"] = a.scalars;
  return j;
}

// ---- reading with paths

[[noreturn]] void bad(const std::string& path, const std::string& what) {
  fail("graph JSON: {}: {}", path, what);
}

const json& field(const json& obj, const char* key, const std::string& path) {
  if (!obj.is_object()) bad(path, "expected an object");
  auto it = obj.find(key);
  if (it == obj.end()) bad(path, fmt::format("missing field '{}'", key));
  return *it;
}

std::string str(const json& j, const std::string& path) {
  if (!j.is_string()) bad(path, "expected a string");
  return j.get<std::string>();
}

std::int64_t integer(const json& j, const std::string& path) {
  if (!j.is_number_integer()) bad(path, "expected an integer");
  return j.get<std::int64_t>();
}

double number(const json& j, const std::string& path) {
  if (!j.is_number()) bad(path, "expected a number");
  return j.get<double>();
}

int id32(const json& j, const std::string& path) {
  auto v = integer(j, path);
  if (v < -1 || v > std::numeric_limits<std::int32_t>::max()) bad(path, fmt::format("id {} out of range", v));
  return static_cast<int>(v);
}

const json& array(const json& j, const std::string& path) {
  if (!j.is_array()) bad(path, "expected an array");
  return j;
}

template <typename T, typename F>
std::vector<T> list(const json& j, const std::string& path, F&& each) {
  std::vector<T> out;
  const json& a = array(j, path);
  for (std::size_t i = 0; i < a.size(); ++i) out.push_back(each(a[i], fmt::format("{}[{}]", path, i)));
  return out;
}

// Integer lists are most of a graph's JSON: check them without building a path per element.
std::vector<std::int64_t> ints(const json& j, const std::string& path) {
  const json& a = array(j, path);
  std::vector<std::int64_t> out;
  out.reserve(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].is_number_integer()) bad(fmt::format("{}[{}]", path, i), "expected an integer");
    out.push_back(a[i].get<std::int64_t>());
  }
  return out;
}
std::vector<int> small_ints(const json& j, const std::string& path) {
  auto v = ints(j, path);
  std::vector<int> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (v[i] < -1 || v[i] > std::numeric_limits<std::int32_t>::max())
      bad(fmt::format("{}[{}]", path, i), fmt::format("id {} out of range", v[i]));
    out[i] = static_cast<int>(v[i]);
  }
  return out;
}

// Runs a name parser (which throws weft::Error "unknown ...") and prefixes the path.
template <typename F>
auto named(const json& j, const std::string& path, F&& parse) {
  std::string s = str(j, path);
  try {
    return parse(s);
  } catch (const InternalError&) {
    throw;
  } catch (const Error& e) {
    bad(path, e.what());
  }
}

IndexMap read_index_map(const json& j, const std::string& path) {
  IndexMap m;
  m.factors =
      list<Factor>(field(j, "factors", path), path + ".factors", [](const json& f, const std::string& p) {
        Factor x;
        x.name = str(field(f, "name", p), p + ".name");
        x.size = integer(field(f, "size", p), p + ".size");
        x.kind = named(field(f, "kind", p), p + ".kind", [](const std::string& s) {
          for (auto k : {FactorKind::Parallel, FactorKind::Reduction, FactorKind::NeedReplication})
            if (factor_kind_name(k) == s) return k;
          fail("unknown factor kind '{}'", s);
        });
        x.reduce = named(field(f, "reduce", p), p + ".reduce", [](const std::string& s) {
          for (auto k : {ReduceKind::None, ReduceKind::Sum, ReduceKind::Max})
            if (reduce_kind_name(k) == s) return k;
          fail("unknown reduce kind '{}'", s);
        });
        return x;
      });
  auto tensors = [&](const char* key) {
    std::string p = path + "." + key;
    return list<std::vector<DimFactors>>(field(j, key, path), p, [&](const json& t, const std::string& pt) {
      const json& dims = array(t, pt);
      std::vector<DimFactors> out;
      for (std::size_t d = 0; d < dims.size(); ++d) {
        auto pd = [&] { return fmt::format("{}[{}]", pt, d); };
        if (!dims[d].is_array()) bad(pd(), "expected an array");
        DimFactors fs;
        for (const auto& f : dims[d]) {
          if (!f.is_number_integer()) bad(pd(), "expected an array of integers");
          auto v = f.get<std::int64_t>();
          if (v < 0 || v >= static_cast<std::int64_t>(m.factors.size()))
            bad(pd(), fmt::format("factor id {} out of range", v));
          fs.push_back(static_cast<int>(v));
        }
        out.push_back(std::move(fs));
      }
      return out;
    });
  };
  m.inputs = tensors("inputs");
  m.outputs = tensors("outputs");
  m.flops_per_point = number(field(j, "flops_per_point", path), path + ".flops_per_point");
  m.work_factors = small_ints(field(j, "work_factors", path), path + ".work_factors");
  for (int f : m.work_factors)
    if (f < 0 || f >= static_cast<int>(m.factors.size()))
      bad(path + ".work_factors", fmt::format("factor id {} out of range", f));
  return m;
}

OpAttrs read_attrs(const json& j, const std::string& path) {
  if (!j.is_object()) bad(path, "expected an object");
  OpAttrs a;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    std::string p = path + "." + k;
    if (k == "equation")
      a.equation = str(*it, p);
    else if (k == "unary")
      a.unary = named(*it, p, parse_unary_fn);
    else if (k == "binary")
      a.binary = named(*it, p, parse_binary_fn);
    else if (k == "reduce")
      a.reduce = named(*it, p, parse_reduce_fn);
    else if (k == "axes")
      a.axes = small_ints(*it, p);
    else if (k == "ints")
      a.ints = ints(*it, p);
    else if (k == "scalar")
      a.scalar = number(*it, p);
    else if (k == "scalars")
      a.scalars = list<double>(*it, p, [](const json& e, const std::string& pe) { return number(e, pe); });
    else
      bad(p, "unknown attribute");
  }
  return a;
}

}  // namespace

std::string graph_to_json(const Graph& g, int indent, const JsonValueOptions& vo) {
  json tensors = json::array();
  std::map<std::string, std::pair<HostTensor, DType>> sidecar;
  for (std::size_t t = 0; t < g.tensors().size(); ++t) {
    const auto& ti = g.tensors()[t];
    json jt{{"name", ti.name},
            {"shape", ti.shape},
            {"dtype", dtype_name(ti.dtype)},
            {"role", role_name(ti.role)},
            {"producer", ti.producer}};
    if (auto of = g.grad_of(static_cast<TensorId>(t))) jt["grad_of"] = *of;
    if (const LeafValue* v = g.value(static_cast<TensorId>(t))) {
      if (!v->in_memory()) {
        jt["value_file"] = v->file;
        jt["value_key"] = v->key;
      } else if (!vo.sidecar_path.empty() && v->data->numel() > vo.inline_limit) {
        jt["value_file"] = vo.sidecar_ref.empty() ? vo.sidecar_path : vo.sidecar_ref;
        jt["value_key"] = ti.name;
        sidecar.emplace(ti.name, std::make_pair(*v->data, ti.dtype));
      } else {
        json vals = json::array();
        for (double x : v->data->data) {
          if (std::isfinite(x))
            vals.push_back(x);
          else
            vals.push_back(std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf");
        }
        jt["value"] = std::move(vals);
      }
    }
    tensors.push_back(std::move(jt));
  }
  // Assignments move; nlohmann's initializer lists would deep-copy every subtree.
  json ops = json::array();
  for (const auto& op : g.ops()) {
    json o = json::object();
    o["name"] = op.name;
    o["kind"] = op_kind_name(op.kind);
    o["inputs"] = op.inputs;
    o["outputs"] = op.outputs;
    o["attrs"] = attrs_json(op.attrs);
    o["index_map"] = index_map_json(op.index_map);
    ops.push_back(std::move(o));
  }
  json j = json::object();
  j["format"] = kFormat;
  j["version"] = kVersion;
  j["name"] = g.name();
  j["tensors"] = std::move(tensors);
  j["ops"] = std::move(ops);
  j["outputs"] = g.outputs();
  j["loss"] = g.loss() ? json(*g.loss()) : json(nullptr);
  if (!g.seed_parameters()) j["seed_parameters"] = false;
  if (!sidecar.empty()) write_value_file(vo.sidecar_path, sidecar);
  return j.dump(indent);
}

Graph graph_from_json(std::string_view text, const std::string& base_dir) {
  const json j = JsonReader("graph JSON").parse(text);
  const std::string root = "$";
  if (!j.is_object()) bad(root, "expected an object");
  if (str(field(j, "format", root), "$.format") != kFormat)
    bad("$.format", fmt::format("expected '{}'", kFormat));
  if (integer(field(j, "version", root), "$.version") != kVersion)
    bad("$.version", fmt::format("unsupported version (this build reads {})", kVersion));
  Graph g(str(field(j, "name", root), "$.name"));
  const json& ts = array(field(j, "tensors", root), "$.tensors");
  std::vector<std::pair<TensorId, TensorId>> grads;
  std::vector<std::pair<TensorId, LeafValue>> values;
  for (std::size_t t = 0; t < ts.size(); ++t) {
    std::string p = fmt::format("$.tensors[{}]", t);
    TensorInfo ti;
    ti.name = str(field(ts[t], "name", p), p + ".name");
    ti.shape = ints(field(ts[t], "shape", p), p + ".shape");
    for (auto s : ti.shape)
      if (s < 1) bad(p + ".shape", fmt::format("non-positive dimension in {}", fmt::join(ti.shape, ",")));
    ti.dtype = named(field(ts[t], "dtype", p), p + ".dtype", parse_dtype);
    ti.role = named(field(ts[t], "role", p), p + ".role", parse_role);
    ti.producer = id32(field(ts[t], "producer", p), p + ".producer");
    if (ts[t].contains("grad_of"))
      grads.emplace_back(static_cast<TensorId>(t), id32(ts[t]["grad_of"], p + ".grad_of"));
    if (ts[t].contains("value")) {
      const json& jv = array(ts[t]["value"], p + ".value");
      auto v = std::make_shared<HostTensor>();
      v->shape = ti.shape;
      v->data.reserve(jv.size());
      for (std::size_t k = 0; k < jv.size(); ++k) {
        const json& x = jv[k];
        if (x.is_number())
          v->data.push_back(x.get<double>());
        else if (x.is_string() && (x == "nan" || x == "inf" || x == "-inf"))
          v->data.push_back(x == "nan"   ? std::numeric_limits<double>::quiet_NaN()
                            : x == "inf" ? std::numeric_limits<double>::infinity()
                                         : -std::numeric_limits<double>::infinity());
        else
          bad(fmt::format("{}.value[{}]", p, k), "expected a number (or \"nan\", \"inf\", \"-inf\")");
      }
      values.emplace_back(static_cast<TensorId>(t), LeafValue{std::move(v), {}, {}});
    } else if (ts[t].contains("value_file")) {
      std::string file = str(ts[t]["value_file"], p + ".value_file");
      if (!base_dir.empty() && !file.empty() && file.front() != '/') file = base_dir + "/" + file;
      values.emplace_back(
          static_cast<TensorId>(t),
          LeafValue{nullptr, std::move(file), str(field(ts[t], "value_key", p), p + ".value_key")});
    }
    g.add_tensor_unchecked(std::move(ti));
  }
  const auto nt = static_cast<TensorId>(ts.size());
  auto check_id = [&](TensorId t, const std::string& p) {
    if (t < 0 || t >= nt)
      bad(p, fmt::format("tensor id {} does not exist (dangling; the graph has {} tensors)", t, nt));
  };
  const json& ops = array(field(j, "ops", root), "$.ops");
  for (std::size_t o = 0; o < ops.size(); ++o) {
    std::string p = fmt::format("$.ops[{}]", o);
    Op op;
    op.name = str(field(ops[o], "name", p), p + ".name");
    p = fmt::format("$.ops[{}] ('{}')", o, op.name);
    op.kind = named(field(ops[o], "kind", p), p + ".kind", parse_op_kind);
    op.inputs = small_ints(field(ops[o], "inputs", p), p + ".inputs");
    op.outputs = small_ints(field(ops[o], "outputs", p), p + ".outputs");
    for (std::size_t i = 0; i < op.inputs.size(); ++i)
      check_id(op.inputs[i], fmt::format("{}.inputs[{}]", p, i));
    for (std::size_t i = 0; i < op.outputs.size(); ++i)
      check_id(op.outputs[i], fmt::format("{}.outputs[{}]", p, i));
    op.attrs = ops[o].contains("attrs") ? read_attrs(ops[o]["attrs"], p + ".attrs") : OpAttrs{};
    op.index_map = read_index_map(field(ops[o], "index_map", p), p + ".index_map");
    g.add_op_unchecked(std::move(op));
  }
  for (std::size_t t = 0; t < g.tensors().size(); ++t) {
    OpId pr = g.tensors()[t].producer;
    if (pr != kNoOp && (pr < 0 || pr >= static_cast<OpId>(ops.size())))
      bad(fmt::format("$.tensors[{}].producer", t), fmt::format("op id {} does not exist", pr));
  }
  for (auto [t, of] : grads) {
    check_id(of, fmt::format("$.tensors[{}].grad_of", t));
    g.set_grad_of(t, of);
  }
  const json& outs = array(field(j, "outputs", root), "$.outputs");
  for (std::size_t i = 0; i < outs.size(); ++i) {
    std::string p = fmt::format("$.outputs[{}]", i);
    TensorId t = id32(outs[i], p);
    check_id(t, p);
    g.mark_output(t);
  }
  const json& loss = field(j, "loss", root);
  if (!loss.is_null()) {
    TensorId t = id32(loss, "$.loss");
    check_id(t, "$.loss");
    if (!g.tensors()[t].shape.empty())
      bad("$.loss", fmt::format("loss '{}' is not a scalar", g.tensors()[t].name));
    g.set_loss(t);
  }
  try {
    g.validate();
  } catch (const InternalError&) {
    throw;
  } catch (const Error& e) {
    fail("graph JSON: invalid graph: {}", e.what());
  }
  for (auto& [t, v] : values) {
    try {
      g.set_value(t, std::move(v));
    } catch (const InternalError&) {
      throw;
    } catch (const Error& e) {
      bad(fmt::format("$.tensors[{}].value", t), e.what());
    }
  }
  if (j.contains("seed_parameters")) {
    if (!j["seed_parameters"].is_boolean()) bad("$.seed_parameters", "expected true or false");
    g.set_seed_parameters(j["seed_parameters"].get<bool>());
  }
  return g;
}

}  // namespace weft::ir
