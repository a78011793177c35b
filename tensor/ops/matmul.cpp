// Matrix products (matmul, linear) through the GEMM kernel. Transposed views are passed to the
// kernel as transposed operands, so x @ w.T and friends never copy.

#include <cstddef>
#include <cstring>
#include <functional>
#include <tuple>
#include <utility>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "tensor/autocast.h"
#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda_support.h"
#include "tensor/ops/dispatch.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/gemm.h"
#endif

namespace loom {

namespace {

// A [rows, cols] matrix (or a batch of them, batch_stride apart) as the GEMM kernel sees it.
struct Operand {
  Tensor holder;  // keeps the memory alive (a contiguous copy when the view was unusable)
  bool trans = false;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

// Reads the last two dims of a 2-D or 3-D tensor as a GEMM operand.
Operand as_operand(const Tensor& t) {
  int64_t n = t.dim();
  int64_t rows = t.shape()[n - 2], cols = t.shape()[n - 1];
  int64_t sr = t.strides()[n - 2], sc = t.strides()[n - 1];
  int64_t batch_stride = n == 3 ? t.strides()[0] : 0;
  if ((sc == 1 || cols == 1) && (sr >= cols || rows == 1)) {
    return {t, false, std::max<int64_t>(rows == 1 ? cols : sr, 1), batch_stride};
  }
  if ((sr == 1 || rows == 1) && (sc >= rows || cols == 1)) {
    return {t, true, std::max<int64_t>(cols == 1 ? rows : sc, 1), batch_stride};
  }
  Tensor packed = detail::contiguous_input(t);
  return {packed, false, std::max<int64_t>(cols, 1), n == 3 ? rows * cols : 0};
}

// Views t ([batch..., r, c]) as [prod(batch), r, c]; copies when the batch dims do not fold
// into one stride.
Tensor fold_batch(const Tensor& t) {
  int64_t n = t.dim();
  std::vector<int64_t> batch_dims;  // batch dims of size > 1
  for (int64_t d = 0; d < n - 2; ++d) {
    if (t.shape()[d] != 1) batch_dims.push_back(d);
  }
  bool foldable = true;
  for (size_t i = 0; i + 1 < batch_dims.size(); ++i) {
    int64_t d = batch_dims[i], e = batch_dims[i + 1];
    if (t.strides()[d] != t.strides()[e] * t.shape()[e]) foldable = false;
  }
  Tensor base = foldable ? t : detail::contiguous_input(t);
  int64_t batch = 1;
  for (int64_t d = 0; d < n - 2; ++d)
    batch *= t.shape()[d];
  int64_t batch_stride = batch_dims.empty() ? 0 : base.strides()[batch_dims.back()];
  return Tensor::make_view(base, {batch, t.shape()[n - 2], t.shape()[n - 1]},
                           {batch_stride, base.strides()[n - 2], base.strides()[n - 1]},
                           base.offset());
}

// Each product's matrix of `batch`, shared out among the intra-op threads.
void for_each_product(int64_t batch, int64_t m, int64_t n, int64_t k,
                      const std::function<void(int64_t)>& product) {
  const int64_t grain = std::max<int64_t>(
      1, kernels::cpu::kMinParallelElements * 16 / std::max<int64_t>(m * n * k, 1));
  kernels::cpu::parallel_for(batch, grain, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i)
      product(i);
  });
}

// batched_gemm of bf16 operands on the CPU: the products summed in f32 and rounded to out's
// bf16 once (gemm_bf16), as a bf16 GEMM with f32 accumulation does; or, for an f32 out, kept.
template <typename C>
void bf16_batched_gemm(const Operand& a, const Operand& b, Tensor& out, int64_t batch, int64_t m,
                       int64_t n, int64_t k, bool accumulate) {
  const auto* pa = static_cast<const uint16_t*>(a.holder.raw_data());
  const auto* pb = static_cast<const uint16_t*>(b.holder.raw_data());
  auto* pc = static_cast<C*>(out.raw_data());
  for_each_product(batch, m, n, k, [&](int64_t i) {
    kernels::cpu::gemm_bf16(a.trans, b.trans, m, n, k, pa + i * a.batch_stride, a.ld,
                            pb + i * b.batch_stride, b.ld, pc + i * m * n,
                            std::max<int64_t>(n, 1), accumulate);
  });
}

// f16 operands on the CPU (16-bit weights in f16), which has no f16 GEMM: the product of
// their f32 copies, rounded once (bf16 has its own GEMM: bf16_batched_gemm).
bool f16_on_the_cpu(const Tensor& x) {
  return x.dtype() == DType::F16 && detail::computes_through_f32(x);
}

// out[i] = a[i] @ b[i] (+= when accumulate) for a batch of `batch` products; a batch stride
// of 0 reuses the same matrix. out is contiguous [batch, m, n], of a's and b's dtype or, for
// bf16 operands (f16 ones on CUDA), f32: the f32 sums unrounded. On CUDA, a defined `bias`
// [n] is added to every row by the GEMM's epilogue (the CPU caller adds it itself); on meta
// it is counted as read, as CUDA's epilogue reads it. A defined `b_sums` [n] (CUDA and meta,
// a single product) receives the sums of op(B)'s columns, by the same GEMM's epilogue. A
// defined `gelu_aux` (CUDA and meta, a single product with a bias) receives the biased
// product and `out` GELU of it (kernels::cuda::gemm_bias_gelu). A defined `dgelu_aux` (CUDA
// and meta, a single product without a bias: GELU's input, as gelu_aux received it) makes
// `out` the product times GELU's derivative there (kernels::cuda::gemm_dgelu).
void batched_gemm(const Operand& a, const Operand& b, Tensor& out, int64_t batch, int64_t m,
                  int64_t n, int64_t k, bool accumulate,
                  [[maybe_unused]] const Tensor& bias = Tensor(),
                  [[maybe_unused]] const Tensor& b_sums = Tensor(),
                  [[maybe_unused]] const Tensor& gelu_aux = Tensor(),
                  [[maybe_unused]] const Tensor& dgelu_aux = Tensor()) {
  if (reports_op_cost(out.device())) {
    const double flops = 2.0 * double(batch) * double(m) * double(n) * double(k);
    const Tensor none = Tensor::empty({0}, out.dtype(), out.device());
    record_meta_op("gemm", OpClass::Gemm, flops,
                   {a.holder, b.holder, accumulate ? out : none, bias.defined() ? bias : none,
                    dgelu_aux.defined() ? dgelu_aux : none},
                   {out, b_sums.defined() ? b_sums : none, gelu_aux.defined() ? gelu_aux : none},
                   {m, n, k, batch});
  }
  if (out.device().is_meta()) return;
  check(out.device().is_cuda() || !(gelu_aux.defined() || dgelu_aux.defined()),
        "batched_gemm: GELU and its gradient in the GEMM are CUDA's");
  const DType operands = a.holder.dtype();
  if (operands == DType::BF16 && out.device().is_cpu()) {
    return out.dtype() == DType::F32
               ? bf16_batched_gemm<float>(a, b, out, batch, m, n, k, accumulate)
               : bf16_batched_gemm<uint16_t>(a, b, out, batch, m, n, k, accumulate);
  }
  if (out.device().is_cuda() && gelu_aux.defined()) {
    check(batch == 1 && !accumulate && bias.defined(), "batched_gemm: GELU after a biased product");
    LOOM_IF_CUDA(kernels::cuda::gemm_bias_gelu(
        operands, a.trans, b.trans, m, n, k, a.holder.raw_data(), a.ld, b.holder.raw_data(), b.ld,
        bias.raw_data(), out.raw_data(), gelu_aux.raw_data(), detail::stream_of(out)));
    return;
  }
  if (out.device().is_cuda() && dgelu_aux.defined()) {
    check(batch == 1 && !accumulate && !bias.defined() && !b_sums.defined(),
          "batched_gemm: GELU's gradient after an unbiased product");
    LOOM_IF_CUDA(kernels::cuda::gemm_dgelu(operands, a.trans, b.trans, m, n, k, a.holder.raw_data(),
                                           a.ld, b.holder.raw_data(), b.ld, out.raw_data(),
                                           dgelu_aux.raw_data(), detail::stream_of(out)));
    return;
  }
  if (out.device().is_cuda()) {
    LOOM_IF_CUDA(kernels::cuda::gemm(
        operands, out.dtype(), a.trans, b.trans, m, n, k, a.holder.raw_data(), a.ld, a.batch_stride,
        b.holder.raw_data(), b.ld, b.batch_stride, out.raw_data(), std::max<int64_t>(n, 1), m * n,
        batch, accumulate, bias.defined() ? bias.raw_data() : nullptr,
        b_sums.defined() ? b_sums.raw_data() : nullptr, detail::stream_of(out)));
    return;
  }
  check(!b_sums.defined(), "batched_gemm: column sums in the GEMM are CUDA's");
  if (operands != out.dtype())
    fail("matmul: ", operands, " operands on the CPU give a ", operands, " product, not ",
         out.dtype());
  detail::dispatch_floating(out.dtype(), "matmul", [&]<typename T>() {
    const T* pa = a.holder.data<T>();
    const T* pb = b.holder.data<T>();
    T* pc = out.data<T>();
    for_each_product(batch, m, n, k, [&](int64_t i) {
      kernels::cpu::gemm<T>(a.trans, b.trans, m, n, k, pa + i * a.batch_stride, a.ld,
                            pb + i * b.batch_stride, b.ld, pc + i * m * n,
                            std::max<int64_t>(n, 1), accumulate);
    });
  });
}

Tensor matmul_forward(const Tensor& a, const Tensor& b) {
  detail::check_kernel_device("matmul", a);
  detail::check_kernel_device("matmul", b);
  detail::check_same_kind("matmul", a, b);
  if (a.dim() < 2 || b.dim() < 2) {
    fail("matmul: operands need at least 2 dimensions, got ", shape_str(a.shape()), " and ",
         shape_str(b.shape()));
  }
  int64_t m = a.size(-2), k = a.size(-1), n = b.size(-1);
  if (b.size(-2) != k) {
    fail("matmul: inner dimensions differ: ", shape_str(a.shape()), " x ", shape_str(b.shape()));
  }
  Shape out_shape(a.shape().begin(), a.shape().end() - 1);
  out_shape.push_back(n);
  if (b.dim() == 2) {
    // Fold a's leading dims into rows: [..., m, k] -> [rows, k].
    int64_t rows = a.numel() / std::max<int64_t>(k, 1);
    if (k == 0) rows = numel_of(out_shape) / std::max<int64_t>(n, 1);
    Tensor a2 = a.dim() == 2 ? a : detail::contiguous_input(a);
    if (a.dim() != 2) a2 = Tensor::make_view(a2, {rows, k}, {k, 1}, a2.offset());
    Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
    if (out.numel() == 0) return out;
    batched_gemm(as_operand(a2), as_operand(b), out, 1, rows, n, k, false);
    return out;
  }
  Shape batch_a(a.shape().begin(), a.shape().end() - 2);
  Shape batch_b(b.shape().begin(), b.shape().end() - 2);
  if (batch_a != batch_b) {
    fail("matmul: batch dimensions differ: ", shape_str(a.shape()), " x ", shape_str(b.shape()),
         " (batched operands must have equal batch dimensions)");
  }
  Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
  if (out.numel() == 0) return out;
  int64_t batch = numel_of(batch_a);
  batched_gemm(as_operand(fold_batch(a)), as_operand(fold_batch(b)), out, batch, m, n, k, false);
  return out;
}

// a @ b (2-D, no autograd) in `dtype`: a's, or f32 for bf16/f16 operands, the f32 sums not
// rounded to 16 bits (a weight gradient: Note [Weight gradients in f32] in autocast.cpp).
Tensor product_in(const Tensor& a, const Tensor& b, DType dtype) {
  if (dtype == a.dtype() || !is_16bit_float(a.dtype())) return matmul(a, b);
  if (f16_on_the_cpu(a)) return matmul(cast(a, DType::F32), cast(b, DType::F32));
  Tensor out = Tensor::empty({a.size(0), b.size(1)}, dtype, a.device());
  if (out.numel() > 0)
    batched_gemm(as_operand(a), as_operand(b), out, 1, a.size(0), b.size(1), a.size(1), false);
  return out;
}

// {a @ b, the sums of b's columns} (2-D, no autograd), both in `dtype` as product_in gives a
// product: a linear layer's weight and bias gradients, X^T dY and dY's column sums. On CUDA
// (and meta following it) one GEMM gives both (its BGRADA epilogue: kernels/cuda/gemm.h), the
// launch a separate column sum would take saved; elsewhere product_in and sum().
std::pair<Tensor, Tensor> product_and_column_sums(const Tensor& a, const Tensor& b, DType dtype) {
  const bool in_one_gemm = takes_cuda_path(b.device()) && a.dtype() == b.dtype() &&
                           (dtype == a.dtype() || is_16bit_float(a.dtype()));
  if (!in_one_gemm) return {product_in(a, b, dtype), sum(b, {0}, false, dtype)};
  Tensor out = Tensor::empty({a.size(0), b.size(1)}, dtype, a.device());
  Tensor sums = Tensor::empty({b.size(1)}, dtype, b.device());
  if (sums.numel() > 0)
    batched_gemm(as_operand(a), as_operand(b), out, 1, a.size(0), b.size(1), a.size(1), false,
                 Tensor(), sums);
  return {out, sums};
}

}  // namespace

