#include "kernels/cuda/elementwise.h"

#include <cstring>
#include <type_traits>

#include "kernels/cuda/chunk_plan.cuh"
#include "kernels/cuda/common.cuh"

// Note [Vectorised elementwise kernels]
// Contiguous kernels move 16 bytes per load and store (4 f32, 8 bf16, 2 f64) when every pointer
// is 16-byte aligned: a bandwidth-bound kernel then issues a quarter (f32) or an eighth (bf16)
// of the memory instructions. Each thread reads a whole vector of every input before writing
// the same vector of the output, so `out` may alias an input. Elements past the last whole
// vector (or all of them, for unaligned pointers) take a scalar grid-stride loop in the same
// kernel, so there is one kernel per operation either way.
//
// Note [Strided layouts by value]
// Shapes and strides travel in the kernel's parameters (no device allocation, no copy): a
// StridedLayout holds up to kMaxDims dimensions, innermost first, after the host has dropped
// size-1 dimensions and merged dimensions that are contiguous in every operand (a transposed
// [B, T, C] view of 3 dimensions often becomes 2). The per-element index decomposition loops
// over a fixed kMaxDims with an early exit, fully unrolled, so the layout stays in the constant
// bank; indices use 32-bit division when the element count allows (much cheaper than 64-bit).

namespace loom::kernels::cuda {

namespace {

constexpr int kThreads = 256;


// ---------------------------------------------------------------------------------------------
// Element types: storage T, arithmetic in Acc<T> (double for f64, float otherwise).


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
// Contiguous maps; see Note [Vectorised elementwise kernels].

template <typename T>
struct alignas(16) Vec16 {
  static constexpr int kSize = 16 / static_cast<int>(sizeof(T));
  T v[kSize];
};

template <typename T, int kIn>
struct MapArgs {
  const T* in[kIn];
  T* out;
  int64_t n;
  int64_t vectors;  // whole 16-byte vectors processed vectorised (0 when unaligned)
};

template <typename T, int kIn, typename F>
__device__ __forceinline__ T apply_map(const F& f, const T (&x)[kIn]) {
  if constexpr (kIn == 1) {
    return narrow<T>(f(widen(x[0])));
  } else {
    return narrow<T>(f(widen(x[0]), widen(x[1])));
  }
}

template <typename T, int kIn, typename F>
__global__ void map_kernel(const MapArgs<T, kIn> args, const F f) {
  constexpr int kVec = Vec16<T>::kSize;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t v = tid; v < args.vectors; v += stride) {
    Vec16<T> in[kIn];
#pragma unroll
    for (int k = 0; k < kIn; ++k)
      in[k] = reinterpret_cast<const Vec16<T>*>(args.in[k])[v];
    Vec16<T> out;
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      T x[kIn];
#pragma unroll
      for (int k = 0; k < kIn; ++k)
        x[k] = in[k].v[j];
      out.v[j] = apply_map<T, kIn>(f, x);
    }
    reinterpret_cast<Vec16<T>*>(args.out)[v] = out;
  }
  for (int64_t i = args.vectors * kVec + tid; i < args.n; i += stride) {
    T x[kIn];
#pragma unroll
    for (int k = 0; k < kIn; ++k)
      x[k] = args.in[k][i];
    args.out[i] = apply_map<T, kIn>(f, x);
  }
}

template <typename T, int kIn, typename F>
void launch_map(const void* const (&in)[kIn], void* out, int64_t n, const F& f,
                cudaStream_t stream) {
  if (n <= 0) return;
  constexpr int kVec = Vec16<T>::kSize;
  MapArgs<T, kIn> args;
  bool aligned = aligned16(out);
  for (int k = 0; k < kIn; ++k) {
    args.in[k] = static_cast<const T*>(in[k]);
    aligned = aligned && aligned16(in[k]);
  }
  args.out = static_cast<T*>(out);
  args.n = n;
  args.vectors = aligned ? n / kVec : 0;
  const int64_t work = aligned ? args.vectors + (n % kVec) : n;
  map_kernel<T, kIn, F><<<grid_for(work, kThreads), kThreads, 0, stream>>>(args, f);
  LOOM_CUDA_CHECK_LAUNCH();
}

