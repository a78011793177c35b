#pragma once
// How distributed checkpoints (strategies/checkpoint/distributed_state.h) see what a rank
// holds: parts of whole tensors, elements [begin, begin + length) of a parameter's row-major
// flattening. Strategy (strategy.h) and the sharding engine (sharded/engine.h) describe
// their parameters and optimizer state with these.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "optim/optimizer.h"
#include "tensor/tensor.h"

namespace loom::strategies {

// A run of a parameter's elements [begin, begin + values.numel()), or (sizes not empty) the
// box offsets[d] .. offsets[d] + sizes[d] of the whole parameter (a tensor-parallel rank's
// block of columns), its elements row-major in `values`.
struct ParameterPart {
  std::string name;  // as named_parameters() names it
  int64_t begin = 0;
  Tensor values;  // 1-D: the part's elements, a view where the holder can give one
  Shape offsets = {}, sizes = {};
};

// One piece of a tensor the optimizer updates: a run of the parameter's elements at a flat
// offset of the optimizer's tensor, or (sizes not empty) a box of the whole parameter that
// sits at `local_offsets` of the optimizer's tensor (which then has the parameter's rank).
struct OptimizerPart {
  std::string param;
  int64_t begin = 0, length = 0;  // elements of the parameter
  int64_t offset = 0;             // where they sit in the optimizer's tensor
  Shape offsets = {}, sizes = {}, local_offsets = {};
  // Held by this rank alone (ZeRO-1 inside a pipeline stage): written whole, not shared out
  // among the replicas of replica_of_held().
  bool sole_holder = false;
};
// [group][index in the group] -> the parts that tensor is made of.
using OptimizerLayout = std::vector<std::vector<std::vector<OptimizerPart>>>;

// The layout of `optimizer` whose every tensor is a key of `parts` (the tensor's impl -> its
// parts). Throws loom::Error, prefixed `who`, for a tensor that is not.
using PartsByTensor = std::map<const TensorImpl*, std::vector<OptimizerPart>>;
OptimizerLayout optimizer_layout_of(const optim::Optimizer& optimizer, const PartsByTensor& parts,
                                    const std::string& who);

// Where loaded parameter values come from: read(name, begin, out) fills the 1-D host tensor
// `out` with elements [begin, begin + out.numel()) of parameter `name`; box(name, offsets,
// sizes, out) with the box of it (row-major, out.numel() = the product of sizes).
struct ReadParameter {
  std::function<void(const std::string& name, int64_t begin, Tensor& out)> run;
  std::function<void(const std::string& name, const Shape& offsets, const Shape& sizes,
                     Tensor& out)>
      box;
  void operator()(const std::string& name, int64_t begin, Tensor& out) const {
    run(name, begin, out);
  }
};

// Copies `values` (the box's elements, row-major) into the box offsets/sizes of `target` (a
// contiguous CPU tensor of the same dtype), row by row.
void copy_into_box(Tensor& target, const Shape& offsets, const Shape& sizes, const Tensor& values);

// The whole shape of a split parameter whose part has shape `part`: `dim` times `ranks`
// larger.
inline Shape whole_shape(Shape part, int dim, int ranks) {
  part[static_cast<size_t>(dim)] *= ranks;
  return part;
}

}  // namespace loom::strategies
