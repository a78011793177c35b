#pragma once
// Row-major GEMM on the GPU through cuBLASLt, with the semantics of kernels/cpu/gemm.h plus a
// batch and an optional bias. For b < batch:
//   C_b = op(A_b) op(B_b) (+ C_b when accumulate) (+ bias[j] added to every row when bias)
// where X_b = X + b * stride_x elements (a stride of 0 reuses one matrix for every product).
// op(A) is [m, k]: A itself (row-major, leading dimension lda) or, with trans_a, the
// transpose of a row-major [k, m] matrix; likewise op(B) is [k, n]; C is [m, n] with ldc.
// A and B hold `dtype`: F32, BF16 or F16 (anything else: loom::Error); C and the bias hold
// `out_dtype`, which is `dtype` or, for BF16 and F16 operands, F32 (cuBLASLt's 16-bit inputs
// with an f32 result: the f32 sums not rounded to 16 bits).
// Accumulation is f32 in every case: bf16/f16 use CUBLAS_COMPUTE_32F; f32 uses
// CUBLAS_COMPUTE_32F (IEEE FMA) unless set_allow_tf32(true) selects
// CUBLAS_COMPUTE_32F_FAST_TF32 (inputs rounded to TF32, ~10-bit mantissa, on tensor cores).
// The bias, when given, has n elements (one per column of the row-major result) and is the
// same for every batch; it is added in f32 before the single rounding of the result (in the
// rare case where cuBLASLt has no bias epilogue for a shape, it is added by a second GEMM and
// the result is rounded twice).
// `b_column_sums`, when given (n elements of out_dtype), receives the sums of op(B)'s columns
// over its k rows, accumulated in f32: a linear layer's bias gradient beside its weight
// gradient (X^T dY and the column sums of dY), by cuBLASLt's BGRADA epilogue (its A is our B),
// or where cuBLASLt has no algorithm with it, by a second GEMM, ones[1, k] op(B). Only for a
// single product (batch 1) without accumulate or bias.
//
// Degenerate sizes behave like the CPU kernel: m, n or batch 0 does nothing; k == 0 makes
// C = (accumulate ? C : 0) (+ bias). Leading dimensions must be at least the row length of
// the stored matrix (lda >= (trans_a ? m : k), ldb >= (trans_b ? k : n), ldc >= n, all >= 1).
//
// Runs asynchronously on `stream`, which must belong to the current device; never
// synchronises the host. Thread-safe. The first GEMM on a device creates its cuBLASLt handle,
// the first on a (device, stream) pair allocates that stream's 32 MiB workspace (cudaMalloc),
// and the first of each shape asks cuBLASLt's heuristic for an algorithm; those steps must
// not happen inside CUDA graph capture. See Note [GEMM resources] in gemm.cpp.

#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace loom::kernels::cuda {

void gemm(DType dtype, DType out_dtype, bool trans_a, bool trans_b, int64_t m, int64_t n,
          int64_t k, const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb,
          int64_t stride_b, void* c, int64_t ldc, int64_t stride_c, int64_t batch,
          bool accumulate, const void* bias, void* b_column_sums, cudaStream_t stream);

// A linear layer and the GELU after it (GPT-2's MLP's first layer), one product:
//   aux = op(A) op(B) + bias,  C = gelu(op(A) op(B) + bias)   (GELU's tanh form)
// A, B, C, aux and the bias of `dtype`; C and aux contiguous [m, n] (leading dimension n).
// By cuBLASLt's GELU_AUX_BIAS epilogue, which takes GELU of the f32 sum before it is rounded
// (aux, GELU's input for the backward, is that sum rounded once); where cuBLASLt has no
// algorithm with it, the GEMM writes aux (its bias epilogue, or the rank-1 bias) and a GELU
// kernel C from aux, as gelu(linear) computes it (C then rounded twice). k == 0 gives
// aux = bias rows and C = gelu(aux).
void gemm_bias_gelu(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                    const void* a, int64_t lda, const void* b, int64_t ldb, const void* bias,
                    void* c, void* aux, cudaStream_t stream);

// The input gradient of a linear layer read through GELU (GPT-2's MLP's second layer, whose
// input is gemm_bias_gelu's C), one product:
//   C = gelu'(aux) * (op(A) op(B))   (elementwise; GELU's tanh form)
// A, B, C and aux of `dtype`; C and aux contiguous [m, n]; aux is GELU's input (gemm_bias_gelu's
// aux). By cuBLASLt's DGELU epilogue, which scales the f32 sum before it is rounded once; where
// cuBLASLt has no algorithm with it, the GEMM writes the product to C and gelu_backward scales
// it there, as gelu_backward(aux, product) computes it (C then rounded twice). k == 0 gives 0.
void gemm_dgelu(DType dtype, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                const void* a, int64_t lda, const void* b, int64_t ldb, void* c, const void* aux,
                cudaStream_t stream);

// Process-wide switch for f32 GEMMs (default false: exact f32 products). Applies to GEMMs
// launched after the call; safe to call from any thread.
void set_allow_tf32(bool allow);
bool allow_tf32();

}  // namespace loom::kernels::cuda
