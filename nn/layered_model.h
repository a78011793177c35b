#pragma once
// A model that runs as a sequence of layers, each feeding the next: the shape a pipeline
// splits into stages (strategies/pipeline/). Layer 0 takes the model's input, the last layer
// gives its output, and layer_loss() scores that output against targets. Running every
// layer in order must compute exactly what the model's own forward computes, so that a
// pipelined model trains as the whole one does.

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::nn {

class LayeredModel {
 public:
  virtual ~LayeredModel() = default;
  virtual int64_t layer_count() const = 0;
  virtual Tensor forward_layer(int64_t layer, const Tensor& x) const = 0;
  // The mean loss of `output` (the last layer's) against `targets`.
  virtual Tensor layer_loss(const Tensor& output, const Tensor& targets) const = 0;
  // The names (as named_parameters() gives them) of the parameters layer `layer` uses; a
  // parameter may belong to several layers (GPT's tied wte: the first and the last).
  virtual std::vector<std::string> layer_parameters(int64_t layer) const = 0;
};

}  // namespace loom::nn
