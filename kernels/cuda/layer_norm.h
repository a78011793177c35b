#pragma once
// Layer normalisation over rows of length `width` on the GPU: the CUDA counterpart of
// kernels/cpu/layer_norm.h,
//   y = (x - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps) (biased variance).
//
// Storage f32, bf16 or f16 (x, weight, bias, dx, dweight, dbias of `dtype`; y of `y_dtype` and
// dy of `dy_dtype`, each `dtype` or, for an f32 `dtype`, bf16 or f16: a norm that writes the
// 16-bit input of autocast's products and reads their 16-bit gradient, y rounded once from
// the f32 value and dy widened on load); all arithmetic in f32. mean and rstd are always
// f32 [rows], whatever the dtype. Launchers are asynchronous on `stream`, never synchronise,
// and throw loom::Error for a dtype they do not take or a failed launch. Results are
// deterministic: no atomics, fixed reduction orders.

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace loom::kernels::cuda {

// Writes y [rows, width] and each row's mean and rstd (f32 [rows]), which backward needs.
// Two passes over the row for the variance, as the CPU kernel. One warp per row for rows up
// to a few thousand elements, one block per row beyond.
void layer_norm_forward(DType dtype, DType y_dtype, const void* x, const void* weight,
                        const void* bias, void* y, float* mean, float* rstd, int64_t rows,
                        int64_t width, double eps, cudaStream_t stream);

// Bytes of device workspace layer_norm_backward needs (0 when rows or width is 0). Depends only
// on the sizes, so callers may allocate it once per shape.
size_t layer_norm_backward_workspace(int64_t rows, int64_t width);

// dx [rows, width], dweight [width] and dbias [width] are OVERWRITTEN (unlike the CPU kernel,
// which accumulates into dweight and dbias). dweight or dbias may be null to skip it. The
// parameter gradients are reduced without atomics: each block of 16 rows writes f32 partial
// sums into `workspace` (layer_norm_backward_workspace bytes, float-aligned), and a second
// kernel adds the partials in a fixed order, so the result is bitwise reproducible.
// With rows == 0, dweight and dbias are set to zero.
void layer_norm_backward(DType dtype, DType dy_dtype, const void* dy, const void* x,
                         const void* weight, const float* mean, const float* rstd, void* dx,
                         void* dweight, void* dbias, int64_t rows, int64_t width, void* workspace,
                         cudaStream_t stream);

// Residual add + layer norm in one kernel (the pre-LN block's second half): sum = x + residual
// (x, sum of `dtype`; residual of `residual_dtype`, dtype or low_dtype, widened on load) is
// written, and y (of `low_dtype`) = layer_norm(sum), read back from the row each thread wrote.
// Backward is layer_norm_backward's on `sum`, with dsum (of `dtype`, the gradient that reached
// sum along the residual stream; null where none did) added to dx; a non-null `dresidual`
// also gets dx rounded to `low_dtype` (the residual's gradient when it is 16-bit), in the same
// pass. low_dtype is dtype, or bf16/f16 for an f32 dtype. dsum, dx and dresidual must not
// overlap.
void add_layer_norm_forward(DType dtype, DType low_dtype, DType residual_dtype, const void* x,
                            const void* residual, const void* weight, const void* bias, void* sum,
                            void* y, float* mean, float* rstd, int64_t rows, int64_t width,
                            double eps, cudaStream_t stream);
void add_layer_norm_backward(DType dtype, DType low_dtype, const void* dy, const void* dsum,
                             const void* sum, const void* weight, const float* mean,
                             const float* rstd, void* dx, void* dresidual, void* dweight,
                             void* dbias, int64_t rows, int64_t width, void* workspace,
                             cudaStream_t stream);

// RMS normalisation (Llama's RMSNorm), layer norm without the mean and the bias:
//   y = x * rstd * weight,  rstd = 1 / sqrt(mean(x^2) + eps),
// with the same kernels, contracts and determinism. Backward's workspace is
// layer_norm_backward_workspace(rows, width); dweight (overwritten) may be null.
void rms_norm_forward(DType dtype, DType y_dtype, const void* x, const void* weight, void* y,
                      float* rstd, int64_t rows, int64_t width, double eps, cudaStream_t stream);
// The residual add in front of RMS norm, as add_layer_norm's (Llama's post-attention norm).
void add_rms_norm_forward(DType dtype, DType low_dtype, DType residual_dtype, const void* x,
                          const void* residual, const void* weight, void* sum, void* y,
                          float* rstd, int64_t rows, int64_t width, double eps,
                          cudaStream_t stream);
void add_rms_norm_backward(DType dtype, DType low_dtype, const void* dy, const void* dsum,
                           const void* sum, const void* weight, const float* rstd, void* dx,
                           void* dresidual, void* dweight, int64_t rows, int64_t width,
                           void* workspace, cudaStream_t stream);
void rms_norm_backward(DType dtype, DType dy_dtype, const void* dy, const void* x,
                       const void* weight, const float* rstd, void* dx, void* dweight,
                       int64_t rows, int64_t width, void* workspace, cudaStream_t stream);

}  // namespace loom::kernels::cuda
