// Rotary position embedding (contract in rotary.h). A thread per element of the output (grid
// stride past the grid's limit); each product and sum explicitly rounded (no contraction into
// FMAs), as the CPU kernels round them.

#include "kernels/cuda/rotary.h"

#include "core/error.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/common.cuh"

namespace loom::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// A table's value as x's dtype T holds it, in T's arithmetic.
template <typename T, typename C>
__device__ __forceinline__ Acc<T> table_value(C v) {
  return widen(narrow<T>(static_cast<Acc<T>>(widen(v))));
}

// Element i of the [batch, heads, time, dim] index space at `layout`.
__device__ __forceinline__ int64_t offset_of(int64_t i, int64_t heads, int64_t time, int64_t dim,
                                             RotaryLayout layout) {
  const int64_t d = i % dim, row = i / dim;
  const int64_t t = row % time, h = row / time % heads, b = row / time / heads;
  return b * layout.b + h * layout.h + t * layout.t + d;
}

template <typename T, typename C>
__global__ void rotary_forward_kernel(const T* x, RotaryLayout x_layout, int64_t heads,
                                      int64_t time, int64_t dim, const C* cos, const C* sin, T* y,
                                      RotaryLayout y_layout, int64_t n) {
  const int64_t half = dim / 2, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t d = i % dim, t = i / dim % time;
    const T* in = x + (offset_of(i, heads, time, dim, x_layout) - d);
    const Acc<T> rotated = d < half ? -widen(in[d + half]) : widen(in[d - half]);
    const T a = narrow<T>(mul_rn(widen(in[d]), table_value<T>(cos[t * dim + d])));
    const T s = narrow<T>(mul_rn(rotated, table_value<T>(sin[t * dim + d])));
    y[offset_of(i, heads, time, dim, y_layout)] = narrow<T>(add_rn(widen(a), widen(s)));
  }
}

template <typename T, typename C>
__global__ void rotary_backward_kernel(const T* dy, RotaryLayout dy_layout, int64_t heads,
                                       int64_t time, int64_t dim, const C* cos, const C* sin, T* dx,
                                       RotaryLayout dx_layout, int64_t n) {
  const int64_t half = dim / 2, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    const int64_t d = i % dim, t = i / dim % time;
    const T* g = dy + (offset_of(i, heads, time, dim, dy_layout) - d);
    const C* c = cos + t * dim;
    const C* s = sin + t * dim;
    const Acc<T> other = d < half ? mul_rn(widen(g[d + half]), table_value<T>(s[d + half]))
                                  : -mul_rn(widen(g[d - half]), table_value<T>(s[d - half]));
    dx[offset_of(i, heads, time, dim, dx_layout)] =
        narrow<T>(add_rn(mul_rn(widen(g[d]), table_value<T>(c[d])), other));
  }
}

void check_sizes(const char* op, int64_t rows, int64_t time, int64_t dim) {
  if (rows < 0 || time < 0 || dim < 0 || dim % 2 != 0)
    fail(op, ": expected non-negative sizes and an even dim, got rows ", rows, ", time ", time,
         ", dim ", dim);
}

// Calls f.template operator()<T, C>() for x's storage type T and the tables' C (T or float).
template <typename F>
void dispatch_rotary(DType dtype, DType table_dtype, const char* op, F&& f) {
  dispatch_arithmetic(dtype, op, [&]<typename T>() {
    if (table_dtype == dtype) {
      f.template operator()<T, T>();
    } else if (table_dtype == DType::F32) {
      f.template operator()<T, float>();
    } else {
      fail(op, ": the tables must be f32 or x's ", dtype_name(dtype), ", got ",
           dtype_name(table_dtype));
    }
  });
}

}  // namespace

void rotary_forward(DType dtype, DType table_dtype, const void* x, RotaryLayout x_layout,
                    int64_t batch, int64_t heads, int64_t time, int64_t dim, const void* cos,
                    const void* sin, void* y, RotaryLayout y_layout, cudaStream_t stream) {
  check_sizes("rotary_forward", batch * heads, time, dim);
  const int64_t n = batch * heads * time * dim;
  if (n == 0) return;
  dispatch_rotary(dtype, table_dtype, "rotary_forward", [&]<typename T, typename C>() {
    rotary_forward_kernel<T, C><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(x), x_layout, heads, time, dim, static_cast<const C*>(cos),
        static_cast<const C*>(sin), static_cast<T*>(y), y_layout, n);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

void rotary_backward(DType dtype, DType table_dtype, const void* dy, RotaryLayout dy_layout,
                     int64_t batch, int64_t heads, int64_t time, int64_t dim, const void* cos,
                     const void* sin, void* dx, RotaryLayout dx_layout, cudaStream_t stream) {
  check_sizes("rotary_backward", batch * heads, time, dim);
  const int64_t n = batch * heads * time * dim;
  if (n == 0) return;
  dispatch_rotary(dtype, table_dtype, "rotary_backward", [&]<typename T, typename C>() {
    rotary_backward_kernel<T, C><<<grid_for(n, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(dy), dy_layout, heads, time, dim, static_cast<const C*>(cos),
        static_cast<const C*>(sin), static_cast<T*>(dx), dx_layout, n);
    LOOM_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace loom::kernels::cuda
