// bias_gelu: a product's bias and the GELU after it in one pass each way.
//
// Note [Bias and GELU in one pass]
// GPT-2's MLP computes gelu(x @ W + b). As linear and gelu, the forward writes x @ W + b
// (the bias first, the product accumulated onto it: on the CPU a pass that fills the output
// with the bias rows and a product that reads it back) and reads it again for GELU; the
// backward writes GELU's gradient and reads it again to sum the bias's gradient. Megatron's
// bias_gelu (megatron/core/fusions/fused_bias_gelu.py) takes the product without its bias
// instead: y = gelu(x + b) reads x once and writes y once, and its backward writes
// dx = dy * gelu'(x + b) and sums each column of it into db in the same pass. What is saved
// for backward is the same tensor as before (the product, now without its bias), so memory
// is unchanged. The results are gelu's up to the rounding of x @ W + b: the bias is added to
// the finished product instead of the product accumulated onto it. On the CPU the threads
// take columns in backward, so each db sums its rows in order on any thread count; on CUDA
// the kernel writes dx and sum() reduces it (the same two launches as gelu's backward and
// linear's bias gradient). Under autocast the product arrives in bf16 or f16; the CPU
// kernels read and write those themselves, computing in f32 (kernels/cpu/widen.h): the bits
// of widening x, the bias and dy to f32 copies and rounding the results, without the copies.
//
// On CUDA the GEMM does better than this op: its epilogue adds the bias and takes GELU as the
// product is written, keeping the biased product for the backward (cuBLASLt's GELU_AUX_BIAS,
// kernels::cuda::gemm_bias_gelu), and the weight gradient's GEMM sums the bias's gradient
// (BGRADA), where bias_gelu's backward needs a column sum of its own. So linear_gelu, GPT-2's
// MLP's first layer, is one GEMM forward on CUDA (and on meta following it; GELU's gradient,
// then linear's, backward: detail::linear_gelu_in_one_gemm) and the product then bias_gelu on
// the CPU: a pass fewer forward and a column sum fewer backward on CUDA (issue 46's launch
// budget). The two agree to rounding: CUDA takes GELU of the biased f32 sum, rounded once,
// where the CPU rounds the product, adds the bias and rounds GELU of that.

#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/widen.h"
#include "tensor/autocast.h"
#include "tensor/autograd/node.h"
#include "tensor/meta.h"
#include "tensor/ops.h"
#include "tensor/ops/cuda_support.h"
#include "tensor/ops/dispatch.h"

#if LOOM_WITH_CUDA
#include "kernels/cuda/elementwise.h"
#endif