void detail::matmul_into(const Tensor& a, const Tensor& b, Tensor& out, bool accumulate) {
  check(a.dim() == 2 && b.dim() == 2 && out.dim() == 2 && out.is_contiguous() &&
            a.size(1) == b.size(0) && out.size(0) == a.size(0) && out.size(1) == b.size(1),
        "matmul_into: expected a [m, k], b [k, n] and a contiguous out [m, n]");
  if (out.numel() == 0) return;
  batched_gemm(as_operand(a), as_operand(b), out, 1, a.size(0), b.size(1), a.size(1), accumulate);
}

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  if (autocast_dtype() != DType::F32) {
    DType low = autocast_dtype();
    AutocastGuard off(DType::F32);  // convert operands and result once, not recursively
    return autocast_output(matmul(autocast_input(a_in, low), autocast_input(b_in, low)), low);
  }
  const Tensor& a = a_in;
  const Tensor& b = b_in;
  if (f16_on_the_cpu(a)) {
    detail::check_same_kind("matmul", a, b);
    return cast(matmul(cast(a, DType::F32), cast(b, DType::F32)), a.dtype());
  }
  Tensor out = matmul_forward(a, b);
  if (autograd::any_requires_grad({a, b})) {
    autograd::record(
        "Matmul", {a, b}, {out},
        [a = a.detach(), b = b.detach()](const std::vector<Tensor>& g, const autograd::Node& node) {
          Tensor ga, gb;
          if (node.needs_input_grad(0)) ga = matmul(g[0], transpose(b, -1, -2));
          if (node.needs_input_grad(1)) {
            if (b.dim() == 2) {
              Tensor a2 = a.dim() > 2 ? reshape(a, {-1, a.size(-1)}) : a;
              Tensor g2 = a.dim() > 2 ? reshape(g[0], {-1, g[0].size(-1)}) : g[0];
              // A transposed b (x @ weight^T) gets its gradient in its own layout, (g^T a)^T,
              // so that it reaches the weight contiguous, without a strided pass; in the
              // dtype its producer takes (f32 for a weight's cast: Note [Weight gradients in
              // f32] in autocast.cpp).
              const DType want = node.input_gradient_dtype(1);
              gb = detail::is_transposed_matrix(b)
                       ? transpose(product_in(transpose(g2, 0, 1), a2, want), 0, 1)
                       : product_in(transpose(a2, 0, 1), g2, want);
            } else {
              gb = matmul(transpose(a, -1, -2), g[0]);
            }
          }
          return std::vector<Tensor>{ga, gb};
        });
  }
  return out;
}