struct AddFn {
  template <typename C>
  __device__ C operator()(C a, C b) const {
    return a + b;
  }
};
struct SubFn {
  template <typename C>
  __device__ C operator()(C a, C b) const {
    return a - b;
  }
};
struct MulFn {
  template <typename C>
  __device__ C operator()(C a, C b) const {
    return a * b;
  }
};
struct DivFn {
  template <typename C>
  __device__ C operator()(C a, C b) const {
    return a / b;
  }
};
template <typename C>
struct AddScalarFn {
  C value;
  __device__ C operator()(C a) const { return a + value; }
};
template <typename C>
struct ScaleFn {
  C factor;
  __device__ C operator()(C a) const { return a * factor; }
};

__device__ __forceinline__ float tanh_of(float v) {
  return tanhf(v);
}
__device__ __forceinline__ double tanh_of(double v) {
  return tanh(v);
}

constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;

// Same expression order as kernels/cpu/elementwise.cpp.
struct GeluForwardFn {
  template <typename C>
  __device__ C operator()(C v) const {
    const C c = static_cast<C>(kSqrt2OverPi), k = static_cast<C>(kGeluCubic);
    C t = tanh_of(c * (v + k * v * v * v));
    return C(0.5) * v * (C(1) + t);
  }
};
struct GeluBackwardFn {
  template <typename C>
  __device__ C operator()(C v, C dy) const {
    const C c = static_cast<C>(kSqrt2OverPi), k = static_cast<C>(kGeluCubic);
    C t = tanh_of(c * (v + k * v * v * v));
    C sech2 = C(1) - t * t;
    C grad = C(0.5) * (C(1) + t) + C(0.5) * v * sech2 * c * (C(1) + C(3) * k * v * v);
    return dy * grad;
  }
};

__device__ __forceinline__ float exp_of(float v) {
  return expf(v);
}
__device__ __forceinline__ double exp_of(double v) {
  return exp(v);
}

// Same expression order as kernels/cpu/elementwise.cpp.
struct SiluForwardFn {
  template <typename C>
  __device__ C operator()(C v) const {
    return v / (C(1) + exp_of(-v));
  }
};
struct SiluBackwardFn {
  template <typename C>
  __device__ C operator()(C v, C dy) const {
    C s = C(1) / (C(1) + exp_of(-v));
    return dy * (s * (C(1) + v * (C(1) - s)));
  }
};

// SwiGLU, as kernels/cpu's swiglu_* round it (silu by SiluForwardFn's expression).
template <typename T>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* y, int64_t n) {
  using C = Acc<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const T s = narrow<T>(SiluForwardFn{}(widen(gate[i])));
    y[i] = narrow<T>(static_cast<C>(widen(s)) * static_cast<C>(widen(up[i])));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* gate, const T* up, const T* dy, T* dgate, T* dup,
                                       int64_t n) {
  using C = Acc<T>;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const C g = widen(gate[i]), d = widen(dy[i]);
    const C denominator = C(1) + exp_of(-g);  // silu and sigmoid as Silu*Fn compute them
    const C sigmoid = C(1) / denominator;
    dup[i] = narrow<T>(d * static_cast<C>(widen(narrow<T>(g / denominator))));
    dgate[i] = narrow<T>(d * static_cast<C>(widen(up[i])) *
                         (sigmoid * (C(1) + g * (C(1) - sigmoid))));
  }
}

