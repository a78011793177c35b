#pragma once
// Kernels of the communication layer on the GPU: combining a received buffer into an
// accumulator, finishing averages, and dtype conversion of flat buffers (e.g. bf16 gradients
// reduced in f32). The CUDA counterparts of kernels/cpu/reduce_ops.h.
//
// Semantics as kernels/cpu/reduce_ops.cpp (Note [Reduction semantics] there), so that a buffer
// reduced on the GPU holds the CPU backend's bits: bf16/f16 combine in f32 and round to nearest
// even once; Min and Max propagate NaN (min(a, b) = a is NaN ? a : (a < b ? a : b), so a tie of
// zeros keeps the later operand); every NaN result is stored as the canonical quiet NaN (f32
// 0x7FC00000, f64 0x7FF8000000000000, bf16 0x7FC0, f16 0x7E00); integers wrap (two's complement).
// All launchers are asynchronous on `stream`; buffers are contiguous device memory.

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"

namespace loom::kernels::cuda {

enum class CommReduce { Sum, Avg, Min, Max, Prod };

// acc[i] = acc[i] op x[i] for i < n, any of the 7 dtypes. Avg combines as Sum; finish it with
// divide_inplace, or with scale_inplace from kernels/cuda/elementwise.h by 1.0 / size, which is
// what the CPU backend does (same bits, NaN payloads aside). acc and x may be the same buffer;
// otherwise they must not overlap.
void reduce_inplace(CommReduce op, DType dtype, void* acc, const void* x, int64_t n,
                    cudaStream_t stream);

// acc[i] /= divisor: floating types divide in f32 (f64 for f64) by the divisor rounded to that
// type; integers divide with truncation toward zero. divisor must be non-zero.
void divide_inplace(DType dtype, void* acc, int64_t divisor, int64_t n, cudaStream_t stream);

// dst[i] = src[i] converted, for contiguous buffers; f32 <-> bf16/f16 are 16-byte vectorised,
// same dtypes copy, other pairs convert as kernels/cuda/elementwise.h's copy_strided.
void convert(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t n,
             cudaStream_t stream);

}  // namespace loom::kernels::cuda
