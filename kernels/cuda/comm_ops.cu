#include "kernels/cuda/comm_ops.h"

#include <type_traits>

#include "core/tags.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/copy.h"

// The combining kernels move 16 bytes per access when both buffers are 16-byte aligned (the
// usual case: bucket and staging buffers come from the caching allocator), and fall back to
// element accesses otherwise; see Note [Vectorised elementwise kernels] in elementwise.cu.

namespace loom::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// Element arithmetic per storage type: Acc is what the CPU backend combines in.
template <typename T>
struct Elem {
  using Acc = T;
  __device__ static T load(T v) { return v; }
};
template <>
struct Elem<__nv_bfloat16> {
  using Acc = float;
  __device__ static float load(__nv_bfloat16 v) { return __bfloat162float(v); }
};
template <>
struct Elem<__half> {
  using Acc = float;
  __device__ static float load(__half v) { return __half2float(v); }
};

// Stores with the CPU backend's rounding and canonical NaNs.
template <typename T>
__device__ __forceinline__ T store(typename Elem<T>::Acc v) {
  if constexpr (std::is_same_v<T, float>) {
    return v != v ? __uint_as_float(0x7FC00000u) : v;
  } else if constexpr (std::is_same_v<T, double>) {
    return v != v ? __longlong_as_double(0x7FF8000000000000ll) : v;
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    // Round to nearest even by adding 0x7FFF plus the lowest kept bit, as reduce_ops.cpp does.
    const uint32_t bits = __float_as_uint(v);
    __nv_bfloat16_raw raw;
    raw.x =
        v != v ? 0x7FC0 : static_cast<unsigned short>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
    return __nv_bfloat16(raw);
  } else if constexpr (std::is_same_v<T, __half>) {
    if (v != v) {
      __half_raw raw;
      raw.x = 0x7E00;
      return __half(raw);
    }
    return __float2half_rn(v);
  } else {
    return v;
  }
}

template <CommReduce kOp, typename A>
__device__ __forceinline__ A combine(A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    if constexpr (kOp == CommReduce::Sum) {
      return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
    } else if constexpr (kOp == CommReduce::Prod) {
      return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
    } else if constexpr (kOp == CommReduce::Min) {
      return a < b ? a : b;
    } else {
      return a > b ? a : b;
    }
  } else {
    if constexpr (kOp == CommReduce::Sum) {
      return a + b;
    } else if constexpr (kOp == CommReduce::Prod) {
      return a * b;
    } else if constexpr (kOp == CommReduce::Min) {
      return a != a ? a : (a < b ? a : b);
    } else {
      return a != a ? a : (a > b ? a : b);
    }
  }
}

template <typename T, CommReduce kOp>
__global__ void reduce_kernel(T* acc, const T* x, int64_t n, int64_t vectors) {
  using E = Elem<T>;
  constexpr int kVec = Vec16<T>::kSize;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t v = tid; v < vectors; v += stride) {
    Vec16<T> a = reinterpret_cast<const Vec16<T>*>(acc)[v];
    const Vec16<T> b = reinterpret_cast<const Vec16<T>*>(x)[v];
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      a.v[j] = store<T>(combine<kOp>(E::load(a.v[j]), E::load(b.v[j])));
    reinterpret_cast<Vec16<T>*>(acc)[v] = a;
  }
  for (int64_t i = vectors * kVec + tid; i < n; i += stride)
    acc[i] = store<T>(combine<kOp>(E::load(acc[i]), E::load(x[i])));
}

template <typename T>
__global__ void divide_kernel(T* acc, typename Elem<T>::Acc divisor, int64_t n) {
  using E = Elem<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    acc[i] = store<T>(E::load(acc[i]) / divisor);
}

// Integers divide as signed 64-bit values and wrap back to T: the divisor is never narrowed
// (an i32 buffer divided by 2^32 + 3 gets 0, not acc / 3), a negative divisor truncates like
// C++'s `/` on the promoted operands (u8 included), and i32 INT32_MIN / -1 wraps to INT32_MIN.
template <typename T>
__global__ void divide_integer_kernel(T* acc, int64_t divisor, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    acc[i] = static_cast<T>(static_cast<int64_t>(acc[i]) / divisor);
}

template <typename T, CommReduce kOp>
void launch_reduce(void* acc, const void* x, int64_t n, cudaStream_t stream) {
  constexpr int kVec = Vec16<T>::kSize;
  const bool aligned =
      reinterpret_cast<uintptr_t>(acc) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const int64_t vectors = aligned ? n / kVec : 0;
  const int64_t work = aligned ? vectors + n % kVec : n;
  reduce_kernel<T, kOp><<<grid_for(work, kThreads), kThreads, 0, stream>>>(
      static_cast<T*>(acc), static_cast<const T*>(x), n, vectors);
  LOOM_CUDA_CHECK_LAUNCH();
}

}  // namespace

void reduce_inplace(CommReduce op, DType dtype, void* acc, const void* x, int64_t n,
                    cudaStream_t stream) {
  if (n < 0) tag::kKernelsCudaCommOps.fail("reduce_inplace: negative element count ", n);
  if (n == 0) return;
  visit_device_dtype(dtype, [&]<typename T>() {
    switch (op) {
      case CommReduce::Sum:
      case CommReduce::Avg: return launch_reduce<T, CommReduce::Sum>(acc, x, n, stream);
      case CommReduce::Min: return launch_reduce<T, CommReduce::Min>(acc, x, n, stream);
      case CommReduce::Max: return launch_reduce<T, CommReduce::Max>(acc, x, n, stream);
      case CommReduce::Prod: return launch_reduce<T, CommReduce::Prod>(acc, x, n, stream);
    }
    tag::kKernelsCudaCommOps.fail("reduce_inplace: invalid CommReduce value ",
                                  static_cast<int>(op));
  });
}

void divide_inplace(DType dtype, void* acc, int64_t divisor, int64_t n, cudaStream_t stream) {
  if (divisor == 0) tag::kKernelsCudaCommOps.fail("divide_inplace: divisor must be non-zero");
  if (n < 0) tag::kKernelsCudaCommOps.fail("divide_inplace: negative element count ", n);
  if (n == 0) return;
  visit_device_dtype(dtype, [&]<typename T>() {
    if constexpr (std::is_integral_v<T>) {
      divide_integer_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<T*>(acc),
                                                                               divisor, n);
    } else {
      using A = typename Elem<T>::Acc;
      divide_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(static_cast<T*>(acc),
                                                                       static_cast<A>(divisor), n);
    }
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

void convert(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t n,
             cudaStream_t stream) {
  if (n < 0) tag::kKernelsCudaCommOps.fail("convert: negative element count ", n);
  if (n == 0) return;
  const int64_t stride = 1;
  copy_strided(src_dtype, 1, &n, src, &stride, dst_dtype, dst, stream);
}

}  // namespace loom::kernels::cuda
