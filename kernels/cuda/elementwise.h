#pragma once
// Elementwise CUDA kernels on raw device pointers: the CUDA counterparts of
// kernels/cpu/elementwise.h (fills, copies and dtype conversions: copy.h).
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

}  // namespace loom::kernels::cuda
