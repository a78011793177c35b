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
#include "nn/pretrained.h"
#include "strategies/memory_report.h"
#include "strategies/precision.h"
#include "strategies/registry.h"
#include "tensor/meta.h"

namespace loom::strategies {

struct MemoryEstimate {
  // Peak bytes per kind on the rank that holds the most (rank 0: padding sits at the end),
  // in MemoryKind order. Activations are not predicted here (they depend on the forward and
  // the batch: estimate_micro_batch below); they stay 0.
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
// built. `options.accelerator` "cuda" models a GPU job, whose host memory holds one more
// gradient shard under parameter offload; anything else, ranks computing on the CPU.
MemoryEstimate estimate_memory(const nn::Module& model, const std::string& strategy,
                               int world_size, const StrategyConfig& options = {},
                               int states_per_parameter = 2);

// Whether autocast's weight cache (WeightCastScope, tensor/autocast.h) must outlive the
// forward of a step's last micro-batch: only for activation checkpointing, whose backward
// recomputes the forward with the same casts. Otherwise train_gpt ends the scope when that
// forward ends, and each cast is freed once the backward is done with it, as PyTorch's
// autocast (whose cache lives for the forward) frees it; estimate_micro_batch follows the same
// rule for a step of one micro-batch. (The earlier micro-batches of an accumulating step keep
// the casts for the next ones.)
bool weight_casts_outlive_last_forward(const nn::ModelSpec& spec);

// One training micro-batch of `batch` sequences of `time` tokens through the model `spec`
// describes (forward and loss under `precision`'s autocast, then backward of the loss, scaled
// when `precision` scales it or `grad_accum` > 1 divides it, as Strategy::forward_backward
// runs them), with the parameters in `weights_dtype` (a sharded strategy's 16-bit weights)
// and, with `weight_cast_cache`, autocast's casts of them cached as train_gpt caches them for
// the strategies that keep their parameters through a step (the non-sharded ones:
// Strategy::parameters_held_through_step), run on the meta device (tensor/meta.h), where the
// real code path runs without computing and allocates the CPU path's tensors byte for byte: a
// CPU run's memory report measures the same. Under the data-parallel and sharded strategies
// every rank runs one of these per micro-batch.
struct MicroBatchEstimate {
  // The peak bytes of activations (MemoryKind::Activations), the tokens and the model's own
  // tensors that are not parameters (Llama's rotary tables) included.
  int64_t activation_bytes = 0;
  MetaCostTotals costs;  // every op's FLOPs and bytes
};
MicroBatchEstimate estimate_micro_batch(nn::ModelSpec spec, int64_t batch, int64_t time,
                                        const Precision& precision, int64_t grad_accum = 1,
                                        DType weights_dtype = DType::F32,
                                        bool weight_cast_cache = true);

}  // namespace loom::strategies
