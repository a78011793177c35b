#pragma once
// StrategyRegistry: strategies by name, as in Lightning. Built-ins registered at start-up:
// single_device, ddp, ddp_spawn, ddp_fork, ddp_find_unused_parameters_true. A user strategy
// registered at run time is selectable everywhere a built-in is (train_gpt --strategy, Fabric):
//   StrategyRegistry::register_strategy("my_ddp",
//       [](const StrategyOptions& o) { return std::make_unique<MyDDP>(o); },
//       "DDP with my gradient hook");

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "strategies/strategy.h"

namespace loom::strategies {

using StrategyFactory = std::function<std::unique_ptr<Strategy>(const StrategyOptions&)>;
// Adjusts the caller's options before the factory sees them (a registered name's defaults,
// e.g. find_unused_parameters for ddp_find_unused_parameters_true).
using OptionsDefaults = std::function<void(StrategyOptions&)>;

class StrategyRegistry {
 public:
  // Throws loom::Error when the name is empty or taken.
  static void register_strategy(const std::string& name, StrategyFactory factory,
                                std::string description, OptionsDefaults defaults = {});
  static bool remove(const std::string& name);
  // Creates the strategy `name`; an unknown name is loom::Error listing the available names
  // and the closest match.
  static std::unique_ptr<Strategy> get(const std::string& name, StrategyOptions options = {});
  // (name, description) of every registered strategy, sorted by name.
  static std::vector<std::pair<std::string, std::string>> available_strategies();
};

}  // namespace loom::strategies
