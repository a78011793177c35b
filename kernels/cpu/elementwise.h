#pragma once
// Elementwise CPU kernels on raw pointers. Templates are instantiated for float and double
// (and where a declaration says so, for the 16-bit floats).

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace loom::kernels::cpu {

enum class BinaryOp { Add, Sub, Mul, Div };

// out (contiguous, shape) = a op b, with a and b read through their own strides.
template <typename T>
void binary(BinaryOp op, int ndim, const int64_t* shape, const T* a, const int64_t* a_strides,
            const T* b, const int64_t* b_strides, T* out);

template <typename T>
void add_inplace(T* a, const T* b, int64_t n);  // a += b
// out[i] = a[i % a_period] + b[i] for f32 a and out and a bf16 or f16 b (its bits, `b_dtype`)
// widened exactly: the values of adding the widened b, in one pass without a widened copy
// (a_period = n: operands of one shape; the length of a row: an f32 bias). out may equal a
// when a_period = n; a_period divides n.
void add_widened(float* out, const float* a, int64_t a_period, const uint16_t* b,
                 DType b_dtype, int64_t n);
template <typename T>
void scale_inplace(T* a, T factor, int64_t n);  // a *= factor
template <typename T>
void add_scalar(const T* a, T value, T* out, int64_t n);  // out = a + value
template <typename T>
void scale(const T* a, T factor, T* out, int64_t n);  // out = a * factor

// GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
template <typename T>
void gelu_forward(const T* x, T* y, int64_t n);
template <typename T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n);
// Megatron's fused bias + GELU over rows of `width`: y = gelu(x + bias); backward writes
// dx = dy * gelu'(x + bias) and the bias's gradient, dbias = the column sums of dx (each in
// row order, whatever the thread count), in one pass. Also instantiated for BFloat16 and Half,
// computed in f32 (kernels/cpu/widen.h), whose dbias may be T or float (DB: the f32 sums
// unrounded, a bf16-mixed bias gradient).
template <typename T>
void bias_gelu_forward(const T* x, const T* bias, T* y, int64_t rows, int64_t width);
template <typename T, typename DB = T>
void bias_gelu_backward(const T* x, const T* bias, const T* dy, T* dx, DB* dbias, int64_t rows,
                        int64_t width);

// SiLU (swish, Llama's MLP activation): x * sigmoid(x) = x / (1 + exp(-x)).
template <typename T>
void silu_forward(const T* x, T* y, int64_t n);
template <typename T>
void silu_backward(const T* x, const T* dy, T* dx, int64_t n);
// SwiGLU (Llama's MLP): y = silu(gate) * up, silu rounded to S first, as silu and mul round
// it; its backward du = dy * silu(gate) (silu rounded to S), dgate = dy * up * silu'(gate)
// rounded once. S: float, double, BFloat16 or Half, computed in compute_of<S> (widen.h).
template <typename S>
void swiglu_forward(const S* gate, const S* up, S* y, int64_t n);
template <typename S>
void swiglu_backward(const S* gate, const S* up, const S* dy, S* dgate, S* dup, int64_t n);

// Copies elements of `element_size` bytes from a strided source into a contiguous dst.
void copy_strided(size_t element_size, int ndim, const int64_t* shape, const void* src,
                  const int64_t* src_strides, void* dst);

}  // namespace loom::kernels::cpu
