#pragma once
// Reductions over the middle axis of a contiguous [outer, extent, inner] block.

#include <cstdint>

namespace loom::kernels::cpu {

// out[o, i] = sum_d x[o, d, i]; summed in index order (deterministic).
template <typename T>
void sum_axis(const T* x, T* out, int64_t outer, int64_t extent, int64_t inner);
// out[o, i] = max_d x[o, d, i], argmax[o, i] = first d attaining it. extent must be > 0.
template <typename T>
void max_axis(const T* x, T* out, int64_t* argmax, int64_t outer, int64_t extent, int64_t inner);
// Sum of all n elements, accumulated in double.
template <typename T>
double sum_all(const T* x, int64_t n);

}  // namespace loom::kernels::cpu
