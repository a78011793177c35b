#include "kernels/cpu/elementwise.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/half.h"
#include "kernels/cpu/strided.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/widen.h"

namespace loom::kernels::cpu {

namespace {

template <typename T, typename Op>
void binary_rows(int ndim, const int64_t* shape, const T* a, const int64_t* a_strides, const T* b,
                 const int64_t* b_strides, T* out, Op op) {
  int64_t out_offset = 0;
  int64_t as = ndim ? a_strides[ndim - 1] : 0;
  int64_t bs = ndim ? b_strides[ndim - 1] : 0;
  for_each_row<2>(ndim, shape, {a_strides, b_strides},
                  [&](const std::array<int64_t, 2>& offsets, int64_t n) {
                    const T* pa = a + offsets[0];
                    const T* pb = b + offsets[1];
                    T* po = out + out_offset;
                    // Specialised inner loops so the common layouts vectorise.
                    if (as == 1 && bs == 1) {
                      for (int64_t i = 0; i < n; ++i)
                        po[i] = op(pa[i], pb[i]);
                    } else if (as == 1 && bs == 0) {
                      T vb = *pb;
                      for (int64_t i = 0; i < n; ++i)
                        po[i] = op(pa[i], vb);
                    } else if (as == 0 && bs == 1) {
                      T va = *pa;
                      for (int64_t i = 0; i < n; ++i)
                        po[i] = op(va, pb[i]);
                    } else {
                      for (int64_t i = 0; i < n; ++i)
                        po[i] = op(pa[i * as], pb[i * bs]);
                    }
                    out_offset += n;
                  });
}

}  // namespace

namespace {

template <typename T>
void binary_serial(BinaryOp op, int ndim, const int64_t* shape, const T* a,
                   const int64_t* a_strides, const T* b, const int64_t* b_strides, T* out) {
  switch (op) {
    case BinaryOp::Add:
      return binary_rows(ndim, shape, a, a_strides, b, b_strides, out,
                         [](T x, T y) { return x + y; });
    case BinaryOp::Sub:
      return binary_rows(ndim, shape, a, a_strides, b, b_strides, out,
                         [](T x, T y) { return x - y; });
    case BinaryOp::Mul:
      return binary_rows(ndim, shape, a, a_strides, b, b_strides, out,
                         [](T x, T y) { return x * y; });
    case BinaryOp::Div:
      return binary_rows(ndim, shape, a, a_strides, b, b_strides, out,
                         [](T x, T y) { return x / y; });
  }
}

}  // namespace

// The output is contiguous: the threads take ranges of the outermost dimension.
template <typename T>
void binary(BinaryOp op, int ndim, const int64_t* shape, const T* a, const int64_t* a_strides,
            const T* b, const int64_t* b_strides, T* out) {
  if (ndim == 0) return binary_serial(op, ndim, shape, a, a_strides, b, b_strides, out);
  int64_t inner = 1;
  for (int d = 1; d < ndim; ++d)
    inner *= shape[d];
  parallel_rows(shape[0], inner, [&](int64_t first, int64_t last) {
    std::vector<int64_t> part(shape, shape + ndim);
    part[0] = last - first;
    binary_serial(op, ndim, part.data(), a + first * a_strides[0], a_strides,
                  b + first * b_strides[0], b_strides, out + first * inner);
  });
}

template <typename T>
void add_inplace(T* a, const T* b, int64_t n) {
  parallel_for(n, kMinParallelElements, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i)
      a[i] += b[i];
  });
}

void add_widened(float* out, const float* a, int64_t a_period, const uint16_t* b,
                 DType b_dtype, int64_t n) {
  if (b_dtype != DType::BF16 && b_dtype != DType::F16)
    fail("add_widened: the addend must be bf16 or f16, got ", dtype_name(b_dtype));
  if (n == 0) return;
  if (a_period < 1 || n % a_period != 0)
    fail("add_widened: the f32 operand's period ", a_period, " does not divide ", n);
  auto widened = [bf16 = b_dtype == DType::BF16](uint16_t bits) {
    return bf16 ? bf16_bits_to_float(bits) : f16_bits_to_f32(bits);
  };
  parallel_for(n, kMinParallelElements, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i)
      out[i] = a[a_period == n ? i : i % a_period] + widened(b[i]);
  });
}

template <typename T>
void scale_inplace(T* a, T factor, int64_t n) {
  parallel_for(n, kMinParallelElements, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i)
      a[i] *= factor;
  });
}

