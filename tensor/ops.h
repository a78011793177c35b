#pragma once
// The public ops. Each validates its inputs, dispatches to the kernel for the inputs'
// device, and records its vector-Jacobian product when a gradient is needed.
// All inputs of an op must be on one device; index inputs take i32 or i64. Floating ops take
// f32 and f64, and bf16/f16 too where a kernel reads them (CUDA's elementwise ops, reductions,
// normalisations, attention, GEMMs; on the CPU the GEMMs, and the elementwise ops, sums and
// cross-entropy through f32 copies rounded once); the normalisations and softmax refuse 16-bit
// inputs on the CPU outside autocast. The binary elementwise ops (add, sub, mul, div) compute
// operands of two floating dtypes in the wider one, as PyTorch's type promotion does.

#include <optional>
#include <vector>

#include "tensor/tensor.h"

namespace loom {

// --- elementwise, with NumPy broadcasting -------------------------------------------------
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor neg(const Tensor& a);
// GELU with the tanh approximation (GPT-2's).
Tensor gelu(const Tensor& x);
// gelu(x + bias) for x [..., n] and bias [n] (Megatron's bias_gelu, GPT-2's MLP after a
// product without its bias): one pass forward, and one backward that also sums the bias's
// gradient (Note [Bias and GELU in one pass]). Under autocast a bias beside a 16-bit x is
// taken in x's dtype, as linear takes its bias.
Tensor bias_gelu(const Tensor& x, const Tensor& bias);
// gelu(linear(x, weight, bias)), GPT-2's MLP's first layer, in the fewest passes each device
// has (Note [Bias and GELU in one pass]): on the CPU the product without its bias, then
// bias_gelu; on CUDA one GEMM whose epilogue adds the bias and takes GELU (backward GELU's
// gradient, then linear's, the bias's in the weight gradient's GEMM).
Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias);
// GPT-2's MLP, linear(gelu(linear(x, w1, b1)), w2, b2), with GELU's gradient taken in the
// second product's input-gradient GEMM (Note [GELU's gradient in the next product],
// tensor/ops/matmul.cpp): linear_gelu_keeping_input gives {out, input}, out = linear_gelu's
// value and, on CUDA's path while gradients are wanted, input = the biased product GELU read,
// which carries the gradient: out then has none of its own and is for linear_after_gelu to
// read. Elsewhere input is undefined and out is linear_gelu(x, w1, b1). linear_after_gelu
// is linear(gelu.out, weight, bias), its backward giving gelu.input its gradient through GELU
// directly (or, with gelu.input undefined, linear's); an undefined bias: matmul(gelu.out,
// weight) (a row-parallel layer's part, whose bias is added after the group's sum).
struct GeluOutput {
  Tensor out, input;
};
GeluOutput linear_gelu_keeping_input(const Tensor& x, const Tensor& weight, const Tensor& bias);
Tensor linear_after_gelu(const GeluOutput& gelu, const Tensor& weight, const Tensor& bias);
// SiLU (swish): x * sigmoid(x), Llama's MLP activation.
Tensor silu(const Tensor& x);
// SwiGLU, Llama's MLP: silu(gate) * up in one pass each way (gate and up of one shape, dtype
// and device). The forward rounds silu(gate) to the dtype before the product, as silu and mul
// do; the backward gives up's gradient as mul does and gate's rounded once (mul and silu's
// backward round twice). Saves gate and up only, not silu(gate).
Tensor swiglu(const Tensor& gate, const Tensor& up);
// Rotary position embedding, Hugging Face's apply_rotary_pos_emb: x * cos + rotate_half(x) *
// sin, rotate_half(x) = concat(-x[..., dim/2:], x[..., :dim/2]), for x [batch, heads, time,
// dim] (any strides; the last dim contiguous, else copied first) and position tables cos, sin
// [time, dim] in f32 or x's dtype, taken in x's dtype (as cos.to(x.dtype)). One pass each way
// (Note [Rotary positions in one pass], tensor/ops/rotary.cpp); the result, and x's gradient,
// laid out as x where x is a permutation of a contiguous tensor (Llama's q and k, views of
// their projection), else contiguous. The tables are constants: no gradient reaches them.
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin);

inline Tensor operator+(const Tensor& a, const Tensor& b) {
  return add(a, b);
}
inline Tensor operator-(const Tensor& a, const Tensor& b) {
  return sub(a, b);
}
inline Tensor operator*(const Tensor& a, const Tensor& b) {
  return mul(a, b);
}
inline Tensor operator/(const Tensor& a, const Tensor& b) {
  return div(a, b);
}
inline Tensor operator*(const Tensor& a, double b) {
  return mul(a, b);
}
inline Tensor operator-(const Tensor& a) {
  return neg(a);
}

// In-place updates, never recorded (optimizers, gradient accumulation). `b` broadcasts to a.
// An f32 `a` also takes a bf16 or f16 `b` of its shape, widened on load in the same pass (a
// 16-bit gradient accumulated into an f32 one: the values of adding b cast to f32).
void add_(Tensor& a, const Tensor& b);
void mul_(Tensor& a, double b);
void fill_(Tensor& a, double value);
// copy_: same shape; converts dtype. Between the host and a GPU, a copy into host memory has
// finished when it returns; a copy into the GPU is ordered on the GPU's current stream, and
// from pinned host memory it is asynchronous: the source must stay unchanged until that
// stream has passed the copy (tensor/cuda/copy.h).
void copy_(Tensor& dst, const Tensor& src);

