#pragma once
// Iteration over N-d index spaces with per-operand strides (in elements; 0 broadcasts).

#include <array>
#include <cstdint>
#include <vector>

namespace loom::kernels::cpu {

// Calls f(offsets, inner_size) for every position of the leading ndim-1 dimensions in
// row-major order; offsets[k] is operand k's element offset of the row's first element.
// The row's elements are strides[k][ndim-1] apart. ndim 0 is one row of one element.
template <size_t K, typename F>
void for_each_row(int ndim, const int64_t* shape, const std::array<const int64_t*, K>& strides,
                  F&& f) {
  std::array<int64_t, K> offsets{};
  if (ndim == 0) {
    f(offsets, int64_t{1});
    return;
  }
  for (int d = 0; d < ndim; ++d) {
    if (shape[d] == 0) return;
  }
  int64_t inner = shape[ndim - 1];
  std::vector<int64_t> index(ndim, 0);
  while (true) {
    f(offsets, inner);
    int d = ndim - 2;
    for (; d >= 0; --d) {
      ++index[d];
      for (size_t k = 0; k < K; ++k)
        offsets[k] += strides[k][d];
      if (index[d] < shape[d]) break;
      for (size_t k = 0; k < K; ++k)
        offsets[k] -= strides[k][d] * shape[d];
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

}  // namespace loom::kernels::cpu
