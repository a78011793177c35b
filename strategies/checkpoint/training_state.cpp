#include "strategies/checkpoint/training_state.h"

#include <cstdio>
#include <optional>

#include "strategies/sharded/sharded_strategy.h"
#include "tensor/error.h"

namespace loom::strategies::checkpoint {

bool shards_optimizer_state(const Strategy& strategy) {
  return dynamic_cast<const ShardedStrategy*>(&strategy) != nullptr;
}

std::string optimizer_file(const Strategy& strategy) {
  if (!shards_optimizer_state(strategy)) return "optimizer.safetensors";
  char name[64];
  std::snprintf(name, sizeof name, "optimizer.rank-%05d.safetensors", strategy.rank());
  return name;
}

std::map<std::string, Tensor> optimizer_snapshot(const optim::Optimizer& optimizer,
                                                 Strategy& strategy) {
  std::map<std::string, Tensor> out;
  for (const auto& [name, tensor] : strategy.optimizer_state(optimizer))
    out.emplace(name, tensor.to(Device::cpu()));
  if (const LossScaler* scaler = strategy.loss_scaler()) {
    const LossScaler::State s = scaler->state();
    out["scaler.scale"] = Tensor::from_vector<double>({s.scale}, {});
    out["scaler.clean_steps"] = Tensor::from_vector<int64_t>({s.clean_steps}, {});
    out["scaler.skipped"] = Tensor::from_vector<int64_t>({s.skipped}, {});
  }
  return out;
}

void restore_optimizer(const std::map<std::string, Tensor>& snapshot, optim::Optimizer& optimizer,
                       Strategy& strategy, const std::string& origin) {
  std::map<std::string, Tensor> state;
  std::optional<LossScaler::State> scaler;
  for (const auto& [name, tensor] : snapshot) {
    if (name.rfind("scaler.", 0) == 0) {
      if (!scaler) scaler.emplace();
      if (name == "scaler.scale") scaler->scale = tensor.item();
      if (name == "scaler.clean_steps") scaler->clean_steps = static_cast<int>(tensor.item());
      if (name == "scaler.skipped") scaler->skipped = static_cast<int64_t>(tensor.item());
    } else if (name.rfind("train.", 0) != 0) {
      state.emplace(name, tensor);
    }
  }
  optimizer.load_state_dict(state);
  LossScaler* mine = strategy.loss_scaler();
  if (scaler && mine == nullptr) {
    fail("[checkpoint] ", origin, " holds a loss scaler (16-mixed) but this run's precision "
         "has none; resume with precision 16-mixed");
  }
  if (mine != nullptr) {
    if (!scaler) fail("[checkpoint] ", origin, " has no loss scaler state; it was not saved under 16-mixed");
    mine->restore(*scaler);
  }
}

}  // namespace loom::strategies::checkpoint
