// Wide-ResNet, U-Net and VGG19 forward graphs (NCHW activations, OIHW conv weights).
//
// Parameter counts (closed forms the tests check against the built graphs):
//   Wide-ResNet bottleneck block with base filters f, width factor W, input channels cin:
//     cin·f + 9·f·(W·f) + (W·f)·4f + 2·(f + W·f + 4f) [+ cin·4f + 2·4f for the projection]
//   plus the stem 3·C·49 + 2C and the classifier 32C·K + K.
//   U-Net: double conv (ci -> co) = 9·ci·co + 9·co² + 4·co; transposed 2x2 conv fi -> fo =
//     4·fi·fo + fo; final 1x1 conv base·K + K.
//   VGG19: Σ convs (9·ci·co + co) + 512·(I/32)²·4096 + 4096 + 4096² + 4096 + 4096·K + K.
#include <fmt/format.h>

#include <array>

#include "layers.hpp"
#include "weft/core/error.hpp"
#include "weft/models/models.hpp"

namespace weft::models {

using detail::Net;
using ir::TensorId;

ir::Graph wide_resnet(const WideResNetConfig& c) {
  c.validate();
  ir::Graph g(c.name);
  Net net(g, c.dtype);
  const std::int64_t N = c.batch, C = c.channels, W = c.width_factor;
  TensorId x = g.input("images", {N, 3, c.image, c.image}, c.dtype);
  TensorId labels = g.input("labels", {N}, DType::I32);
  x = net.conv(x, 3, C, 7, 2, 3, "stem.conv");
  x = net.relu(net.batch_norm(x, C, "stem.bn"), "stem.relu");
  x = g.pool2d(ir::ReduceFn::Max, x, 3, 2, 1, "stem.pool");
  const std::array<int, 4> stages =
      c.layers == 50 ? std::array<int, 4>{3, 4, 6, 3} : std::array<int, 4>{3, 4, 23, 3};
  std::int64_t cin = C;
  for (int i = 0; i < 4; ++i) {
    const std::int64_t f = C << i;
    for (int j = 0; j < stages[i]; ++j) {
      const std::string p = fmt::format("stage{}.block{}", i, j);
      const std::int64_t stride = (i > 0 && j == 0) ? 2 : 1;
      TensorId y = net.conv(x, cin, f, 1, 1, 0, p + ".conv1");
      y = net.relu(net.batch_norm(y, f, p + ".bn1"), p + ".relu1");
      y = net.conv(y, f, f * W, 3, stride, 1, p + ".conv2");
      y = net.relu(net.batch_norm(y, f * W, p + ".bn2"), p + ".relu2");
      y = net.conv(y, f * W, 4 * f, 1, 1, 0, p + ".conv3");
      y = net.batch_norm(y, 4 * f, p + ".bn3");
      TensorId r = x;
      if (cin != 4 * f || stride != 1) {  // shapes differ: a projection shortcut
        r = net.conv(x, cin, 4 * f, 1, stride, 0, p + ".proj");
        r = net.batch_norm(r, 4 * f, p + ".proj_bn");
      }
      x = net.relu(g.add(r, y, p + ".res"), p + ".out");
      cin = 4 * f;
    }
  }
  x = g.reduce(ir::ReduceFn::Mean, x, {2, 3}, "global_pool");  // [n, 32C]
  TensorId logits = net.linear(x, cin, c.classes, "fc");
  g.set_loss(g.cross_entropy(logits, labels, "loss"));
  return g;
}

namespace {

TensorId double_conv(Net& net, TensorId x, std::int64_t ci, std::int64_t co, const std::string& p) {
  x = net.relu(net.batch_norm(net.conv(x, ci, co, 3, 1, 1, p + ".conv1"), co, p + ".bn1"), p + ".relu1");
  return net.relu(net.batch_norm(net.conv(x, co, co, 3, 1, 1, p + ".conv2"), co, p + ".bn2"), p + ".relu2");
}

// 2x2 stride-2 transposed conv as what it is: out[n,o,2i+a,2j+b] = Σ_c x[n,c,i,j]·w[c,o,a,b],
// an einsum to [n,o,i,a,j,b] and a row-major reshape to [n,o,2H,2W] (exact shapes, parameters
// and FLOPs; the IR has no transposed-conv kind).
TensorId up_conv(Net& net, TensorId x, std::int64_t ci, std::int64_t co, std::int64_t n, std::int64_t hw,
                 const std::string& p) {
  ir::Graph& g = net.g();
  TensorId w = net.param(p + ".w", {ci, co, 2, 2});
  TensorId y = g.einsum("ncij,coab->noiajb", {x, w}, p + ".einsum");
  y = g.reshape(y, {n, co, 2 * hw, 2 * hw}, p + ".interleave");
  return net.channel_bias(y, co, p);
}

}  // namespace

ir::Graph unet(const UNetConfig& c) {
  c.validate();
  ir::Graph g(c.name);
  Net net(g, c.dtype);
  const std::int64_t N = c.batch;
  TensorId x = g.input("images", {N, c.in_channels, c.image, c.image}, c.dtype);
  TensorId labels = g.input("labels", {N, c.image, c.image}, DType::I32);
  std::vector<TensorId> skips;
  std::int64_t ci = c.in_channels, f = c.base_channels, hw = c.image;
  for (std::int64_t d = 0; d < c.depth; ++d) {
    x = double_conv(net, x, ci, f, fmt::format("down{}", d));
    skips.push_back(x);
    x = g.pool2d(ir::ReduceFn::Max, x, 2, 2, 0, fmt::format("down{}.pool", d));
    ci = f;
    f *= 2;
    hw /= 2;
  }
  x = double_conv(net, x, ci, f, "bottleneck");
  for (std::int64_t d = c.depth - 1; d >= 0; --d) {
    const std::int64_t fo = c.base_channels << d;
    const std::string p = fmt::format("up{}", d);
    x = up_conv(net, x, f, fo, N, hw, p + ".upconv");
    hw *= 2;
    x = g.concat({skips[static_cast<std::size_t>(d)], x}, 1, p + ".skip_concat");  // the long skip connection
    x = double_conv(net, x, 2 * fo, fo, p);
    f = fo;
  }
  TensorId logits = net.channel_bias(net.conv(x, f, c.classes, 1, 1, 0, "head.conv"), c.classes, "head");
  logits = g.transpose(logits, {0, 2, 3, 1}, "head.nhwc");  // classes last for the per-pixel loss
  g.set_loss(g.cross_entropy(logits, labels, "loss"));
  return g;
}

ir::Graph vgg19(const Vgg19Config& c) {
  c.validate();
  ir::Graph g(c.name);
  Net net(g, c.dtype);
  const std::int64_t N = c.batch;
  TensorId x = g.input("images", {N, 3, c.image, c.image}, c.dtype);
  TensorId labels = g.input("labels", {N}, DType::I32);
  // Configuration E: conv counts and channels per stage, each stage ending in a 2x2 max pool.
  const std::array<std::pair<int, std::int64_t>, 5> stages{{{2, 64}, {2, 128}, {4, 256}, {4, 512}, {4, 512}}};
  std::int64_t ci = 3;
  for (std::size_t s = 0; s < stages.size(); ++s) {
    for (int k = 0; k < stages[s].first; ++k) {
      const std::string p = fmt::format("conv{}_{}", s + 1, k + 1);
      const std::int64_t co = stages[s].second;
      x = net.relu(net.channel_bias(net.conv(x, ci, co, 3, 1, 1, p), co, p), p + ".relu");
      ci = co;
    }
    x = g.pool2d(ir::ReduceFn::Max, x, 2, 2, 0, fmt::format("pool{}", s + 1));
  }
  const std::int64_t side = c.image / 32, flat = 512 * side * side;
  x = g.reshape(x, {N, flat}, "flatten");
  x = net.relu(net.linear(x, flat, 4096, "fc6"), "fc6.relu");
  x = net.relu(net.linear(x, 4096, 4096, "fc7"), "fc7.relu");
  TensorId logits = net.linear(x, 4096, c.classes, "classifier");
  g.set_loss(g.cross_entropy(logits, labels, "loss"));
  return g;
}

}  // namespace weft::models
