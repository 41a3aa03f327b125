// Names of the IR's enums, for dumps and JSON.
#include <array>
#include <string_view>
#include <utility>

#include "weft/core/error.hpp"
#include "weft/ir/index_map.hpp"
#include "weft/ir/op.hpp"
#include "weft/ir/tensor.hpp"

namespace weft::ir {
namespace {

template <typename E, std::size_t N>
std::string_view name_of(const std::array<std::pair<E, std::string_view>, N>& table, E e) {
  for (const auto& [v, n] : table)
    if (v == e) return n;
  throw InternalError("enum value without a name");
}

template <typename E, std::size_t N>
E parse_of(const std::array<std::pair<E, std::string_view>, N>& table, std::string_view s, const char* what) {
  for (const auto& [v, n] : table)
    if (n == s) return v;
  std::string known;
  for (const auto& [v, n] : table) known += (known.empty() ? "" : ", ") + std::string(n);
  fail("unknown {} '{}' (expected one of: {})", what, s, known);
}

constexpr std::array<std::pair<Role, std::string_view>, 7> kRoles{{{Role::Input, "input"},
                                                                   {Role::Parameter, "parameter"},
                                                                   {Role::Activation, "activation"},
                                                                   {Role::Gradient, "gradient"},
                                                                   {Role::OptimizerState, "optimizer_state"},
                                                                   {Role::Constant, "constant"},
                                                                   {Role::Buffer, "buffer"}}};
constexpr std::array<std::pair<FactorKind, std::string_view>, 3> kFactorKinds{
    {{FactorKind::Parallel, "parallel"},
     {FactorKind::Reduction, "reduction"},
     {FactorKind::NeedReplication, "need_replication"}}};
constexpr std::array<std::pair<ReduceKind, std::string_view>, 3> kReduceKinds{
    {{ReduceKind::None, "none"}, {ReduceKind::Sum, "sum"}, {ReduceKind::Max, "max"}}};
constexpr std::array<std::pair<OpKind, std::string_view>, 35> kOpKinds{{
    {OpKind::Einsum, "einsum"},
    {OpKind::Unary, "unary"},
    {OpKind::Binary, "binary"},
    {OpKind::Reduce, "reduce"},
    {OpKind::Softmax, "softmax"},
    {OpKind::LayerNorm, "layer_norm"},
    {OpKind::Embedding, "embedding"},
    {OpKind::CrossEntropy, "cross_entropy"},
    {OpKind::Transpose, "transpose"},
    {OpKind::Reshape, "reshape"},
    {OpKind::Concat, "concat"},
    {OpKind::Slice, "slice"},
    {OpKind::Conv2d, "conv2d"},
    {OpKind::Pool2d, "pool2d"},
    {OpKind::Opaque, "opaque"},
    {OpKind::Dropout, "dropout"},
    {OpKind::Cast, "cast"},
    {OpKind::Gather, "gather"},
    {OpKind::ScatterAdd, "scatter_add"},
    {OpKind::TopK, "topk"},
    {OpKind::UnaryGrad, "unary_grad"},
    {OpKind::BroadcastTo, "broadcast_to"},
    {OpKind::SoftmaxGrad, "softmax_grad"},
    {OpKind::LayerNormGrad, "layer_norm_grad"},
    {OpKind::LayerNormParamGrad, "layer_norm_param_grad"},
    {OpKind::EmbeddingGrad, "embedding_grad"},
    {OpKind::CrossEntropyGrad, "cross_entropy_grad"},
    {OpKind::Pad, "pad"},
    {OpKind::Conv2dGradInput, "conv2d_grad_input"},
    {OpKind::Conv2dGradWeight, "conv2d_grad_weight"},
    {OpKind::Pool2dGrad, "pool2d_grad"},
    {OpKind::SgdUpdate, "sgd_update"},
    {OpKind::AdamUpdate, "adam_update"},
    {OpKind::Attention, "attention"},
    {OpKind::AttentionGrad, "attention_grad"},
}};
constexpr std::array<std::pair<UnaryFn, std::string_view>, 13> kUnary{{{UnaryFn::Identity, "identity"},
                                                                       {UnaryFn::Neg, "neg"},
                                                                       {UnaryFn::Relu, "relu"},
                                                                       {UnaryFn::Gelu, "gelu"},
                                                                       {UnaryFn::Tanh, "tanh"},
                                                                       {UnaryFn::Exp, "exp"},
                                                                       {UnaryFn::Log, "log"},
                                                                       {UnaryFn::Sigmoid, "sigmoid"},
                                                                       {UnaryFn::Sqrt, "sqrt"},
                                                                       {UnaryFn::Rsqrt, "rsqrt"},
                                                                       {UnaryFn::Square, "square"},
                                                                       {UnaryFn::Scale, "scale"},
                                                                       {UnaryFn::GeluErf, "gelu_erf"}}};
constexpr std::array<std::pair<BinaryFn, std::string_view>, 5> kBinary{{{BinaryFn::Add, "add"},
                                                                        {BinaryFn::Sub, "sub"},
                                                                        {BinaryFn::Mul, "mul"},
                                                                        {BinaryFn::Div, "div"},
                                                                        {BinaryFn::Max, "max"}}};
constexpr std::array<std::pair<ReduceFn, std::string_view>, 3> kReduce{
    {{ReduceFn::Sum, "sum"}, {ReduceFn::Max, "max"}, {ReduceFn::Mean, "mean"}}};

}  // namespace

std::string_view role_name(Role r) { return name_of(kRoles, r); }
Role parse_role(std::string_view s) { return parse_of(kRoles, s, "tensor role"); }
std::string_view factor_kind_name(FactorKind k) { return name_of(kFactorKinds, k); }
std::string_view reduce_kind_name(ReduceKind k) { return name_of(kReduceKinds, k); }
std::string_view op_kind_name(OpKind k) { return name_of(kOpKinds, k); }
OpKind parse_op_kind(std::string_view s) { return parse_of(kOpKinds, s, "op kind"); }
std::string_view unary_fn_name(UnaryFn f) { return name_of(kUnary, f); }
UnaryFn parse_unary_fn(std::string_view s) { return parse_of(kUnary, s, "unary function"); }
std::string_view binary_fn_name(BinaryFn f) { return name_of(kBinary, f); }
BinaryFn parse_binary_fn(std::string_view s) { return parse_of(kBinary, s, "binary function"); }
std::string_view reduce_fn_name(ReduceFn f) { return name_of(kReduce, f); }
ReduceFn parse_reduce_fn(std::string_view s) { return parse_of(kReduce, s, "reduce function"); }

}  // namespace weft::ir
