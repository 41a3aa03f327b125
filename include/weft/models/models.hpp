#pragma once
// The model zoo: forward graphs (with a scalar loss) of the models the papers evaluate, built on
// the IR with the configurations of their tables (Rhino Tables 1-4, Alpa's benchmark suites).
// Every builder takes a config struct (validated: weft::Error on a bad field) and returns an
// ir::Graph; ir::build_training_graph turns it into a training step. Presets name the papers'
// configurations ("GPT-2.7B", "MoE-16E-2.4B", "WR-6B", ...); docs/modules/models.md lists each
// preset's config and its computed parameter count against the named one.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "weft/core/dtype.hpp"
#include "weft/ir/graph.hpp"

namespace weft::models {

// GPT (Megatron-LM / Alpa): pre-LN decoder blocks, fused QKV, FFN = 4h with GeLU, learned
// position embedding, logits through the tied token embedding, cross-entropy on i32 labels.
struct GptConfig {
  std::string name = "gpt";
  std::int64_t layers = 24, hidden = 1024, heads = 16;
  std::int64_t ffn = 0;  // 0: 4 * hidden
  std::int64_t seq = 1024, vocab = 51200, batch = 1;
  DType dtype = DType::F32;
  // Attention as the IR's fused op (ir::OpKind::Attention: out and the log-sum-exp saved, not
  // the s x s probabilities) instead of einsum-softmax-einsum; the same function (no mask).
  // The fused op has no dropout: it needs attention_dropout = 0.
  bool fused_attention = false;
  // A causal mask in the fused op (a query sees the keys up to its own position; flash attention
  // then computes the unmasked pairs only: about half the work). A GPT is a causal LM; the flag
  // is off by default so that the fused and unfused forms stay the same function (the unfused
  // zoo GPT has no mask: causal needs fused_attention).
  bool causal = false;
  // Training-mode dropout as Megatron-LM places it (ir::OpKind::Dropout, one seed per site):
  // hidden_dropout on the embedding's output and on the attention's and the FFN's outputs before
  // each residual add; attention_dropout on the softmax probabilities. 0 leaves the site out.
  // The presets carry the papers' 0.1 (GPT-2 / GPT-3 / Megatron-LM).
  double hidden_dropout = 0.0, attention_dropout = 0.0;
  void validate() const;  // weft::Error naming the bad field
  std::int64_t ffn_size() const { return ffn > 0 ? ffn : 4 * hidden; }
  std::string to_string() const;
  bool operator==(const GptConfig&) const = default;
};

// Llama (Touvron et al. 2023, "Llama 2"; "The Llama 3 Herd of Models", Llama Team, AI @ Meta 2024,
// arXiv:2407.21783): pre-norm decoder blocks with RMSNorm (x · rsqrt(mean(x²) + eps) · g, no bias),
// grouped-query attention (separate q [h, n·d], k and v [h, kv·d], o [n·d, h] projections; k and v repeated
// to the query heads, as Hugging Face's repeat_kv), rotary position embedding on q and k (x·cos +
// rotate_half(x)·sin, the cos / sin tables Constant leaves with their values), a SwiGLU MLP (down(silu(gate
// x) · up x)), an untied LM head, no biases anywhere, causal attention, cross-entropy on i32 labels.
struct LlamaConfig {
  std::string name = "llama";
  std::int64_t layers = 32, hidden = 4096, heads = 32;
  std::int64_t kv_heads = 8;  // heads % kv_heads == 0; kv_heads == heads is multi-head attention
  std::int64_t ffn = 14336;   // the SwiGLU hidden size (given: Llama rounds 8h/3 · multiplier up)
  std::int64_t seq = 8192, vocab = 128256, batch = 1;
  DType dtype = DType::F32;
  double rope_theta = 500000.0;  // Llama 3; Llama 2: 10000
  double norm_eps = 1e-5;        // RMSNorm's eps (both generations' configs)
  // Attention as the IR's fused op with causal = true (out and the log-sum-exp saved, not the
  // s x s probabilities) instead of einsum-softmax-einsum with a causal mask; the same function.
  bool fused_attention = false;
  void validate() const;  // weft::Error naming the bad field
  std::int64_t head_dim() const { return hidden / heads; }
  std::string to_string() const;
  bool operator==(const LlamaConfig&) const = default;
};

// GShard MoE (Alpa's suite): GPT-like blocks where every `moe_every`-th block (the odd ones for
// 2) replaces its FFN by `experts` expert FFNs with top-2 gating; expert capacity
// ceil(2 * seq * capacity_factor / experts); one routing group per sequence.
struct MoeConfig {
  std::string name = "moe";
  std::int64_t layers = 8, hidden = 768, heads = 16;
  std::int64_t ffn = 0;  // 0: 8 * hidden (Alpa's MoE suite)
  std::int64_t experts = 8;
  std::int64_t moe_every = 2;
  double capacity_factor = 1.0;
  std::int64_t seq = 1024, vocab = 32000, batch = 1;
  DType dtype = DType::F32;
  void validate() const;
  std::int64_t ffn_size() const { return ffn > 0 ? ffn : 8 * hidden; }
  std::int64_t capacity() const;  // tokens per expert per group
  std::string to_string() const;
  bool operator==(const MoeConfig&) const = default;
};

// Wide-ResNet (Alpa's Flax model): ResNet-50/101 bottleneck blocks whose 3x3 conv has
// width_factor times the block's base filters; `channels` is the stem's filter count.
// BatchNorm is modelled as a per-channel affine scale and shift (2 parameters per channel).
struct WideResNetConfig {
  std::string name = "wide_resnet";
  std::int64_t layers = 50;  // 50 or 101
  std::int64_t channels = 320, width_factor = 2;
  std::int64_t classes = 1024, image = 224, batch = 1;
  DType dtype = DType::F32;
  void validate() const;
  std::string to_string() const;
  bool operator==(const WideResNetConfig&) const = default;
};

// U-Net (Ronneberger et al.): `depth` down levels of two 3x3 conv + BN + ReLU with 2x2 max
// pooling, a bottleneck, then `depth` up levels of a 2x2 stride-2 transposed conv, a concat
// with the encoder's skip tensor of that level (the long skip connection) and two 3x3 convs; a
// final 1x1 conv to `classes` per-pixel logits. Padded convs: spatial sizes halve exactly.
struct UNetConfig {
  std::string name = "unet";
  std::int64_t base_channels = 64, depth = 4, in_channels = 3, classes = 2;
  std::int64_t image = 256, batch = 1;
  DType dtype = DType::F32;
  void validate() const;
  std::string to_string() const;
  bool operator==(const UNetConfig&) const = default;
};

// VGG19 (configuration E) with 3x3 convs + bias + ReLU, 5 max pools, FC 4096-4096-classes.
// classes = 1'000'000 gives the million-way classifier of Whale's and Rhino's experiments.
struct Vgg19Config {
  std::string name = "vgg19";
  std::int64_t classes = 1000, image = 224, batch = 1;
  DType dtype = DType::F32;
  void validate() const;
  std::string to_string() const;
  bool operator==(const Vgg19Config&) const = default;
};

// BERT (post-LN encoder): token + position + segment embeddings with LN, blocks of attention
// and a 4h GeLU FFN, the masked-LM head (dense + GeLU + LN, decoder tied to the token
// embedding, output bias) and cross-entropy over every position. No pooler / NSP head.
struct BertConfig {
  std::string name = "bert";
  std::int64_t layers = 24, hidden = 1024, heads = 16;
  std::int64_t ffn = 0;  // 0: 4 * hidden
  std::int64_t seq = 512, vocab = 30522, type_vocab = 2, batch = 1;
  DType dtype = DType::F32;
  // Dropout at BERT's sites (after the embeddings' LN, on the attention probabilities, on the
  // attention's and the FFN's outputs before each residual add); the preset carries BERT's 0.1.
  double hidden_dropout = 0.0, attention_dropout = 0.0;
  void validate() const;
  std::int64_t ffn_size() const { return ffn > 0 ? ffn : 4 * hidden; }
  std::string to_string() const;
  bool operator==(const BertConfig&) const = default;
};

ir::Graph gpt(const GptConfig& config);
ir::Graph llama(const LlamaConfig& config);
ir::Graph moe(const MoeConfig& config);
ir::Graph wide_resnet(const WideResNetConfig& config);
ir::Graph unet(const UNetConfig& config);
ir::Graph vgg19(const Vgg19Config& config);
ir::Graph bert(const BertConfig& config);

// Megatron-LM's model FLOPs of one training step (forward + backward, no recomputation):
// 72·B·S·L·h²·(1 + S/(6h) + V/(12·L·h)). Counts only matmuls (2 FLOPs per MAC); assumes
// FFN = 4h.
double megatron_flops(const GptConfig& config);

// A Llama step's model FLOPs as torchtitan and the Llama papers count them: 6·N·T + 12·L·h·s·T
// for T = batch·seq tokens, N the parameters every token multiplies (all but the embedding table:
// q, k, v, o, gate, up, down and the LM head, plus the norms' scales), 12·L·h·s the attention's
// two s x s contractions (forward + backward, the causal mask not discounted). Matmuls only.
double llama_flops(const LlamaConfig& config);

// ---- presets: the papers' named configurations
struct Preset {
  std::string name;     // canonical name, e.g. "GPT-2.7B"
  std::string family;   // "gpt" | "moe" | "wide_resnet" | "unet" | "vgg19" | "bert" | "llama"
  double named_params;  // the parameter count the paper's name / table states
  std::string source;   // where the config comes from
  bool operator==(const Preset&) const = default;
};
const std::vector<Preset>& presets();
const Preset& find_preset(std::string_view name);  // canonical names and aliases ("GPT-3")

// Config of a preset of that family, with the given batch and dtype (weft::Error for an unknown
// name or a name of another family).
GptConfig gpt_config(std::string_view preset, std::int64_t batch = 1, DType dtype = DType::F32);
MoeConfig moe_config(std::string_view preset, std::int64_t batch = 1, DType dtype = DType::F32);
WideResNetConfig wide_resnet_config(std::string_view preset, std::int64_t batch = 1,
                                    DType dtype = DType::F32);
UNetConfig unet_config(std::string_view preset, std::int64_t batch = 1, DType dtype = DType::F32);
Vgg19Config vgg19_config(std::string_view preset, std::int64_t batch = 1, DType dtype = DType::F32);
BertConfig bert_config(std::string_view preset, std::int64_t batch = 1, DType dtype = DType::F32);
LlamaConfig llama_config(std::string_view preset, std::int64_t batch = 1, DType dtype = DType::F32);

ir::Graph gpt_preset(std::string_view preset, std::int64_t batch = 1, DType dtype = DType::F32);
ir::Graph moe_preset(std::string_view preset, std::int64_t batch = 1, DType dtype = DType::F32);
// Any preset of any family.
ir::Graph build_preset(std::string_view preset, std::int64_t batch = 1, DType dtype = DType::F32);

}  // namespace weft::models
