#include "kernels/cuda/copy.h"

#include <cstring>
#include <type_traits>

#include "kernels/cuda/chunk_plan.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/strided_layout.cuh"

namespace loom::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// ---------------------------------------------------------------------------------------------
// One element from one dtype to another, with the CPU's rules.

template <typename T>
constexpr bool kFloatFamily =
    std::is_same_v<T, float> || std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>;

// bf16 exactly as core/dtype.cpp's float_to_bf16_bits (round to nearest even; a NaN keeps
// its sign and upper payload and becomes quiet), so that conversions match the CPU bitwise.
__host__ __device__ __forceinline__ __nv_bfloat16 bf16_like_cpu(float value) {
  uint32_t bits;
#ifdef __CUDA_ARCH__
  bits = __float_as_uint(value);
#else
  std::memcpy(&bits, &value, sizeof(bits));
#endif
  __nv_bfloat16_raw raw;
  if (value != value) {
    raw.x = static_cast<unsigned short>((bits >> 16) | 0x0040u);
  } else {
    raw.x = static_cast<unsigned short>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  }
  return __nv_bfloat16(raw);
}

// From a float-family value (already widened to float) to Dst.
template <typename Dst>
__host__ __device__ __forceinline__ Dst from_float_value(float v) {
  if constexpr (std::is_same_v<Dst, float>) {
    return v;
  } else if constexpr (std::is_same_v<Dst, double>) {
    return static_cast<double>(v);
  } else if constexpr (std::is_same_v<Dst, __nv_bfloat16>) {
    return bf16_like_cpu(v);
  } else if constexpr (std::is_same_v<Dst, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<Dst, uint8_t>) {
    // x86's static_cast<uint8_t>(double) truncates to int32 and keeps the low byte.
    return static_cast<uint8_t>(static_cast<int32_t>(v));
  } else {
    return static_cast<Dst>(v);
  }
}

// CPU from_double (tensor/ops/copy.cpp): bf16/f16 through float, integers by truncation.
template <typename Dst>
__host__ __device__ __forceinline__ Dst from_double_value(double v) {
  if constexpr (std::is_same_v<Dst, double>) {
    return v;
  } else if constexpr (kFloatFamily<Dst>) {
    return from_float_value<Dst>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<Dst, uint8_t>) {
    return static_cast<uint8_t>(static_cast<int32_t>(v));
  } else {
    return static_cast<Dst>(v);
  }
}

// One element from Src to Dst with the CPU's rules. Float-family sources go through float,
// which gives the same value as the CPU's route through double (widening is exact).
template <typename Src, typename Dst>
__device__ __forceinline__ Dst convert_value(Src s) {
  if constexpr (std::is_same_v<Src, Dst>) {
    return s;
  } else if constexpr (std::is_integral_v<Src> && std::is_integral_v<Dst>) {
    return static_cast<Dst>(s);
  } else if constexpr (kFloatFamily<Src>) {
    return from_float_value<Dst>(widen(s));
  } else {
    return from_double_value<Dst>(static_cast<double>(s));
  }
}

// ---------------------------------------------------------------------------------------------
// Copies, conversions and fills.

// One template for all 49 (Src, Dst) pairs, strided or contiguous.
template <typename Src, typename Dst>
__global__ void copy_kernel(const __grid_constant__ StridedLayout<1> layout, const Src* src,
                            Dst* dst, int64_t n, bool contiguous, bool index32) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    int64_t off[1] = {i};
    if (!contiguous) offsets_for(layout, i, index32, off);
    dst[i] = convert_value<Src, Dst>(src[off[0]]);
  }
}

// Contiguous f32 <-> bf16/f16: 8 elements per step (one 16-byte access on the 2-byte side,
// two on the f32 side).
template <typename T>
struct alignas(8 * sizeof(T)) Vec8 {
  T v[8];
};

// Whether src and dst both allow 8-element accesses.
template <typename Src, typename Dst>
__host__ __device__ __forceinline__ bool vec8_aligned(const Src* src, const Dst* dst) {
  return reinterpret_cast<uintptr_t>(src) % sizeof(Vec8<Src>) == 0 &&
         reinterpret_cast<uintptr_t>(dst) % sizeof(Vec8<Dst>) == 0;
}

