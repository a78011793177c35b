#pragma once
// Shared pieces of the causal attention kernels: operands and argument blocks, tile loads,
// the D_i = rowsum(dout * out) kernel, occupancy hints. Private to attention.cu, which
// includes this through attention_simt.cuh and attention_tensor_core.cuh.

#include <cmath>
#include <type_traits>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/warp_mma.cuh"

namespace loom::kernels::cuda::attention_detail {

using bf16 = __nv_bfloat16;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kMaxHeadDim = 128;
constexpr int kMaxGridY = 65535;

// The version public launchers use for bf16 where the device runs it (f32 always uses v1);
// see attention.h. kTensorCore (v2, the last one measured on a GPU) or kSimt here is the
// fallback should v3 misbehave on one.
constexpr AttentionVersion kDefaultBf16Version = AttentionVersion::kMma;

// One operand of one layout: element (b, h, t, d) at ptr + b*sb + h*sh + t*st + d.
template <typename T>
struct Operand {
  T* ptr;
  int64_t sb, sh, st;
  __device__ T* head(int b, int h) const { return ptr + b * sb + h * sh; }
};

template <typename T>
struct ForwardArgs {
  Operand<const T> q, k, v;
  Operand<T> out;
  float* lse;  // [B*H*T]
  int heads, time, head_dim;
  int group;         // query heads per key/value head: query head h reads k and v's h / group
  float scale_log2;  // log2(e) / sqrt(head_dim): scores in base 2
};

template <typename T>
struct BackwardArgs {
  Operand<const T> dout, q, k, v;
  Operand<T> dq, dk, dv;
  const float* lse;    // [B*H*T], natural log
  const float* delta;  // [B*H*T], D_i = rowsum(dout * out)
  int heads, time, head_dim;
  int group;  // query heads per key/value head (ForwardArgs::group)
  float scale, scale_log2;
};

// 16 bytes of storage elements, for vector loads.
template <typename T>
struct alignas(16) Chunk {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

// Whether rows of one head can be read in 16-byte chunks: the head dim fills the padded one,
// and every row starts 16-byte aligned. (GPT-2's fused projection qualifies.)
template <int kD, typename T>
__device__ __forceinline__ bool chunked_rows(const T* src, int64_t st, int head_dim) {
  return head_dim == kD && st % Chunk<T>::kSize == 0 &&
         reinterpret_cast<uintptr_t>(src) % sizeof(Chunk<T>) == 0;
}

// Copies rows [t0, t0 + kRows) x dims [0, kD) of one head into shared memory, row r at
// dst + r * pitch, zero past `time` rows and `head_dim` dims. Reads are coalesced along d, in
// 16-byte chunks where chunked_rows allows (dst rows must then start 16-byte aligned), and
// asynchronously (cp_async<16>, waited for before returning) when no conversion is needed.
// Callers synchronise the block before
// reading dst, as always.
template <int kRows, int kD, int kThreads, typename S, typename T>
__device__ __forceinline__ void load_rows(S* dst, int pitch, const T* src, int64_t st, int t0,
                                          int time, int head_dim) {
  constexpr int kVec = Chunk<T>::kSize, kPerRow = kD / kVec;
  if constexpr (std::is_same_v<S, T>) {
    if (chunked_rows<kD>(src, st, head_dim)) {
      // Asynchronous copies need no unrolling to overlap: all are issued before the wait.
#pragma unroll 1
      for (int i = threadIdx.x; i < kRows * kPerRow; i += kThreads) {
        const int r = i / kPerRow, d = (i % kPerRow) * kVec, t = t0 + r;
        if (t < time) {
          cp_async<16>(dst + r * pitch + d, src + t * st + d, 16);
        } else {
          *reinterpret_cast<uint4*>(dst + r * pitch + d) = make_uint4(0, 0, 0, 0);
        }
      }
      cp_async_commit();
      cp_async_wait<0>();
      return;
    }
  } else {
    if (chunked_rows<kD>(src, st, head_dim)) {
#pragma unroll 2
      for (int i = threadIdx.x; i < kRows * kPerRow; i += kThreads) {
        const int r = i / kPerRow, d = (i % kPerRow) * kVec, t = t0 + r;
        Chunk<T> c;
        if (t < time) {
          c = *reinterpret_cast<const Chunk<T>*>(src + t * st + d);
        } else {
#pragma unroll
          for (int j = 0; j < kVec; ++j)
            c.v[j] = from_float<T>(0.0f);
        }
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          dst[r * pitch + d + j] = from_float<S>(to_float(c.v[j]));
      }
      return;
    }
  }
#pragma unroll 4
  for (int i = threadIdx.x; i < kRows * kD; i += kThreads) {
    const int r = i / kD, d = i % kD, t = t0 + r;
    const float x = (t < time && d < head_dim) ? to_float(src[t * st + d]) : 0.0f;
    dst[r * pitch + d] = from_float<S>(x);
  }
}

// As load_rows, transposed: row r, dim d at dst[d * pitch + r].
template <int kRows, int kD, int kThreads, typename T>
__device__ __forceinline__ void load_rows_transposed(float* dst, int pitch, const T* src,
                                                     int64_t st, int t0, int time, int head_dim) {
  if (chunked_rows<kD>(src, st, head_dim)) {
    constexpr int kVec = Chunk<T>::kSize, kPerRow = kD / kVec;
#pragma unroll 2
    for (int i = threadIdx.x; i < kRows * kPerRow; i += kThreads) {
      const int r = i / kPerRow, d = (i % kPerRow) * kVec, t = t0 + r;
      if (t < time) {
        const Chunk<T> c = *reinterpret_cast<const Chunk<T>*>(src + t * st + d);
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          dst[(d + j) * pitch + r] = to_float(c.v[j]);
      } else {
#pragma unroll
        for (int j = 0; j < kVec; ++j)
          dst[(d + j) * pitch + r] = 0.0f;
      }
    }
    return;
  }
#pragma unroll 4
  for (int i = threadIdx.x; i < kRows * kD; i += kThreads) {
    const int r = i / kD, d = i % kD, t = t0 + r;
    dst[d * pitch + r] = (t < time && d < head_dim) ? to_float(src[t * st + d]) : 0.0f;
  }
}

__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}

__device__ __forceinline__ float dot4(float4 a, const float (&b)[4], float acc) {
  acc = fmaf(a.x, b[0], acc);
  acc = fmaf(a.y, b[1], acc);
  acc = fmaf(a.z, b[2], acc);
  return fmaf(a.w, b[3], acc);
}

// D_i = sum_d dout[i, d] * out[i, d], one warp per row.
template <typename T>
__global__ void attention_delta(Operand<const T> dout, Operand<const T> out, float* delta,
                                int heads, int time, int head_dim, int64_t rows) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = int64_t(gridDim.x) * (blockDim.x / kWarpSize);
  for (int64_t row = int64_t(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
       row < rows; row += warps) {  // uniform per warp
    const int t = static_cast<int>(row % time);
    const int bh = static_cast<int>(row / time);
    const T* g = dout.head(bh / heads, bh % heads) + t * dout.st;
    const T* o = out.head(bh / heads, bh % heads) + t * out.st;
    float acc = 0.0f;
    for (int d = lane; d < head_dim; d += kWarpSize)
      acc = fmaf(to_float(g[d]), to_float(o[d]), acc);
    acc = warp_sum(acc);
    if (lane == 0) delta[row] = acc;
  }
}

// Blocks per SM that `smem` bytes of shared memory leave room for on sm_90 (228 KiB per SM,
// 1 KiB reserved per block), capped at `most`: the minimum passed to __launch_bounds__, which
// bounds registers per thread at 64K / (threads * blocks). Left to itself, ptxas may aim at an
// occupancy that shared memory rules out anyway, and spill to reach it.
constexpr int min_blocks(size_t smem, int most) {
  const size_t fit = (228 * 1024) / (smem + 1024);
  return fit < 1 ? 1 : (fit > size_t(most) ? most : static_cast<int>(fit));
}
}  // namespace loom::kernels::cuda::attention_detail
