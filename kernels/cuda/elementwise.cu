#include "kernels/cuda/elementwise.h"

#include <type_traits>

#include "kernels/cuda/chunk_plan.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/strided_layout.cuh"

// Note [Vectorised elementwise kernels]
// Contiguous kernels move 16 bytes per load and store (4 f32, 8 bf16, 2 f64) when every pointer
// is 16-byte aligned: a bandwidth-bound kernel then issues a quarter (f32) or an eighth (bf16)
// of the memory instructions. Each thread reads a whole vector of every input before writing
// the same vector of the output, so `out` may alias an input. Elements past the last whole
// vector (or all of them, for unaligned pointers) take a scalar grid-stride loop in the same
// kernel, so there is one kernel per operation either way.

namespace loom::kernels::cuda {

namespace {

constexpr int kThreads = 256;

// ---------------------------------------------------------------------------------------------
// Contiguous maps; see Note [Vectorised elementwise kernels].

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
// Strided binary ops; see Note [Strided layouts by value] in strided_layout.cuh.

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

}  // namespace loom::kernels::cuda
