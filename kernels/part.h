#pragma once
// The part of a table, or of each row's classes, that one tensor-parallel rank holds: shared by
// the CPU and CUDA kernels of the vocabulary-parallel embedding and cross-entropy.

#include <cstdint>

namespace loom::kernels {

// Indices [first, first + extent) of the whole, extent being the part's own (an embedding
// weight's rows, the logits' width). With `part`, an index of the whole outside it selects
// nothing here (a zero row and no gradient; no target) instead of being an error. The default
// is the whole, every index inside (callers check).
struct Part {
  int64_t first = 0;
  bool part = false;
};

}  // namespace loom::kernels
