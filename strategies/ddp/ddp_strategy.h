#pragma once
// The DDP strategies: ddp, and ddp_spawn / ddp_fork, which start their own ranks.

#include <memory>
#include <string>
#include <vector>

#include "strategies/ddp/options.h"
#include "strategies/ddp/reducer.h"
#include "strategies/model_averaging.h"
#include "strategies/strategy.h"

namespace loom::strategies {

// Distributed data parallel: parameters broadcast from rank 0 at setup, gradients averaged
// in buckets during backward (strategies/ddp/reducer.h); with local_sgd_period set, local
// SGD after a warm-up (strategies/ddp/options.h).
class DDPStrategy : public ParallelStrategy {
 public:
  explicit DDPStrategy(StrategyOptions options, DDPOptions ddp = {});
  const DDPOptions& ddp_options() const { return ddp_; }
  std::string name() const override { return "ddp"; }
  void setup_module(nn::Module& module) override;
  void backward(const Tensor& loss) override;
  void optimizer_step(optim::Optimizer& optimizer) override;
  void set_backward_sync(bool sync) override;
  void teardown() override;

 private:
  // True once local SGD has taken over from gradient synchronisation.
  bool past_warmup() const;

  DDPOptions ddp_;
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<PeriodicModelAverager> averager_;  // set when local_sgd_period > 0
  std::vector<Tensor> params_;
  bool user_sync_ = true;  // the last set_backward_sync()
};

// ddp_spawn / ddp_fork: DDP whose ranks the program starts itself when no launcher did
// (strategies/local_launch.h); under loomrun or torchrun they behave exactly like ddp.
// The number of ranks is `devices` ("auto" means 1 on the CPU, as in Lightning).
class DDPLaunchingStrategy : public DDPStrategy {
 public:
  DDPLaunchingStrategy(StrategyOptions options, DDPOptions ddp, bool fork);
  std::string name() const override { return fork_ ? "ddp_fork" : "ddp_spawn"; }
  void setup_environment() override;

 private:
  bool fork_;
};

}  // namespace loom::strategies