template <typename T>
void add_scalar(const T* a, T value, T* out, int64_t n) {
  parallel_for(n, kMinParallelElements, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i)
      out[i] = a[i] + value;
  });
}

template <typename T>
void scale(const T* a, T factor, T* out, int64_t n) {
  parallel_for(n, kMinParallelElements, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i)
      out[i] = a[i] * factor;
  });
}

namespace {
constexpr double kSqrt2OverPi = 0.7978845608028654;
constexpr double kGeluCubic = 0.044715;
}  // namespace

namespace {

// GELU and its derivative at v, one expression order for gelu_* and bias_gelu_*.
template <typename T>
inline T gelu_at(T v) {
  const T c = static_cast<T>(kSqrt2OverPi), k = static_cast<T>(kGeluCubic);
  T t = tanh_approx(c * (v + k * v * v * v));
  return T(0.5) * v * (T(1) + t);
}

template <typename T>
inline T gelu_slope_at(T v) {
  const T c = static_cast<T>(kSqrt2OverPi), k = static_cast<T>(kGeluCubic);
  T t = tanh_approx(c * (v + k * v * v * v));
  T sech2 = T(1) - t * t;
  return T(0.5) * (T(1) + t) + T(0.5) * v * sech2 * c * (T(1) + T(3) * k * v * v);
}

}  // namespace

template <typename T>
void gelu_forward(const T* x, T* y, int64_t n) {
  parallel_for(n, kMinParallelElements, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i)
      y[i] = gelu_at(x[i]);
  });
}

template <typename T>
void gelu_backward(const T* x, const T* dy, T* dx, int64_t n) {
  parallel_for(n, kMinParallelElements, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i)
      dx[i] = dy[i] * gelu_slope_at(x[i]);
  });
}

template <typename S>
void bias_gelu_forward(const S* x, const S* bias, S* y, int64_t rows, int64_t width) {
  parallel_rows(rows, width, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const S* xr = x + r * width;
      S* yr = y + r * width;
      for (int64_t i = 0; i < width; ++i)
        yr[i] = narrow<S>(gelu_at(widen(xr[i]) + widen(bias[i])));
    }
  });
}

// The threads take columns, so that each bias gradient sums its rows in order on any thread
// count, in the same pass that writes dx. The sums run in the compute type and are rounded
// to S once at the end.
template <typename S, typename DB>
void bias_gelu_backward(const S* x, const S* bias, const S* dy, S* dx, DB* dbias, int64_t rows,
                        int64_t width) {
  using C = compute_of<S>;
  parallel_rows(width, rows, [&](int64_t first, int64_t last) {
    std::vector<C> sums(static_cast<size_t>(last - first), C(0));
    for (int64_t r = 0; r < rows; ++r) {
      const S* xr = x + r * width;
      const S* dyr = dy + r * width;
      S* dxr = dx + r * width;
      for (int64_t i = first; i < last; ++i) {
        const C d = widen(dyr[i]) * gelu_slope_at(widen(xr[i]) + widen(bias[i]));
        dxr[i] = narrow<S>(d);
        sums[i - first] += d;
      }
    }
    for (int64_t i = first; i < last; ++i)
      dbias[i] = narrow<DB>(sums[i - first]);
  });
}

namespace {

template <typename E>
void copy_rows(int ndim, const int64_t* shape, const E* src, const int64_t* src_strides, E* dst) {
  int64_t out = 0;
  int64_t s = ndim ? src_strides[ndim - 1] : 0;
  for_each_row<1>(ndim, shape, {src_strides}, [&](const std::array<int64_t, 1>& off, int64_t n) {
    const E* p = src + off[0];
    if (s == 1) {
      std::memcpy(dst + out, p, static_cast<size_t>(n) * sizeof(E));
    } else {
      for (int64_t i = 0; i < n; ++i)
        dst[out + i] = p[i * s];
    }
    out += n;
  });
}

}  // namespace

void copy_strided(size_t element_size, int ndim, const int64_t* shape, const void* src,
                  const int64_t* src_strides, void* dst) {
  switch (element_size) {
    case 1:
      return copy_rows(ndim, shape, static_cast<const uint8_t*>(src), src_strides,
                       static_cast<uint8_t*>(dst));
    case 2:
      return copy_rows(ndim, shape, static_cast<const uint16_t*>(src), src_strides,
                       static_cast<uint16_t*>(dst));
    case 4:
      return copy_rows(ndim, shape, static_cast<const uint32_t*>(src), src_strides,
                       static_cast<uint32_t*>(dst));
    default:
      return copy_rows(ndim, shape, static_cast<const uint64_t*>(src), src_strides,
                       static_cast<uint64_t*>(dst));
  }
}

