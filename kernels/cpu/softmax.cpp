#include "kernels/cpu/softmax.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec_math.h"

namespace loom::kernels::cpu {

template <typename T>
void softmax_forward(const T* x, T* y, int64_t rows, int64_t width, int64_t causal_t) {
  parallel_rows(rows, width, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const T* xr = x + r * width;
      T* yr = y + r * width;
      int64_t valid = causal_t > 0 ? (r % causal_t) + 1 : width;
      T m = xr[0];
      for (int64_t i = 1; i < valid; ++i)
        m = std::max(m, xr[i]);
      T total = 0;
      for (int64_t i = 0; i < valid; ++i) {
        yr[i] = exp_approx(xr[i] - m);
        total += yr[i];
      }
      T inv = T(1) / total;
      for (int64_t i = 0; i < valid; ++i)
        yr[i] *= inv;
      for (int64_t i = valid; i < width; ++i)
        yr[i] = 0;
    }
  });
}

template <typename T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t rows, int64_t width) {
  parallel_rows(rows, width, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const T* yr = y + r * width;
      const T* dyr = dy + r * width;
      T* dxr = dx + r * width;
      T dot = 0;
      for (int64_t i = 0; i < width; ++i)
        dot += yr[i] * dyr[i];
      for (int64_t i = 0; i < width; ++i)
        dxr[i] = yr[i] * (dyr[i] - dot);
    }
  });
}

template <typename T>
double cross_entropy_forward(const T* logits, const int64_t* targets, T* logsumexp, int64_t rows,
                             int64_t vocab) {
  parallel_rows(rows, vocab, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const T* xr = logits + r * vocab;
      T m = xr[0];
      for (int64_t i = 1; i < vocab; ++i)
        m = std::max(m, xr[i]);
      T s = 0;
      for (int64_t i = 0; i < vocab; ++i)
        s += exp_approx(xr[i] - m);
      logsumexp[r] = m + std::log(s);
    }
  });
  double total = 0;  // in row order, whatever the threads
  for (int64_t r = 0; r < rows; ++r)
    total += static_cast<double>(logsumexp[r] - logits[r * vocab + targets[r]]);
  return rows > 0 ? total / static_cast<double>(rows) : 0.0;
}

template <typename T>
void cross_entropy_backward(const T* logits, const int64_t* targets, const T* logsumexp, T scale,
                            T* dlogits, int64_t rows, int64_t vocab) {
  parallel_rows(rows, vocab, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const T* xr = logits + r * vocab;
      T* dr = dlogits + r * vocab;
      T lse = logsumexp[r];
      for (int64_t i = 0; i < vocab; ++i)
        dr[i] = scale * exp_approx(xr[i] - lse);
      dr[targets[r]] -= scale;
    }
  });
}

#define LOOM_INSTANTIATE(T)                                                                   \
  template void softmax_forward<T>(const T*, T*, int64_t, int64_t, int64_t);                  \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t);                \
  template double cross_entropy_forward<T>(const T*, const int64_t*, T*, int64_t, int64_t);   \
  template void cross_entropy_backward<T>(const T*, const int64_t*, const T*, T, T*, int64_t, \
                                          int64_t);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(double)
#undef LOOM_INSTANTIATE

}  // namespace loom::kernels::cpu
