#include "kernels/cpu/embedding.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

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
  // The positions grouped by row, in order of n within each row (a stable sort).
  std::vector<std::pair<int64_t, int64_t>> by_row;  // (row, n)
  by_row.reserve(static_cast<size_t>(count));
  for (int64_t n = 0; n < count; ++n) {
    if (const int64_t row = row_of(indices[n], vocab, part); row >= 0) by_row.emplace_back(row, n);
  }
  std::stable_sort(by_row.begin(), by_row.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  // The threads take columns; each sums a row's run from zero, then adds it once.
  parallel_rows(width, static_cast<int64_t>(by_row.size()), [&](int64_t begin, int64_t end) {
    std::vector<T> sum(static_cast<size_t>(end - begin));
    for (size_t start = 0; start < by_row.size();) {
      const int64_t row = by_row[start].first;
      std::fill(sum.begin(), sum.end(), T(0));
      size_t next = start;
      for (; next < by_row.size() && by_row[next].first == row; ++next) {
        const T* src = dout + by_row[next].second * width + begin;
        for (int64_t i = 0; i < end - begin; ++i)
          sum[static_cast<size_t>(i)] += src[i];
      }
      T* dst = dweight + row * width + begin;
      for (int64_t i = 0; i < end - begin; ++i)
        dst[i] += sum[static_cast<size_t>(i)];
      start = next;
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
