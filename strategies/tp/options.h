#pragma once
// Options of tensor parallelism (strategies/tp/model_parallel_strategy.h, and the pipeline's
// pp x tp mesh; docs/parallelism.md).

namespace loom::strategies {

struct TensorParallelOptions {
  // Ranks per replica that split every layer (--tp); the data-parallel size is the world
  // divided by it.
  int size = 1;
  // Megatron-LM's sequence parallelism between the split layers (model_parallel only).
  bool sequence_parallel = false;
};

}  // namespace loom::strategies
