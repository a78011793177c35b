#pragma once
// Which layers of a LayeredModel each pipeline stage runs.

#include <cstdint>
#include <vector>

#include "nn/layered_model.h"
#include "nn/module.h"

namespace loom::strategies::pipeline {

// Chunk s runs layers [bounds[s], bounds[s + 1]) (a chunk is a stage, or a virtual stage of
// an interleaved schedule). With `balance` (layers per chunk) that
// split; without, partition_by_cost with each layer's parameter elements as its cost (a
// parameter counts in every layer that uses it). Throws loom::Error for more stages than
// layers or a balance that does not add up.
std::vector<int64_t> partition_layers(const nn::LayeredModel& model, const nn::Module& module,
                                      int stages, const std::vector<int64_t>& balance);

// The contiguous split of layers with costs `costs` into `stages` chunks (each at least one
// layer) whose most expensive chunk costs the least; bounds as above.
std::vector<int64_t> partition_by_cost(const std::vector<int64_t>& costs, int stages);

// The cost of each layer as the time of its forward on `sample` (the first layer's input;
// the last layer's with its layer_loss against `sample` as targets), in microseconds, the
// median of `repeats` runs without autograd. A short profiling pass for balancing stages by
// time. On the meta device under a simulation's clock (simulated_now in
// tensor/meta.h), the simulated times: the cost model's.
std::vector<int64_t> layer_forward_times(const nn::LayeredModel& model, const Tensor& sample,
                                         int repeats = 5);

}  // namespace loom::strategies::pipeline
