#pragma once
// Predicts per-rank memory by kind before training, as DeepSpeed's
// estimate_zero{2,3}_model_states_mem_needs do, but from the engine's own layout: the units a
// wrap policy makes, their padding to the world size, and the working sets the schedule
// keeps alive (docs/sharding.md, "Memory"). Tests hold it within 5% of what a training step
// measures (strategies/memory_report.h) for parameters, gradients, optimizer state and
// offloaded memory.

#include <array>
#include <cstdint>
#include <string>

#include "nn/module.h"
#include "strategies/memory_report.h"
#include "strategies/registry.h"

namespace loom::strategies {

struct MemoryEstimate {
  // Peak bytes per kind on the rank that holds the most (rank 0: padding sits at the end),
  // in MemoryKind order. Activations are not predicted here (they depend on the forward and
  // the batch); they stay 0.
  std::array<int64_t, kMemoryKindCount> peak_by_kind = {};
  int64_t units = 1;  // sharded strategies: the units the wrap policy makes
  int64_t nvme_bytes = 0;  // NVMe offload: master shards and optimizer state in the swap file

  int64_t peak(MemoryKind kind) const { return peak_by_kind[static_cast<size_t>(kind)]; }
  // Parameters, gradients and optimizer state: the "model states" of the ZeRO paper.
  int64_t model_states() const {
    return peak(MemoryKind::Parameters) + peak(MemoryKind::Gradients) +
           peak(MemoryKind::OptimizerState);
  }
};

// For `model` trained under the registered strategy `strategy` (its name's defaults applied
// to `options`, as StrategyRegistry::create does) on `world_size` ranks, with an optimizer
// that keeps `states_per_parameter` tensors per parameter (AdamW 2, SGD with momentum 1).
// The name's kind (StrategyKind) picks the model: single device, data parallel (the ddp
// names) and sharded are modelled; other kinds are an error naming the strategy. Nothing is
// built.
MemoryEstimate estimate_memory(const nn::Module& model, const std::string& strategy,
                               int world_size, const StrategyConfig& options = {},
                               int states_per_parameter = 2);

}  // namespace loom::strategies