// dst[0, n) = src converted: the first `vectors` groups of 8 elements one 8-element step each
// (both sides aligned for them), then single elements. This thread takes every stride-th step
// and element from `first`.
template <typename Src, typename Dst>
__device__ __forceinline__ void convert_span(const Src* src, Dst* dst, int64_t n, int64_t vectors,
                                             int64_t first, int64_t stride) {
  for (int64_t v = first; v < vectors; v += stride) {
    const Vec8<Src> in = reinterpret_cast<const Vec8<Src>*>(src)[v];
    Vec8<Dst> out;
#pragma unroll
    for (int j = 0; j < 8; ++j)
      out.v[j] = convert_value<Src, Dst>(in.v[j]);
    reinterpret_cast<Vec8<Dst>*>(dst)[v] = out;
  }
  for (int64_t i = vectors * 8 + first; i < n; i += stride)
    dst[i] = convert_value<Src, Dst>(src[i]);
}

template <typename Src, typename Dst>
__global__ void convert_vec8_kernel(const Src* src, Dst* dst, int64_t n, int64_t vectors) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  convert_span(src, dst, n, vectors, static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x,
               stride);
}

template <typename Src, typename Dst>
void launch_convert_vec8(const void* src, void* dst, int64_t n, cudaStream_t stream) {
  const bool aligned =
      vec8_aligned(static_cast<const Src*>(src), static_cast<const Dst*>(dst));
  const int64_t vectors = aligned ? n / 8 : 0;
  const int64_t work = aligned ? vectors + n % 8 : n;
  convert_vec8_kernel<Src, Dst><<<grid_for(work, kThreads), kThreads, 0, stream>>>(
      static_cast<const Src*>(src), static_cast<Dst*>(dst), n, vectors);
  LOOM_CUDA_CHECK_LAUNCH();
}

// Returns true when (src_dtype, dst_dtype) has a vectorised contiguous conversion.
bool try_convert_vec8(DType src_dtype, const void* src, DType dst_dtype, void* dst, int64_t n,
                      cudaStream_t stream) {
  if (src_dtype == DType::F32 && dst_dtype == DType::BF16) {
    launch_convert_vec8<float, __nv_bfloat16>(src, dst, n, stream);
  } else if (src_dtype == DType::F32 && dst_dtype == DType::F16) {
    launch_convert_vec8<float, __half>(src, dst, n, stream);
  } else if (src_dtype == DType::BF16 && dst_dtype == DType::F32) {
    launch_convert_vec8<__nv_bfloat16, float>(src, dst, n, stream);
  } else if (src_dtype == DType::F16 && dst_dtype == DType::F32) {
    launch_convert_vec8<__half, float>(src, dst, n, stream);
  } else {
    return false;
  }
  return true;
}

// Fill with one bit pattern: 16-byte stores where the pointer allows, element stores after.
template <typename U>
__global__ void fill_kernel(U* dst, U value, int64_t n, int64_t vectors) {
  constexpr int kPer = 16 / static_cast<int>(sizeof(U));
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (vectors > 0) {
    Vec16<U> pattern;
#pragma unroll
    for (int j = 0; j < kPer; ++j)
      pattern.v[j] = value;
    for (int64_t v = tid; v < vectors; v += stride)
      reinterpret_cast<Vec16<U>*>(dst)[v] = pattern;
  }
  for (int64_t i = vectors * kPer + tid; i < n; i += stride)
    dst[i] = value;
}