namespace {

// A linear layer's weight and bias gradients from its input x2 [rows, in] and output gradient
// g2 [rows, out], each wanted by `node` (inputs 1 and 2) in the dtype its producer takes (f32
// for weight casts: Note [Weight gradients in f32] in autocast.cpp), in one GEMM where both
// are wanted in one dtype (its epilogue sums the bias's).
std::pair<Tensor, Tensor> linear_parameter_gradients(const Tensor& x2, const Tensor& g2,
                                                     const autograd::Node& node) {
  Tensor gw, gb;
  const bool weight = node.needs_input_grad(1), bias = node.needs_input_grad(2);
  if (weight && bias && node.input_gradient_dtype(1) == node.input_gradient_dtype(2))
    return product_and_column_sums(transpose(x2, 0, 1), g2, node.input_gradient_dtype(1));
  if (weight) gw = product_in(transpose(x2, 0, 1), g2, node.input_gradient_dtype(1));
  if (bias) gb = sum(g2, {0}, false, node.input_gradient_dtype(2));
  return {gw, gb};
}

// x [..., in] as the [rows, in] matrix a linear layer multiplies, never recorded.
Tensor as_rows(const Tensor& x, int64_t rows, int64_t in) {
  NoGradGuard no_grad;
  return reshape(x.contiguous(), {rows, in});
}

// An undefined bias: none.
void check_linear_shapes(const char* op, const Tensor& x, const Tensor& weight,
                         const Tensor& bias) {
  const bool bias_fits =
      !bias.defined() || (bias.dim() == 1 && weight.dim() == 2 && bias.size(0) == weight.size(1));
  if (weight.dim() != 2 || x.dim() < 1 || x.size(-1) != weight.size(0) || !bias_fits) {
    fail(op, ": expected x [..., in], weight [in, out], bias [out]; got x ", shape_str(x.shape()),
         ", weight ", shape_str(weight.shape()), ", bias ",
         bias.defined() ? shape_str(bias.shape()) : std::string("none"));
  }
}

// What linear_with records for GELU in the GEMM (CUDA's path, or meta following it).
enum class GeluInGemm {
  kNone,
  // The node's output is GELU's: its backward takes GELU's gradient, then linear's.
  kOutput,
  // The node's output is the biased product, GELU's input (linear's backward); GELU's output
  // is written beside it outside autograd, for linear_after_gelu to read.
  kKeepingInput,
};

// linear(x, weight, bias) as {out, undefined}; or with `gelu` (CUDA's path, or meta following
// it) {gelu of it, the biased product}, both from one GEMM (kernels::cuda::gemm_bias_gelu).
GeluOutput linear_with(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                       GeluInGemm gelu) {
  if (autocast_dtype() != DType::F32) {
    DType low = autocast_dtype();
    AutocastGuard off(DType::F32);
    GeluOutput r = linear_with(autocast_input(x_in, low), autocast_input(weight_in, low),
                               autocast_input(bias_in, low), gelu);
    return {autocast_output(r.out, low),
            r.input.defined() ? autocast_output(r.input, low) : r.input};
  }
  const Tensor& x = x_in;
  const Tensor& weight = weight_in;
  const Tensor& bias = bias_in;
  detail::check_kernel_device("linear", x);
  detail::check_same_kind("linear", x, weight);
  detail::check_same_kind("linear", x, bias);
  const bool with_gelu = gelu != GeluInGemm::kNone;
  check(!with_gelu || takes_cuda_path(x.device()), "linear_with: GELU in the GEMM is CUDA's");
  if (f16_on_the_cpu(x)) {
    return {cast(linear(cast(x, DType::F32), cast(weight, DType::F32), cast(bias, DType::F32)),
                 x.dtype()),
            Tensor()};
  }
  check_linear_shapes("linear", x, weight, bias);
  int64_t in = weight.size(0), out_features = weight.size(1);
  int64_t rows = x.numel() / std::max<int64_t>(in, 1);
  Tensor x2 = as_rows(x, rows, in);
  Shape out_shape(x.shape().begin(), x.shape().end() - 1);
  out_shape.push_back(out_features);
  Tensor out = Tensor::empty(out_shape, x.dtype(), x.device());
  Tensor pre = with_gelu ? Tensor::empty(out_shape, x.dtype(), x.device()) : Tensor();
  Tensor b = detail::contiguous_input(bias);
  if (out.device().is_cuda() || out.device().is_meta()) {
    if (out.numel() > 0)
      batched_gemm(as_operand(x2), as_operand(weight), out, 1, rows, out_features, in, false, b,
                   Tensor(), pre);
  } else {
    // Every row starts as the bias, which the product then accumulates onto.
    const size_t row_bytes = static_cast<size_t>(out_features) * dtype_size(out.dtype());
    auto* po = static_cast<std::byte*>(out.raw_data());
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(po + static_cast<size_t>(r) * row_bytes, b.raw_data(), row_bytes);
    if (out.numel() > 0)
      batched_gemm(as_operand(x2), as_operand(weight), out, 1, rows, out_features, in, true);
  }
  if (!autograd::any_requires_grad({x, weight, bias})) return {out, pre};
  // The recorded output: the product, or with GELU in the GEMM GELU's output or its input.
  const bool gelu_backward = gelu == GeluInGemm::kOutput;
  const Tensor& recorded = gelu == GeluInGemm::kKeepingInput ? pre : out;
  autograd::record(
      gelu_backward ? "LinearGelu" : "Linear", {x, weight, bias}, {recorded},
      [x2 = x2.detach(), w = weight.detach(), pre = gelu_backward ? pre.detach() : Tensor(),
       x_shape = x.shape()](const std::vector<Tensor>& g, const autograd::Node& node) {
        Tensor g2 = reshape(pre.defined() ? detail::gelu_backward(pre, g[0]) : g[0],
                            {x2.size(0), w.size(1)});
        Tensor gx;
        if (node.needs_input_grad(0)) gx = reshape(matmul(g2, transpose(w, 0, 1)), x_shape);
        auto [gw, gb] = linear_parameter_gradients(x2, g2, node);
        return std::vector<Tensor>{gx, gw, gb};
      });
  return {out, pre};
}

}  // namespace

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_with(x, weight, bias, GeluInGemm::kNone).out;
}

