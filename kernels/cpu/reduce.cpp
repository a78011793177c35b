#include "kernels/cpu/reduce.h"

#include <algorithm>

namespace loom::kernels::cpu {

template <typename T>
void sum_axis(const T* x, T* out, int64_t outer, int64_t extent, int64_t inner) {
  for (int64_t o = 0; o < outer; ++o) {
    T* dst = out + o * inner;
    std::fill(dst, dst + inner, T(0));
    const T* src = x + o * extent * inner;
    for (int64_t d = 0; d < extent; ++d) {
      const T* row = src + d * inner;
      for (int64_t i = 0; i < inner; ++i)
        dst[i] += row[i];
    }
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

}  // namespace loom::kernels::cpu
