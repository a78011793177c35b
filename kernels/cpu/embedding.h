#pragma once
// Embedding lookup and its gradient (a deterministic, sequential scatter-add).

#include <cstdint>

#include "kernels/part.h"

namespace loom::kernels::cpu {

// out[n, :] = weight[indices[n] - first, :] for n < count, weight being [vocab, width] (of a
// part of a table: rows [first, first + vocab) of it; an index outside them gives a zero row).
// T is float, double, or uint16_t for the bits of bf16 and f16 rows (a lookup copies them
// exactly).
template <typename T>
void embedding_forward(const int64_t* indices, const T* weight, T* out, int64_t count,
                       int64_t width, int64_t vocab, Part part = {});
// dweight[r, :] += the sum of dout[n, :] over the n whose index selects row r, summed from zero
// in order of n (of a part: indices outside it add nothing). Each row gets its own sum added
// once, so the result is the bits of adding, to dweight, what the same call makes of zeros
// (the CUDA kernel's too): an op may add into a gradient summed elsewhere (Note [Adding into
// the partial gradient] in tensor/autograd/engine.cpp).
template <typename T>
void embedding_backward(const int64_t* indices, const T* dout, T* dweight, int64_t count,
                        int64_t width, int64_t vocab, Part part = {});

}  // namespace loom::kernels::cpu