Tensor detail::linear_gelu_in_one_gemm(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return linear_with(x, weight, bias, GeluInGemm::kOutput).out;
}

// Note [GELU's gradient in the next product]
// GPT-2's MLP is linear, GELU, linear. cuBLASLt takes GELU's gradient in the epilogue of the
// GEMM that gives the second linear's input gradient (DGELU: the f32 sum dH = dY W2^T times
// gelu'(pre), rounded once), so GELU's backward kernel (reading dH and pre, writing dpre) goes;
// llm.c does this on sm_90 (its gelu_fusion 2). That GEMM belongs to the second linear's node,
// which must then know GELU's input and give its gradient to GELU's input, not to its own
// (GELU's output). Found by pattern (the second linear looking at its input's producer), the
// fusion would depend on what stands between the two: a sharded unit's backward entry
// (DeepSpeed stage 3's per-module units wrap each linear, FSDP's per-block ones do not) hides
// GELU, and the fused and the unfused backward differ in their bits (dH rounded to 16 bits
// first or not), so the strategies would stop agreeing bitwise (tried 2026-12-06). So it is
// structural: linear_gelu_keeping_input makes GELU's input the first layer's differentiable
// output, with GELU's output beside it carrying no gradient, and linear_after_gelu records a
// node over GELU's input, the weight and the bias that keeps GELU's output as saved data.
// What wraps the first layer's output (nn::Linear's forward hook wraps `input`) wraps the
// tensor the gradient flows through, and every strategy runs the same arithmetic. Numerics:
// GELU's gradient scales the unrounded f32 dH, where PyTorch's autocast rounds dH to bf16
// first: one rounding fewer. Where cuBLASLt has no DGELU algorithm, the GEMM rounds dH and
// GELU's backward kernel scales it (kernels/cuda/gemm.h). The CPU has no GEMM epilogue: there
// `input` is undefined and the two are linear_gelu and linear (bias_gelu's one-pass backward).
// On CUDA a GPT-2 layer is a launch fewer each step (test_emulated_training.cpp counts them).
GeluOutput linear_gelu_keeping_input(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (!takes_cuda_path(x.device())) return {linear_gelu(x, weight, bias), Tensor()};
  GeluOutput r = linear_with(x, weight, bias, GeluInGemm::kKeepingInput);
  if (!r.input.requires_grad()) r.input = Tensor();  // nothing to differentiate: out is all
  return r;
}

