#pragma once
// Device-side helpers shared by Loom's CUDA kernels (include from .cu files only).
// Storage types: float and __nv_bfloat16 (and __half where a kernel supports f16); all
// arithmetic happens in float (f32 accumulation), converted on load and store.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "kernels/cuda/check.h"

namespace loom::kernels::cuda {

constexpr int kWarpSize = 32;

__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Element <-> float conversions (round-to-nearest-even on store, as the CPU path does).
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) { return v; }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

// Arithmetic type of a storage type: double for f64, float otherwise (f32 accumulation).
template <typename T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
template <typename T>
using Acc = typename AccOf<T>::type;

// Storage -> arithmetic type, exactly.
__host__ __device__ __forceinline__ float widen(float v) { return v; }
__host__ __device__ __forceinline__ double widen(double v) { return v; }
__host__ __device__ __forceinline__ float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
__host__ __device__ __forceinline__ float widen(__half v) { return __half2float(v); }

// Arithmetic -> storage type, rounding to nearest even (through float for bf16/f16).
template <typename T, typename A>
__device__ __forceinline__ T narrow(A v) {
  if constexpr (std::is_same_v<T, float>) {
    return static_cast<float>(v);
  } else if constexpr (std::is_same_v<T, double>) {
    return v;
  } else {
    return from_float<T>(static_cast<float>(v));
  }
}

// Explicitly rounded operations: nvcc would otherwise contract a * b + c into one fused
// multiply-add, which rounds once instead of twice and so departs from the CPU's bits.
__device__ __forceinline__ float add_rn(float a, float b) {
  return __fadd_rn(a, b);
}
__device__ __forceinline__ double add_rn(double a, double b) {
  return __dadd_rn(a, b);
}
__device__ __forceinline__ float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ __forceinline__ double mul_rn(double a, double b) {
  return __dmul_rn(a, b);
}
__device__ __forceinline__ float div_rn(float a, float b) {
  return __fdiv_rn(a, b);
}
__device__ __forceinline__ double div_rn(double a, double b) {
  return __ddiv_rn(a, b);
}
__device__ __forceinline__ float sqrt_rn(float a) {
  return __fsqrt_rn(a);
}
__device__ __forceinline__ double sqrt_rn(double a) {
  return __dsqrt_rn(a);
}

// Sixteen bytes of T, loaded and stored with one vector instruction.
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};
template <typename T>
constexpr int kPackElems = 16 / static_cast<int>(sizeof(T));

// Sixteen bytes of T as one vector, for kernels that load and store whole vectors by index
// (reinterpret_cast<const Vec16<T>*>(p)[v]); kSize elements.
template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
  T v[kSize];
};

template <int V, typename T>
__device__ __forceinline__ Pack<T, V> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}
template <int V, typename T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, V>& pack) {
  *reinterpret_cast<Pack<T, V>*>(p) = pack;
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Sum / max over the 32 lanes of a warp; every lane gets the result.
__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets
// the result. `scratch` is shared memory of at least 32 floats; the call synchronises.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  int warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v, float* scratch) {
  int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  int warps = blockDim.x / kWarpSize;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// The threads that share one row: a warp (kBlockPerRow false) or the whole block.
template <bool kBlockPerRow>
struct RowGroup {
  int64_t row;
  int lane, lanes;
  __device__ RowGroup() {
    if constexpr (kBlockPerRow) {
      row = blockIdx.x;
      lane = threadIdx.x;
      lanes = blockDim.x;
    } else {
      row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + threadIdx.x / kWarpSize;
      lane = threadIdx.x % kWarpSize;
      lanes = kWarpSize;
    }
  }
  // Every thread of the group must call these (block mode synchronises).
  __device__ float sum(float v, float* scratch) const {
    if constexpr (kBlockPerRow)
      return block_sum(v, scratch);
    else
      return warp_sum(v);
  }
  __device__ float max(float v, float* scratch) const {
    if constexpr (kBlockPerRow)
      return block_max(v, scratch);
    else
      return warp_max(v);
  }
};

// Blocks for a grid-stride loop over n elements: enough to fill the device, never more than
// the elements need.
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 65535LL * 8) {
  int64_t blocks = ceil_div(n, threads);
  if (blocks < 1) blocks = 1;
  return static_cast<unsigned>(blocks < max_blocks ? blocks : max_blocks);
}

// The device twin of visit_dtype (core/dtype.h): calls f.template operator()<T>() with the
// device storage type of any dtype (float, double, __nv_bfloat16, __half, int32_t, int64_t,
// uint8_t).
template <typename F>
void visit_device_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::F32: f.template operator()<float>(); return;
    case DType::F64: f.template operator()<double>(); return;
    case DType::BF16: f.template operator()<__nv_bfloat16>(); return;
    case DType::F16: f.template operator()<__half>(); return;
    case DType::I32: f.template operator()<int32_t>(); return;
    case DType::I64: f.template operator()<int64_t>(); return;
    case DType::U8: f.template operator()<uint8_t>(); return;
  }
  invalid_dtype_size(dtype);
}

// Calls f.template operator()<T>() with the storage type of a floating dtype (f32, f64, bf16,
// f16), or throws naming `op`.
template <typename F>
void dispatch_arithmetic(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: f.template operator()<float>(); return;
    case DType::F64: f.template operator()<double>(); return;
    case DType::BF16: f.template operator()<__nv_bfloat16>(); return;
    case DType::F16: f.template operator()<__half>(); return;
    default:
      fail(op, ": the CUDA kernel takes f32, f64, bf16 or f16 tensors, got ", dtype_name(dtype));
  }
}

// Calls f.template operator()<T>() with the storage type for dtype (f32, bf16, f16), or
// throws naming `op`.
template <typename F>
void dispatch_float_storage(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::F32: f.template operator()<float>(); return;
    case DType::BF16: f.template operator()<__nv_bfloat16>(); return;
    case DType::F16: f.template operator()<__half>(); return;
    default:
      fail(op, ": the CUDA kernel takes f32, bf16 or f16 tensors, got dtype #",
           static_cast<int>(dtype));
  }
}

// Checks the launch that just happened (configuration errors surface here; errors inside
// the kernel surface at the next synchronising call).
#define LOOM_CUDA_CHECK_LAUNCH() LOOM_CUDA_CHECK(cudaGetLastError())

}  // namespace loom::kernels::cuda
