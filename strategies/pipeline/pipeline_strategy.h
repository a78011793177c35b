#pragma once
// The pipeline strategy ("pipeline", docs/parallelism.md): the ranks form a mesh of dp x pp
// (strategies/device_mesh.h); the pp ranks of a replica each run a contiguous run of the
// model's layers (partition.h; the model must be an nn::LayeredModel, as GPT is) on the
// micro-batches of a batch in a schedule's order (schedule.h, stage_runner.h), and the dp
// replicas of a stage average their gradients. A parameter two stages use (GPT's tied wte:
// the embedding on the first stage, the output projection on the last) lives on both and its
// two gradients are summed across them every step (as Megatron does), so both copies stay
// identical.
//
// Each rank builds the whole model (so that the weights are those of the single-device
// model) and frees the storage of the parameters its stage does not use in setup_module.
//
// With tensor_parallel.size > 1 the mesh is dp x pp x tp and each stage's layers are split
// over its tp group (as model_parallel splits them, strategies/tp/), activations passing
// between the same tp ranks of neighbouring stages.
//
// A step: train_batch(inputs, targets) instead of forward_backward; then the usual
// gradient_norm / clip_gradients (over every stage, each parameter counted once),
// optimizer_step (each rank its stage's parameters).
//
// Data parallelism over the dp replicas of a stage is DDP's reducer (strategies/ddp/reducer.h),
// one per model chunk of the stage, as Megatron-LM wraps each chunk in its DDP: it starts
// listening just before the chunk's last weight-gradient pass of the batch, so each bucket is
// averaged while the rest of that backward (and the schedule after it) runs. Parameters that
// two chunks use (the tied embedding) are summed across their stages and then averaged at the
// end of the batch instead.
//
// Not supported yet (a clear error):
// gradient accumulation without synchronisation (set_backward_sync(false)).

#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "nn/layered_model.h"
#include "strategies/ddp/reducer.h"
#include "strategies/device_mesh.h"
#include "strategies/pipeline/schedule.h"
#include "strategies/pipeline/stage_runner.h"
#include "strategies/strategy.h"
#include "strategies/pipeline/options.h"
#include "strategies/tp/layout.h"
#include "strategies/tp/options.h"

namespace loom::strategies {

class PipelineStrategy : public ParallelStrategy {
 public:
  PipelineStrategy(StrategyOptions options, pipeline::PipelineOptions pipeline,
                   TensorParallelOptions tensor_parallel = {});
  const pipeline::PipelineOptions& pipeline_options() const { return pipeline_; }
  std::string name() const override { return "pipeline"; }
  void setup_environment() override;
  // The first layer's input for balancing by time (pipeline_options().balance_by "time"):
  // one micro-batch. Before setup_module.
  void set_profile_input(Tensor sample) { profile_input_ = std::move(sample); }
  // Takes the first micro-batch of recipe.sample_input's rows as the profile input.
  void set_model_recipe(const ModelRecipe& recipe) override;
  // Partitions the module (an nn::LayeredModel) into stages and keeps this rank's.
  void setup_module(nn::Module& module) override;
  // Keeps this stage's parameters in the optimizer's groups; under ZeRO-1 in the stage's dp
  // group (pipeline_options().data_parallel), this replica's 1/dp of each instead.
  void setup_optimizer(optim::Optimizer& optimizer) override;
  // The update; under ZeRO-1 each replica steps its parts, then they exchange them.
  void optimizer_step(optim::Optimizer& optimizer) override;
  // One batch (this data-parallel rank's rows) through the pipeline: split into
  // pipeline_options().micro_batches micro-batches by rows, each loss multiplied by
  // scale / micro_batches before its backward; gradients synchronised (tied parameters
  // summed across stages, then averaged over the stage's dp replicas). Returns the batch's
  // mean loss on every rank. Collective.
  Tensor train_batch(const Tensor& inputs, const Tensor& targets, double scale = 1.0);
  // train_batch(inputs, targets, scale): the model's own loss, not loss_of_rows.
  Tensor train_batch(const Tensor& inputs, const Tensor& targets, const LossOfRows& loss_of_rows,
                     double scale = 1.0) override;
  Tensor forward_backward(const LossOfRows& loss_of_rows, int64_t rows, double scale) override;
  void set_backward_sync(bool sync) override;
  // 16-mixed: this stage's gradients divided by the loss scale; inf/NaN on any rank skips the
  // step everywhere.
  void unscale_gradients() override;
  double gradient_norm(double norm_type = 2.0) override;
  double clip_gradients(double max_norm, double norm_type = 2.0) override;
  void gather_full_module() override;
  void teardown() override;
  std::map<std::string, Tensor> gather_state(const std::map<std::string, Tensor>& state) override;

