#include "kernels/cpu/softmax.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/lane_reduce.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cpu/widen.h"

namespace loom::kernels::cpu {

template <typename T>
void softmax_forward(const T* x, T* y, int64_t rows, int64_t width, int64_t causal_t) {
  parallel_rows(rows, width, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const T* xr = x + r * width;
      T* yr = y + r * width;
      int64_t valid = causal_t > 0 ? (r % causal_t) + 1 : width;
      const T m = lane_max(xr, valid, xr[0]);
      for (int64_t i = 0; i < valid; ++i)
        yr[i] = exp_approx(xr[i] - m);
      const T total = lane_sum(yr, valid);
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
      const T dot = lane_dot(yr, dyr, width);
      for (int64_t i = 0; i < width; ++i)
        dxr[i] = yr[i] * (dyr[i] - dot);
    }
  });
}

namespace {

template <typename S>
void row_logsumexps(const S* logits, compute_of<S>* logsumexp, int64_t rows, int64_t vocab) {
  using C = compute_of<S>;
  parallel_rows(rows, vocab, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const S* xr = logits + r * vocab;
      const auto at = [xr](int64_t i) { return widen(xr[i]); };
      const C m = lane_max_of<C>(vocab, at, at(0));
      const C s = lane_sum_of<C>(vocab, [&](int64_t i) { return exp_approx(at(i) - m); });
      logsumexp[r] = m + std::log(s);
    }
  });
}

}  // namespace

template <typename S>
void cross_entropy_part_forward(const S* logits, const int64_t* targets, int64_t first,
                                compute_of<S>* logsumexp, compute_of<S>* picked, int64_t rows,
                                int64_t vocab) {
  row_logsumexps(logits, logsumexp, rows, vocab);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t t = targets[r] - first;
    picked[r] = t >= 0 && t < vocab ? widen(logits[r * vocab + t]) : compute_of<S>(0);
  }
}

template <typename S>
double cross_entropy_forward(const S* logits, const int64_t* targets, compute_of<S>* logsumexp,
                             int64_t rows, int64_t vocab) {
  row_logsumexps(logits, logsumexp, rows, vocab);
  double total = 0;  // in row order, whatever the threads
  for (int64_t r = 0; r < rows; ++r)
    total += static_cast<double>(logsumexp[r] - widen(logits[r * vocab + targets[r]]));
  return rows > 0 ? total / static_cast<double>(rows) : 0.0;
}

template <typename S>
void cross_entropy_backward(const S* logits, const int64_t* targets,
                            const compute_of<S>* logsumexp, compute_of<S> scale, S* dlogits,
                            int64_t rows, int64_t vocab, Part part) {
  using C = compute_of<S>;
  parallel_rows(rows, vocab, [&](int64_t first, int64_t last) {
    for (int64_t r = first; r < last; ++r) {
      const S* xr = logits + r * vocab;
      S* dr = dlogits + r * vocab;
      const C lse = logsumexp[r];
      const int64_t t = targets[r] - part.first;
      const bool has_target = !part.part || (t >= 0 && t < vocab);
      // Read before dr[t] is written: dlogits may be logits.
      const C at_target = has_target ? scale * exp_approx(widen(xr[t]) - lse) - scale : C(0);
      for (int64_t i = 0; i < vocab; ++i)
        dr[i] = narrow<S>(scale * exp_approx(widen(xr[i]) - lse));
      if (has_target) dr[t] = narrow<S>(at_target);
    }
  });
}

#define LOOM_INSTANTIATE(T)                                                                   \
  template void softmax_forward<T>(const T*, T*, int64_t, int64_t, int64_t);                  \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t);                \
  template double cross_entropy_forward<T>(const T*, const int64_t*, T*, int64_t, int64_t);   \
  template void cross_entropy_part_forward<T>(const T*, const int64_t*, int64_t, T*, T*,      \
                                              int64_t, int64_t);                              \
  template void cross_entropy_backward<T>(const T*, const int64_t*, const T*, T, T*, int64_t, \
                                          int64_t, Part);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(double)
#undef LOOM_INSTANTIATE
template double cross_entropy_forward<BFloat16>(const BFloat16*, const int64_t*, float*, int64_t,
                                                int64_t);
template void cross_entropy_part_forward<BFloat16>(const BFloat16*, const int64_t*, int64_t,
                                                   float*, float*, int64_t, int64_t);
template void cross_entropy_backward<BFloat16>(const BFloat16*, const int64_t*, const float*,
                                               float, BFloat16*, int64_t, int64_t, Part);
template double cross_entropy_forward<Half>(const Half*, const int64_t*, float*, int64_t, int64_t);
template void cross_entropy_part_forward<Half>(const Half*, const int64_t*, int64_t, float*,
                                               float*, int64_t, int64_t);
template void cross_entropy_backward<Half>(const Half*, const int64_t*, const float*, float,
                                           Half*, int64_t, int64_t, Part);

}  // namespace loom::kernels::cpu
