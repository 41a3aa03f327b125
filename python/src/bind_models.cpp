// Bindings of weft/models: the zoo's builders (returning weft.Graph, the type bind_ir registers),
// preset lookup and Megatron's FLOPs formula, in the submodule _weft.models. The Pythonic
// signatures (preset name or explicit config) live in python/weft/models.py.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "weft/core/dtype.hpp"
#include "weft/models/models.hpp"

namespace py = pybind11;
using namespace weft::models;
using i64 = std::int64_t;

namespace {

py::dict config_dict(const std::string& preset) {
  const Preset& p = find_preset(preset);
  py::dict d;
  d["name"] = p.name;
  d["family"] = p.family;
  if (p.family == "gpt") {
    auto c = gpt_config(preset);
    d["layers"] = c.layers, d["hidden"] = c.hidden, d["heads"] = c.heads, d["ffn"] = c.ffn_size();
    d["seq"] = c.seq, d["vocab"] = c.vocab;
    d["hidden_dropout"] = c.hidden_dropout, d["attention_dropout"] = c.attention_dropout;
  } else if (p.family == "moe") {
    auto c = moe_config(preset);
    d["layers"] = c.layers, d["hidden"] = c.hidden, d["heads"] = c.heads, d["ffn"] = c.ffn_size();
    d["experts"] = c.experts, d["moe_every"] = c.moe_every, d["capacity"] = c.capacity();
    d["seq"] = c.seq, d["vocab"] = c.vocab;
  } else if (p.family == "wide_resnet") {
    auto c = wide_resnet_config(preset);
    d["layers"] = c.layers, d["channels"] = c.channels, d["width_factor"] = c.width_factor;
    d["classes"] = c.classes, d["image"] = c.image;
  } else if (p.family == "unet") {
    auto c = unet_config(preset);
    d["base_channels"] = c.base_channels, d["depth"] = c.depth, d["in_channels"] = c.in_channels;
    d["classes"] = c.classes, d["image"] = c.image;
  } else if (p.family == "vgg19") {
    auto c = vgg19_config(preset);
    d["classes"] = c.classes, d["image"] = c.image;
  } else if (p.family == "llama") {
    auto c = llama_config(preset);
    d["layers"] = c.layers, d["hidden"] = c.hidden, d["heads"] = c.heads, d["kv_heads"] = c.kv_heads;
    d["ffn"] = c.ffn, d["seq"] = c.seq, d["vocab"] = c.vocab, d["rope_theta"] = c.rope_theta;
    d["norm_eps"] = c.norm_eps;
  } else {
    auto c = bert_config(preset);
    d["layers"] = c.layers, d["hidden"] = c.hidden, d["heads"] = c.heads, d["ffn"] = c.ffn_size();
    d["seq"] = c.seq, d["vocab"] = c.vocab, d["type_vocab"] = c.type_vocab;
    d["hidden_dropout"] = c.hidden_dropout, d["attention_dropout"] = c.attention_dropout;
  }
  return d;
}

LlamaConfig llama_cfg(const std::string& name, i64 layers, i64 hidden, i64 heads, i64 kv_heads, i64 ffn,
                      i64 seq, i64 vocab, i64 batch, const std::string& dtype, bool fused_attention,
                      double rope_theta, double norm_eps) {
  LlamaConfig c;
  c.name = name, c.layers = layers, c.hidden = hidden, c.heads = heads, c.kv_heads = kv_heads, c.ffn = ffn;
  c.seq = seq, c.vocab = vocab, c.batch = batch, c.dtype = weft::parse_dtype(dtype);
  c.fused_attention = fused_attention, c.rope_theta = rope_theta, c.norm_eps = norm_eps;
  return c;
}

}  // namespace

