// Validation and one-line printing of the zoo's config structs.
#include <fmt/format.h>

#include <cmath>

#include "weft/core/error.hpp"
#include "weft/models/models.hpp"

namespace weft::models {
namespace {

void positive(std::int64_t v, const std::string& model, const char* field) {
  WEFT_CHECK(v >= 1, "{} config: {} must be >= 1, got {}", model, field, v);
}

void floating(DType t, const std::string& model) {
  WEFT_CHECK(is_floating(t), "{} config: dtype must be a floating type, got {}", model, dtype_name(t));
}

void transformer(const std::string& model, std::int64_t layers, std::int64_t hidden, std::int64_t heads,
                 std::int64_t ffn, std::int64_t seq, std::int64_t vocab, std::int64_t batch, DType dt) {
  positive(layers, model, "layers");
  positive(hidden, model, "hidden");
  positive(heads, model, "heads");
  WEFT_CHECK(hidden % heads == 0, "{} config: hidden {} is not divisible by heads {}", model, hidden, heads);
  WEFT_CHECK(ffn >= 0, "{} config: ffn must be >= 0 (0 means the default), got {}", model, ffn);
  positive(seq, model, "seq");
  positive(vocab, model, "vocab");
  positive(batch, model, "batch");
  floating(dt, model);
}

void probability(double p, const std::string& model, const char* field) {
  WEFT_CHECK(std::isfinite(p) && p >= 0 && p < 1, "{} config: {} must be in [0, 1), got {}", model, field, p);
}

// ", dropout=0.1/0.1" when any dropout site is on.
std::string dropout_text(double hidden, double attention) {
  return hidden > 0 || attention > 0 ? fmt::format(" dropout={}/{}", hidden, attention) : std::string();
}

}  // namespace

void GptConfig::validate() const {
  transformer(name, layers, hidden, heads, ffn, seq, vocab, batch, dtype);
  probability(hidden_dropout, name, "hidden_dropout");
  probability(attention_dropout, name, "attention_dropout");
  WEFT_CHECK(!(fused_attention && attention_dropout > 0),
             "{} config: fused_attention has no dropout inside the fused op; set attention_dropout = 0 "
             "(got {})",
             name, attention_dropout);
  WEFT_CHECK(!causal || fused_attention,
             "{} config: causal attention is the fused op's mask; set fused_attention (the unfused zoo GPT "
             "has no mask)",
             name);
}

std::string GptConfig::to_string() const {
  return fmt::format(
      "GptConfig({}: layers={} hidden={} heads={} ffn={} seq={} vocab={} batch={} dtype={}{}{}{})", name,
      layers, hidden, heads, ffn_size(), seq, vocab, batch, dtype_name(dtype),
      dropout_text(hidden_dropout, attention_dropout), fused_attention ? " fused_attention" : "",
      causal ? " causal" : "");
}

void LlamaConfig::validate() const {
  transformer(name, layers, hidden, heads, ffn, seq, vocab, batch, dtype);
  positive(ffn, name, "ffn");
  positive(kv_heads, name, "kv_heads");
  WEFT_CHECK(
      heads % kv_heads == 0,
      "{} config: heads {} is not divisible by kv_heads {} (each key/value head serves heads / kv_heads "
      "query heads)",
      name, heads, kv_heads);
  WEFT_CHECK(head_dim() % 2 == 0, "{} config: the head dim hidden / heads = {} must be even (rotary pairs)",
             name, head_dim());
  WEFT_CHECK(std::isfinite(rope_theta) && rope_theta > 1,
             "{} config: rope_theta must be a finite number > 1, got {}", name, rope_theta);
  WEFT_CHECK(std::isfinite(norm_eps) && norm_eps > 0, "{} config: norm_eps must be a positive number, got {}",
             name, norm_eps);
}

std::string LlamaConfig::to_string() const {
  return fmt::format(
      "LlamaConfig({}: layers={} hidden={} heads={} kv_heads={} ffn={} seq={} vocab={} batch={} dtype={} "
      "rope_theta={} norm_eps={}{})",
      name, layers, hidden, heads, kv_heads, ffn, seq, vocab, batch, dtype_name(dtype), rope_theta, norm_eps,
      fused_attention ? " fused_attention" : "");
}

void MoeConfig::validate() const {
  transformer(name, layers, hidden, heads, ffn, seq, vocab, batch, dtype);
  WEFT_CHECK(experts >= 2, "{} config: top-2 gating needs experts >= 2, got {}", name, experts);
  positive(moe_every, name, "moe_every");
  WEFT_CHECK(std::isfinite(capacity_factor) && capacity_factor > 0,
             "{} config: capacity_factor must be a positive number, got {}", name, capacity_factor);
}

std::int64_t MoeConfig::capacity() const {
  return std::max<std::int64_t>(
      1, static_cast<std::int64_t>(
             std::ceil(2.0 * static_cast<double>(seq) * capacity_factor / static_cast<double>(experts))));
}

std::string MoeConfig::to_string() const {
  return fmt::format(
      "MoeConfig({}: layers={} hidden={} heads={} ffn={} experts={} moe_every={} capacity={} seq={} vocab={} "
      "batch={} dtype={})",
      name, layers, hidden, heads, ffn_size(), experts, moe_every, capacity(), seq, vocab, batch,
      dtype_name(dtype));
}

void WideResNetConfig::validate() const {
  WEFT_CHECK(layers == 50 || layers == 101, "{} config: layers must be 50 or 101, got {}", name, layers);
  positive(channels, name, "channels");
  positive(width_factor, name, "width_factor");
  positive(classes, name, "classes");
  positive(batch, name, "batch");
  WEFT_CHECK(image >= 32, "{} config: image must be >= 32 (five stride-2 stages), got {}", name, image);
  floating(dtype, name);
}

std::string WideResNetConfig::to_string() const {
  return fmt::format(
      "WideResNetConfig({}: layers={} channels={} width_factor={} classes={} image={} batch={} dtype={})",
      name, layers, channels, width_factor, classes, image, batch, dtype_name(dtype));
}

void UNetConfig::validate() const {
  positive(base_channels, name, "base_channels");
  positive(depth, name, "depth");
  WEFT_CHECK(depth <= 10, "{} config: depth must be <= 10, got {}", name, depth);
  positive(in_channels, name, "in_channels");
  positive(classes, name, "classes");
  positive(batch, name, "batch");
  positive(image, name, "image");
  WEFT_CHECK(image % (std::int64_t{1} << depth) == 0, "{} config: image {} must be divisible by 2^depth = {}",
             name, image, std::int64_t{1} << depth);
  floating(dtype, name);
}

std::string UNetConfig::to_string() const {
  return fmt::format(
      "UNetConfig({}: base_channels={} depth={} in_channels={} classes={} image={} batch={} dtype={})", name,
      base_channels, depth, in_channels, classes, image, batch, dtype_name(dtype));
}

void Vgg19Config::validate() const {
  positive(classes, name, "classes");
  positive(batch, name, "batch");
  WEFT_CHECK(image >= 32 && image % 32 == 0, "{} config: image must be a positive multiple of 32, got {}",
             name, image);
  floating(dtype, name);
}

std::string Vgg19Config::to_string() const {
  return fmt::format("Vgg19Config({}: classes={} image={} batch={} dtype={})", name, classes, image, batch,
                     dtype_name(dtype));
}

void BertConfig::validate() const {
  transformer(name, layers, hidden, heads, ffn, seq, vocab, batch, dtype);
  positive(type_vocab, name, "type_vocab");
  probability(hidden_dropout, name, "hidden_dropout");
  probability(attention_dropout, name, "attention_dropout");
}

std::string BertConfig::to_string() const {
  return fmt::format(
      "BertConfig({}: layers={} hidden={} heads={} ffn={} seq={} vocab={} type_vocab={} batch={} dtype={}{})",
      name, layers, hidden, heads, ffn_size(), seq, vocab, type_vocab, batch, dtype_name(dtype),
      dropout_text(hidden_dropout, attention_dropout));
}

}  // namespace weft::models
