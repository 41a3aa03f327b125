// Bindings of weft/ir: weft.Graph (builder, inspection, autodiff, JSON) and weft.interpret.
// Tensors are referred to by their integer id (what every builder method returns). Enum-like
// arguments are strings ("f32", "gelu", "max", "adam"), parsed by the IR's own name tables so a
// bad name is a ValueError listing the valid ones.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <map>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "weft/core/dtype.hpp"
#include "weft/core/error.hpp"
#include "weft/ir/autodiff.hpp"
#include "weft/ir/graph.hpp"
#include "weft/ir/interpreter.hpp"
#include "weft/ir/json.hpp"
#include "weft/ir/precision.hpp"
#include "weft/ir/value_file.hpp"

namespace py = pybind11;
using namespace weft::ir;
using weft::DType;

namespace {

using Ids = std::vector<TensorId>;

py::dict tensor_dict(const Graph& g, TensorId t) {
  const TensorInfo& ti = g.tensor(t);
  py::dict d;
  d["id"] = t;
  d["name"] = ti.name;
  d["shape"] = py::tuple(py::cast(ti.shape));
  d["dtype"] = std::string(weft::dtype_name(ti.dtype));
  d["role"] = std::string(role_name(ti.role));
  d["producer"] = ti.producer == kNoOp ? py::object(py::none()) : py::object(py::str(g.op(ti.producer).name));
  auto of = g.grad_of(t);
  d["grad_of"] = of ? py::object(py::int_(*of)) : py::object(py::none());
  d["has_value"] = g.value(t) != nullptr;
  return d;
}

HostTensor host_of(const Graph& g, TensorId t, const py::handle& v) {
  auto arr = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(v);
  if (!arr)
    throw py::type_error("set_value: the value of '" + g.tensor(t).name +
                         "' is not convertible to a numeric array");
  HostTensor h;
  for (py::ssize_t d = 0; d < arr.ndim(); ++d) h.shape.push_back(arr.shape(d));
  h.data.assign(arr.data(), arr.data() + arr.size());
  return h;
}

py::object value_array(const Graph& g, TensorId t) {
  const LeafValue* v = g.value(t);
  if (!v) return py::none();
  HostTensor h = v->load();
  std::vector<py::ssize_t> shape(h.shape.begin(), h.shape.end());
  py::array_t<double> a(shape);
  std::copy(h.data.begin(), h.data.end(), a.mutable_data());
  return a;  // C++20 moves it into the py::object (std::move here is -Wredundant-move)
}

py::dict op_dict(const Graph& g, OpId o) {
  const Op& op = g.op(o);
  py::dict d;
  d["id"] = o;
  d["name"] = op.name;
  d["kind"] = std::string(op_kind_name(op.kind));
  d["inputs"] = op.inputs;
  d["outputs"] = op.outputs;
  d["flops"] = op.flops();
  d["index_map"] = op.index_map.to_string();
  const OpAttrs& a = op.attrs;
  py::dict attrs;
  if (!a.equation.empty()) attrs["equation"] = a.equation;
  if (op.kind == OpKind::Unary || op.kind == OpKind::UnaryGrad)
    attrs["unary"] = std::string(unary_fn_name(a.unary));
  if (op.kind == OpKind::Binary) attrs["binary"] = std::string(binary_fn_name(a.binary));
  if (op.kind == OpKind::Reduce || op.kind == OpKind::Pool2d || op.kind == OpKind::Pool2dGrad)
    attrs["reduce"] = std::string(reduce_fn_name(a.reduce));
  if (!a.axes.empty()) attrs["axes"] = a.axes;
  if (!a.ints.empty()) attrs["ints"] = a.ints;
  if (a.scalar != 0) attrs["scalar"] = a.scalar;
  if (!a.scalars.empty()) attrs["scalars"] = a.scalars;
  d["attrs"] = attrs;
  return d;
}

Optimizer parse_optimizer(const py::object& o) {
  if (o.is_none()) return Optimizer::None;
  auto s = o.cast<std::string>();
  if (s == "adam") return Optimizer::Adam;
  if (s == "sgd") return Optimizer::Sgd;
  if (s == "none") return Optimizer::None;
  weft::fail("unknown optimizer '{}' (expected 'adam', 'sgd' or None)", s);
}

bool has_backward(const Graph& g) {
  for (const auto& t : g.tensors())
    if (t.role == Role::Gradient) return true;
  return false;
}

// Feed keys are tensor names (or ids); names must identify one tensor.
TensorId resolve(const Graph& g, const std::unordered_multimap<std::string, TensorId>& by_name,
                 py::handle key) {
  if (py::isinstance<py::int_>(key)) {
    auto t = key.cast<TensorId>();
    g.tensor(t);
    return t;
  }
  auto name = key.cast<std::string>();
  auto n = by_name.count(name);
  WEFT_CHECK(n > 0, "feed '{}' names no tensor of graph '{}'", name, g.name());
  WEFT_CHECK(n == 1, "feed '{}' is ambiguous: {} tensors have that name (feed by id)", name, n);
  return by_name.find(name)->second;
}

py::dict interpret_py(const Graph& g, const py::dict& feeds) {
  std::unordered_multimap<std::string, TensorId> by_name;
  for (std::size_t t = 0; t < g.tensors().size(); ++t)
    by_name.emplace(g.tensors()[t].name, static_cast<TensorId>(t));
  std::map<TensorId, HostTensor> in;
  for (auto [k, v] : feeds) {
    TensorId t = resolve(g, by_name, k);
    auto arr = py::array_t<double, py::array::c_style | py::array::forcecast>::ensure(v);
    WEFT_CHECK(arr, "feed for '{}' is not convertible to a float64 array", g.tensor(t).name);
    HostTensor h;
    for (py::ssize_t d = 0; d < arr.ndim(); ++d) h.shape.push_back(arr.shape(d));
    h.data.assign(arr.data(), arr.data() + arr.size());
    in[t] = std::move(h);
  }
  std::vector<HostTensor> vals;
  {
    py::gil_scoped_release release;
    vals = interpret(g, in);
  }
  py::dict out;
  for (std::size_t t = 0; t < vals.size(); ++t) {
    const TensorInfo& ti = g.tensors()[t];
    std::string key = ti.name;
    if (by_name.count(key) > 1) key += "@" + std::to_string(t);  // names that repeat get their id
    std::vector<py::ssize_t> shape(vals[t].shape.begin(), vals[t].shape.end());
    if (ti.dtype == DType::I32 || ti.dtype == DType::I64) {
      py::array_t<std::int64_t> a(shape);
      auto* p = a.mutable_data();
      for (std::size_t i = 0; i < vals[t].data.size(); ++i) p[i] = static_cast<std::int64_t>(vals[t].data[i]);
      out[py::str(key)] = a;
    } else {
      py::array_t<double> a(shape);
      std::copy(vals[t].data.begin(), vals[t].data.end(), a.mutable_data());
      out[py::str(key)] = a;
    }
  }
  return out;
}

}  // namespace

