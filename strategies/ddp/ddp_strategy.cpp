#include "strategies/ddp/ddp_strategy.h"

#include "core/error.h"
#include "core/tags.h"
#include "strategies/parameter_sync.h"

namespace loom::strategies {

DDPStrategy::DDPStrategy(StrategyOptions options, DDPOptions ddp)
    : ParallelStrategy(std::move(options)), ddp_(std::move(ddp)) {}

void DDPStrategy::setup_module(nn::Module& module) {
  if (ddp_.local_sgd_period < 0 || ddp_.local_sgd_warmup < 0)
    tag::kDdp.fail("local_sgd_period and local_sgd_warmup must be at least 0, got ",
                   ddp_.local_sgd_period, " and ", ddp_.local_sgd_warmup);
  Strategy::setup_module(module);
  comm::ProcessGroup& group = group_for("setup_module");
  auto named = module.named_parameters();
  verify_same_parameters(named, group);
  std::vector<Tensor> params;
  std::vector<std::string> names;
  for (auto& [name, p] : named) {
    params.push_back(p);
    names.push_back(name);
  }
  broadcast_parameters(params, group);
  averager_.reset();
  if (ddp_.local_sgd_period > 0)
    averager_ = std::make_unique<PeriodicModelAverager>(ddp_.local_sgd_period,
                                                        ddp_.local_sgd_warmup);
  params_ = params;
  reducer_ = std::make_unique<Reducer>(params, group_, ddp_, names);
  reducer_->set_sync(user_sync_ && !past_warmup());
}

bool DDPStrategy::past_warmup() const {
  return averager_ && averager_->step() >= averager_->warmup_steps();
}

void DDPStrategy::backward(const Tensor& loss) {
  if (!reducer_) tag::kDdp.fail("backward before setup_module(): the module is not set up");
  reducer_->set_sync(user_sync_ && !past_warmup());
  reducer_->prepare_for_backward(loss);
  loss.backward();
  reducer_->finalize_backward();
}

void DDPStrategy::optimizer_step(optim::Optimizer& optimizer) {
  Strategy::optimizer_step(optimizer);
  if (averager_) averager_->average_parameters(params_, group_for("optimizer_step"));
}

void DDPStrategy::set_backward_sync(bool sync) {
  user_sync_ = sync;
  if (reducer_) reducer_->set_sync(sync && !past_warmup());
}

void DDPStrategy::teardown() {
  reducer_.reset();
  averager_.reset();
  params_.clear();
  ParallelStrategy::teardown();
}

DDPLaunchingStrategy::DDPLaunchingStrategy(StrategyOptions options, DDPOptions ddp, bool fork)
    : DDPStrategy(std::move(options), std::move(ddp)), fork_(fork) {
  if (fork_ && accelerator_->name() == "cuda") {
    // As in PyTorch: a forked child cannot use CUDA once the parent has initialised it, and
    // choosing the accelerator already did.
    tag::kDdpFork.fail(
        "the cuda accelerator cannot be used with forked ranks (CUDA does not "
        "survive fork); use strategy 'ddp_spawn', or 'ddp' under loomrun");
  }
}

void DDPLaunchingStrategy::setup_environment() {
  join_or_start_ranks(fork_ ? LaunchMethod::Fork : LaunchMethod::Spawn);
}

}  // namespace loom::strategies
