#include "kernels/cpu/layer_norm.h"

#include <cmath>

#include "kernels/cpu/lane_reduce.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/widen.h"

namespace loom::kernels::cpu {

namespace {

// Layer norm (kCentered) and RMS norm (the mean taken as 0, no bias) share their code. With a
// residual, each row first becomes x + residual, written to `sum`, and is normalised from
// there while it is in cache. y is stored as Y and the residual as R: each T, or a 16-bit
// float (y rounded once from T, the residual widened on load).
template <bool kCentered, typename T, typename Y = T, typename R = Y>
void normalize_forward(const T* x, const T* weight, const T* bias, Y* y, T* mean, T* rstd,
                       int64_t rows, int64_t width, double eps, const R* residual = nullptr,
                       T* sum = nullptr) {
  parallel_rows(rows, width, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const T* xr = x + r * width;
      Y* yr = y + r * width;
      if (residual) {
        const R* rr = residual + r * width;
        T* sr = sum + r * width;
        for (int64_t i = 0; i < width; ++i)
          sr[i] = xr[i] + widen(rr[i]);
        xr = sr;
      }
      T m = 0;
      if constexpr (kCentered) m = lane_sum(xr, width) / static_cast<T>(width);
      const T v = lane_sum_of<T>(width, [xr, m](int64_t i) {
                    const T d = xr[i] - m;
                    return d * d;
                  }) /
                  static_cast<T>(width);
      T s = static_cast<T>(1.0 / std::sqrt(static_cast<double>(v) + eps));
      for (int64_t i = 0; i < width; ++i) {
        if constexpr (kCentered) yr[i] = narrow<Y>((xr[i] - m) * s * weight[i] + bias[i]);
        else yr[i] = narrow<Y>(xr[i] * s * weight[i]);
      }
      if constexpr (kCentered) mean[r] = m;
      rstd[r] = s;
    }
  });
}

// dx row by row; dweight and dbias column by column, each summing its rows in order (the
// threads take rows for the one, columns for the other). A `dsum` (the gradient that reached
// the normalised input by another path, as a residual stream's) is added to dx in its pass.
// dy is read as D: T, or a 16-bit float widened exactly on load; a `dx_low` gets dx rounded to
// D in the same pass.
template <bool kCentered, typename T, typename D = T>
void normalize_backward(const D* dy, const T* x, const T* weight, const T* mean, const T* rstd,
                        T* dx, T* dweight, T* dbias, int64_t rows, int64_t width,
                        const T* dsum = nullptr, D* dx_low = nullptr) {
  parallel_rows(rows, width, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const T* xr = x + r * width;
      const D* dyr = dy + r * width;
      T* dxr = dx + r * width;
      T m = kCentered ? mean[r] : T(0), s = rstd[r];
      // dxhat = dy * weight; dx = s * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
      const T sum_dxhat =
          kCentered ? lane_sum_of<T>(width, [&](int64_t i) { return widen(dyr[i]) * weight[i]; })
                    : T(0);
      const T sum_dxhat_xhat = lane_sum_of<T>(width, [&](int64_t i) {
        return (widen(dyr[i]) * weight[i]) * ((xr[i] - m) * s);
      });
      T inv_width = T(1) / static_cast<T>(width);
      T mean_dxhat = sum_dxhat * inv_width, mean_dxhat_xhat = sum_dxhat_xhat * inv_width;
      for (int64_t i = 0; i < width; ++i) {
        T xhat = (xr[i] - m) * s;
        T dxhat = widen(dyr[i]) * weight[i];
        if constexpr (kCentered) dxr[i] = s * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat);
        else dxr[i] = s * (dxhat - xhat * mean_dxhat_xhat);
      }
      if (dsum) {
        const T* dsr = dsum + r * width;
        for (int64_t i = 0; i < width; ++i)
          dxr[i] += dsr[i];
      }
      if (dx_low) {
        D* dlr = dx_low + r * width;
        for (int64_t i = 0; i < width; ++i)
          dlr[i] = narrow<D>(dxr[i]);
      }
    }
  });
  if (!dweight && !dbias) return;
  parallel_rows(width, rows, [&](int64_t first, int64_t last) {
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x + r * width;
      const D* dyr = dy + r * width;
      const T m = kCentered ? mean[r] : T(0), s = rstd[r];
      for (int64_t i = first; i < last; ++i) {
        if (dweight) dweight[i] += widen(dyr[i]) * ((xr[i] - m) * s);
        if (dbias) dbias[i] += widen(dyr[i]);
      }
    }
  });
}

}  // namespace

template <typename T, typename L>
void layer_norm_forward(const T* x, const T* weight, const T* bias, L* y, T* mean, T* rstd,
                        int64_t rows, int64_t width, double eps) {
  normalize_forward<true>(x, weight, bias, y, mean, rstd, rows, width, eps);
}