// exp_approx, not std::exp: a scalar library call per element kept these loops from
// vectorising (SiLU was twice PyTorch's time in the Llama step's profile); f64 stays exact.
template <typename T>
void silu_forward(const T* x, T* y, int64_t n) {
  parallel_for(n, kMinParallelElements, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i)
      y[i] = x[i] / (T(1) + exp_approx(-x[i]));
  });
}

template <typename T>
void silu_backward(const T* x, const T* dy, T* dx, int64_t n) {
  parallel_for(n, kMinParallelElements, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      T v = x[i];
      T s = T(1) / (T(1) + exp_approx(-v));
      dx[i] = dy[i] * (s * (T(1) + v * (T(1) - s)));
    }
  });
}

template <typename S>
void swiglu_forward(const S* gate, const S* up, S* y, int64_t n) {
  using C = compute_of<S>;
  parallel_for(n, kMinParallelElements, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const C g = widen(gate[i]);
      const S s = narrow<S>(g / (C(1) + exp_approx(-g)));
      y[i] = narrow<S>(widen(s) * widen(up[i]));
    }
  });
}

template <typename S>
void swiglu_backward(const S* gate, const S* up, const S* dy, S* dgate, S* dup, int64_t n) {
  using C = compute_of<S>;
  parallel_for(n, kMinParallelElements, [&](int64_t first, int64_t last) {
    for (int64_t i = first; i < last; ++i) {
      const C g = widen(gate[i]), d = widen(dy[i]);
      const C denominator = C(1) + exp_approx(-g);  // silu and sigmoid as silu_* compute them
      const C sigmoid = C(1) / denominator;
      dup[i] = narrow<S>(d * widen(narrow<S>(g / denominator)));
      dgate[i] = narrow<S>(d * widen(up[i]) * (sigmoid * (C(1) + g * (C(1) - sigmoid))));
    }
  });
}

#define LOOM_INSTANTIATE_SWIGLU(S)                                  \
  template void swiglu_forward<S>(const S*, const S*, S*, int64_t); \
  template void swiglu_backward<S>(const S*, const S*, const S*, S*, S*, int64_t);
LOOM_INSTANTIATE_SWIGLU(float)
LOOM_INSTANTIATE_SWIGLU(double)
LOOM_INSTANTIATE_SWIGLU(BFloat16)
LOOM_INSTANTIATE_SWIGLU(Half)
#undef LOOM_INSTANTIATE_SWIGLU

#define LOOM_INSTANTIATE(T)                                                                  \
  template void binary<T>(BinaryOp, int, const int64_t*, const T*, const int64_t*, const T*, \
                          const int64_t*, T*);                                               \
  template void add_inplace<T>(T*, const T*, int64_t);                                       \
  template void scale_inplace<T>(T*, T, int64_t);                                            \
  template void add_scalar<T>(const T*, T, T*, int64_t);                                     \
  template void scale<T>(const T*, T, T*, int64_t);                                          \
  template void gelu_forward<T>(const T*, T*, int64_t);                                      \
  template void gelu_backward<T>(const T*, const T*, T*, int64_t);                           \
  template void bias_gelu_forward<T>(const T*, const T*, T*, int64_t, int64_t);              \
  template void bias_gelu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t, int64_t); \
  template void silu_forward<T>(const T*, T*, int64_t);                                      \
  template void silu_backward<T>(const T*, const T*, T*, int64_t);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(double)
#undef LOOM_INSTANTIATE
template void bias_gelu_forward<BFloat16>(const BFloat16*, const BFloat16*, BFloat16*, int64_t,
                                          int64_t);
template void bias_gelu_backward<BFloat16>(const BFloat16*, const BFloat16*, const BFloat16*,
                                           BFloat16*, BFloat16*, int64_t, int64_t);
template void bias_gelu_backward<BFloat16, float>(const BFloat16*, const BFloat16*,
                                                  const BFloat16*, BFloat16*, float*, int64_t,
                                                  int64_t);
template void bias_gelu_forward<Half>(const Half*, const Half*, Half*, int64_t, int64_t);
template void bias_gelu_backward<Half>(const Half*, const Half*, const Half*, Half*, Half*,
                                       int64_t, int64_t);
template void bias_gelu_backward<Half, float>(const Half*, const Half*, const Half*, Half*, float*,
                                              int64_t, int64_t);

}  // namespace loom::kernels::cpu