template <typename T>
void launch_binary_contiguous(BinaryOp op, const void* a, const void* b, void* out, int64_t n,
                              cudaStream_t stream) {
  const void* in[2] = {a, b};
  switch (op) {
    case BinaryOp::Add: return launch_map<T, 2>(in, out, n, AddFn{}, stream);
    case BinaryOp::Sub: return launch_map<T, 2>(in, out, n, SubFn{}, stream);
    case BinaryOp::Mul: return launch_map<T, 2>(in, out, n, MulFn{}, stream);
    case BinaryOp::Div: return launch_map<T, 2>(in, out, n, DivFn{}, stream);
  }
  fail("binary: invalid BinaryOp value ", static_cast<int>(op));
}

// ---------------------------------------------------------------------------------------------
// Strided layouts; see Note [Strided layouts by value].

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

template <typename C>
__device__ __forceinline__ C apply_binary(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::Add: return a + b;
    case BinaryOp::Sub: return a - b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
  }
  return a;
}

// The op is a run-time argument here (uniform across the grid, so the branch is free next to
// the index arithmetic); the contiguous fast path has one kernel per op instead.
template <typename T>
__global__ void binary_strided_kernel(const __grid_constant__ StridedLayout<2> layout, BinaryOp op,
                                      const T* a, const T* b, T* out, int64_t n, bool index32) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    int64_t off[2];
    offsets_for(layout, i, index32, off);
    out[i] = narrow<T>(apply_binary(op, widen(a[off[0]]), widen(b[off[1]])));
  }
}

// ---------------------------------------------------------------------------------------------
// Copies and conversions.

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

constexpr int64_t kScaleChunk = 65536;
constexpr int kScaleThreads = 512;

struct ScaleTable {
  void* x[kMaxChunkTensors];
  int64_t n[kMaxChunkTensors];
  ChunkPlan plan;
};
static_assert(sizeof(ScaleTable) + sizeof(double) <= kMaxKernelParameterBytes);

template <typename T>
__global__ void __launch_bounds__(kScaleThreads)
    multi_scale_kernel(const __grid_constant__ ScaleTable table, const Acc<T> factor) {
  const int t = table.plan.block_tensor[blockIdx.x];
  const int64_t start = static_cast<int64_t>(table.plan.block_chunk[blockIdx.x]) * kScaleChunk;
  const int64_t len = table.n[t] - start < kScaleChunk ? table.n[t] - start : kScaleChunk;
  T* x = static_cast<T*>(table.x[t]) + start;
  const ScaleFn<Acc<T>> scale{factor};
  // 16-byte accesses where the chunk is aligned (as the gradient norm's sums: reduce.cu).
  constexpr int kVec = Vec16<T>::kSize;
  const int64_t vectors = reinterpret_cast<uintptr_t>(x) % 16 == 0 ? len / kVec : 0;
#pragma unroll 4
  for (int64_t v = threadIdx.x; v < vectors; v += blockDim.x) {
    Vec16<T> in = reinterpret_cast<const Vec16<T>*>(x)[v];
#pragma unroll
    for (int j = 0; j < kVec; ++j)
      in.v[j] = narrow<T>(scale(widen(in.v[j])));
    reinterpret_cast<Vec16<T>*>(x)[v] = in;
  }
  for (int64_t i = vectors * kVec + threadIdx.x; i < len; i += blockDim.x)
    x[i] = narrow<T>(scale(widen(x[i])));
}

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
__global__ void __launch_bounds__(kScaleThreads)
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
        multi_cast_kernel<Src, Dst><<<blocks, kScaleThreads, 0, stream>>>(table);
        LOOM_CUDA_CHECK_LAUNCH();
      });
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launchers.

