#pragma once
// Elementwise CUDA kernels on raw device pointers: the CUDA counterparts of
// kernels/cpu/elementwise.h plus fills and dtype conversions (tensor/ops/copy.cpp on the CPU).
//
// All launchers are asynchronous on `stream`: they enqueue work, never synchronise, and throw
// loom::Error for a dtype they do not take or a failed launch. Sizes are element counts; n == 0
// enqueues nothing. Arithmetic kernels take f32, f64, bf16 and f16; f64 computes in double,
// the others in f32 (bf16/f16 are widened on load and rounded to nearest even on store).
// Scalar arguments (`factor`, `value`) are rounded once to the compute type (float, or double
// for f64), as the CPU path rounds them to T with static_cast.

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace loom::kernels::cuda {

enum class BinaryOp { Add, Sub, Mul, Div };

// Most dimensions a strided kernel takes (shapes and strides travel by value in the launch).
constexpr int kMaxDims = 8;

// out (contiguous, `shape`) = a op b, with a and b read through their own strides (in
// elements; 0 broadcasts). `out` may alias a or b only where that operand is contiguous with
// `shape` itself (every element is read before it is written). ndim <= kMaxDims; ndim 0 is one
// element. Contiguous operands take a 16-byte vectorised path.
void binary(BinaryOp op, DType dtype, int ndim, const int64_t* shape, const void* a,
            const int64_t* a_strides, const void* b, const int64_t* b_strides, void* out,
            cudaStream_t stream);

void add_inplace(DType dtype, void* a, const void* b, int64_t n, cudaStream_t stream);  // a += b
// out[i] (f32) = a[i % a_period] (f32) + b[i] (bf16 or f16, `b_dtype`), b widened on load: the
// values of adding b cast to f32, in one pass (a 16-bit matmul result meeting the f32 residual
// stream, a_period = n, or an f32 bias, a_period = its length; with out == a, a 16-bit
// gradient accumulated into an f32 one). All contiguous; a_period divides n.
void add_widened(DType b_dtype, float* out, const float* a, int64_t a_period, const void* b,
                 int64_t n, cudaStream_t stream);
void scale_inplace(DType dtype, void* a, double factor, int64_t n,
                   cudaStream_t stream);  // a *= factor
void add_scalar(DType dtype, const void* a, double value, void* out, int64_t n,
                cudaStream_t stream);  // out = a + value (out may equal a)
void scale(DType dtype, const void* a, double factor, void* out, int64_t n,
           cudaStream_t stream);  // out = a * factor (out may equal a)
// tensors[k][i] *= factor for `count` device buffers of sizes[k] elements of `dtype`, each
// element as scale_inplace computes it, in one launch per 256 tensors or 2,560 chunks of 65,536
// elements (Note [Multi-tensor launches] in chunk_plan.cuh): gradient clipping's scaling.
// `tensors` and `sizes` are host memory, read during the call only.
void multi_tensor_scale(DType dtype, void* const* tensors, const int64_t* sizes, int count,
                        double factor, cudaStream_t stream);

// dst[k] = src[k] converted, for `count` contiguous tensors of sizes[k] elements: f32 to bf16
// or f16, every element as copy_strided converts it, in one launch per 256 tensors or 2,560
// chunks of 65,536 elements (Note [Multi-tensor launches]): autocast's weight casts of a step
// (tensor/autocast.cpp). `src`, `dst` and `sizes` are host memory, read during the call only.
void multi_tensor_cast(DType src_dtype, DType dst_dtype, const void* const* src,
                       void* const* dst, const int64_t* sizes, int count, cudaStream_t stream);

// GELU, tanh approximation, as kernels/cpu: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
// The CPU's f32 path uses a polynomial tanh (relative error ~2e-7); this one uses tanhf, so f32
// results are not bitwise the CPU's: a few ulp apart for x >= -1, but where 1 + tanh cancels
// (x < -1) only to ~4e-7 absolute (backward: ~2e-6 |dy| absolute), since the cancellation
// magnifies the polynomial's error (below x ~ -5 the CPU's 1 + tanh is exactly 0).
void gelu_forward(DType dtype, const void* x, void* y, int64_t n, cudaStream_t stream);
// dx = dy * dgelu/dx (x, dy, dx contiguous; dx may equal dy).
void gelu_backward(DType dtype, const void* x, const void* dy, void* dx, int64_t n,
                   cudaStream_t stream);
// Megatron's fused bias + GELU over `rows` rows of `width` (x, y, dy, dx contiguous; bias
// [width]): y = gelu(x + bias), dx = dy * gelu'(x + bias), as gelu_* compute them (so within
// gelu's bounds of the CPU's bias_gelu_*). The bias's gradient, the column sums of dx, is the
// caller's reduction (the op sums dx over rows).
void bias_gelu_forward(DType dtype, const void* x, const void* bias, void* y, int64_t rows,
                       int64_t width, cudaStream_t stream);
void bias_gelu_backward(DType dtype, const void* x, const void* bias, const void* dy, void* dx,
                        int64_t rows, int64_t width, cudaStream_t stream);
// SiLU, as kernels/cpu: y = x / (1 + exp(-x)) (expf in f32: a few ulp from the CPU's std::exp).
void silu_forward(DType dtype, const void* x, void* y, int64_t n, cudaStream_t stream);
// dx = dy * s (1 + x (1 - s)), s = sigmoid(x) (x, dy, dx contiguous; dx may equal dy).
void silu_backward(DType dtype, const void* x, const void* dy, void* dx, int64_t n,
                   cudaStream_t stream);
// SwiGLU, as kernels/cpu's swiglu_* (silu as silu_forward computes it): y = silu(gate) * up;
// du = dy * silu(gate), dgate = dy * up * silu'(gate) (all contiguous, n elements).
void swiglu_forward(DType dtype, const void* gate, const void* up, void* y, int64_t n,
                    cudaStream_t stream);
void swiglu_backward(DType dtype, const void* gate, const void* up, const void* dy, void* dgate,
                     void* dup, int64_t n, cudaStream_t stream);

// dst[0..n) = value converted to `dtype` exactly as fill_ on the CPU does (any of the 7 dtypes:
// double -> float -> bf16/f16 with round-to-nearest-even; to integers by truncation).
void fill(DType dtype, void* dst, double value, int64_t n, cudaStream_t stream);

// dst (contiguous, `shape`, dst_dtype) = src (strided, src_dtype), converting between any two
// of the 7 dtypes with the CPU's rules (tensor/ops/copy.cpp): integer -> integer wraps like
// static_cast; everything else goes through double, then to bf16/f16 via float with
// round-to-nearest-even (bf16 bit-for-bit the CPU's float_to_bf16_bits, NaN payloads included;
// f16 bit-for-bit except NaN payloads), and to integers by truncation toward zero (values out of
// the integer's range are undefined behaviour on the CPU; here they saturate at the range of the
// conversion's intermediate integer type, so a u8 target wraps values that fit an int32).
// Contiguous same-dtype copies are one cudaMemcpyAsync; contiguous f32 <-> bf16/f16 use 16-byte
// vectorised kernels. src and dst must not overlap.
void copy_strided(DType src_dtype, int ndim, const int64_t* shape, const void* src,
                  const int64_t* src_strides, DType dst_dtype, void* dst, cudaStream_t stream);

}  // namespace loom::kernels::cuda
