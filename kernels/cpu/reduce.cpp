#include "kernels/cpu/reduce.h"

#include <algorithm>

#include "kernels/cpu/thread_pool.h"

namespace loom::kernels::cpu {

template <typename S>
void sum_axis(const S* x, compute_of<S>* out, int64_t outer, int64_t extent, int64_t inner) {
  using C = compute_of<S>;
  // Each output sums its `extent` inputs in order; the threads take whole outputs (columns
  // `begin..end` of every outer slice).
  auto columns = [&](int64_t o, int64_t begin, int64_t end) {
    C* dst = out + o * inner;
    std::fill(dst + begin, dst + end, C(0));
    const S* src = x + o * extent * inner;
    for (int64_t d = 0; d < extent; ++d) {
      const S* row = src + d * inner;
      for (int64_t i = begin; i < end; ++i)
        dst[i] += widen(row[i]);
    }
  };
  if (outer > 1) {
    parallel_rows(outer, extent * inner, [&](int64_t first, int64_t last) {
      for (int64_t o = first; o < last; ++o)
        columns(o, 0, inner);
    });
  } else if (outer == 1) {
    parallel_rows(inner, extent, [&](int64_t begin, int64_t end) { columns(0, begin, end); });
  }
}

template <typename T>
void max_axis(const T* x, T* out, int64_t* argmax, int64_t outer, int64_t extent, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o) {
    const T* src = x + o * extent * inner;
    for (int64_t i = 0; i < inner; ++i) {
      T best = src[i];
      int64_t best_d = 0;
      for (int64_t d = 1; d < extent; ++d) {
        T v = src[d * inner + i];
        if (v > best) {
          best = v;
          best_d = d;
        }
      }
      out[o * inner + i] = best;
      argmax[o * inner + i] = best_d;
    }
  }
}

template <typename T>
double sum_all(const T* x, int64_t n) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i)
    total += static_cast<double>(x[i]);
  return total;
}

#define LOOM_INSTANTIATE(T)                                                     \
  template void sum_axis<T>(const T*, T*, int64_t, int64_t, int64_t);           \
  template void max_axis<T>(const T*, T*, int64_t*, int64_t, int64_t, int64_t); \
  template double sum_all<T>(const T*, int64_t);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(double)
#undef LOOM_INSTANTIATE
template void sum_axis<BFloat16>(const BFloat16*, float*, int64_t, int64_t, int64_t);
template void sum_axis<Half>(const Half*, float*, int64_t, int64_t, int64_t);

}  // namespace loom::kernels::cpu