  int data_parallel_rank() const override;
  int data_parallel_size() const override;

  std::vector<ParameterPart> held_parameters() override;
  std::pair<int, int> replica_of_held() const override;
  bool writes_state_of(const std::string& param) const override;
  Shape parameter_shape(const std::string& name, const Tensor& param) const override;
  OptimizerLayout optimizer_layout(const optim::Optimizer& optimizer) const override;
  void load_parameter_parts(const ReadParameter& read) override;

  // Each stage's measured bubble so far (1 - computing time / time in train_batch), in
  // stage order, and the schedule's theoretical one. Collective over the pipeline.
  std::vector<double> measured_bubbles();
  double theoretical_bubble() const;
  // "pipeline: <mesh>, M micro-batches, <schedule>, layers per chunk ...: bubble per stage
  // ... (theory ...)". Collective (measured_bubbles).
  std::vector<std::string> training_report() override;
  const pipeline::Schedule& schedule() const { return *schedule_; }

  const DeviceMesh& mesh() const;
  int stage() const { return stage_; }
  // Model chunk c (stage c % stages; one chunk per stage unless interleaved) runs layers
  // [layer_bounds()[c], layer_bounds()[c + 1]).
  const std::vector<int64_t>& layer_bounds() const { return bounds_; }

 private:
  pipeline::PipelineOptions pipeline_;
  TensorParallelOptions tp_options_;
  // Whether this stage uses parameter `name` (it keeps its storage).
  bool holds(const std::string& name) const;
  // The stage (lowest) that owns a parameter for norms, checkpoints and gathering.
  int owner_stage(const std::string& name) const;
  // A copy of the parameter's value from its owner (dp rank 0 of the owning stage), on every
  // rank. Collective over the world.
  Tensor from_owner(const std::string& name, const Tensor& param);
  void make_links();
  // One reducer per chunk of this stage over its parameters that no other chunk uses (dp > 1).
  void make_reducers();
  void synchronise_gradients();

  std::optional<DeviceMesh> mesh_;
  std::unique_ptr<pipeline::Schedule> schedule_;
  std::unique_ptr<pipeline::StageRunner> runner_;
  std::vector<pipeline::Action> actions_;  // this stage's, for every batch
  pipeline::StageLinks links_;
  std::shared_ptr<comm::ProcessGroup> tie_group_;  // the first and last stage, when tied
  std::vector<int64_t> bounds_;
  Tensor profile_input_;
  int stage_ = 0;
  std::vector<std::pair<std::string, Tensor>> params_;  // the module's, in order
  std::map<std::string, std::set<int>> stages_of_;      // the stages that use each parameter
  std::vector<std::string> tied_;  // parameters the first and the last stage both use
  // Per chunk of this stage (null: nothing to reduce), and the parameters this stage holds
  // that none of them reduces (used by several chunks), averaged after the batch.
  std::vector<std::unique_ptr<Reducer>> reducers_;
  std::set<std::string> reduced_at_end_;
  // pp x tp: each stage's layers split over its tp group (empty layout: --tp 1).
  std::shared_ptr<nn::TensorParallelGroup> tensor_parallel_;
  TensorParallelLayout layout_;
  bool whole_ = false;  // gather_full_module ran
  // ZeRO-1 in the stage's dp group: this replica's part of each parameter it updates, a view
  // of the parameter (elements [begin, begin + length) of its flattening).
  struct OptimizerPiece {
    size_t param;  // index into params_
    int64_t begin, length;
    Tensor view;
  };
  std::vector<OptimizerPiece> pieces_;
};

}  // namespace loom::strategies
