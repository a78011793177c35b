#pragma once
// Which parameters a tensor-parallel group splits and how (nn::TensorParallelSplit), and what
// follows from it: the whole shape and value of a split parameter, gradient norms over its
// parts, and its parts in checkpoints (one box per block, tensor_index.h). Shared by the
// model_parallel strategy and the pipeline (pp x tp). An empty layout splits nothing.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "nn/tensor_parallel.h"
#include "strategies/parameter_parts.h"

namespace loom::strategies {

class TensorParallelLayout {
 public:
  TensorParallelLayout() = default;
  TensorParallelLayout(std::shared_ptr<comm::ProcessGroup> tp,
                       std::map<std::string, nn::TensorParallelSplit> splits);

  bool is_split(const std::string& name) const { return splits_.count(name) != 0; }
  Shape whole_shape(const std::string& name, const Tensor& part) const;
  // The whole value of parameter `name` from every rank's part (a copy). Collective over
  // the tp group for a split parameter.
  Tensor whole(const std::string& name, const Tensor& part) const;
  // norms[i] is the gradient norm of this rank's part of parameter names[i]; makes those of
  // split parameters the whole parameter's (2-norm: from the parts' squares; infinity norm:
  // their maximum). Collective over the tp group.
  void complete_norms(const std::vector<std::string>& names, std::vector<double>& norms,
                      double norm_type) const;

  // Checkpoints. Whether this rank writes `name` (split: every rank its part; replicated: tp
  // rank 0); its parts (one box per block, or the whole tensor as a run); the parts of an
  // optimizer tensor shaped like it; and loading its parts.
  bool writes(const std::string& name) const;
  void add_parts(const std::string& name, const Tensor& param, std::vector<ParameterPart>& out) const;
  std::vector<OptimizerPart> optimizer_parts(const std::string& name, const Tensor& tensor) const;
  void load(const std::string& name, const Tensor& param, const ReadParameter& read) const;

 private:
  // Where this rank's part of a split parameter sits, block by block: the box in the whole
  // parameter and its offsets in the part.
  struct Block {
    Shape offsets, sizes, local_offsets;
  };
  std::vector<Block> blocks(const std::string& name, const Tensor& part) const;

  std::shared_ptr<comm::ProcessGroup> tp_;
  std::map<std::string, nn::TensorParallelSplit> splits_;
};

}  // namespace loom::strategies
