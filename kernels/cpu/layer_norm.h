#pragma once
// Layer normalisation over rows of length `width`:
//   y = (x - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps) (biased variance),
// and RMS normalisation (Llama's RMSNorm), the same without the mean and the bias:
//   y = x * rstd * weight,  rstd = 1 / sqrt(mean(x^2) + eps).

#include <cstdint>

namespace loom::kernels::cpu {

// T: float or double. The output y, and the gradient dy backward reads, are of T or, for
// T = float, of a 16-bit float L (BFloat16, Half): y rounded once to nearest even from the f32
// value, dy widened exactly on load, so the bits are those of casting an f32 y, or widening an
// L dy to f32 first (a norm that feeds autocast's 16-bit products: tensor/ops.h).

// Also writes each row's mean and rstd, which backward needs.
template <typename T, typename L = T>
void layer_norm_forward(const T* x, const T* weight, const T* bias, L* y, T* mean, T* rstd,
                        int64_t rows, int64_t width, double eps);
// dx is overwritten; dweight and dbias are accumulated into (callers zero them).
template <typename T, typename L = T>
void layer_norm_backward(const L* dy, const T* x, const T* weight, const T* mean, const T* rstd,
                         T* dx, T* dweight, T* dbias, int64_t rows, int64_t width);

// Residual add + layer norm in one pass over each row (the pre-LN block's second half):
// sum = x + residual, y = layer_norm(sum). Backward is layer_norm_backward's on `sum` with
// dsum (the gradient that reached sum along the residual stream) added to dx:
// dx = dsum + dlayer_norm/dsum^T dy, which is the gradient of x and of residual both. y and
// dy are of L, the residual of R, L or T (under autocast the branch's 16-bit result meets the
// f32 stream, and the norm writes its products' 16-bit input; a tensor-parallel branch is
// f32); for a 16-bit residual, `dresidual` gets dx rounded to L in the same pass (the
// residual's gradient), otherwise it may be null.
template <typename T, typename L = T, typename R = L>
void add_layer_norm_forward(const T* x, const R* residual, const T* weight, const T* bias, T* sum,
                            L* y, T* mean, T* rstd, int64_t rows, int64_t width, double eps);
template <typename T, typename L = T>
void add_layer_norm_backward(const L* dy, const T* dsum, const T* sum, const T* weight,
                             const T* mean, const T* rstd, T* dx, L* dresidual, T* dweight,
                             T* dbias, int64_t rows, int64_t width);

// RMS norm: writes y and each row's rstd; backward overwrites dx and accumulates into dweight
// (which may be null). add_rms_norm: the residual add in front of it, as add_layer_norm's
// (Llama's "h = x + attn(...); post_attention_layernorm(h)").
template <typename T, typename L = T>
void rms_norm_forward(const T* x, const T* weight, L* y, T* rstd, int64_t rows, int64_t width,
                      double eps);
template <typename T, typename L = T>
void rms_norm_backward(const L* dy, const T* x, const T* weight, const T* rstd, T* dx, T* dweight,
                       int64_t rows, int64_t width);
template <typename T, typename L = T, typename R = L>
void add_rms_norm_forward(const T* x, const R* residual, const T* weight, T* sum, L* y, T* rstd,
                          int64_t rows, int64_t width, double eps);
template <typename T, typename L = T>
void add_rms_norm_backward(const L* dy, const T* dsum, const T* sum, const T* weight,
                           const T* rstd, T* dx, L* dresidual, T* dweight, int64_t rows,
                           int64_t width);

}  // namespace loom::kernels::cpu