template <typename U>
void launch_fill(void* dst, const void* value_bytes, int64_t n, cudaStream_t stream) {
  U value;
  std::memcpy(&value, value_bytes, sizeof(U));
  constexpr int kPer = 16 / static_cast<int>(sizeof(U));
  const int64_t vectors = aligned16(dst) ? n / kPer : 0;
  const int64_t work = vectors > 0 ? vectors + n % kPer : n;
  fill_kernel<U>
      <<<grid_for(work, kThreads), kThreads, 0, stream>>>(static_cast<U*>(dst), value, n, vectors);
  LOOM_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------------
// Multi-tensor casts (Note [Multi-tensor launches] in chunk_plan.cuh).

constexpr int kCastThreads = 512;
constexpr int64_t kCastChunk = 65536;  // a multiple of 8

struct CastTable {
  const void* src[kMaxChunkTensors];
  void* dst[kMaxChunkTensors];
  int64_t n[kMaxChunkTensors];
  ChunkPlan plan;
};
static_assert(sizeof(CastTable) <= kMaxKernelParameterBytes);

// Each block converts one chunk of one tensor, as convert_vec8_kernel converts it (convert_span:
// 8 elements per step where both sides of the chunk are aligned, then single elements).
template <typename Src, typename Dst>
__global__ void __launch_bounds__(kCastThreads)
    multi_cast_kernel(const __grid_constant__ CastTable table) {
  const int t = table.plan.block_tensor[blockIdx.x];
  const int64_t start = static_cast<int64_t>(table.plan.block_chunk[blockIdx.x]) * kCastChunk;
  const int64_t len = table.n[t] - start < kCastChunk ? table.n[t] - start : kCastChunk;
  const Src* src = static_cast<const Src*>(table.src[t]) + start;
  Dst* dst = static_cast<Dst*>(table.dst[t]) + start;
  convert_span(src, dst, len, vec8_aligned(src, dst) ? len / 8 : 0, threadIdx.x, blockDim.x);
}

template <typename Src, typename Dst>
void launch_multi_cast(const void* const* src, void* const* dst, const int64_t* sizes, int count,
                       cudaStream_t stream) {
  CastTable table;
  for_each_chunk_plan(
      table, count, kCastChunk, [&](int k) { return sizes[k]; },
      [&](int slot, int k) {
        table.src[slot] = src[k];
        table.dst[slot] = dst[k];
        table.n[slot] = sizes[k];
      },
      [&](int blocks) {
        multi_cast_kernel<Src, Dst><<<blocks, kCastThreads, 0, stream>>>(table);
        LOOM_CUDA_CHECK_LAUNCH();
      });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launchers.

void multi_tensor_cast(DType src_dtype, DType dst_dtype, const void* const* src,
                       void* const* dst, const int64_t* sizes, int count, cudaStream_t stream) {
  if (count < 0) fail("multi_tensor_cast: negative tensor count ", count);
  if (count > 0 && (src == nullptr || dst == nullptr || sizes == nullptr))
    fail("multi_tensor_cast: src, dst and sizes must not be null for ", count, " tensors");
  for (int k = 0; k < count; ++k) {
    if (sizes[k] < 0) fail("multi_tensor_cast: tensor #", k, " has a negative size ", sizes[k]);
    if (sizes[k] > 0 && (src[k] == nullptr || dst[k] == nullptr))
      fail("multi_tensor_cast: tensor #", k, " (", sizes[k], " elements) is null");
    if (ceil_div(sizes[k], kCastChunk) > INT32_MAX)
      fail("multi_tensor_cast: tensor #", k, " has too many elements (", sizes[k], ")");
  }
  if (src_dtype == DType::F32 && dst_dtype == DType::BF16) {
    launch_multi_cast<float, __nv_bfloat16>(src, dst, sizes, count, stream);
  } else if (src_dtype == DType::F32 && dst_dtype == DType::F16) {
    launch_multi_cast<float, __half>(src, dst, sizes, count, stream);
  } else {
    fail("multi_tensor_cast: converts f32 to bf16 or f16, got ", dtype_name(src_dtype), " to ",
         dtype_name(dst_dtype));
  }
}

void fill(DType dtype, void* dst, double value, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  visit_device_dtype(dtype, [&]<typename T>() {
    const T converted = from_double_value<T>(value);
    if constexpr (sizeof(T) == 1) {
      launch_fill<uint8_t>(dst, &converted, n, stream);
    } else if constexpr (sizeof(T) == 2) {
      launch_fill<uint16_t>(dst, &converted, n, stream);
    } else if constexpr (sizeof(T) == 4) {
      launch_fill<uint32_t>(dst, &converted, n, stream);
    } else {
      launch_fill<uint64_t>(dst, &converted, n, stream);
    }
  });
}

void copy_strided(DType src_dtype, int ndim, const int64_t* shape, const void* src,
                  const int64_t* src_strides, DType dst_dtype, void* dst, cudaStream_t stream) {
  StridedLayout<1> layout;
  const int64_t* strides[1] = {src_strides};
  if (!coalesce("copy_strided", ndim, shape, strides, layout)) return;
  const int64_t n = numel_of(layout);
  const bool contiguous = is_contiguous(layout);
  if (contiguous && src_dtype == dst_dtype) {
    size_t element_size = 0;
    visit_device_dtype(src_dtype, [&]<typename T>() { element_size = sizeof(T); });
    LOOM_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * element_size,
                                    cudaMemcpyDeviceToDevice, stream));
    return;
  }
  if (contiguous && try_convert_vec8(src_dtype, src, dst_dtype, dst, n, stream)) return;
  const bool index32 = n <= static_cast<int64_t>(UINT32_MAX);
  visit_device_dtype(src_dtype, [&]<typename Src>() {
    visit_device_dtype(dst_dtype, [&]<typename Dst>() {
      copy_kernel<Src, Dst><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
          layout, static_cast<const Src*>(src), static_cast<Dst*>(dst), n, contiguous, index32);
      LOOM_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace loom::kernels::cuda