void binary(BinaryOp op, DType dtype, int ndim, const int64_t* shape, const void* a,
            const int64_t* a_strides, const void* b, const int64_t* b_strides, void* out,
            cudaStream_t stream) {
  StridedLayout<2> layout;
  const int64_t* strides[2] = {a_strides, b_strides};
  if (!coalesce("binary", ndim, shape, strides, layout)) return;
  const int64_t n = numel_of(layout);
  dispatch_arithmetic(dtype, "binary", [&]<typename T>() {
    if (is_contiguous(layout)) {
      launch_binary_contiguous<T>(op, a, b, out, n, stream);
      return;
    }
    binary_strided_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        layout, op, static_cast<const T*>(a), static_cast<const T*>(b), static_cast<T*>(out), n,
        n <= static_cast<int64_t>(UINT32_MAX));
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

void add_inplace(DType dtype, void* a, const void* b, int64_t n, cudaStream_t stream) {
  dispatch_arithmetic(dtype, "add_inplace", [&]<typename T>() {
    const void* in[2] = {a, b};
    launch_map<T, 2>(in, a, n, AddFn{}, stream);
  });
}

namespace {
template <typename T>
__global__ void add_widened_kernel(float* out, const float* a, int64_t a_period, const T* b,
                                   int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    out[i] = a[a_period == n ? i : i % a_period] + widen(b[i]);
}
}  // namespace

void add_widened(DType b_dtype, float* out, const float* a, int64_t a_period, const void* b,
                 int64_t n, cudaStream_t stream) {
  if (b_dtype != DType::BF16 && b_dtype != DType::F16)
    fail("add_widened: the addend must be bf16 or f16, got ", dtype_name(b_dtype));
  if (n == 0) return;
  if (a_period < 1 || n % a_period != 0)
    fail("add_widened: the f32 operand's period ", a_period, " does not divide ", n);
  dispatch_float_storage(b_dtype, "add_widened", [&]<typename T>() {
    add_widened_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        out, a, a_period, static_cast<const T*>(b), n);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

void scale_inplace(DType dtype, void* a, double factor, int64_t n, cudaStream_t stream) {
  scale(dtype, a, factor, a, n, stream);
}

void add_scalar(DType dtype, const void* a, double value, void* out, int64_t n,
                cudaStream_t stream) {
  dispatch_arithmetic(dtype, "add_scalar", [&]<typename T>() {
    const void* in[1] = {a};
    launch_map<T, 1>(in, out, n, AddScalarFn<Acc<T>>{static_cast<Acc<T>>(value)}, stream);
  });
}

void scale(DType dtype, const void* a, double factor, void* out, int64_t n, cudaStream_t stream) {
  dispatch_arithmetic(dtype, "scale", [&]<typename T>() {
    const void* in[1] = {a};
    launch_map<T, 1>(in, out, n, ScaleFn<Acc<T>>{static_cast<Acc<T>>(factor)}, stream);
  });
}

void multi_tensor_scale(DType dtype, void* const* tensors, const int64_t* sizes, int count,
                        double factor, cudaStream_t stream) {
  if (count < 0) fail("multi_tensor_scale: negative tensor count ", count);
  if (count > 0 && (tensors == nullptr || sizes == nullptr))
    fail("multi_tensor_scale: tensors and sizes must not be null for ", count, " tensors");
  for (int k = 0; k < count; ++k) {
    if (sizes[k] < 0) fail("multi_tensor_scale: tensor #", k, " has a negative size ", sizes[k]);
    if (sizes[k] > 0 && tensors[k] == nullptr)
      fail("multi_tensor_scale: tensor #", k, " (", sizes[k], " elements) is null");
    if (ceil_div(sizes[k], kScaleChunk) > INT32_MAX)
      fail("multi_tensor_scale: tensor #", k, " has too many elements (", sizes[k], ")");
  }
  dispatch_arithmetic(dtype, "multi_tensor_scale", [&]<typename T>() {
    ScaleTable table;
    const auto f = static_cast<Acc<T>>(factor);
    for_each_chunk_plan(
        table, count, kScaleChunk, [&](int k) { return sizes[k]; },
        [&](int slot, int k) {
          table.x[slot] = tensors[k];
          table.n[slot] = sizes[k];
        },
        [&](int blocks) {
          multi_scale_kernel<T><<<blocks, kScaleThreads, 0, stream>>>(table, f);
          LOOM_CUDA_CHECK_LAUNCH();
        });
  });
}

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

void swiglu_forward(DType dtype, const void* gate, const void* up, void* y, int64_t n,
                    cudaStream_t stream) {
  if (n < 0) fail("swiglu_forward: negative element count ", n);
  if (n == 0) return;
  dispatch_arithmetic(dtype, "swiglu_forward", [&]<typename T>() {
    swiglu_forward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<T*>(y), n);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

void swiglu_backward(DType dtype, const void* gate, const void* up, const void* dy, void* dgate,
                     void* dup, int64_t n, cudaStream_t stream) {
  if (n < 0) fail("swiglu_backward: negative element count ", n);
  if (n == 0) return;
  dispatch_arithmetic(dtype, "swiglu_backward", [&]<typename T>() {
    swiglu_backward_kernel<T><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(gate), static_cast<const T*>(up), static_cast<const T*>(dy),
        static_cast<T*>(dgate), static_cast<T*>(dup), n);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

void gelu_forward(DType dtype, const void* x, void* y, int64_t n, cudaStream_t stream) {
  dispatch_arithmetic(dtype, "gelu_forward", [&]<typename T>() {
    const void* in[1] = {x};
    launch_map<T, 1>(in, y, n, GeluForwardFn{}, stream);
  });
}

void gelu_backward(DType dtype, const void* x, const void* dy, void* dx, int64_t n,
                   cudaStream_t stream) {
  dispatch_arithmetic(dtype, "gelu_backward", [&]<typename T>() {
    const void* in[2] = {x, dy};
    launch_map<T, 2>(in, dx, n, GeluBackwardFn{}, stream);
  });
}

// One thread per element (grid-stride): out = gelu(x + bias[column]) forward, or
// dy * gelu'(x + bias[column]) backward, widened on load and rounded once on store.
template <typename T, bool kBackward>
__global__ void bias_gelu_kernel(const T* x, const T* bias, const T* dy, T* out, int64_t n,
                                 int64_t width) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const auto v = widen(x[i]) + widen(bias[i % width]);
    if constexpr (kBackward) {
      out[i] = narrow<T>(GeluBackwardFn{}(v, widen(dy[i])));
    } else {
      out[i] = narrow<T>(GeluForwardFn{}(v));
    }
  }
}

void bias_gelu_forward(DType dtype, const void* x, const void* bias, void* y, int64_t rows,
                       int64_t width, cudaStream_t stream) {
  const int64_t n = rows * width;
  if (n <= 0) return;
  dispatch_arithmetic(dtype, "bias_gelu_forward", [&]<typename T>() {
    bias_gelu_kernel<T, false><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(bias), nullptr, static_cast<T*>(y), n,
        width);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

void bias_gelu_backward(DType dtype, const void* x, const void* bias, const void* dy, void* dx,
                        int64_t rows, int64_t width, cudaStream_t stream) {
  const int64_t n = rows * width;
  if (n <= 0) return;
  dispatch_arithmetic(dtype, "bias_gelu_backward", [&]<typename T>() {
    bias_gelu_kernel<T, true><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(x), static_cast<const T*>(bias), static_cast<const T*>(dy),
        static_cast<T*>(dx), n, width);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

void silu_forward(DType dtype, const void* x, void* y, int64_t n, cudaStream_t stream) {
  dispatch_arithmetic(dtype, "silu_forward", [&]<typename T>() {
    const void* in[1] = {x};
    launch_map<T, 1>(in, y, n, SiluForwardFn{}, stream);
  });
}

void silu_backward(DType dtype, const void* x, const void* dy, void* dx, int64_t n,
                   cudaStream_t stream) {
  dispatch_arithmetic(dtype, "silu_backward", [&]<typename T>() {
    const void* in[2] = {x, dy};
    launch_map<T, 2>(in, dx, n, SiluBackwardFn{}, stream);
  });
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
