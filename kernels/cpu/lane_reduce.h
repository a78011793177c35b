#pragma once
// Row reductions in eight fixed lanes: lane l sums the terms l, l + 8, l + 16, ... in order,
// then the lanes are added 0..7 and the tail (n % 8 terms) last. Without -ffast-math a plain
// `sum += x[i]` is one chain of dependent adds that GCC may not reorder (a 128-wide row costs
// 128 add latencies); eight independent chains vectorise, and since the order is written
// here, not chosen by the compiler, the bits are the same on every call, ISA and thread count.

#include <algorithm>
#include <cstdint>

namespace loom::kernels::cpu {

inline constexpr int64_t kReduceLanes = 8;

// The sum of term(i) for i in [0, n), in the lane order above.
template <typename T, typename Term>
T lane_sum_of(int64_t n, Term term) {
  T part[kReduceLanes] = {};
  int64_t j = 0;
  for (; j + kReduceLanes <= n; j += kReduceLanes)
    for (int64_t l = 0; l < kReduceLanes; ++l)
      part[l] += term(j + l);
  T total = 0;
  for (int64_t l = 0; l < kReduceLanes; ++l)
    total += part[l];
  for (; j < n; ++j)
    total += term(j);
  return total;
}

template <typename T>
T lane_sum(const T* x, int64_t n) {
  return lane_sum_of<T>(n, [x](int64_t i) { return x[i]; });
}

template <typename T>
T lane_dot(const T* x, const T* y, int64_t n) {
  return lane_sum_of<T>(n, [x, y](int64_t i) { return x[i] * y[i]; });
}

// The largest of start and term(i) for i in [0, n).
template <typename T, typename Term>
T lane_max_of(int64_t n, Term term, T start) {
  T part[kReduceLanes];
  std::fill(part, part + kReduceLanes, start);
  int64_t j = 0;
  for (; j + kReduceLanes <= n; j += kReduceLanes)
    for (int64_t l = 0; l < kReduceLanes; ++l)
      part[l] = std::max(part[l], term(j + l));
  T m = start;
  for (int64_t l = 0; l < kReduceLanes; ++l)
    m = std::max(m, part[l]);
  for (; j < n; ++j)
    m = std::max(m, term(j));
  return m;
}

template <typename T>
T lane_max(const T* x, int64_t n, T start) {
  return lane_max_of<T>(n, [x](int64_t i) { return x[i]; }, start);
}

}  // namespace loom::kernels::cpu