namespace loom {

namespace {

// FLOPs per element as the meta device counts them: the bias's add and GELU's 8
// (elementwise.cpp's kActivationFlops); backward counts twice GELU's and the bias's sum.
constexpr double kBiasGeluFlops = 9;

// gelu(x + bias) for a contiguous x [rows, width], never recorded.
Tensor bias_gelu_forward(const Tensor& x, const Tensor& bias, int64_t rows, int64_t width) {
  Tensor y = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (reports_op_cost(x.device()))
    record_meta_op("bias_gelu", OpClass::Elementwise, kBiasGeluFlops * double(x.numel()),
                   {x, bias}, {y});
  if (x.device().is_meta()) return y;
  if (x.device().is_cuda()) {
    LOOM_IF_CUDA(kernels::cuda::bias_gelu_forward(x.dtype(), x.raw_data(), bias.raw_data(),
                                                  y.raw_data(), rows, width,
                                                  detail::stream_of(x)));
    return y;
  }
  detail::dispatch_floating_storage(x.dtype(), "bias_gelu", [&]<typename T>() {
    kernels::cpu::bias_gelu_forward<T>(x.data<T>(), bias.data<T>(), y.data<T>(), rows, width);
  });
  return y;
}

// {dx, dbias} for a contiguous x [rows, width], never recorded; dbias in `bias_grad_dtype`
// (the bias's, or f32 for a 16-bit bias: its f32 sums unrounded, Note [Weight gradients in
// f32] in autocast.cpp).
std::vector<Tensor> bias_gelu_backward(const Tensor& x, const Tensor& bias, const Tensor& dy_in,
                                       int64_t rows, int64_t width, DType bias_grad_dtype) {
  if (detail::computes_through_f32(x) && dy_in.dtype() != x.dtype()) {  // dy not rounded
    NoGradGuard no_grad;
    std::vector<Tensor> g =
        bias_gelu_backward(detail::widened(x), detail::widened(bias), detail::widened(dy_in),
                           rows, width, DType::F32);
    return {cast(g[0], x.dtype()), cast(g[1], bias_grad_dtype)};
  }
  Tensor dy = detail::contiguous_input(dy_in);
  Tensor dx = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (takes_cuda_path(x.device())) {  // CUDA, or meta standing for it
    if (reports_op_cost(x.device()))
      record_meta_op("BiasGelu", OpClass::Elementwise, 2 * kBiasGeluFlops * double(x.numel()),
                     {x, bias, dy}, {dx});
    if (x.device().is_cuda()) {
      LOOM_IF_CUDA(kernels::cuda::bias_gelu_backward(x.dtype(), x.raw_data(), bias.raw_data(),
                                                     dy.raw_data(), dx.raw_data(), rows, width,
                                                     detail::stream_of(x)));
    }
    return {dx, sum(reshape(dx, {rows, width}), {0}, false, bias_grad_dtype)};
  }
  Tensor dbias = Tensor::empty(bias.shape(), bias_grad_dtype, bias.device());
  if (reports_op_cost(x.device()))
    record_meta_op("BiasGelu", OpClass::Elementwise, 2 * kBiasGeluFlops * double(x.numel()),
                   {x, bias, dy}, {dx, dbias});
  if (x.device().is_meta()) return {dx, dbias};
  detail::dispatch_floating_storage(x.dtype(), "bias_gelu", [&]<typename T>() {
    if (dbias.dtype() == x.dtype()) {
      kernels::cpu::bias_gelu_backward<T>(x.data<T>(), bias.data<T>(), dy.data<T>(), dx.data<T>(),
                                          dbias.data<T>(), rows, width);
    } else if constexpr (kernels::cpu::kIs16BitFloat<T>) {
      kernels::cpu::bias_gelu_backward<T, float>(x.data<T>(), bias.data<T>(), dy.data<T>(),
                                                 dx.data<T>(), dbias.data<float>(), rows, width);
    }
  });
  return {dx, dbias};
}

}  // namespace

Tensor linear_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  if (takes_cuda_path(x.device())) return detail::linear_gelu_in_one_gemm(x, weight, bias);
  return bias_gelu(matmul(x, weight), bias);
}

Tensor bias_gelu(const Tensor& x_in, const Tensor& bias_in) {
  detail::check_kernel_device("bias_gelu", x_in);
  detail::check_kernel_device("bias_gelu", bias_in);
  Tensor bias = bias_in;
  // Under autocast the bias belongs to the product x came from: it takes the product's
  // 16-bit dtype, as linear's bias does (so the sum is computed as PyTorch's autocast
  // linear followed by GELU computes it, up to rounding the product once more).
  const DType low = autocast_dtype();
  if (low != DType::F32 && x_in.dtype() == low && bias.dtype() != low) {
    bias = autocast_input(bias, low);
    if (bias.dtype() != low) bias = cast(bias, low);
  }
  detail::check_same_kind("bias_gelu", x_in, bias);
  if (x_in.dim() < 1 || bias.shape() != Shape{x_in.size(-1)}) {
    fail("bias_gelu: expected x [..., n] and bias [n]; got x ", shape_str(x_in.shape()),
         ", bias ", shape_str(bias.shape()));
  }
  const int64_t width = x_in.size(-1);
  const int64_t rows = width ? x_in.numel() / width : 0;
  Tensor x = detail::contiguous_input(x_in), b = detail::contiguous_input(bias);
  Tensor y = bias_gelu_forward(x, b, rows, width);
  if (autograd::any_requires_grad({x_in, bias})) {
    autograd::record("BiasGelu", {x_in, bias}, {y},
                     [x = x.detach(), b = b.detach(), rows, width](const std::vector<Tensor>& g,
                                                                   const autograd::Node& node) {
                       std::vector<Tensor> d = bias_gelu_backward(
                           x, b, g[0], rows, width,
                           node.needs_input_grad(1) ? node.input_gradient_dtype(1) : b.dtype());
                       if (!node.needs_input_grad(0)) d[0] = Tensor();
                       if (!node.needs_input_grad(1)) d[1] = Tensor();
                       return d;
                     });
  }
  return y;
}

}  // namespace loom
