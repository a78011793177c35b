#pragma once
// The model_parallel strategy (Lightning's ModelParallelStrategy; docs/parallelism.md): the
// ranks form a mesh of dp x tp (strategies/device_mesh.h); the tp ranks of a replica split
// the model's layers (Megatron-LM's tensor parallelism, through the model's own
// nn::TensorParallelModel::parallelize, as GPT does) and the dp replicas average their
// gradients through DDP's reducer (strategies/ddp/reducer.h: buckets launched while backward
// runs, as Megatron-LM wraps its model chunks in its DDP). Under sequence parallelism the
// gradients of the replicated parameters are first summed over the tp group, in the
// reducer's bucket prologue, once per synchronised backward (after accumulation). The
// collectives between split layers (nn/tensor_parallel.h) run
// over the tp subgroup as differentiable ops: identity forward / all-reduce backward, and
// all-reduce forward / identity backward.
//
// Each rank builds the whole model (so the weights are the single-device model's) and keeps
// its parts of the split parameters in setup_module.

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nn/tensor_parallel.h"
#include "strategies/ddp/reducer.h"
#include "strategies/device_mesh.h"
#include "strategies/strategy.h"
#include "strategies/tp/layout.h"
#include "strategies/tp/options.h"

namespace loom::strategies {

// The tensor-parallel collectives over a process group.
class ProcessGroupTensorParallel : public nn::TensorParallelGroup {
 public:
  // With `sequence_parallel`, copy_in and reduce_out gather and reduce-scatter the sequence
  // (nn::TensorParallelGroup::sequence_parallel).
  explicit ProcessGroupTensorParallel(std::shared_ptr<comm::ProcessGroup> group,
                                      bool sequence_parallel = false);
  bool sequence_parallel() const override { return sequence_parallel_; }
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }
  Tensor copy_in(const Tensor& x) const override;
  Tensor reduce_out(const Tensor& x) const override;
  void sum(Tensor& t) const override;

 private:
  std::shared_ptr<comm::ProcessGroup> group_;
  bool sequence_parallel_ = false;
};

class ModelParallelStrategy : public ParallelStrategy {
 public:
  ModelParallelStrategy(StrategyOptions options, TensorParallelOptions tensor_parallel);
  const TensorParallelOptions& tensor_parallel_options() const { return tensor_parallel_; }
  std::string name() const override { return "model_parallel"; }
  void setup_environment() override;
  // Splits the module (an nn::TensorParallelModel) over this rank's tp group.
  void setup_module(nn::Module& module) override;
  // loss.backward(), with the gradients averaged over the dp replicas by the reducer while it
  // runs (unless accumulating).
  void backward(const Tensor& loss) override;
  void set_backward_sync(bool sync) override { sync_ = sync; }
  void teardown() override;
  // 16-mixed: inf/NaN on any rank skips the step everywhere.
  void unscale_gradients() override;
  double gradient_norm(double norm_type = 2.0) override;
  double clip_gradients(double max_norm, double norm_type = 2.0) override;
  std::map<std::string, Tensor> gather_state(const std::map<std::string, Tensor>& state) override;
  void gather_full_module() override;
  int data_parallel_rank() const override;
  int data_parallel_size() const override;
  // Checkpoints: a split parameter's part is one box per block (columns or rows of the
  // whole), written by the first data-parallel replica; a replicated one is written by tp
  // rank 0 (shared by the replicas like DDP's).
  Shape parameter_shape(const std::string& name, const Tensor& param) const override;
  std::vector<ParameterPart> held_parameters() override;
  std::pair<int, int> replica_of_held() const override;
  bool writes_state_of(const std::string& param) const override;
  OptimizerLayout optimizer_layout(const optim::Optimizer& optimizer) const override;
  void load_parameter_parts(const ReadParameter& read) override;

  const DeviceMesh& mesh() const;

 private:
  void make_reducer();
  std::optional<DeviceMesh> mesh_;
  TensorParallelOptions tensor_parallel_;
  std::shared_ptr<ProcessGroupTensorParallel> tp_;
  TensorParallelLayout layout_;
  std::vector<std::pair<std::string, Tensor>> params_;
  // Over the dp group; absent when there is nothing to reduce (dp 1 without sequence
  // parallelism).
  std::unique_ptr<Reducer> reducer_;
  bool sync_ = true;
  bool whole_ = false;  // gather_full_module ran
};

}  // namespace loom::strategies