void bind_models(py::module_& root) {
  py::module_ m = root.def_submodule("models", "weft's model zoo (see weft.models)");
  m.def(
      "presets",
      [] {
        py::list out;
        for (const auto& p : presets()) {
          py::dict d;
          d["name"] = p.name, d["family"] = p.family, d["named_params"] = p.named_params,
          d["source"] = p.source;
          out.append(d);
        }
        return out;
      },
      "The papers' named configurations: name, family, named_params, source.");
  m.def("preset_config", &config_dict, py::arg("name"), "The config fields of a preset (aliases accepted).");
  m.def(
      "build_preset",
      [](const std::string& name, i64 batch, const std::string& dtype) {
        return build_preset(name, batch, weft::parse_dtype(dtype));
      },
      py::arg("name"), py::arg("batch") = 1, py::arg("dtype") = "f32");
  m.def(
      "gpt",
      [](const std::string& name, i64 layers, i64 hidden, i64 heads, i64 ffn, i64 seq, i64 vocab, i64 batch,
         const std::string& dtype, bool fused_attention, double hidden_dropout, double attention_dropout,
         bool causal) {
        GptConfig c;
        c.name = name, c.layers = layers, c.hidden = hidden, c.heads = heads, c.ffn = ffn, c.seq = seq;
        c.vocab = vocab, c.batch = batch, c.dtype = weft::parse_dtype(dtype);
        c.fused_attention = fused_attention, c.causal = causal;
        c.hidden_dropout = hidden_dropout, c.attention_dropout = attention_dropout;
        return gpt(c);
      },
      py::arg("name"), py::arg("layers"), py::arg("hidden"), py::arg("heads"), py::arg("ffn"), py::arg("seq"),
      py::arg("vocab"), py::arg("batch"), py::arg("dtype"), py::arg("fused_attention") = false,
      py::arg("hidden_dropout") = 0.0, py::arg("attention_dropout") = 0.0, py::arg("causal") = false);
  m.def(
      "moe",
      [](const std::string& name, i64 layers, i64 hidden, i64 heads, i64 ffn, i64 experts, i64 moe_every,
         double capacity_factor, i64 seq, i64 vocab, i64 batch, const std::string& dtype) {
        MoeConfig c;
        c.name = name, c.layers = layers, c.hidden = hidden, c.heads = heads, c.ffn = ffn,
        c.experts = experts;
        c.moe_every = moe_every, c.capacity_factor = capacity_factor, c.seq = seq, c.vocab = vocab;
        c.batch = batch, c.dtype = weft::parse_dtype(dtype);
        return moe(c);
      },
      py::arg("name"), py::arg("layers"), py::arg("hidden"), py::arg("heads"), py::arg("ffn"),
      py::arg("experts"), py::arg("moe_every"), py::arg("capacity_factor"), py::arg("seq"), py::arg("vocab"),
      py::arg("batch"), py::arg("dtype"));
  m.def(
      "wide_resnet",
      [](const std::string& name, i64 layers, i64 channels, i64 width_factor, i64 classes, i64 image,
         i64 batch, const std::string& dtype) {
        WideResNetConfig c;
        c.name = name, c.layers = layers, c.channels = channels, c.width_factor = width_factor;
        c.classes = classes, c.image = image, c.batch = batch, c.dtype = weft::parse_dtype(dtype);
        return wide_resnet(c);
      },
      py::arg("name"), py::arg("layers"), py::arg("channels"), py::arg("width_factor"), py::arg("classes"),
      py::arg("image"), py::arg("batch"), py::arg("dtype"));
  m.def(
      "unet",
      [](const std::string& name, i64 base_channels, i64 depth, i64 in_channels, i64 classes, i64 image,
         i64 batch, const std::string& dtype) {
        UNetConfig c;
        c.name = name, c.base_channels = base_channels, c.depth = depth, c.in_channels = in_channels;
        c.classes = classes, c.image = image, c.batch = batch, c.dtype = weft::parse_dtype(dtype);
        return unet(c);
      },
      py::arg("name"), py::arg("base_channels"), py::arg("depth"), py::arg("in_channels"), py::arg("classes"),
      py::arg("image"), py::arg("batch"), py::arg("dtype"));
  m.def(
      "vgg19",
      [](const std::string& name, i64 classes, i64 image, i64 batch, const std::string& dtype) {
        Vgg19Config c;
        c.name = name, c.classes = classes, c.image = image, c.batch = batch,
        c.dtype = weft::parse_dtype(dtype);
        return vgg19(c);
      },
      py::arg("name"), py::arg("classes"), py::arg("image"), py::arg("batch"), py::arg("dtype"));
  m.def(
      "bert",
      [](const std::string& name, i64 layers, i64 hidden, i64 heads, i64 ffn, i64 seq, i64 vocab,
         i64 type_vocab, i64 batch, const std::string& dtype, double hidden_dropout,
         double attention_dropout) {
        BertConfig c;
        c.name = name, c.layers = layers, c.hidden = hidden, c.heads = heads, c.ffn = ffn, c.seq = seq;
        c.vocab = vocab, c.type_vocab = type_vocab, c.batch = batch, c.dtype = weft::parse_dtype(dtype);
        c.hidden_dropout = hidden_dropout, c.attention_dropout = attention_dropout;
        return bert(c);
      },
      py::arg("name"), py::arg("layers"), py::arg("hidden"), py::arg("heads"), py::arg("ffn"), py::arg("seq"),
      py::arg("vocab"), py::arg("type_vocab"), py::arg("batch"), py::arg("dtype"),
      py::arg("hidden_dropout") = 0.0, py::arg("attention_dropout") = 0.0);
  m.def(
      "llama",
      [](const std::string& name, i64 layers, i64 hidden, i64 heads, i64 kv_heads, i64 ffn, i64 seq,
         i64 vocab, i64 batch, const std::string& dtype, bool fused_attention, double rope_theta,
         double norm_eps) {
        return llama(llama_cfg(name, layers, hidden, heads, kv_heads, ffn, seq, vocab, batch, dtype,
                               fused_attention, rope_theta, norm_eps));
      },
      py::arg("name"), py::arg("layers"), py::arg("hidden"), py::arg("heads"), py::arg("kv_heads"),
      py::arg("ffn"), py::arg("seq"), py::arg("vocab"), py::arg("batch"), py::arg("dtype"),
      py::arg("fused_attention"), py::arg("rope_theta"), py::arg("norm_eps"));
  m.def(
      "llama_flops",
      [](const std::string& name, i64 layers, i64 hidden, i64 heads, i64 kv_heads, i64 ffn, i64 seq,
         i64 vocab, i64 batch, double rope_theta, double norm_eps) {
        return llama_flops(llama_cfg(name, layers, hidden, heads, kv_heads, ffn, seq, vocab, batch, "f32",
                                     false, rope_theta, norm_eps));
      },
      py::arg("name"), py::arg("layers"), py::arg("hidden"), py::arg("heads"), py::arg("kv_heads"),
      py::arg("ffn"), py::arg("seq"), py::arg("vocab"), py::arg("batch"), py::arg("rope_theta"),
      py::arg("norm_eps"),
      "A Llama step's model FLOPs: 6·N·T + 12·L·h·s·T (N: every parameter but the embedding table).");
  m.def(
      "megatron_flops",
      [](i64 layers, i64 hidden, i64 seq, i64 vocab, i64 batch) {
        GptConfig c;
        c.layers = layers, c.hidden = hidden, c.heads = 1, c.seq = seq, c.vocab = vocab, c.batch = batch;
        return megatron_flops(c);
      },
      py::arg("layers"), py::arg("hidden"), py::arg("seq"), py::arg("vocab"), py::arg("batch"),
      "Megatron-LM's model FLOPs of a GPT training step: 72·B·S·L·h²·(1 + S/(6h) + V/(12·L·h)).");
}