// --- matrix products ------------------------------------------------------------------------
// [M,K]x[K,N]; [...,M,K]x[K,N] (leading dims folded); [...,M,K]x[...,K,N] (equal batch dims).
// Transposed views are used in place, without copies.
Tensor matmul(const Tensor& a, const Tensor& b);
// x [..., in] times weight [in, out] plus bias [out] (GPT-2's Conv1D layout).
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias);

// --- normalisation, softmax, attention, losses ------------------------------------------------
// Over the last dimension; weight and bias have the size of the last dimension.
// `out_dtype` (layer_norm, add_layer_norm's normed, rms_norm): the output's dtype where it is
// to differ from the input's (as autocast leaves it): bf16 or f16 for an f32 input, the values
// of cast(layer_norm(...), out_dtype) in one pass, whose backward reads the 16-bit gradient as
// it is (widening it on load, the values of the cast's backward). For a norm that only
// autocast's 16-bit products read, which would cast its output first (nn::LayerNorm's
// NormOutput::ForProducts).
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps = 1e-5,
                  std::optional<DType> out_dtype = std::nullopt);
// The residual add and the layer norm after it in one pass (a pre-LN block's
// "h = x + attn(...); ln_2(h)"): sum = x + residual (the same shape), normed =
// layer_norm(sum, weight, bias, eps, out_dtype). The same values as add and layer_norm;
// backward adds the gradient reaching `sum` to layer norm's in one pass. One kernel (CPU and
// CUDA) where x, the parameters and the sum share a dtype and the residual has the output's:
// that dtype, or under autocast the 16-bit out_dtype of an f32 stream meeting a 16-bit branch,
// whose gradient backward then writes rounded to 16 bits in the same pass; otherwise the two
// ops.
struct AddNorm {
  Tensor sum, normed;
};
AddNorm add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                            const Tensor& bias, double eps = 1e-5,
                            std::optional<DType> out_dtype = std::nullopt);
// {x, layer_norm(x, ...)} for an x that also continues as a residual stream (a pre-LN block's
// input and first norm): the same values; `sum` is x (a view of it) through which the block's
// stream takes x, so that backward adds the stream's gradient to the norm's in the norm's
// pass, and, where x is an f32 stream plus a 16-bit branch of its shape (the block before's
// last add), writes both operands' gradients there, the branch's rounded, in place of that
// add's backward (Note [A norm takes over the residual add before it]). Otherwise, or without
// gradients, {x, layer_norm(x, ...)}. Every other read of x goes through `sum`: one that does
// not still gets its gradient to the add's operands, but the branch's is then rounded once
// per reader where the two ops round their sum once.
AddNorm layer_norm_keeping_stream(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                  double eps = 1e-5,
                                  std::optional<DType> out_dtype = std::nullopt);
// layer_norm(x, ...) where the stream ends, x's last reader (a model's final norm after its
// last block): as layer_norm_keeping_stream's normed output, with no stream to continue.
Tensor layer_norm_ending_stream(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                double eps = 1e-5, std::optional<DType> out_dtype = std::nullopt);
// RMS normalisation (Llama's RMSNorm): x / sqrt(mean(x^2) + eps) * weight, no mean, no bias.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps,
                std::optional<DType> out_dtype = std::nullopt);
// The residual add and the RMS norm after it, as add_layer_norm's (Llama's
// "h = x + attn(...); post_attention_layernorm(h)").
AddNorm add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight, double eps,
                     std::optional<DType> out_dtype = std::nullopt);
// {x, rms_norm(x, ...)}, as layer_norm_keeping_stream's (a Llama layer's input norm), and
// rms_norm where the stream ends, as layer_norm_ending_stream's (Llama's final norm).
AddNorm rms_norm_keeping_stream(const Tensor& x, const Tensor& weight, double eps,
                                std::optional<DType> out_dtype = std::nullopt);
Tensor rms_norm_ending_stream(const Tensor& x, const Tensor& weight, double eps,
                              std::optional<DType> out_dtype = std::nullopt);