template <typename T, typename L>
void layer_norm_backward(const L* dy, const T* x, const T* weight, const T* mean, const T* rstd,
                         T* dx, T* dweight, T* dbias, int64_t rows, int64_t width) {
  normalize_backward<true>(dy, x, weight, mean, rstd, dx, dweight, dbias, rows, width);
}

template <typename T, typename L, typename R>
void add_layer_norm_forward(const T* x, const R* residual, const T* weight, const T* bias, T* sum,
                            L* y, T* mean, T* rstd, int64_t rows, int64_t width, double eps) {
  normalize_forward<true>(x, weight, bias, y, mean, rstd, rows, width, eps, residual, sum);
}

template <typename T, typename L>
void add_layer_norm_backward(const L* dy, const T* dsum, const T* sum, const T* weight,
                             const T* mean, const T* rstd, T* dx, L* dresidual, T* dweight,
                             T* dbias, int64_t rows, int64_t width) {
  normalize_backward<true>(dy, sum, weight, mean, rstd, dx, dweight, dbias, rows, width, dsum,
                           dresidual);
}

template <typename T, typename L>
void rms_norm_forward(const T* x, const T* weight, L* y, T* rstd, int64_t rows, int64_t width,
                      double eps) {
  normalize_forward<false>(x, weight, static_cast<const T*>(nullptr), y, static_cast<T*>(nullptr),
                           rstd, rows, width, eps);
}

template <typename T, typename L>
void rms_norm_backward(const L* dy, const T* x, const T* weight, const T* rstd, T* dx, T* dweight,
                       int64_t rows, int64_t width) {
  normalize_backward<false>(dy, x, weight, static_cast<const T*>(nullptr), rstd, dx, dweight,
                            static_cast<T*>(nullptr), rows, width);
}

template <typename T, typename L, typename R>
void add_rms_norm_forward(const T* x, const R* residual, const T* weight, T* sum, L* y, T* rstd,
                          int64_t rows, int64_t width, double eps) {
  normalize_forward<false>(x, weight, static_cast<const T*>(nullptr), y, static_cast<T*>(nullptr),
                           rstd, rows, width, eps, residual, sum);
}

template <typename T, typename L>
void add_rms_norm_backward(const L* dy, const T* dsum, const T* sum, const T* weight,
                           const T* rstd, T* dx, L* dresidual, T* dweight, int64_t rows,
                           int64_t width) {
  normalize_backward<false>(dy, sum, weight, static_cast<const T*>(nullptr), rstd, dx, dweight,
                            static_cast<T*>(nullptr), rows, width, dsum, dresidual);
}

#define LOOM_INSTANTIATE_NORMS(T, L)                                                             \
  template void layer_norm_forward<T, L>(const T*, const T*, const T*, L*, T*, T*, int64_t,       \
                                         int64_t, double);                                        \
  template void layer_norm_backward<T, L>(const L*, const T*, const T*, const T*, const T*, T*,   \
                                          T*, T*, int64_t, int64_t);                              \
  template void rms_norm_forward<T, L>(const T*, const T*, L*, T*, int64_t, int64_t, double);     \
  template void rms_norm_backward<T, L>(const L*, const T*, const T*, const T*, T*, T*, int64_t,  \
                                        int64_t);                                                 \
  template void add_layer_norm_forward<T, L, L>(const T*, const L*, const T*, const T*, T*, L*,  \
                                                T*, T*, int64_t, int64_t, double);               \
  template void add_layer_norm_backward<T, L>(const L*, const T*, const T*, const T*, const T*,   \
                                              const T*, T*, L*, T*, T*, int64_t, int64_t);       \
  template void add_rms_norm_forward<T, L, L>(const T*, const L*, const T*, T*, L*, T*, int64_t,  \
                                              int64_t, double);                                   \
  template void add_rms_norm_backward<T, L>(const L*, const T*, const T*, const T*, const T*, T*, \
                                            L*, T*, int64_t, int64_t);
LOOM_INSTANTIATE_NORMS(float, float)
LOOM_INSTANTIATE_NORMS(double, double)
LOOM_INSTANTIATE_NORMS(float, BFloat16)
LOOM_INSTANTIATE_NORMS(float, Half)
// An f32 residual before a 16-bit output (a tensor-parallel branch, its f32 bias added after
// the reduction).
#define LOOM_INSTANTIATE_F32_RESIDUAL(L)                                                          \
  template void add_layer_norm_forward<float, L, float>(const float*, const float*, const float*, \
                                                        const float*, float*, L*, float*, float*, \
                                                        int64_t, int64_t, double);                \
  template void add_rms_norm_forward<float, L, float>(const float*, const float*, const float*,   \
                                                      float*, L*, float*, int64_t, int64_t,       \
                                                      double);
LOOM_INSTANTIATE_F32_RESIDUAL(BFloat16)
LOOM_INSTANTIATE_F32_RESIDUAL(Half)
#undef LOOM_INSTANTIATE_F32_RESIDUAL
#undef LOOM_INSTANTIATE_NORMS

}  // namespace loom::kernels::cpu
