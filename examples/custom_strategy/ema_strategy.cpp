#include "ema_strategy.h"

#include <cstdlib>

#include "core/error.h"
#include "tensor/ops.h"

namespace example {

namespace strategies = loom::strategies;

EmaOptions ema_options(const strategies::StrategyConfig& config) {
  EmaOptions options;
  const auto it = config.extra.find("--ema-decay");
  if (it == config.extra.end()) return options;
  char* end = nullptr;
  options.decay = std::strtod(it->second.c_str(), &end);
  if (it->second.empty() || *end != '\0' || !(options.decay >= 0 && options.decay <= 1)) {
    loom::fail("[ddp_ema] --ema-decay must be a number from 0 to 1, got '", it->second, "'");
  }
  return options;
}

EmaDDPStrategy::EmaDDPStrategy(strategies::StrategyOptions options, strategies::DDPOptions ddp,
                               EmaOptions ema)
    : DDPStrategy(std::move(options), std::move(ddp)), ema_(ema) {}

void EmaDDPStrategy::setup_module(loom::nn::Module& module) {
  DDPStrategy::setup_module(module);
  average_.clear();
  for (const auto& [name, param] : module.named_parameters())
    average_[name] = param.detach().clone();
}

void EmaDDPStrategy::optimizer_step(loom::optim::Optimizer& optimizer) {
  DDPStrategy::optimizer_step(optimizer);
  if (skips_step()) return;
  loom::NoGradGuard no_grad;
  for (const auto& [name, param] : module_->named_parameters()) {
    loom::Tensor& average = average_.at(name);
    loom::mul_(average, ema_.decay);
    loom::add_(average, loom::mul(param.detach(), 1.0 - ema_.decay));
  }
}

strategies::StrategyEntry ema_strategy_entry() {
  std::vector<std::string> flags = strategies::StrategyRegistry::entry("ddp").flags;
  flags.push_back("--ema-decay");
  return {.factory =
              [](const strategies::StrategyConfig& c) {
                return std::make_unique<EmaDDPStrategy>(c, c.ddp, ema_options(c));
              },
          .description =
              "ddp keeping an exponential moving average of the weights "
              "(examples/custom_strategy)",
          .kind = strategies::StrategyKind::DataParallel,
          .flags = std::move(flags)};
}

}  // namespace example
