#pragma once
// Random shapes and strided layouts for the strided kernels' emulation tests
// (test_elementwise.cpp's binary ops, test_copy.cpp's copies), with the row-major offsets a CPU
// oracle reads them by.

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

namespace loom::cuda_emulation::testing {

// A shape and an operand's strides into a buffer of `span` elements: dimensions permuted,
// stepped, or broadcast (stride 0).
struct Layout {
  std::vector<int64_t> strides;
  int64_t span = 1;
};

inline std::vector<int64_t> random_shape(std::mt19937_64& rng, int max_dims) {
  std::uniform_int_distribution<int> dims(0, max_dims), extent(1, 4);
  std::vector<int64_t> shape(static_cast<size_t>(dims(rng)));
  for (auto& d : shape) d = extent(rng);
  return shape;
}

inline Layout random_layout(const std::vector<int64_t>& shape, std::mt19937_64& rng, bool broadcast) {
  const size_t ndim = shape.size();
  std::vector<size_t> order(ndim);
  for (size_t i = 0; i < ndim; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), rng);
  std::uniform_int_distribution<int> step(1, 2), coin(0, 3);
  Layout l;
  l.strides.assign(ndim, 0);
  int64_t stride = 1;
  for (size_t i : order) {
    if (broadcast && coin(rng) == 0) continue;  // stride 0
    l.strides[i] = stride * step(rng);
    stride = l.strides[i] * shape[i];
  }
  l.span = 1;
  for (size_t i = 0; i < ndim; ++i) l.span += (shape[i] - 1) * l.strides[i];
  return l;
}

inline int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Offset of the i-th element (row-major over `shape`) through `strides`.
inline int64_t offset_of(int64_t i, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides) {
  int64_t off = 0;
  for (size_t d = shape.size(); d-- > 0;) {
    off += (i % shape[d]) * strides[d];
    i /= shape[d];
  }
  return off;
}

}  // namespace loom::cuda_emulation::testing
