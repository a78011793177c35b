#pragma once
// Which layers of a LayeredModel each pipeline stage runs.

#include <cstdint>
#include <vector>

#include "nn/layered_model.h"
#include "nn/module.h"

namespace loom::strategies::pipeline {

// Chunk s runs layers [bounds[s], bounds[s + 1]) (a chunk is a stage, or a virtual stage of
// an interleaved schedule). With `balance` (layers per chunk) that
// split; without, the contiguous split whose largest stage has the fewest parameter elements
// (a parameter counts in every layer that uses it). Throws loom::Error for more stages than
// layers or a balance that does not add up.
std::vector<int64_t> partition_layers(const nn::LayeredModel& model, const nn::Module& module,
                                      int stages, const std::vector<int64_t>& balance);

}  // namespace loom::strategies::pipeline