void bind_ir(py::module_& m) {
  m.def(
      "_value_file_header",
      [](const std::string& path) {
        py::dict out;
        for (const auto& [k, e] : read_value_file_header(path)) {
          py::dict d;
          d["dtype"] = e.dtype;
          d["shape"] = py::tuple(py::cast(e.shape));
          out[py::str(k)] = d;
        }
        return out;
      },
      py::arg("path"), "The tensors of a safetensors file: key -> {dtype, shape} (its header only).");
  py::class_<Graph> G(
      m, "Graph",
      "A weft IR graph: tensors (by integer id) and ops with index maps. Builder methods return "
      "the id of the tensor they make; errors (bad shapes, names, attributes) raise ValueError.");
  G.def(py::init<std::string>(), py::arg("name") = "")
      // ---- leaves
      .def(
          "input",
          [](Graph& g, std::string name, Shape shape, const std::string& dtype) {
            return g.input(std::move(name), std::move(shape), weft::parse_dtype(dtype));
          },
          py::arg("name"), py::arg("shape"), py::arg("dtype") = "f32", "An input leaf (data, labels, ids).")
      .def(
          "parameter",
          [](Graph& g, std::string name, Shape shape, const std::string& dtype) {
            return g.parameter(std::move(name), std::move(shape), weft::parse_dtype(dtype));
          },
          py::arg("name"), py::arg("shape"), py::arg("dtype") = "f32", "A trainable parameter leaf.")
      .def(
          "constant",
          [](Graph& g, std::string name, Shape shape, const std::string& dtype) {
            return g.constant(std::move(name), std::move(shape), weft::parse_dtype(dtype));
          },
          py::arg("name"), py::arg("shape"), py::arg("dtype") = "f32",
          "A constant leaf: a value known when the graph is made (give it with set_value).")
      .def(
          "buffer",
          [](Graph& g, std::string name, Shape shape, const std::string& dtype) {
            return g.buffer(std::move(name), std::move(shape), weft::parse_dtype(dtype));
          },
          py::arg("name"), py::arg("shape"), py::arg("dtype") = "f32",
          "A buffer leaf: state that is not trained (running statistics, position tables); give its value "
          "with set_value.")
      // ---- values the model carries
      .def(
          "set_value", [](Graph& g, TensorId t, const py::handle& v) { g.set_value(t, host_of(g, t, v)); },
          py::arg("t"), py::arg("value"),
          "Sets the value of a Parameter, Buffer or Constant leaf (a numeric array of its shape; stored as "
          "float64, integral for integer tensors). ValueError naming the tensor otherwise.")
      .def("set_value_file", &Graph::set_value_file, py::arg("t"), py::arg("file"), py::arg("key"),
           "Names the value of a leaf as tensor `key` of the safetensors file `file` (read when an "
           "executor needs it; a rank reads what its tiles need).")
      .def("clear_value", &Graph::clear_value, py::arg("t"))
      .def("value", &value_array, py::arg("t"),
           "The value of leaf t as a float64 array (read from its file when file-backed), or None.")
      .def(
          "value_source",
          [](const Graph& g, TensorId t) -> py::object {
            const LeafValue* v = g.value(t);
            if (!v) return py::none();
            if (v->in_memory()) return py::str("memory");
            return py::make_tuple(v->file, v->key);
          },
          py::arg("t"), "None, 'memory', or (file, key) for a file-backed value.")
      .def_property_readonly(
          "value_names",
          [](const Graph& g) {
            std::vector<std::string> out;
            for (const auto& [t, v] : g.values()) out.push_back(g.tensor(t).name);
            return out;
          },
          "Names of the leaves that carry a value.")
      .def_property("seed_parameters", &Graph::seed_parameters, &Graph::set_seed_parameters,
                    "Whether Parameters without a value may be initialised from the seed (graphs built in "
                    "code: True; an imported module: False, its weights are its own).")
      .def_property_readonly(
          "base_dtype", [](const Graph& g) { return std::string(weft::dtype_name(base_float_dtype(g))); },
          "The graph's base float dtype (its parameters' most common one): what an executor runs at its "
          "own dtype; a float tensor of another dtype is held at its own precision where the run is wider "
          "than it (narrower than the base) or never below it (wider than the base).")
      // ---- ops
      .def("einsum", &Graph::einsum, py::arg("equation"), py::arg("operands"), py::arg("name") = "",
           "Einsum over any equation, e.g. 'bsh,hf->bsf'.")
      .def("matmul", &Graph::matmul, py::arg("a"), py::arg("b"), py::arg("name") = "",
           "[..., m, k] x [k, n].")
      .def(
          "unary",
          [](Graph& g, const std::string& fn, TensorId x, std::string name, double scalar) {
            return g.unary(parse_unary_fn(fn), x, std::move(name), scalar);
          },
          py::arg("fn"), py::arg("x"), py::arg("name") = "", py::arg("scalar") = 0.0,
          "Elementwise fn: identity, neg, relu, gelu (tanh form), tanh, exp, log, sigmoid, sqrt, rsqrt, "
          "square, "
          "scale (by scalar).")
      .def(
          "scale",
          [](Graph& g, TensorId x, double s, std::string name) {
            return g.unary(UnaryFn::Scale, x, std::move(name), s);
          },
          py::arg("x"), py::arg("scalar"), py::arg("name") = "")
      .def("dropout", &Graph::dropout, py::arg("x"), py::arg("p"), py::arg("seed"), py::arg("name") = "",
           "Training-mode dropout: x * keep / (1 - p), keep a counter-based hash of (seed, step, the "
           "element's global index), so every shard of a distributed plan computes its part of the same "
           "mask.")
      .def(
          "cast",
          [](Graph& g, TensorId x, const std::string& dtype, std::string name) {
            return g.cast(x, weft::parse_dtype(dtype), std::move(name));
          },
          py::arg("x"), py::arg("dtype"), py::arg("name") = "",
          "x converted to the floating dtype 'f64', 'f32', 'bf16' or 'f16' (torch's x.to(dtype)): executors "
          "hold the result at that precision; x itself when it has that dtype already. Its gradient is "
          "the output's gradient converted back to x's dtype.")
      .def(
          "binary",
          [](Graph& g, const std::string& fn, TensorId a, TensorId b, std::string name) {
            return g.binary(parse_binary_fn(fn), a, b, std::move(name));
          },
          py::arg("fn"), py::arg("a"), py::arg("b"), py::arg("name") = "",
          "Elementwise add, sub, mul, div, max with numpy broadcasting.")
      .def(
          "reduce",
          [](Graph& g, const std::string& fn, TensorId x, std::vector<int> axes, std::string name) {
            return g.reduce(parse_reduce_fn(fn), x, std::move(axes), std::move(name));
          },
          py::arg("fn"), py::arg("x"), py::arg("axes"), py::arg("name") = "",
          "sum, mean or max over axes (removed).")
      .def("softmax", &Graph::softmax, py::arg("x"), py::arg("axis") = -1, py::arg("name") = "")
      .def("layer_norm", &Graph::layer_norm, py::arg("x"), py::arg("gamma"), py::arg("beta"),
           py::arg("eps") = 1e-5, py::arg("name") = "", "Layer norm over the last dim.")
      .def(
          "embedding",
          [](Graph& g, TensorId table, TensorId ids, std::string name,
             std::optional<std::int64_t> padding_idx) {
            if (!padding_idx) return g.embedding(table, ids, std::move(name));
            const std::int64_t v = g.tensor(table).shape.at(0);
            WEFT_CHECK(*padding_idx >= 0 && *padding_idx < v,
                       "embedding: padding_idx {} is not a row of the {}-row table", *padding_idx, v);
            OpAttrs a;
            a.ints = {*padding_idx};
            return g.add_op(OpKind::Embedding, {table, ids}, std::move(a), std::move(name))[0];
          },
          py::arg("table"), py::arg("ids"), py::arg("name") = "", py::arg("padding_idx") = py::none(),
          "Rows of table at ids. padding_idx (torch's): that row gets no gradient from this lookup.")
      .def(
          "cross_entropy",
          [](Graph& g, TensorId logits, TensorId labels, std::string name, std::optional<TensorId> weight,
             std::int64_t ignore_index, double label_smoothing, const std::string& normalize) {
            WEFT_CHECK(normalize == "valid" || normalize == "tokens",
                       "cross_entropy: normalize must be 'valid' or 'tokens', got '{}'", normalize);
            CrossEntropyAttrs a;
            a.ignore_index = ignore_index;
            a.label_smoothing = label_smoothing;
            a.token_mean = normalize == "tokens";
            return g.cross_entropy(logits, labels, a, weight.value_or(-1), std::move(name));
          },
          py::arg("logits"), py::arg("labels"), py::arg("name") = "", py::arg("weight") = py::none(),
          py::arg("ignore_index") = -100, py::arg("label_smoothing") = 0.0, py::arg("normalize") = "valid",
          "torch's F.cross_entropy of logits [..., C] (class last) and integer labels [...]: a scalar. "
          "Labels equal to ignore_index contribute 0; weight: class weights [C] (a constant, buffer or "
          "input: not differentiated); label_smoothing ε as torch. normalize='valid' (torch's mean): "
          "divided by the weighted count of valid labels of the whole training step, micro-batches and "
          "replicas included; 'tokens': by the token count (reduction='sum' is that times the step's "
          "tokens).")
      .def("transpose", &Graph::transpose, py::arg("x"), py::arg("perm"), py::arg("name") = "")
      .def("reshape", &Graph::reshape, py::arg("x"), py::arg("shape"), py::arg("name") = "")
      .def("concat", &Graph::concat, py::arg("xs"), py::arg("axis"), py::arg("name") = "")
      .def(
          "broadcast_to",
          [](Graph& g, TensorId x, Shape shape, std::vector<int> axes, std::string name) {
            OpAttrs a;
            a.ints = std::move(shape);
            a.axes = std::move(axes);
            return g.add_op(OpKind::BroadcastTo, {x}, std::move(a), std::move(name))[0];
          },
          py::arg("x"), py::arg("shape"), py::arg("axes") = std::vector<int>{}, py::arg("name") = "",
          "x copied to `shape`, inserting the dims in `axes` and widening its size-1 dims (an expand); "
          "its gradient sums over them.")
      .def("slice", &Graph::slice, py::arg("x"), py::arg("axis"), py::arg("begin"), py::arg("end"),
           py::arg("name") = "")
      .def("conv2d", &Graph::conv2d, py::arg("x"), py::arg("w"), py::arg("stride") = 1, py::arg("pad") = 0,
           py::arg("name") = "", "x[n,c,H,W] * w[o,c,r,t] with stride and zero padding.")
      .def(
          "pool2d",
          [](Graph& g, const std::string& fn, TensorId x, std::int64_t k, std::int64_t s, std::int64_t p,
             std::string name) { return g.pool2d(parse_reduce_fn(fn), x, k, s, p, std::move(name)); },
          py::arg("fn"), py::arg("x"), py::arg("kernel"), py::arg("stride"), py::arg("pad") = 0,
          py::arg("name") = "", "max or mean pooling over k x k windows.")
      .def(
          "gather", &Graph::gather, py::arg("x"), py::arg("index"), py::arg("axis"), py::arg("name") = "",
          "torch.gather: out[i] = x[i with i[axis] := index[i]]; index (integer) has x's shape off the axis.")
      .def("scatter_add", &Graph::scatter_add, py::arg("base"), py::arg("index"), py::arg("src"),
           py::arg("axis"), py::arg("name") = "",
           "torch.scatter_add: base, then out[i with i[axis] := index[i]] += src[i]; index and src share one "
           "shape, equal to base's off the axis.")
      .def(
          "topk",
          [](Graph& g, TensorId x, std::int64_t k, int axis, bool largest, std::string name) {
            auto [v, i] = g.topk(x, k, axis, largest, std::move(name));
            return std::make_pair(v, i);
          },
          py::arg("x"), py::arg("k"), py::arg("axis") = -1, py::arg("largest") = true, py::arg("name") = "",
          "(values, indices) of the k largest (or smallest) along axis, best first; ties: lower index first.")
      .def(
          "attention",
          [](Graph& g, TensorId q, TensorId k, TensorId v, std::optional<double> scale, bool causal,
             std::string name) {
            auto [out, lse] = g.attention(q, k, v, scale, causal, std::move(name));
            return std::make_pair(out, lse);
          },
          py::arg("q"), py::arg("k"), py::arg("v"), py::arg("scale") = py::none(), py::arg("causal") = false,
          py::arg("name") = "",
          "Fused attention: (out, lse) with out = softmax(scale * q @ k^T) @ v over q[..., s, d], "
          "k[..., t, d], v[..., t, e] and lse[..., s] (f32) the log-sum-exp of each score row; scale "
          "defaults to 1/sqrt(d); causal keeps key j <= query i (torch's is_causal). Its backward saves "
          "out and lse, not the s x t probabilities.")
      .def("opaque", &Graph::opaque, py::arg("inputs"), py::arg("shape"), py::arg("flops"),
           py::arg("name") = "",
           "An op the planner cannot split (replicated), with a given output shape and FLOPs.")
      // ---- outputs
      .def("set_loss", &Graph::set_loss, py::arg("t"))
      .def("mark_output", &Graph::mark_output, py::arg("t"))
      .def_property_readonly("loss", &Graph::loss)
      .def_property_readonly("outputs", &Graph::outputs)
      .def_property("name", &Graph::name, &Graph::set_name)
      // ---- inspection
      .def_property_readonly(
          "tensors",
          [](const Graph& g) {
            py::list l;
            for (std::size_t t = 0; t < g.tensors().size(); ++t)
              l.append(tensor_dict(g, static_cast<TensorId>(t)));
            return l;
          },
          "Dicts with id, name, shape, dtype, role, producer (op name or None), grad_of.")
      .def_property_readonly(
          "ops",
          [](const Graph& g) {
            py::list l;
            for (std::size_t o = 0; o < g.ops().size(); ++o) l.append(op_dict(g, static_cast<OpId>(o)));
            return l;
          },
          "Dicts with id, name, kind, inputs, outputs, attrs, flops, index_map (one-line form).")
      .def("tensor", &tensor_dict, py::arg("t"))
      .def("find", &Graph::find_tensor, py::arg("name"),
           "The id of the first tensor with this name, or None.")
      .def("grad", &Graph::grad, py::arg("t"),
           "The id of the gradient of tensor t (a training graph), or None.")
      .def("grad_of", &Graph::grad_of, py::arg("t"))
      .def("num_params", &Graph::num_params)
      .def("param_bytes", &Graph::param_bytes)
      .def(
          "flops",
          [](const Graph& g) { return g.loss() && !has_backward(g) ? training_flops(g) : g.flops(); },
          "Training FLOPs (forward + backward, no optimizer) of a forward graph with a loss; for a graph "
          "that "
          "already holds backward ops (or has no loss), the sum of its ops' FLOPs.")
      .def("forward_flops", &Graph::flops, "The sum of the FLOPs of the graph's ops as it is.")
      .def("training_flops", &training_flops, "Forward + backward FLOPs of a forward graph with a loss.")
      .def(
          "train_step",
          [](const Graph& g, const py::object& optimizer, double lr, double beta1, double beta2, double eps,
             std::int64_t step, double momentum, const py::object& master_weights) {
            TrainOptions o;
            o.optimizer = parse_optimizer(optimizer);
            o.lr = lr, o.beta1 = beta1, o.beta2 = beta2, o.eps = eps, o.step = step;
            o.momentum = momentum;
            if (!master_weights.is_none()) {
              // bool only: an int or a string here is more likely a mistake than a wish.
              if (!py::isinstance<py::bool_>(master_weights))
                throw py::type_error("train_step: master_weights must be None, True or False, got " +
                                     py::repr(master_weights).cast<std::string>());
              o.master_weights = master_weights.cast<bool>();
            }
            return build_training_graph(g, o);
          },
          py::arg("optimizer") = "adam", py::arg("lr") = 1e-3, py::arg("beta1") = 0.9,
          py::arg("beta2") = 0.999, py::arg("eps") = 1e-8, py::arg("step") = 1, py::arg("momentum") = 0.0,
          py::arg("master_weights") = py::none(),
          "The training-step graph: forward + backward + optimizer ('adam', 'sgd' or None: gradients only). "
          "momentum: SGD's heavy-ball momentum (0: none; > 0 adds one state per parameter). "
          "master_weights: None (auto) or True keeps an f32 master copy of every f16/bf16 parameter, "
          "updated in f32 with f32 optimizer states (mixed-precision Adam: 16 bytes per parameter); "
          "False updates half-precision parameters in their own dtype. f32/f64 parameters are their "
          "own master either way.")
      .def(
          "fingerprint", [](const Graph& g) { return graph_fingerprint(g); },
          "Content hash of the graph's structure (tensors, ops, shapes, dtypes, roles; not its name or "
          "values): what plans and programs record of the graph they were made for.")
      .def("validate", &Graph::validate)
      .def("dump", &Graph::dump)
      .def(
          "to_json",
          [](const Graph& g, std::optional<int> indent, const std::string& sidecar,
             const std::string& sidecar_ref, std::int64_t inline_limit) {
            JsonValueOptions vo;
            vo.sidecar_path = sidecar, vo.sidecar_ref = sidecar_ref, vo.inline_limit = inline_limit;
            return graph_to_json(g, indent.value_or(-1), vo);
          },
          py::arg("indent") = py::none(), py::arg("sidecar") = "", py::arg("sidecar_ref") = "",
          py::arg("inline_limit") = 4096,
          "The graph as JSON, with its values: inline, or, given `sidecar` (a .safetensors path), those of "
          "more than `inline_limit` elements in that file, named in the JSON as `sidecar_ref` (default: the "
          "path). See Graph.save.")
      .def_static("from_json", &graph_from_json, py::arg("text"), py::arg("base_dir") = "",
                  "Loads and validates a graph (ValueError on bad input); `base_dir` resolves relative "
                  "value-file paths.")
      .def("copy", [](const Graph& g) { return Graph(g); })
      .def("__eq__", [](const Graph& a, const Graph& b) { return a == b; })
      .def("__repr__", [](const Graph& g) {
        return "Graph('" + g.name() + "', " + std::to_string(g.ops().size()) + " ops, " +
               std::to_string(g.tensors().size()) + " tensors, " + std::to_string(g.num_params()) +
               " params)";
      });
  G.attr("__hash__") = py::none();
  // Shorthands for the common elementwise ops.
  for (const char* fn : {"relu", "gelu", "tanh", "exp", "log", "sigmoid", "sqrt", "rsqrt", "square", "neg"}) {
    UnaryFn f = parse_unary_fn(fn);
    G.def(
        fn, [f](Graph& g, TensorId x, std::string name) { return g.unary(f, x, std::move(name)); },
        py::arg("x"), py::arg("name") = "");
  }
  for (const char* fn : {"add", "sub", "mul", "div"}) {
    BinaryFn f = parse_binary_fn(fn);
    G.def(
        fn,
        [f](Graph& g, TensorId a, TensorId b, std::string name) {
          return g.binary(f, a, b, std::move(name));
        },
        py::arg("a"), py::arg("b"), py::arg("name") = "");
  }
  G.def(
      "maximum",
      [](Graph& g, TensorId a, TensorId b, std::string name) {
        return g.binary(BinaryFn::Max, a, b, std::move(name));
      },
      py::arg("a"), py::arg("b"), py::arg("name") = "");
  m.def(
      "interpret", &interpret_py, py::arg("graph"), py::arg("feeds"),
      "Runs the reference interpreter (float64). feeds: tensor name (or id) -> array for every leaf. Returns "
      "name -> array for every tensor (int tensors as int64; a name used by several tensors gets '@<id>').");
}
