#include "strategies/pipeline/stage_runner.h"

#include <chrono>

#include "core/error.h"
#include "core/tags.h"
#include "strategies/trace.h"
#include "tensor/autocast.h"
#include "tensor/autograd/node.h"
#include "tensor/ops.h"

namespace loom::strategies::pipeline {

namespace {

constexpr int kHeaderWords = 8;  // dtype, rank, up to 6 dimensions

// The streams of a stage, by what they carry and with whom.
enum StreamKind {
  kActivationsToNext,
  kGradientsFromNext,
  kActivationsFromPrev,
  kGradientsToPrev,
  kActivationsWrapOut,  // last stage -> first (interleaved)
  kGradientsWrapIn,
  kActivationsWrapIn,  // first stage <- last (interleaved)
  kGradientsWrapOut,
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// "F3" or "F3c1" (chunk 1 of the stage), the span of an action in --trace: F forward,
// B backward, I and W its input and weight halves.
std::string action_label(const Action& a, bool chunked) {
  constexpr const char* kLetters[] = {"F", "B", "I", "W"};
  std::string label = kLetters[a.kind];
  label += std::to_string(a.micro_batch);
  if (chunked) {
    label += 'c';
    label += std::to_string(a.chunk);
  }
  return label;
}

Trace::Args action_args(const Action& a) {
  return {{"micro_batch", a.micro_batch}, {"chunk", a.chunk}};
}

}  // namespace

StageRunner::StageRunner(const nn::LayeredModel& model, const Schedule& schedule, int stage,
                         int stages, std::vector<int64_t> bounds, StageLinks links,
                         Device device)
    : model_(model),
      schedule_(schedule),
      stage_(stage),
      stages_(stages),
      device_(device),
      bounds_(std::move(bounds)) {
  const int chunks = schedule.chunks_per_stage();
  if (chunk_count() != stages * chunks) {
    tag::kPipeline.fail(chunk_count(), " model chunks for ", stages, " stages of ", chunks);
  }
  auto need = [&](const Link& link, const char* what) {
    if (!link.group) tag::kPipeline.fail("stage ", stage, " of ", stages, ": no link ", what);
    return link;
  };
  if (stage + 1 < stages) {
    streams_[kActivationsToNext].link = need(links.activations_to_next, "to the next stage");
    streams_[kGradientsFromNext].link = need(links.gradients_from_next, "from the next stage");
  }
  if (stage > 0) {
    streams_[kActivationsFromPrev].link = need(links.activations_from_prev, "from the previous stage");
    streams_[kGradientsToPrev].link = need(links.gradients_to_prev, "to the previous stage");
  }
  if (chunks > 1 && stage == stages - 1) {
    streams_[kActivationsWrapOut].link = need(links.activations_wrap, "to the first stage");
    streams_[kGradientsWrapIn].link = need(links.gradients_wrap, "from the first stage");
  }
  if (chunks > 1 && stage == 0) {
    streams_[kActivationsWrapIn].link = need(links.activations_wrap, "from the last stage");
    streams_[kGradientsWrapOut].link = need(links.gradients_wrap, "to the last stage");
  }
}

StageRunner::Stream* StageRunner::activations_in(int chunk) {
  if (global_chunk(chunk) == 0) return nullptr;
  return &streams_.at(stage_ > 0 ? kActivationsFromPrev : kActivationsWrapIn);
}

StageRunner::Stream* StageRunner::activations_out(int chunk) {
  if (global_chunk(chunk) == chunk_count() - 1) return nullptr;
  return &streams_.at(stage_ + 1 < stages_ ? kActivationsToNext : kActivationsWrapOut);
}

StageRunner::Stream* StageRunner::gradients_in(int chunk) {
  if (global_chunk(chunk) == chunk_count() - 1) return nullptr;
  return &streams_.at(stage_ + 1 < stages_ ? kGradientsFromNext : kGradientsWrapIn);
}

StageRunner::Stream* StageRunner::gradients_out(int chunk) {
  if (global_chunk(chunk) == 0) return nullptr;
  return &streams_.at(stage_ > 0 ? kGradientsToPrev : kGradientsWrapOut);
}

void StageRunner::plan_receives(Stream& stream, int sender, bool activations, int micro_batches) {
  stream.buffers.clear();
  stream.receives.clear();
  if (stream.planned_for == micro_batches) return;  // the same messages as the last batch
  stream.planned_for = micro_batches;
  stream.order.clear();
  for (const Action& a : schedule_.actions(sender, stages_, micro_batches)) {
    const bool sends_gradient = a.kind == Action::Backward || a.kind == Action::BackwardInput;
    if (activations ? a.kind != Action::Forward : !sends_gradient) continue;
    const int from = a.chunk * stages_ + sender;
    const int to = activations ? from + 1 : from - 1;
    if (to < 0 || to >= chunk_count() || to % stages_ != stage_) continue;
    stream.order.emplace_back(to / stages_, a.micro_batch);
  }
}

// Note [Pipeline messages on a device]
// A stage's activations and gradients are received where it computes: into tensors of its
// device, which every backend takes (shm stages CUDA tensors through pinned memory, nccl
// moves them as they are), or into meta tensors for a simulated link, whose sim group moves
// meta tensors only. The header of i64 words that announces the activations' shape is read
// on the host, so it travels in host memory unless the group moves CUDA tensors only (nccl).
Device StageRunner::message_device(const Stream& stream) const {
  const Device wire = stream.link.group->device();
  return wire.is_meta() ? wire : device_;
}

Device host_values_device(const comm::ProcessGroup& group) {
  return group.device().is_cuda() ? group.device() : Device::cpu();
}

void StageRunner::post_receives(Stream& stream, bool activations) {
  if (!stream.receives.empty() || stream.order.empty()) return;
  if (activations && !stream.shape) return;  // the header has not come yet
  if (!activations) {
    for (const Key& key : stream.order)
      if (!output_shapes_.count(key.first)) return;  // a chunk whose output is still unknown
  }
  for (const Key& key : stream.order) {
    const auto& [shape, dtype] =
        activations ? std::pair{*stream.shape, stream.dtype} : output_shapes_.at(key.first);
    stream.buffers.push_back(Tensor::empty(shape, dtype, message_device(stream)));
    stream.receives.push_back(stream.link.group->recv(stream.buffers.back(), stream.link.peer));
  }
}

Tensor StageRunner::take(Stream& stream, const Key& key) {
  const bool activations = &stream == activations_in(key.first);
  if (activations && !stream.shape) {
    Tensor words = Tensor::empty({kHeaderWords}, DType::I64, host_values_device(*stream.link.group));
    stream.link.group->recv(words, stream.link.peer)->wait();
    const std::vector<int64_t> w = words.to_vector<int64_t>();
    stream.dtype = static_cast<DType>(w[0]);
    stream.shape = Shape(w.begin() + 2, w.begin() + 2 + w[1]);
  }
  post_receives(stream, activations);
  if (stream.receives.empty()) {
    tag::kPipeline.fail("stage ", stage_, ": the gradient of chunk ", key.first, ", micro-batch ",
                        key.second, " is due before its forward ran");
  }
  for (size_t i = 0; i < stream.order.size(); ++i) {
    if (stream.order[i] != key) continue;
    Trace::Span span(current_trace(), activations ? "wait activations" : "wait gradients",
                     "pipeline", Trace::kMainThread, {{"micro_batch", key.second}, {"chunk", key.first}});
    stream.receives[i]->wait();
    Tensor value = stream.buffers[i];
    stream.buffers[i] = Tensor();
    return value;
  }
  tag::kPipeline.fail("stage ", stage_, ": chunk ", key.first, ", micro-batch ", key.second,
                      " expects a message its neighbour's schedule does not send");
}

double StageRunner::run(const std::vector<Action>& actions, int micro_batches,
                        const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets,
                        double loss_scale, DType compute_dtype,
                        const std::function<void(int chunk)>& before_last_weight_pass) {
  const auto started = std::chrono::steady_clock::now();
  const auto m = static_cast<size_t>(micro_batches);
  if ((has_first_chunk() && inputs.size() != m) || (has_last_chunk() && targets.size() != m))
    tag::kPipeline.fail("stage ", stage_, ": ", m,
                        " micro-batches need as many inputs and targets");
  inputs_.clear();
  outputs_.clear();
  losses_.clear();
  loss_values_.assign(m, 0.0);
  // Every receive of the batch, from the senders' schedules, posted once shapes are known.
  const int p = stages_;
  const std::pair<int, int> receiving[] = {{kActivationsFromPrev, stage_ - 1},
                                           {kActivationsWrapIn, p - 1},
                                           {kGradientsFromNext, stage_ + 1},
                                           {kGradientsWrapIn, 0}};
  for (const auto& [kind, sender] : receiving) {
    auto found = streams_.find(kind);
    if (found == streams_.end()) continue;
    const bool activations = kind == kActivationsFromPrev || kind == kActivationsWrapIn;
    plan_receives(found->second, sender, activations, micro_batches);
    post_receives(found->second, activations);
  }
  // The index of each chunk's last action that computes weight gradients.
  std::vector<size_t> last_weight_pass(static_cast<size_t>(schedule_.chunks_per_stage()),
                                      actions.size());
  for (size_t i = 0; i < actions.size(); ++i) {
    if (actions[i].kind == Action::Backward || actions[i].kind == Action::BackwardWeight)
      last_weight_pass[static_cast<size_t>(actions[i].chunk)] = i;
  }
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    if (before_last_weight_pass && last_weight_pass[static_cast<size_t>(a.chunk)] == i)
      before_last_weight_pass(a.chunk);
    switch (a.kind) {
      case Action::Forward:
        forward(a, inputs, targets, compute_dtype);
        break;
      case Action::Backward:
      case Action::BackwardInput:
        backward(a, loss_scale);
        break;
      case Action::BackwardWeight:
        backward_weight(a);
        break;
    }
  }
  for (const comm::WorkPtr& send : sends_)
    send->wait();
  sends_.clear();
  total_s_ += seconds_since(started);
  double sum = 0;
  for (double v : loss_values_)
    sum += v;
  return has_last_chunk() ? sum / static_cast<double>(m) : 0.0;
}

void StageRunner::forward(const Action& a, const std::vector<Tensor>& inputs,
                          const std::vector<Tensor>& targets, DType compute_dtype) {
  const Key key{a.chunk, a.micro_batch};
  const int chunk = global_chunk(a.chunk);
  Tensor x;
  if (chunk == 0) {
    x = inputs[a.micro_batch];
  } else {
    x = take(*activations_in(a.chunk), key);
    x.set_requires_grad(true);  // a leaf whose gradient goes back to the chunk before
    inputs_[key] = x;
  }
  const auto started = std::chrono::steady_clock::now();
  Trace::Span span(current_trace(), action_label(a, chunk_count() > stages_), "pipeline",
                   Trace::kMainThread, action_args(a));
  Tensor y = x;
  {
    AutocastGuard autocast(compute_dtype);
    for (int64_t layer = bounds_[chunk]; layer < bounds_[chunk + 1]; ++layer)
      y = model_.forward_layer(layer, y);
    if (chunk == chunk_count() - 1) losses_[key] = model_.layer_loss(y, targets[a.micro_batch]);
  }
  busy_s_ += seconds_since(started);
  if (chunk == chunk_count() - 1) {
    loss_values_[a.micro_batch] = losses_[key].item();
    return;
  }
  auto known = output_shapes_.find(a.chunk);
  if (known == output_shapes_.end()) {
    output_shapes_.emplace(a.chunk, std::pair{y.shape(), y.dtype()});
    post_receives(*gradients_in(a.chunk), /*activations=*/false);
  } else if (known->second.first != y.shape() || known->second.second != y.dtype()) {
    tag::kPipeline.fail("stage ", stage_, ": micro-batch ", a.micro_batch, " gives activations ",
                        y.str(), " where an earlier one gave ", shape_str(known->second.first), " ",
                        dtype_name(known->second.second),
                        "; every micro-batch must have the same shape");
  }
  outputs_[key] = y;
  Stream& out = *activations_out(a.chunk);
  if (!out.header_sent) {
    if (y.dim() > kHeaderWords - 2) tag::kPipeline.fail("activations of more than 6 dimensions");
    std::vector<int64_t> words(kHeaderWords, 0);
    words[0] = static_cast<int64_t>(y.dtype());
    words[1] = y.dim();
    for (int64_t d = 0; d < y.dim(); ++d)
      words[2 + d] = y.size(d);
    sends_.push_back(out.link.group->send(
        Tensor::from_vector(words, {kHeaderWords}, host_values_device(*out.link.group)), out.link.peer));
    out.header_sent = true;
  }
  sends_.push_back(out.link.group->send(y.detach().contiguous(), out.link.peer));
}

// A whole backward, or its input half (Note [Split backward] in tensor/autograd/engine.cpp)
// with the weight half kept for backward_weight.
void StageRunner::backward(const Action& a, double loss_scale) {
  const Key key{a.chunk, a.micro_batch};
  const int chunk = global_chunk(a.chunk);
  Tensor root, seed;
  if (chunk == chunk_count() - 1) {
    root = loss_scale != 1.0 ? mul(losses_.at(key), loss_scale) : losses_.at(key);
  } else {
    seed = take(*gradients_in(a.chunk), key);
    root = outputs_.at(key);
  }
  {
    const auto started = std::chrono::steady_clock::now();
    Trace::Span span(current_trace(), action_label(a, chunk_count() > stages_), "pipeline",
                     Trace::kMainThread, action_args(a));
    if (a.kind == Action::Backward) {
      root.backward(seed);
    } else {
      std::vector<Tensor> wanted;
      if (chunk > 0) wanted.push_back(inputs_.at(key));
      weight_halves_[key] = autograd::run_backward_input({root}, {seed}, wanted);
    }
    busy_s_ += seconds_since(started);
  }
  if (chunk > 0) {
    const Tensor g = inputs_.at(key).grad();
    if (!g.defined()) {
      tag::kPipeline.fail("stage ", stage_, ": micro-batch ", a.micro_batch,
                          "'s input got no gradient");
    }
    Stream& out = *gradients_out(a.chunk);
    sends_.push_back(out.link.group->send(g.contiguous(), out.link.peer));
  }
  inputs_.erase(key);
  outputs_.erase(key);
  losses_.erase(key);
}

void StageRunner::backward_weight(const Action& a) {
  const Key key{a.chunk, a.micro_batch};
  auto half = weight_halves_.find(key);
  if (half == weight_halves_.end()) {
    tag::kPipeline.fail("stage ", stage_, ": the weight half of micro-batch ", a.micro_batch,
                        " before its input half");
  }
  const auto started = std::chrono::steady_clock::now();
  Trace::Span span(current_trace(), action_label(a, chunk_count() > stages_), "pipeline",
                   Trace::kMainThread, action_args(a));
  half->second.run();
  weight_halves_.erase(half);
  busy_s_ += seconds_since(started);
}

}  // namespace loom::strategies::pipeline
