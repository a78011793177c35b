#pragma once
// The sharded strategies (ZeRO stages 1-3, FSDP, with CPU offload): a ParallelStrategy that
// hands the module to the sharding engine (engine.h). The registry's names (fsdp,
// deepspeed_stage_3_offload, ...) are this class with different ShardingOptions
// (strategies/registry.cpp, docs/sharding.md). Under a launcher it joins the job; otherwise
// it starts `devices` ranks itself, as ddp_spawn does.

#include <memory>
#include <string>

#include "strategies/sharded/engine.h"
#include "strategies/sharded/options.h"
#include "strategies/strategy.h"

namespace loom::strategies {

class ShardedStrategy : public ParallelStrategy {
 public:
  // `name` is the registry's (fsdp, deepspeed_stage_3, ...): it tags messages.
  ShardedStrategy(StrategyOptions options, sharded::ShardingOptions sharding, std::string name);
  ~ShardedStrategy() override;
  std::string name() const override { return name_; }
  const sharded::ShardingOptions& sharding_options() const { return sharding_; }
  void setup_environment() override;
  // Checks that every rank holds the same parameters, broadcasts rank 0's, then shards them.
  void setup_module(nn::Module& module) override;
  // Points the optimizer at this rank's shard (sharded::ShardedEngine::adopt_optimizer).
  void setup_optimizer(optim::Optimizer& optimizer) override;
  void backward(const Tensor& loss) override;
  void set_backward_sync(bool sync) override;
  void unscale_gradients() override;
  double gradient_norm(double norm_type = 2.0) override;
  double clip_gradients(double max_norm, double norm_type = 2.0) override;
  void optimizer_step(optim::Optimizer& optimizer) override;
  void gather_full_module() override;
  // The module's parameters in `state` (or views of them, as state_dict() gives) become
  // copies of the whole model, gathered unit by unit from the f32 masters.
  std::map<std::string, Tensor> gather_state(const std::map<std::string, Tensor>& state) override;
  std::vector<ParameterPart> held_parameters() override;
  // None: units gather their parameters per use (and 16-bit weights need no cast).
  std::vector<Tensor> parameters_held_through_step() const override { return {}; }
  std::pair<int, int> replica_of_held() const override;
  OptimizerLayout optimizer_layout(const optim::Optimizer& optimizer) const override;
  // f32 under 16-bit weights: checkpoints hold the masters.
  DType parameter_dtype(const Tensor& param) const override;
  void load_parameter_parts(const ReadParameter& read) override;
  std::map<std::string, Tensor> optimizer_state(const optim::Optimizer& optimizer) override;
  // Writes gather_state(state); every rank must call it (between steps).
  void save_checkpoint(const std::filesystem::path& path,
                       const std::map<std::string, Tensor>& state) override;
  bool prefers_sharded_checkpoints() const override { return true; }
  void teardown() override;

  // The engine, once setup_module() ran (for tests, reports and benchmarks).
  const sharded::ShardedEngine* engine() const { return engine_.get(); }

 private:
  sharded::ShardedEngine& need_engine(const char* what) const;

  sharded::ShardingOptions sharding_;
  std::string name_;
  std::unique_ptr<sharded::ShardedEngine> engine_;
  bool optimizer_adopted_ = false;
};

}  // namespace loom::strategies
