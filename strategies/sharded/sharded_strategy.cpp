#include "strategies/sharded/sharded_strategy.h"

#include "strategies/parameter_sync.h"

namespace loom::strategies {

ShardedStrategy::ShardedStrategy(StrategyOptions options, sharded::ShardingOptions sharding,
                                 std::string name)
    : ParallelStrategy(std::move(options)), sharding_(std::move(sharding)), name_(std::move(name)) {}

ShardedStrategy::~ShardedStrategy() = default;

void ShardedStrategy::setup_environment() {
  join_or_start_ranks(LaunchMethod::Spawn);
}

sharded::ShardedEngine& ShardedStrategy::need_engine(const char* what) const {
  if (!engine_) Tag(name_).fail(what, " before setup_module(): the module is not set up");
  return *engine_;
}

void ShardedStrategy::setup_module(nn::Module& module) {
  if (!group_) Tag(name_).fail("setup_module before setup_environment(): no process group");
  Strategy::setup_module(module);
  verify_same_parameters(module.named_parameters(), *group_);
  broadcast_parameters(module.parameters(), *group_);
  sharded::ShardingOptions sharding = sharding_;
  if (sharding.hybrid_shard && sharding.shard_group_size == 0) {
    // FSDP's default: shard inside a node, replicate across nodes. Ranks this strategy started
    // itself all run on this node.
    sharding.shard_group_size = environment_ && environment_->world_size == group_->size()
                                    ? environment_->local_world_size
                                    : group_->size();
  }
  engine_ = std::make_unique<sharded::ShardedEngine>(module, group_, sharding);
  optimizer_adopted_ = false;
}

void ShardedStrategy::setup_optimizer(optim::Optimizer& optimizer) {
  need_engine("setup_optimizer").adopt_optimizer(optimizer);
  optimizer_adopted_ = true;
}

void ShardedStrategy::backward(const Tensor& loss) {
  sharded::ShardedEngine& engine = need_engine("backward");
  engine.prepare_for_backward();
  loss.backward();
  engine.finalize_backward();
}

void ShardedStrategy::set_backward_sync(bool sync) {
  need_engine("set_backward_sync").set_sync(sync);
}

void ShardedStrategy::unscale_gradients() {
  if (!scaler_) return;
  sharded::ShardedEngine& engine = need_engine("unscale_gradients");
  scaler_->unscale(engine.shard_parameters());
  scaler_->set_found_inf(engine.any_nonfinite_gradient());  // every rank skips, or none
}

double ShardedStrategy::gradient_norm(double norm_type) {
  return need_engine("gradient_norm").grad_norm(norm_type);
}

double ShardedStrategy::clip_gradients(double max_norm, double norm_type) {
  return need_engine("clip_gradients").clip_grad_norm(max_norm, norm_type);
}

void ShardedStrategy::optimizer_step(optim::Optimizer& optimizer) {
  sharded::ShardedEngine& engine = need_engine("optimizer_step");
  if (!optimizer_adopted_) {
    Tag(name_).fail(
        "optimizer_step with an optimizer that was not set up: call "
        "setup_optimizer(optimizer) after setup_module() so that it steps this rank's shard");
  }
  Strategy::optimizer_step(optimizer);
  engine.after_step();
}

std::map<std::string, Tensor> ShardedStrategy::gather_state(
    const std::map<std::string, Tensor>& state) {
  if (!engine_) return state;
  // Under stage 3 a parameter's storage is released between steps: use gathered copies. A
  // parameter in `state` may be a view of it (state_dict() detaches): the same storage,
  // offset and shape.
  const std::vector<std::pair<Tensor, Tensor>> full = engine_->full_parameters();
  std::map<std::string, Tensor> whole = state;
  for (auto& [name, tensor] : whole) {
    if (!tensor.defined()) continue;
    for (const auto& [param, copy] : full) {
      if (tensor.storage() == param.storage() && tensor.offset() == param.offset() &&
          tensor.shape() == param.shape()) {
        tensor = copy;
        break;
      }
    }
  }
  return whole;
}

std::vector<ParameterPart> ShardedStrategy::held_parameters() {
  return engine_ ? engine_->held_parameters() : ParallelStrategy::held_parameters();
}

std::pair<int, int> ShardedStrategy::replica_of_held() const {
  return engine_ ? engine_->replica_of_held() : ParallelStrategy::replica_of_held();
}

OptimizerLayout ShardedStrategy::optimizer_layout(const optim::Optimizer& optimizer) const {
  return engine_ && optimizer_adopted_ ? engine_->optimizer_layout(optimizer)
                                       : ParallelStrategy::optimizer_layout(optimizer);
}

DType ShardedStrategy::parameter_dtype(const Tensor& param) const {
  return engine_ && sharding_.weights_dtype != DType::F32 ? DType::F32 : param.dtype();
}

void ShardedStrategy::load_parameter_parts(const ReadParameter& read) {
  if (engine_) {
    engine_->load_parameter_parts(read);
  } else {
    ParallelStrategy::load_parameter_parts(read);
  }
}

std::map<std::string, Tensor> ShardedStrategy::optimizer_state(const optim::Optimizer& optimizer) {
  return engine_ ? engine_->optimizer_state(optimizer) : Strategy::optimizer_state(optimizer);
}

void ShardedStrategy::save_checkpoint(const std::filesystem::path& path,
                                      const std::map<std::string, Tensor>& state) {
  Strategy::save_checkpoint(path, gather_state(state));
}

void ShardedStrategy::gather_full_module() {
  if (!engine_) return;
  engine_->unshard_module();
  engine_.reset();
}

void ShardedStrategy::teardown() {
  engine_.reset();
  ParallelStrategy::teardown();
}

}  // namespace loom::strategies
