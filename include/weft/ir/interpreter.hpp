#pragma once
// A small reference interpreter: executes a graph on real numbers (f64 arithmetic; each result
// and leaf rounded to its held dtype, precision.hpp: the graph's base dtype at f64, an f32 region
// of an f64 graph at f32) with plain loops. It is the oracle for autodiff and, later, for
// distributed execution. Small shapes only: an einsum loops over every point of its index space.
//
// Semantics of every op kind (x, y, dy, ... as in OpKind; N = number of tokens = Π leading dims):
//   Einsum        out[o] = Σ over the letters not in the output of Π_k operand_k[...]  (any equation)
//   Unary         identity x | neg −x | relu max(x,0) | tanh | exp | log | sqrt | rsqrt 1/√x | square x²
//                 | sigmoid 1/(1+e^−x) | scale attrs.scalar·x
//                 | gelu: the tanh approximation 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))
//                 | gelu_erf: the exact form 0.5·x·(1 + erf(x/√2)) (torch's default nn.GELU)
//   Binary        add, sub, mul, div, max, numpy broadcasting (trailing alignment)
//   Reduce        sum | mean | max over attrs.axes (the dims are removed)
//   Softmax       exp(x − max) / Σ exp(x − max) along attrs.axes[0]
//   LayerNorm     (x − μ)/√(σ² + eps)·γ + β over the last dim, σ² the population variance
//   Embedding     out[..., h] = table[ids[...], h]        (ids out of range: weft::Error)
//   CrossEntropy  (1/N)·Σ_tokens (logsumexp(logits[t, :]) − logits[t, label[t]])
//   Transpose     out dim i = in dim perm[i];  Reshape: row-major;  Concat / Slice along one axis
//   Conv2d        y[n,o,p,q] = Σ_{c,r,t} x[n,c,p·s+r−pad, q·s+t−pad]·w[o,c,r,t]  (zero padding)
//   Pool2d        window k×k, stride s, padding pad: Max = max over the window's in-bounds
//                 elements (0 for a window entirely in the padding); Mean = Σ in-bounds / k²
//                 (padding counts as zeros, PyTorch's count_include_pad)
//   Opaque        not executable: weft::Error
//   Cast          x (the held-dtype rounding of its result is the conversion)
//   Dropout       x·keep·(1/(1−p)), keep = dropout_keep(seed, step, global flat index, p) (kernels.hpp;
//                 the interpreter runs step 1 and whole tensors)
//   Gather        out[i] = x[i with i[axis] := index[i]]   (torch.gather; index out of range: weft::Error)
//   ScatterAdd    out = base (or zeros of [index's shape, axis := attrs.ints[0]]), then for every i in
//                 row-major order out[i with i[axis] := index[i]] += src[i]   (torch.scatter_add)
//   TopK          values, indices of the k = attrs.ints[0] largest (ints[1] = 1; else smallest) along
//                 the axis, best first; NaN counts as the largest; ties: the lower index first
//                 (torch.argmax's documented first maximum; torch.topk leaves tie order unspecified)
//   Attention     S = scale·q·kᵀ over q[..., s, d], k[..., t, d] (causal: S[i, j] = −∞ for key j >
//                 query i, top-left aligned as torch's is_causal); lse[i] = log Σ_j exp(S[i, j]) (f32);
//                 out = exp(S − lse)·v[..., t, e]
//   AttentionGrad P = exp(scale·q·kᵀ − lse) recomputed; dv = Pᵀ·dout; D[i] = Σ_c dout[i, c]·out[i, c];
//                 dS = P ∘ (dout·vᵀ − D); dq = scale·dS·k; dk = scale·dSᵀ·q
//   UnaryGrad     dx = dy·f'(x) with f' of the same fn (relu' = [x > 0]; gelu' of the tanh form)
//   BroadcastTo   out[i] = x[i without the inserted dims attrs.axes], size-1 dims of x broadcast
//   SoftmaxGrad   dx = y·(dy − Σ_axis dy·y)
//   LayerNormGrad dx = rstd·(g − mean(g) − x̂·mean(g·x̂)) with g = dy·γ, x̂ = (x − μ)·rstd
//   LayerNormParamGrad  dγ = Σ_leading dy·x̂,  dβ = Σ_leading dy
//   EmbeddingGrad dtable[v, h] = Σ_{positions with ids = v} dy[..., h]
//   CrossEntropyGrad  dlogits[t, c] = dloss·(softmax(logits[t])[c] − [c = label[t]]) / N
//   Pad           zeros of size attrs.ints[2] along attrs.axes[0], x written at [begin, end)
//   Conv2dGradInput / Conv2dGradWeight: the adjoints of Conv2d in x and in w
//   Pool2dGrad    Max: dy to the first maximal in-bounds element of each window (row-major, found
//                 from x); Mean: dy/k² to every in-bounds element of the window
//   SgdUpdate     p' = p − lr·g; with momentum μ: buf' = μ·buf + g, p' = p − lr·buf'
//   AdamUpdate    m' = β1·m + (1−β1)·g;  v' = β2·v + (1−β2)·g²;
//                 p' = p − lr·(m'/(1−β1^step)) / (√(v'/(1−β2^step)) + eps)
//   (either, with a master copy w) the rule updates w instead of p, and p' = w' (values are
//                 doubles: the cast to the parameter's dtype is no rounding here)
// Integer tensors (ids, labels) hold integral doubles.
#include <map>
#include <vector>

#include "weft/ir/graph.hpp"
#include "weft/ir/host_tensor.hpp"

namespace weft::ir {

// Runs every op in topological order. `feeds` must give every Input, Parameter, Constant and
// OptimizerState leaf, with the tensor's shape (a master copy should start equal to its
// parameter); the one exception is autodiff's dloss seed (a Constant whose grad_of() is the
// loss), which is 1.0 when not fed. Returns the value of every
// tensor (indexed by TensorId). Throws weft::Error for a missing/misshaped feed, an Opaque op, or
// an id/label out of range.
std::vector<HostTensor> interpret(const Graph& g, const std::map<TensorId, HostTensor>& feeds);

}  // namespace weft::ir
