#pragma once
// Reductions over the middle axis of a contiguous [outer, extent, inner] block.

#include <cstdint>

#include "kernels/cpu/widen.h"

namespace loom::kernels::cpu {

// out[o, i] = sum_d x[o, d, i]; summed in index order (deterministic). Also for BFloat16 and
// Half x, summed into f32 (kernels/cpu/widen.h).
template <typename S>
void sum_axis(const S* x, compute_of<S>* out, int64_t outer, int64_t extent, int64_t inner);
// out[o, i] = max_d x[o, d, i], argmax[o, i] = first d attaining it. extent must be > 0.
template <typename T>
void max_axis(const T* x, T* out, int64_t* argmax, int64_t outer, int64_t extent, int64_t inner);
// Sum of all n elements, accumulated in double.
template <typename T>
double sum_all(const T* x, int64_t n);

}  // namespace loom::kernels::cpu
