#pragma once
// One pipeline stage's share of a batch: layers [begin, end) of a LayeredModel, run micro-
// batch by micro-batch in a schedule's order (schedule.h), with activations coming from the
// previous stage and gradients from the next one over point-to-point links.
//
// Links: each direction of each neighbour pair has its own 2-rank process group, so that
// every group carries one stream of messages in one direction, in micro-batch order, and a
// receive posted ahead never holds up a send behind it in the same group's queue. Receives
// of a batch's activations and gradients are posted as soon as their shapes are known; the
// activation's shape and dtype are agreed once (a header before the first one), not sent
// with every micro-batch. A neighbour that dies or stalls surfaces as a loom::CommError of
// the link's group (its name says which stages) within the group's timeout.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "comm/process_group.h"
#include "nn/layered_model.h"
#include "strategies/pipeline/schedule.h"

namespace loom::strategies::pipeline {

struct StageLinks {
  // 2-rank groups in which the previous stage is rank 0 and this one rank 1 (from_prev,
  // grads_to_prev), or this one rank 0 and the next rank 1 (to_next, grads_from_next). Null
  // at the first / last stage.
  std::shared_ptr<comm::ProcessGroup> from_prev, to_next, grads_from_next, grads_to_prev;
};

class StageRunner {
 public:
  StageRunner(const nn::LayeredModel& model, int stage, int stages, int64_t layer_begin,
              int64_t layer_end, StageLinks links);

  // Runs `actions` over `micro_batches` micro-batches: inputs[k] feed the first stage,
  // targets[k] score the last one (each is empty on the other stages), whose losses are
  // multiplied by loss_scale before their backward. Leaves the gradients accumulated on the
  // stage's parameters. Returns the mean of the micro-batches' losses on the last stage, 0
  // elsewhere. The forward runs under autocast to `compute_dtype` (F32: off).
  double run(const std::vector<Action>& actions, int micro_batches,
             const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets,
             double loss_scale, DType compute_dtype);

  // Time spent computing (forward and backward, not waiting for neighbours) and in run()
  // altogether, summed over the batches run so far: 1 - busy / total is the stage's bubble.
  double busy_seconds() const { return busy_s_; }
  double total_seconds() const { return total_s_; }

  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == stages_ - 1; }

 private:
  void forward(int k, const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets,
               DType compute_dtype);
  void post_gradient_receives();
  void backward(int k, double loss_scale);
  // The activation header: shape and dtype of what this stage sends (first batch only).
  void send_header(const Tensor& output);
  void receive_header();

  const nn::LayeredModel& model_;
  int stage_, stages_;
  int64_t layer_begin_, layer_end_;
  StageLinks links_;
  std::optional<Shape> in_shape_, out_shape_;
  DType in_dtype_ = DType::F32, out_dtype_ = DType::F32;
  // Per micro-batch of the batch being run.
  std::vector<Tensor> received_, inputs_, outputs_, losses_, grads_;
  std::vector<double> loss_values_;
  std::vector<comm::WorkPtr> receives_, grad_receives_, sends_;
  double busy_s_ = 0, total_s_ = 0;
};

}  // namespace loom::strategies::pipeline
