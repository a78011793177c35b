#include "kernels/cpu/embedding.h"

#include <cstring>

#include "kernels/cpu/thread_pool.h"

namespace loom::kernels::cpu {

namespace {

// The row of `weight` that index i of the whole table selects, or -1 outside a part.
int64_t row_of(int64_t i, int64_t vocab, Part part) {
  const int64_t row = i - part.first;
  return !part.part || (row >= 0 && row < vocab) ? row : -1;
}

}  // namespace

template <typename T>
void embedding_forward(const int64_t* indices, const T* weight, T* out, int64_t count,
                       int64_t width, int64_t vocab, Part part) {
  parallel_rows(count, width, [&](int64_t first, int64_t last) {
    for (int64_t n = first; n < last; ++n) {
      if (const int64_t row = row_of(indices[n], vocab, part); row >= 0) {
        std::memcpy(out + n * width, weight + row * width, sizeof(T) * width);
      } else {
        std::memset(out + n * width, 0, sizeof(T) * width);
      }
    }
  });
}

template <typename T>
void embedding_backward(const int64_t* indices, const T* dout, T* dweight, int64_t count,
                        int64_t width, int64_t vocab, Part part) {
  // Rows may repeat an index: the threads take columns, each adding its rows in order.
  parallel_rows(width, count, [&](int64_t begin, int64_t end) {
    for (int64_t n = 0; n < count; ++n) {
      const int64_t row = row_of(indices[n], vocab, part);
      if (row < 0) continue;
      T* dst = dweight + row * width;
      const T* src = dout + n * width;
      for (int64_t i = begin; i < end; ++i)
        dst[i] += src[i];
    }
  });
}

template void embedding_forward<float>(const int64_t*, const float*, float*, int64_t, int64_t,
                                       int64_t, Part);
template void embedding_forward<double>(const int64_t*, const double*, double*, int64_t, int64_t,
                                        int64_t, Part);
template void embedding_forward<uint16_t>(const int64_t*, const uint16_t*, uint16_t*, int64_t,
                                          int64_t, int64_t, Part);
template void embedding_backward<float>(const int64_t*, const float*, float*, int64_t, int64_t,
                                        int64_t, Part);
template void embedding_backward<double>(const int64_t*, const double*, double*, int64_t, int64_t,
                                         int64_t, Part);

}  // namespace loom::kernels::cpu
