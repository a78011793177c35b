#pragma once
// Strided layouts for the CUDA kernels that read operands through strides (elementwise.cu's
// binary ops, copy.cu's copies): a layout by value, its coalescing on the host, and the
// per-element offsets on the device.
//
// Note [Strided layouts by value]
// Shapes and strides travel in the kernel's parameters (no device allocation, no copy): a
// StridedLayout holds up to kMaxDims dimensions, innermost first, after the host has dropped
// size-1 dimensions and merged dimensions that are contiguous in every operand (a transposed
// [B, T, C] view of 3 dimensions often becomes 2). The per-element index decomposition loops
// over a fixed kMaxDims with an early exit, fully unrolled, so the layout stays in the constant
// bank; indices use 32-bit division when the element count allows (much cheaper than 64-bit).

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.h"  // kMaxDims

namespace loom::kernels::cuda {

template <int K>
struct StridedLayout {
  int ndim = 0;                       // after coalescing, >= 1
  int64_t shape[kMaxDims] = {};       // innermost first
  int64_t strides[K][kMaxDims] = {};  // per operand, innermost first, in elements
};

// Drops size-1 dimensions and merges neighbours that are contiguous in every operand. Returns
// false for zero elements. A one-element tensor becomes one dimension of size 1, stride 1.
template <int K>
bool coalesce(const char* op, int ndim, const int64_t* shape, const int64_t* const (&strides)[K],
              StridedLayout<K>& out) {
  if (ndim < 0) fail(op, ": negative dimension count ", ndim);
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] < 0) fail(op, ": negative extent ", shape[d], " in dimension ", d);
    if (shape[d] == 0) return false;
  }
  out.ndim = 0;
  for (int d = ndim - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    if (out.ndim > 0) {
      const int last = out.ndim - 1;
      bool mergeable = true;
      for (int k = 0; k < K; ++k)
        mergeable = mergeable && strides[k][d] == out.strides[k][last] * out.shape[last];
      if (mergeable) {
        out.shape[last] *= shape[d];
        continue;
      }
    }
    if (out.ndim == kMaxDims) {
      fail(op, ": the layout needs more than ", kMaxDims,
           " dimensions after merging contiguous ones (got ", ndim, " dimensions)");
    }
    out.shape[out.ndim] = shape[d];
    for (int k = 0; k < K; ++k)
      out.strides[k][out.ndim] = strides[k][d];
    ++out.ndim;
  }
  if (out.ndim == 0) {
    out.ndim = 1;
    out.shape[0] = 1;
    for (int k = 0; k < K; ++k)
      out.strides[k][0] = 1;
  }
  return true;
}

template <int K>
int64_t numel_of(const StridedLayout<K>& layout) {
  int64_t n = 1;
  for (int d = 0; d < layout.ndim; ++d)
    n *= layout.shape[d];
  return n;
}

template <int K>
bool is_contiguous(const StridedLayout<K>& layout) {
  if (layout.ndim != 1) return false;
  for (int k = 0; k < K; ++k)
    if (layout.strides[k][0] != 1) return false;
  return true;
}

// Element offsets of operand k for the row-major linear index `index` (Index: uint32_t when
// the element count fits, else uint64_t).
template <typename Index, int K>
__device__ __forceinline__ void offsets_of(const StridedLayout<K>& layout, Index index,
                                           int64_t (&offsets)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k)
    offsets[k] = 0;
#pragma unroll
  for (int d = 0; d < kMaxDims; ++d) {
    if (d == layout.ndim) break;
    const Index extent = static_cast<Index>(layout.shape[d]);
    const Index coord = index % extent;
    index /= extent;
#pragma unroll
    for (int k = 0; k < K; ++k)
      offsets[k] += static_cast<int64_t>(coord) * layout.strides[k][d];
  }
}

template <int K>
__device__ __forceinline__ void offsets_for(const StridedLayout<K>& layout, int64_t i, bool index32,
                                            int64_t (&offsets)[K]) {
  if (index32) {
    offsets_of<uint32_t>(layout, static_cast<uint32_t>(i), offsets);
  } else {
    offsets_of<uint64_t>(layout, static_cast<uint64_t>(i), offsets);
  }
}

}  // namespace loom::kernels::cuda
