#pragma once
// Internal helpers shared by the op implementations (not part of the public API).

#include <cstdint>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace loom::detail {

// Calls f.template operator()<T>() with T = float or double for dtype, or throws naming op.
template <typename F>
decltype(auto) dispatch_floating(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: return f.template operator()<float>();
    case DType::F64: return f.template operator()<double>();
    default:
      fail(op, ": expected an f32 or f64 tensor, got ", dtype, "; cast with .to(DType::F32) first");
  }
}

// dispatch_floating's, with T = BFloat16 or Half for bf16 and f16 too: for the CPU kernels
// that read and write the 16-bit floats themselves, computing them in f32
// (kernels/cpu/widen.h), where other ops go through computes_through_f32 below.
template <typename F>
decltype(auto) dispatch_floating_storage(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::BF16: return f.template operator()<BFloat16>();
    case DType::F16: return f.template operator()<Half>();
    default: return dispatch_floating(dtype, op, std::forward<F>(f));
  }
}

// Whether x holds bf16 or f16 on the CPU (or on meta following the CPU's path), whose
// elementwise, reduction and attention kernels take f32 and f64 only: such an op runs on f32
// copies (`widened`) and rounds its result to x's dtype once, the arithmetic of CUDA's
// kernels, which widen on load and round on store.
bool computes_through_f32(const Tensor& x);
// Whether x is a transposed view of a contiguous matrix ([r, c] with strides [1, r]): a
// weight^T of torch.nn.Linear's layout (Llama's projections, a tied output head).
inline bool is_transposed_matrix(const Tensor& x) {
  return x.dim() == 2 && x.size(0) > 1 && x.size(1) > 1 && x.strides()[0] == 1 &&
         x.strides()[1] == x.size(0);
}
// x converted to f32, never recorded by autograd.
Tensor widened(const Tensor& x);
// The dtype two floating operands of different dtypes compute in, as PyTorch promotes them:
// the wider; bf16 with f16 gives f32.
DType promoted_dtype(DType a, DType b);

// Throws unless t is defined and this build has kernels for its device.
void check_kernel_device(const char* op, const Tensor& t);
// Whether x's elements fill the span of storage from its first element without gaps or
// overlaps, in some order of its dimensions (a transposed or permuted contiguous tensor).
bool is_dense(const Tensor& x);
// x's elements in row-major layout for a kernel to read: x itself when contiguous, else a
// copy. Never recorded by autograd (the calling op records its own node against x).
Tensor contiguous_input(const Tensor& x);
// Throws unless a and b share dtype and device.
void check_same_kind(const char* op, const Tensor& a, const Tensor& b);
// out = a @ b (out += a @ b when accumulate) for 2-D a [m, k] and b [k, n], views used in
// place as matmul uses them, into a contiguous out [m, n] of their dtype and device; never
// recorded by autograd. For ops that reuse one buffer across products.
void matmul_into(const Tensor& a, const Tensor& b, Tensor& out, bool accumulate);
// Each of `xs` (contiguous f32 tensors on one device) cast to `dtype` (bf16 or f16): the bits
// of cast() for each, in one launch on CUDA (kernels::cuda::multi_tensor_cast) and one
// reported op on meta; never recorded by autograd. Autocast's weight casts of a step.
std::vector<Tensor> cast_each(const std::vector<Tensor>& xs, DType dtype);
// Records out, x converted to out's dtype (cast() or a cast made otherwise, such as a
// transposed matrix's through its base), as cast() records it, when x needs a gradient.
void record_cast(const Tensor& x, const Tensor& out);
// gelu(linear(x, weight, bias)) on CUDA's path (CUDA, or meta following it) in one GEMM, its
// epilogue adding the bias and taking GELU and keeping GELU's input for the backward
// (kernels::cuda::gemm_bias_gelu): linear_gelu's form there (Note [Bias and GELU in one pass]).
Tensor linear_gelu_in_one_gemm(const Tensor& x, const Tensor& weight, const Tensor& bias);
// dy * gelu'(x) (contiguous x, never recorded): gelu's backward, for ops that fuse GELU
// (linear_gelu on CUDA, whose GEMM wrote x beside gelu(x)).
Tensor gelu_backward(const Tensor& x, const Tensor& dy);
// linear_cross_entropy's chunked form (Note [The classifier without its logits]) with
// chunks of `chunk_rows` rows; for tests of its independence of the chunks.
Tensor linear_cross_entropy_in_chunks(const Tensor& x, const Tensor& weight,
                                      const Tensor& targets, int64_t chunk_rows);
// Index tensor (i32 or i64, any shape) as i64 values, each checked to be in [0, upper).
std::vector<int64_t> indices_as_i64(const char* op, const Tensor& indices, int64_t upper);

}  // namespace loom::detail
