#pragma once
// One pipeline stage's share of a batch: its model chunks (runs of layers of a LayeredModel;
// one chunk, or several under an interleaved schedule, chunk j of stage s being the model's
// chunk j*p + s), run micro-batch by micro-batch in a schedule's order (schedule.h), with
// activations coming from the chunk before and gradients from the chunk after over
// point-to-point links.
//
// Links: each direction between neighbouring stages (and, for interleaved schedules, from
// the last stage back to the first) has its own 2-rank process group, so that each group
// carries one stream of messages in one direction, and a receive posted ahead never holds
// up a send queued behind it (a group runs its operations in order). Both ends know the
// order of the messages on a stream: the sender's schedule. A batch's receives are posted
// as soon as their shapes are known (from the second batch on, when the batch starts); an
// activation's shape and dtype travel once per stream, as a header before the first one. A
// neighbour that dies or stalls surfaces as a loom::CommError of the link's group within the
// group's timeout.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "nn/layered_model.h"
#include "tensor/autograd/node.h"
#include "strategies/pipeline/schedule.h"

namespace loom::strategies::pipeline {

// A 2-rank group and the other end's rank in it.
struct Link {
  std::shared_ptr<comm::ProcessGroup> group;
  int peer = 0;
};

struct StageLinks {
  Link activations_to_next, gradients_from_next;  // with stage s + 1 (not on the last stage)
  Link activations_from_prev, gradients_to_prev;  // with stage s - 1 (not on the first)
  // Interleaved schedules only: from the last stage to the first (on those two stages).
  Link activations_wrap, gradients_wrap;
};

// Where a few values read on the host (a message header, a loss, a flag) cross `group`: in
// host memory, unless the group moves CUDA tensors only (nccl). Note [Pipeline messages on a
// device].
Device host_values_device(const comm::ProcessGroup& group);

class StageRunner {
 public:
  // `bounds` splits the model's layers into stages x schedule.chunks_per_stage() chunks:
  // chunk c runs layers [bounds[c], bounds[c + 1]). `device` is where the stage computes:
  // received activations and gradients land there (Note [Pipeline messages on a device]).
  StageRunner(const nn::LayeredModel& model, const Schedule& schedule, int stage, int stages,
              std::vector<int64_t> bounds, StageLinks links, Device device);

  // Runs `actions` over `micro_batches` micro-batches: inputs[k] feed the model's first
  // chunk, targets[k] score its last one (each is empty on stages without them), whose
  // losses are multiplied by loss_scale before their backward. Leaves the gradients
  // accumulated on the stage's parameters. Returns the mean of the micro-batches' losses on
  // the stage holding the last chunk, 0 elsewhere. The forward runs under autocast to
  // `compute_dtype` (F32: off). `before_last_weight_pass(c)`, when given, runs just before
  // the action that completes the weight gradients of this stage's chunk c for the batch (its
  // last Backward or BackwardWeight): the moment a data-parallel reducer starts listening.
  double run(const std::vector<Action>& actions, int micro_batches,
             const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets,
             double loss_scale, DType compute_dtype,
             const std::function<void(int chunk)>& before_last_weight_pass = {});

  // Time spent computing (forward and backward, not waiting for neighbours) and in run()
  // altogether, summed over the batches run so far: 1 - busy / total is the stage's bubble.
  double busy_seconds() const { return busy_s_; }
  double total_seconds() const { return total_s_; }

  // Whether this stage holds the model's first / last chunk.
  bool has_first_chunk() const { return stage_ == 0; }
  bool has_last_chunk() const { return stage_ == stages_ - 1; }

 private:
  // One direction of one link: what it carries, in order, and the receives posted on it.
  struct Stream {
    Link link;
    std::vector<std::pair<int, int>> order;  // (this stage's chunk, micro-batch) per message
    int planned_for = -1;                    // the micro-batch count `order` was made for
    std::optional<Shape> shape;              // receiving activations: from the header
    DType dtype = DType::F32;
    bool header_sent = false;                // sending activations
    std::vector<Tensor> buffers;
    std::vector<comm::WorkPtr> receives;
  };
  using Key = std::pair<int, int>;  // (chunk, micro-batch)

  int chunk_count() const { return static_cast<int>(bounds_.size()) - 1; }
  int global_chunk(int chunk) const { return chunk * stages_ + stage_; }
  // The streams a chunk's activations arrive on and leave by (null: none, the model's first
  // or last chunk), and the gradient streams that mirror them.
  Stream* activations_in(int chunk);
  Stream* activations_out(int chunk);
  Stream* gradients_in(int chunk);
  Stream* gradients_out(int chunk);
  // The messages of a receiving stream this batch, from the sending stage's schedule (worked
  // out once per micro-batch count), with no receive posted yet.
  void plan_receives(Stream& stream, int sender, bool activations, int micro_batches);
  void post_receives(Stream& stream, bool activations);
  Tensor take(Stream& stream, const Key& key);
  void forward(const Action& a, const std::vector<Tensor>& inputs,
               const std::vector<Tensor>& targets, DType compute_dtype);
  void backward(const Action& a, double loss_scale);
  void backward_weight(const Action& a);

  // Where a tensor message of `stream` lands.
  Device message_device(const Stream& stream) const;

  const nn::LayeredModel& model_;
  const Schedule& schedule_;
  int stage_, stages_;
  Device device_;
  std::vector<int64_t> bounds_;  // of every chunk of the model
  std::map<int, Stream> streams_;  // by kind: see the .cpp
  std::map<int, std::pair<Shape, DType>> output_shapes_;  // per chunk of this stage
  // Per (chunk, micro-batch) of the batch being run.
  std::map<Key, Tensor> inputs_, outputs_, losses_;
  std::map<Key, autograd::WeightGradients> weight_halves_;  // between I and W
  std::vector<double> loss_values_;
  std::vector<comm::WorkPtr> sends_;
  double busy_s_ = 0, total_s_ = 0;
};

}  // namespace loom::strategies::pipeline
