#pragma once
// Embedding lookup and its gradient (a deterministic, sequential scatter-add).

#include <cstdint>

namespace loom::kernels::cpu {

// out[n, :] = weight[indices[n], :] for n < count. T is float, double, or uint16_t for the
// bits of bf16 and f16 rows (a lookup copies them exactly).
template <typename T>
void embedding_forward(const int64_t* indices, const T* weight, T* out, int64_t count,
                       int64_t width);
// dweight[indices[n], :] += dout[n, :], in order of n.
template <typename T>
void embedding_backward(const int64_t* indices, const T* dout, T* dweight, int64_t count,
                        int64_t width);

}  // namespace loom::kernels::cpu
