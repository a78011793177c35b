#pragma once
// --cuda-graph: a single-device CUDA training step captured once and replayed (Note [CUDA
// Graphs] in tensor/cuda/graph.h), as torch.compile's "reduce-overhead" mode and Megatron's
// --enable-cuda-graph do.
//
// The first step runs eagerly (it builds the matmul plans, the optimizer's state and the
// WeightCastPlan); the second is captured, then replayed; every later step is a replay. The
// step is the whole of it: forward, backward, the gradient norm and clipping factor on the
// device (optim::clip_grad_norm_on_device) and AdamW's update with its scalars read from
// device memory (Note [Capturable AdamW] in optim/adamw.h). A replay reads the step's tokens
// from the device tensors that stage() fills before it and rewrites the loss, the norm and
// every parameter's gradient in the tensors the capture left, so the trainer keeps the
// gradients between steps (no zero_grad) and reads the loss and the norm after the replay.
//
// Refused (train()): a build without CUDA and a device other than CUDA (here); a strategy
// other than single_device, --grad-accum above 1 (micro-batches accumulate into the
// gradients a replay overwrites), a loss scaler (16-mixed: its scale is a host value) and an
// optimizer other than AdamW.

#include <functional>
#include <memory>

#include "data/token_blocks.h"
#include "tensor/tensor.h"

namespace loom::train_gpt {

class GraphedStep {
 public:
  // A graphed step on `device`, which must be a CUDA device of a CUDA build.
  explicit GraphedStep(Device device);
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  // `batch` copied into the device tensors the captured step reads (allocated at the first
  // call, before any capture), which the returned batch holds.
  data::Batch stage(const data::Batch& batch);

  // What a step leaves on the device, rewritten by each replay.
  struct Outputs {
    Tensor loss;
    Tensor grad_norm;
  };
  // `step` run eagerly at the first call, captured at the second and replayed from then on;
  // `before_replay` (the host's share of a replayed step: AdamW::prepare_replay) runs before
  // each replay but the first, which follows the capture that did that share itself.
  Outputs run(const std::function<Outputs()>& step, const std::function<void()>& before_replay);

 private:
  struct Graph;
  Device device_;
  std::unique_ptr<Graph> graph_;
  data::Batch staged_;
  Outputs outputs_;
  int64_t calls_ = 0;
};

}  // namespace loom::train_gpt