Tensor linear_after_gelu(const GeluOutput& gelu, const Tensor& weight_in, const Tensor& bias_in) {
  if (!gelu.input.defined())
    return bias_in.defined() ? linear(gelu.out, weight_in, bias_in) : matmul(gelu.out, weight_in);
  if (autocast_dtype() != DType::F32) {
    DType low = autocast_dtype();
    AutocastGuard off(DType::F32);
    const GeluOutput in{autocast_input(gelu.out, low), autocast_input(gelu.input, low)};
    const Tensor bias = bias_in.defined() ? autocast_input(bias_in, low) : bias_in;
    return autocast_output(linear_after_gelu(in, autocast_input(weight_in, low), bias), low);
  }
  const Tensor &h = gelu.out, &pre = gelu.input, &weight = weight_in, &bias = bias_in;
  for (const Tensor* t : {&h, &pre, &weight, &bias}) {
    if (!t->defined()) continue;  // no bias
    detail::check_kernel_device("linear_after_gelu", *t);
    detail::check_same_kind("linear_after_gelu", h, *t);
  }
  check(
      takes_cuda_path(h.device()),
      "linear_after_gelu: GELU's input is kept on the CUDA path only (linear_gelu_keeping_input)");
  if (pre.shape() != h.shape())
    fail("linear_after_gelu: GELU's input ", shape_str(pre.shape()), " and output ",
         shape_str(h.shape()), " differ in shape");
  check_linear_shapes("linear_after_gelu", h, weight, bias);
  const int64_t in = weight.size(0), out_features = weight.size(1);
  const int64_t rows = h.numel() / std::max<int64_t>(in, 1);
  Tensor h2 = as_rows(h, rows, in), pre2 = as_rows(pre, rows, in);
  Shape out_shape(h.shape().begin(), h.shape().end() - 1);
  out_shape.push_back(out_features);
  Tensor out = Tensor::empty(out_shape, h.dtype(), h.device());
  if (out.numel() > 0)
    batched_gemm(as_operand(h2), as_operand(weight), out, 1, rows, out_features, in, false,
                 bias.defined() ? detail::contiguous_input(bias) : Tensor());
  if (!autograd::any_requires_grad({pre, weight, bias})) return out;
  autograd::record(
      "LinearAfterGelu", {pre, weight, bias}, {out},
      [h2 = h2.detach(), pre2 = pre2.detach(), w = weight.detach(), pre_shape = pre.shape()](
          const std::vector<Tensor>& g, const autograd::Node& node) {
        Tensor g2 = reshape(g[0], {h2.size(0), w.size(1)});
        Tensor gpre;
        if (node.needs_input_grad(0)) {  // (g2 @ w^T) * gelu'(pre): GELU's gradient in the GEMM
          gpre = Tensor::empty(pre2.shape(), pre2.dtype(), pre2.device());
          if (gpre.numel() > 0)
            batched_gemm(as_operand(g2), as_operand(transpose(w, 0, 1)), gpre, 1, h2.size(0),
                         h2.size(1), w.size(1), false, Tensor(), Tensor(), Tensor(), pre2);
          gpre = reshape(gpre, pre_shape);
        }
        auto [gw, gb] = linear_parameter_gradients(h2, g2, node);
        return std::vector<Tensor>{gpre, gw, gb};
      });
  return out;
}

}  // namespace loom
