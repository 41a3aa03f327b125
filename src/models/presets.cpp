// The papers' named configurations. Sources: Rhino Tables 1-4 (GPT, MoE, VGG19/UNet,
// Wide-ResNet), Megatron-LM / Alpa's GPT suite for the larger GPTs, Alpa's MoE suite for the
// FFN size (8h) and the every-other-layer MoE placement; S = 1024, V = 51200 (GPT) / 32000 (MoE);
// Llama 2 / 3 from Meta's papers and published config.json files (kLlama below).
// Where a table's printed config cannot give the printed size (Wide-ResNet, U-Net-33M), the
// preset keeps the architecture and changes the channel count; docs/modules/models.md says why.
#include <algorithm>
#include <array>

#include "weft/core/error.hpp"
#include "weft/models/models.hpp"

namespace weft::models {
namespace {

struct GptRow {
  const char* name;
  std::int64_t layers, hidden, heads;
};
constexpr std::array<GptRow, 8> kGpt{{{"GPT-Medium", 24, 1024, 16},
                                      {"GPT-Large", 24, 1536, 16},
                                      {"GPT-XL", 24, 2048, 32},
                                      {"GPT-2.7B", 32, 2560, 32},
                                      {"GPT-6.7B", 32, 4096, 32},
                                      {"GPT-15B", 48, 5120, 40},
                                      {"GPT-39B", 48, 8192, 64},
                                      {"GPT-175B", 96, 12288, 96}}};

struct MoeRow {
  const char* name;
  std::int64_t layers, hidden, heads, experts;
};
constexpr std::array<MoeRow, 5> kMoe{{{"MoE-8E-380M", 8, 768, 16, 8},
                                      {"MoE-8E-760M", 16, 768, 16, 8},
                                      {"MoE-16E-1.3B", 16, 768, 16, 16},
                                      {"MoE-16E-2.4B", 16, 1024, 16, 16},
                                      {"MoE-32E-10B", 16, 1536, 16, 32}}};

struct WrnRow {
  const char* name;
  std::int64_t layers, channels, width_factor;
};
// Rhino's Table 4 prints (channels, width) = (320,2), (448,2), (640,2), (320,12); with Alpa's
// model those give 1.01B, 1.97B, 4.00B and 9.55B. We keep layers and width factor and pick the
// stem channels that give the printed sizes.
constexpr std::array<WrnRow, 4> kWrn{
    {{"WR-1.3B", 50, 360, 2}, {"WR-2.6B", 50, 512, 2}, {"WR-6B", 50, 784, 2}, {"WR-12B", 101, 360, 12}}};

struct UnetRow {
  const char* name;
  std::int64_t base_channels;
};
constexpr std::array<UnetRow, 2> kUnet{{{"UNet-33M", 66}, {"UNet-768M", 320}}};

// Llama: the published model cards' config.json / the papers' tables (layers, hidden, heads, kv
// heads, FFN, vocab, rope θ, training context):
//   Llama 2 (Touvron et al. 2023, Table 1 and meta-llama/Llama-2-*-hf config.json): 7B and 13B
//   multi-head (kv = heads), 70B grouped-query with 8 kv heads; FFN 11008 / 13824 / 28672; vocab
//   32000; θ 10000; context 4096.
//   Llama 3 ("The Llama 3 Herd of Models", Llama Team, AI @ Meta 2024, arXiv:2407.21783, Table 3 and
//   meta-llama/Meta-Llama-3-8B / -70B, Llama-3.1-405B config.json): 8 kv heads throughout; FFN
//   14336 / 28672 / 53248; vocab 128256 (128K tokens, the config's exact size); θ 500000; context
//   8192 (the pre-training length; 3.1's long-context rope scaling changes the tables' values only).
struct LlamaRow {
  const char* name;
  std::int64_t layers, hidden, heads, kv_heads, ffn, vocab, seq;
  double rope_theta, named;
};
constexpr std::array<LlamaRow, 6> kLlama{
    {{"llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, 1e4, 7e9},
     {"llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, 1e4, 13e9},
     {"llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, 1e4, 70e9},
     {"llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 5e5, 8e9},
     {"llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 5e5, 70e9},
     {"llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192, 5e5, 405e9}}};

struct Alias {
  const char* alias;
  const char* name;
};
constexpr std::array<Alias, 12> kAliases{{{"llama3.1-8b", "llama3-8b"},
                                          {"llama3.1-70b", "llama3-70b"},
                                          {"llama3.1-405b", "llama3-405b"},
                                          {"GPT-350M", "GPT-Medium"},
                                          {"GPT-760M", "GPT-Large"},
                                          {"GPT-1.3B", "GPT-XL"},
                                          {"GPT-3", "GPT-175B"},
                                          {"GPT-3-175B", "GPT-175B"},
                                          {"GPT-3 175B", "GPT-175B"},
                                          {"MoE-380M", "MoE-8E-380M"},
                                          {"MoE-10B", "MoE-32E-10B"},
                                          {"VGG19-1M", "VGG19-4.2B"}}};

std::vector<Preset> make_presets() {
  const char* rhino_gpt = "Rhino Table 1 / Megatron-LM (L, h, heads; ffn 4h; S 1024, V 51200)";
  const char* megatron = "Megatron-LM / Alpa GPT suite (L, h, heads; ffn 4h; S 1024, V 51200)";
  const std::array<double, 8> gpt_named{350e6, 760e6, 1.3e9, 2.7e9, 6.7e9, 15e9, 39e9, 175e9};
  std::vector<Preset> v;
  for (std::size_t i = 0; i < kGpt.size(); ++i)
    v.push_back({kGpt[i].name, "gpt", gpt_named[i], i < 5 ? rhino_gpt : megatron});
  const std::array<double, 5> moe_named{380e6, 760e6, 1.3e9, 2.4e9, 10e9};
  for (std::size_t i = 0; i < kMoe.size(); ++i)
    v.push_back({kMoe[i].name, "moe", moe_named[i],
                 "Rhino Table 2 / Alpa MoE suite (ffn 8h, MoE every other layer, top-2; S 1024, V 32000)"});
  const std::array<double, 4> wrn_named{1.3e9, 2.6e9, 6e9, 12e9};
  for (std::size_t i = 0; i < kWrn.size(); ++i)
    v.push_back({kWrn[i].name, "wide_resnet", wrn_named[i],
                 "Rhino Table 4 (layers, width factor; channels re-fit to the named size), Alpa's model"});
  v.push_back({"UNet-33M", "unet", 33e6, "Rhino Table 3 (size only; classic U-Net, base channels fit)"});
  v.push_back({"UNet-768M", "unet", 768e6, "classic U-Net with base channels 320"});
  v.push_back({"VGG19", "vgg19", 143.7e6, "Simonyan & Zisserman configuration E, 1000 classes"});
  v.push_back({"VGG19-4.2B", "vgg19", 4.2e9, "Rhino Table 3: VGG19 with a 1,000,000-class classifier"});
  v.push_back({"BERT-large", "bert", 340e6, "Devlin et al.: L24 h1024 a16, vocab 30522, seq 512"});
  for (const auto& r : kLlama)
    v.push_back({r.name, "llama", r.named,
                 r.vocab == 32000
                     ? "Touvron et al. 2023 (Llama 2) Table 1 / Llama-2 config.json (θ 1e4, S 4096)"
                     : "Llama 3 Herd of Models Table 3 / Llama-3(.1) config.json (θ 5e5, S 8192)"});
  return v;
}

std::string_view canonical(std::string_view name) {
  for (const auto& a : kAliases)
    if (name == a.alias) return a.name;
  return name;
}

template <typename Row, std::size_t N>
const Row& row(const std::array<Row, N>& rows, std::string_view name, const char* family) {
  const Preset& p = find_preset(name);
  WEFT_CHECK(p.family == family, "preset '{}' is a {} model, not {}", name, p.family, family);
  for (const auto& r : rows)
    if (p.name == r.name) return r;
  throw InternalError("preset without a config row");
}

}  // namespace

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = make_presets();
  return all;
}

const Preset& find_preset(std::string_view name) {
  std::string_view n = canonical(name);
  for (const auto& p : presets())
    if (p.name == n) return p;
  std::string known;
  for (const auto& p : presets()) known += (known.empty() ? "" : ", ") + p.name;
  fail("unknown model preset '{}' (known: {})", name, known);
}

// GPT-2 (Radford et al. 2019, as GPT-1: residual, embedding and attention dropout 0.1), GPT-3
// (Brown et al. 2020 trains as GPT-2), Megatron-LM (hidden_dropout = attention_dropout = 0.1, its
// default arguments) and BERT (Devlin et al.: 0.1 on all layers): the presets train with 0.1.
constexpr double kPaperDropout = 0.1;

GptConfig gpt_config(std::string_view preset, std::int64_t batch, DType dtype) {
  const auto& r = row(kGpt, preset, "gpt");
  GptConfig c;
  c.name = r.name, c.layers = r.layers, c.hidden = r.hidden, c.heads = r.heads, c.batch = batch,
  c.dtype = dtype;
  c.hidden_dropout = c.attention_dropout = kPaperDropout;
  c.validate();
  return c;
}

MoeConfig moe_config(std::string_view preset, std::int64_t batch, DType dtype) {
  const auto& r = row(kMoe, preset, "moe");
  MoeConfig c;
  c.name = r.name, c.layers = r.layers, c.hidden = r.hidden, c.heads = r.heads, c.experts = r.experts;
  c.batch = batch, c.dtype = dtype;
  c.validate();
  return c;
}

WideResNetConfig wide_resnet_config(std::string_view preset, std::int64_t batch, DType dtype) {
  const auto& r = row(kWrn, preset, "wide_resnet");
  WideResNetConfig c;
  c.name = r.name, c.layers = r.layers, c.channels = r.channels, c.width_factor = r.width_factor;
  c.batch = batch, c.dtype = dtype;
  c.validate();
  return c;
}

UNetConfig unet_config(std::string_view preset, std::int64_t batch, DType dtype) {
  const auto& r = row(kUnet, preset, "unet");
  UNetConfig c;
  c.name = r.name, c.base_channels = r.base_channels, c.batch = batch, c.dtype = dtype;
  c.validate();
  return c;
}

Vgg19Config vgg19_config(std::string_view preset, std::int64_t batch, DType dtype) {
  const Preset& p = find_preset(preset);
  WEFT_CHECK(p.family == "vgg19", "preset '{}' is a {} model, not vgg19", preset, p.family);
  Vgg19Config c;
  c.name = p.name, c.classes = p.name == "VGG19" ? 1000 : 1'000'000, c.batch = batch, c.dtype = dtype;
  c.validate();
  return c;
}

BertConfig bert_config(std::string_view preset, std::int64_t batch, DType dtype) {
  const Preset& p = find_preset(preset);
  WEFT_CHECK(p.family == "bert", "preset '{}' is a {} model, not bert", preset, p.family);
  BertConfig c;
  c.name = p.name, c.batch = batch, c.dtype = dtype;
  c.hidden_dropout = c.attention_dropout = kPaperDropout;
  c.validate();
  return c;
}

LlamaConfig llama_config(std::string_view preset, std::int64_t batch, DType dtype) {
  const auto& r = row(kLlama, preset, "llama");
  LlamaConfig c;
  c.name = r.name, c.layers = r.layers, c.hidden = r.hidden, c.heads = r.heads, c.kv_heads = r.kv_heads;
  c.ffn = r.ffn, c.vocab = r.vocab, c.seq = r.seq, c.rope_theta = r.rope_theta;
  c.batch = batch, c.dtype = dtype;
  c.validate();
  return c;
}

ir::Graph gpt_preset(std::string_view preset, std::int64_t batch, DType dtype) {
  return gpt(gpt_config(preset, batch, dtype));
}

ir::Graph moe_preset(std::string_view preset, std::int64_t batch, DType dtype) {
  return moe(moe_config(preset, batch, dtype));
}

ir::Graph build_preset(std::string_view preset, std::int64_t batch, DType dtype) {
  const std::string& f = find_preset(preset).family;
  if (f == "gpt") return gpt(gpt_config(preset, batch, dtype));
  if (f == "moe") return moe(moe_config(preset, batch, dtype));
  if (f == "wide_resnet") return wide_resnet(wide_resnet_config(preset, batch, dtype));
  if (f == "unet") return unet(unet_config(preset, batch, dtype));
  if (f == "vgg19") return vgg19(vgg19_config(preset, batch, dtype));
  if (f == "llama") return llama(llama_config(preset, batch, dtype));
  return bert(bert_config(preset, batch, dtype));
}

}  // namespace weft::models
