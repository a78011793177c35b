#pragma once
// Fills, copies and dtype conversions on raw CUDA device pointers: the CUDA side of
// tensor/ops/copy.cpp (fill_, copy_, cast), converting with the CPU's rules bit for bit.
//
// All launchers are asynchronous on `stream`: they enqueue work, never synchronise, and throw
// loom::Error for a dtype they do not take or a failed launch. Sizes are element counts; n == 0
// enqueues nothing.

#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "kernels/cuda/elementwise.h"  // kMaxDims

namespace loom::kernels::cuda {

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

// dst[k] = src[k] converted, for `count` contiguous tensors of sizes[k] elements: f32 to bf16
// or f16, every element as copy_strided converts it, in one launch per 256 tensors or 2,560
// chunks of 65,536 elements (Note [Multi-tensor launches]): autocast's weight casts of a step
// (tensor/autocast.cpp). `src`, `dst` and `sizes` are host memory, read during the call only.
void multi_tensor_cast(DType src_dtype, DType dst_dtype, const void* const* src,
                       void* const* dst, const int64_t* sizes, int count, cudaStream_t stream);

}  // namespace loom::kernels::cuda
