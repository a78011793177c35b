#pragma once
// --cuda-graph: the forward and backward of a single-device CUDA step captured once and
// replayed (Note [CUDA Graphs] in tensor/cuda/graph.h), as torch.compile's "reduce-overhead"
// mode and Megatron's --enable-cuda-graph do.
//
// The first step runs eagerly (it builds the matmul plans, the optimizer's state and the
// WeightCastPlan); the second is captured, then replayed; every later step is a replay. A
// replay reads the step's tokens from device tensors that stage() fills before it, and writes
// the loss and every parameter's gradient into the tensors the capture left, so the trainer
// keeps those gradients between steps instead of dropping them (zero_grad), and makes no
// weight-cast scope (the casts are in the graph). Clipping, the learning rate and the
// optimizer's update stay eager: their scalars (the clipping factor, the rate, the step count)
// are host values a capture would freeze.
//
// Refused, naming the flag: a build without CUDA and a device other than CUDA (here), a
// strategy other than single_device, --grad-accum above 1 (micro-batches accumulate into the
// gradients a replay overwrites) and a loss scaler (16-mixed: its scale is a host value)
// (train(), which knows the strategy).

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
  // The step's forward and backward: `forward_backward` run eagerly on the first call,
  // captured at the second and replayed from then on. Returns the loss.
  Tensor run(const std::function<Tensor()>& forward_backward);
  // True once the step is replayed: the host work of a step (weight-cast scopes, dropping the
  // gradients) is to be skipped.
  bool replaying() const;

 private:
  struct Graph;
  Device device_;
  std::unique_ptr<Graph> graph_;
  data::Batch staged_;
  Tensor loss_;
  int64_t calls_ = 0;
};

}  // namespace loom::train_gpt
