#pragma once
// A strategy of one's own with options of its own, added to Loom without touching the
// library: DDP that also keeps an exponential moving average of the weights (the EMA weights
// that timm's ModelEmaV2 and many diffusion trainers evaluate with). After every optimizer
// step that was not skipped, on every rank,
//   average <- decay * average + (1 - decay) * weight
// so decay 0 keeps the weights themselves and decay 1 the weights at setup.
//
// Its registry entry (ema_strategy_entry) declares the flag it reads, --ema-decay, beside
// DDP's; a front end that chose it by name hands the flag's value in StrategyConfig::extra.

#include <map>
#include <string>

#include "strategies/ddp/ddp_strategy.h"
#include "strategies/registry.h"

namespace example {

struct EmaOptions {
  double decay = 0.99;  // in [0, 1]
};

// The options in config.extra ("--ema-decay"), or their defaults; a value that is not a
// number in [0, 1] is loom::Error naming it.
EmaOptions ema_options(const loom::strategies::StrategyConfig& config);

class EmaDDPStrategy : public loom::strategies::DDPStrategy {
 public:
  EmaDDPStrategy(loom::strategies::StrategyOptions options, loom::strategies::DDPOptions ddp,
                 EmaOptions ema);
  std::string name() const override { return "ddp_ema"; }
  // DDP's setup, then the average starts as a copy of the (broadcast) weights.
  void setup_module(loom::nn::Module& module) override;
  // DDP's step, then the average moves towards the new weights.
  void optimizer_step(loom::optim::Optimizer& optimizer) override;
  // The averaged weights, by parameter name.
  const std::map<std::string, loom::Tensor>& averaged() const { return average_; }

 private:
  EmaOptions ema_;
  std::map<std::string, loom::Tensor> average_;
};

// The registry entry: kind DataParallel, DDP's flags and --ema-decay.
loom::strategies::StrategyEntry ema_strategy_entry();

}  // namespace example
