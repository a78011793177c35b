#pragma once
// How distributed checkpoints (strategies/checkpoint/distributed_state.h) see what a rank
// holds: parts of whole tensors, elements [begin, begin + length) of a parameter's row-major
// flattening. Strategy (strategy.h) and the sharding engine (sharded/engine.h) describe
// their parameters and optimizer state with these.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::strategies {

struct ParameterPart {
  std::string name;  // as named_parameters() names it
  int64_t begin = 0;
  Tensor values;  // 1-D: the part's elements, a view where the holder can give one
};

// One piece of a tensor the optimizer updates.
struct OptimizerPart {
  std::string param;
  int64_t begin = 0, length = 0;  // elements of the parameter
  int64_t offset = 0;             // where they sit in the optimizer's tensor
};
// [group][index in the group] -> the parts that tensor is made of.
using OptimizerLayout = std::vector<std::vector<std::vector<OptimizerPart>>>;

// Fills the 1-D host tensor `out` with elements [begin, begin + out.numel()) of parameter
// `name`.
using ReadParameter = std::function<void(const std::string& name, int64_t begin, Tensor& out)>;

}  // namespace loom::strategies