// Softmax over the last dimension. With causal, x is [..., T, T] and entries with column >
// row are masked out (probability 0).
Tensor softmax(const Tensor& x, bool causal = false);
// Causal scaled-dot-product attention of q [B, H, T, D] over k, v [B, H_kv, T, D], H_kv
// dividing H (grouped-query attention: query head h reads key/value head h / (H / H_kv)).
// Last strides 1, other strides free, so q/k/v may be views into a fused projection. Scale
// 1/sqrt(D). Flash-style on every device: no [T, T] matrix is kept for backward. The result
// is [B, H, T, D] laid out as [B, T, H, D] in memory, so that
// permute({0, 2, 1, 3}).reshape({B, T, H*D}) is free.
Tensor causal_attention(const Tensor& q, const Tensor& k, const Tensor& v);
// causal_attention over the three [B, T, H*D] column blocks of a fused projection qkv
// [B, T, 3*H*D] (q's heads, then k's, then v's), as FlashAttention's qkvpacked functions: the
// result [B, T, H*D] with the heads merged, and the gradient of qkv written by the kernel as
// one tensor, where attending to split views makes the split copy three into one. The same
// bits as causal_attention on the split views (Note [Attention on the packed projection]).
Tensor causal_attention_packed(const Tensor& qkv, int64_t heads);
// Mean over rows of -log softmax(logits)[target]; logits [N, V], targets [N] (i32/i64).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets);
// The same, of logits handed over (a product's result passed on at once, as
// linear_cross_entropy passes it, or std::move'd): on CUDA (and meta following it), inside a
// LossGradientScope, logits that nothing else holds then get their gradient written over them
// by the forward (Note [The loss's gradient with the loss]); the same loss and gradients.
Tensor cross_entropy(Tensor&& logits, const Tensor& targets);
// The caller's word, on this thread until destroyed, that the backward of the losses computed
// inside starts from `gradient` (Strategy::forward_backward's: its scale, times a loss
// scaler's): CUDA's cross_entropy may then compute its gradient in its forward, for that
// gradient. A word not kept costs time, not correctness: the backward rescales what the
// forward wrote. Only a finite, nonzero gradient counts. Scopes nest; the innermost is in
// effect.
class LossGradientScope {
 public:
  explicit LossGradientScope(double gradient);
  ~LossGradientScope();
  LossGradientScope(const LossGradientScope&) = delete;
  LossGradientScope& operator=(const LossGradientScope&) = delete;
  // The innermost scope's gradient, as the f32 a loss's backward receives; none outside any.
  static std::optional<float> gradient();

 private:
  std::optional<float> previous_;
};
// cross_entropy(matmul(x, transpose(weight, 0, 1)), targets) without holding the [N, V]
// logits: x [N, C], weight [V, C] (a classifier's rows, as a tied embedding holds them),
// targets [N]. On the CPU (f32/f64, outside autocast) the logits are made a chunk of rows at
// a time and the forward computes both gradients with them, which backward scales by the
// loss's gradient (Note [The classifier without its logits]); the same loss and gradients up
// to the order of sums. CUDA, autocast and 16-bit operands compose the two ops, handing the
// logits over to cross_entropy (which on CUDA may then write their gradient in its forward).
Tensor linear_cross_entropy(const Tensor& x, const Tensor& weight, const Tensor& targets);
// Tensor parallelism's cross-entropy, in the pieces nn::parallel_cross_entropy combines over the
// ranks. logits [N, V] hold the classes [first, first + V) of rows whose targets [N] (i32/i64,
// >= 0) index the whole row. Per row: the logsumexp of the part, and the target's logit where
// the target falls in the part, else 0: {logsumexp, picked}, each [N] (f32; f64 for f64 logits
// on the CPU). Not differentiable.
std::vector<Tensor> cross_entropy_part(const Tensor& logits, const Tensor& targets,
                                       int64_t first);
// The part's share of the gradient of the mean loss over the whole rows: dloss / N *
// (exp(logits - logsumexp) - onehot(target - first)), with logsumexp [N] the whole rows' and
// dloss the mean loss's gradient (one element); no onehot where the target is outside the
// part. Not differentiable.
Tensor cross_entropy_part_backward(const Tensor& logits, const Tensor& targets, int64_t first,
                                   const Tensor& logsumexp, const Tensor& dloss);
// Rows of weight [V, C] picked by indices (any shape, i32/i64): result [..., C].
Tensor embedding(const Tensor& indices, const Tensor& weight);
// Rows [first, first + V) of a larger table of which weight [V, C] holds a part (tensor
// parallelism's vocabulary-parallel embedding): a position whose index falls outside them gets
// a zero row and adds nothing to weight's gradient. Indices must be >= 0.
Tensor embedding_part(const Tensor& indices, const Tensor& weight, int64_t first);

// --- reductions -------------------------------------------------------------------------------
Tensor sum(const Tensor& x);  // all elements -> shape []
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
// The sum in `dtype` (PyTorch's dtype= argument): x's dtype, or f32 for a bf16/f16 x, whose
// elements are then widened as read and summed in f32 without rounding to 16 bits.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, DType dtype);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
// Maximum along one dimension; the gradient flows to the first maximal element. CUDA tensors
// are reduced on the CPU (max is not on a training step's path).
Tensor max(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor max(const Tensor& x);
// Sums a broadcast result back down to `shape` (the vjp of broadcasting).
Tensor sum_to(const Tensor& x, const Shape& shape);

// --- shape ops (views where possible) ----------------------------------------------------------
Tensor reshape(const Tensor& x, const Shape& shape);  // one -1 allowed; view when possible
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor concat(const std::vector<Tensor>& xs, int64_t dim);
// Splits into pieces of the given sizes along dim (views).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim);
Tensor contiguous(const Tensor& x);
Tensor cast(const Tensor& x, DType dtype);

}  // namespace loom
