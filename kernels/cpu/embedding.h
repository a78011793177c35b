#pragma once
// Embedding lookup and its gradient (a deterministic, sequential scatter-add).

#include <cstdint>

namespace loom::kernels::cpu {

// A part of a table (tensor parallelism's vocabulary-parallel embedding): the weight holds rows
// [first, first + rows) of it, and an index outside them selects nothing (a zero row forward,
// no addition backward). The default is the whole table, every index inside (callers check).
struct EmbeddingRows {
  int64_t first = 0;
  int64_t rows = -1;  // < 0: the whole table
  bool holds(int64_t index) const { return rows < 0 || (index >= first && index < first + rows); }
};

// out[n, :] = weight[indices[n] - first, :] for n < count. T is float, double, or uint16_t
// for the bits of bf16 and f16 rows (a lookup copies them exactly).
template <typename T>
void embedding_forward(const int64_t* indices, const T* weight, T* out, int64_t count,
                       int64_t width, EmbeddingRows part = {});
// dweight[indices[n] - first, :] += dout[n, :], in order of n.
template <typename T>
void embedding_backward(const int64_t* indices, const T* dout, T* dweight, int64_t count,
                        int64_t width, EmbeddingRows part = {});

}  // namespace loom::kernels::cpu
