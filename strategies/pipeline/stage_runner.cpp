#include "strategies/pipeline/stage_runner.h"

#include <chrono>

#include "tensor/autocast.h"
#include "tensor/error.h"
#include "tensor/ops.h"

namespace loom::strategies::pipeline {

namespace {
constexpr int kHeaderWords = 8;  // dtype, rank, up to 6 dimensions

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

StageRunner::StageRunner(const nn::LayeredModel& model, int stage, int stages, int64_t layer_begin,
                         int64_t layer_end, StageLinks links)
    : model_(model),
      stage_(stage),
      stages_(stages),
      layer_begin_(layer_begin),
      layer_end_(layer_end),
      links_(std::move(links)) {
  if ((stage > 0) != (links_.from_prev != nullptr) || (stage > 0) != (links_.grads_to_prev != nullptr) ||
      (stage + 1 < stages) != (links_.to_next != nullptr) ||
      (stage + 1 < stages) != (links_.grads_from_next != nullptr)) {
    fail("[pipeline] stage ", stage, " of ", stages, ": links to its neighbours are missing");
  }
}

void StageRunner::send_header(const Tensor& output) {
  if (output.dim() > kHeaderWords - 2) fail("[pipeline] activations of more than 6 dimensions");
  std::vector<int64_t> words(kHeaderWords, 0);
  words[0] = static_cast<int64_t>(output.dtype());
  words[1] = output.dim();
  for (int64_t d = 0; d < output.dim(); ++d)
    words[2 + d] = output.size(d);
  sends_.push_back(links_.to_next->send(Tensor::from_vector(words, {kHeaderWords}), 1));
  out_shape_ = output.shape();
  out_dtype_ = output.dtype();
}

void StageRunner::receive_header() {
  Tensor words = Tensor::empty({kHeaderWords}, DType::I64);
  links_.from_prev->recv(words, 0)->wait();
  const std::vector<int64_t> w = words.to_vector<int64_t>();
  in_dtype_ = static_cast<DType>(w[0]);
  in_shape_ = Shape(w.begin() + 2, w.begin() + 2 + w[1]);
}

void StageRunner::post_gradient_receives() {
  if (last() || !out_shape_ || grad_receives_.empty() || grad_receives_[0]) return;
  for (size_t k = 0; k < grads_.size(); ++k) {
    grads_[k] = Tensor::empty(*out_shape_, out_dtype_);
    grad_receives_[k] = links_.grads_from_next->recv(grads_[k], 1);
  }
}

double StageRunner::run(const std::vector<Action>& actions, int micro_batches,
                        const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets,
                        double loss_scale, DType compute_dtype) {
  const auto started = std::chrono::steady_clock::now();
  const auto m = static_cast<size_t>(micro_batches);
  if ((first() && inputs.size() != m) || (last() && targets.size() != m))
    fail("[pipeline] stage ", stage_, ": ", m, " micro-batches need as many inputs and targets");
  for (auto* v : {&received_, &inputs_, &outputs_, &losses_, &grads_})
    v->assign(m, Tensor());
  loss_values_.assign(m, 0.0);
  receives_.assign(m, nullptr);
  grad_receives_.assign(m, nullptr);
  if (!first()) {
    if (!in_shape_) receive_header();
    for (size_t k = 0; k < m; ++k) {
      received_[k] = Tensor::empty(*in_shape_, in_dtype_);
      receives_[k] = links_.from_prev->recv(received_[k], 0);
    }
  }
  post_gradient_receives();  // from the second batch on; the first posts them after a forward
  for (const Action& a : actions) {
    if (a.kind == Action::Forward) {
      forward(a.micro_batch, inputs, targets, compute_dtype);
      post_gradient_receives();
    } else {
      backward(a.micro_batch, loss_scale);
    }
  }
  for (const comm::WorkPtr& send : sends_)
    send->wait();
  sends_.clear();
  total_s_ += seconds_since(started);
  double sum = 0;
  for (double v : loss_values_)
    sum += v;
  return last() ? sum / static_cast<double>(m) : 0.0;
}

void StageRunner::forward(int k, const std::vector<Tensor>& inputs,
                          const std::vector<Tensor>& targets, DType compute_dtype) {
  Tensor x;
  if (first()) {
    x = inputs[k];
  } else {
    receives_[k]->wait();
    x = received_[k];
    x.set_requires_grad(true);  // a leaf whose gradient goes back to the previous stage
    inputs_[k] = x;
  }
  const auto started = std::chrono::steady_clock::now();
  Tensor y = x;
  {
    AutocastGuard autocast(compute_dtype);
    for (int64_t layer = layer_begin_; layer < layer_end_; ++layer)
      y = model_.forward_layer(layer, y);
    if (last()) losses_[k] = model_.layer_loss(y, targets[k]);
  }
  busy_s_ += seconds_since(started);
  if (last()) {
    loss_values_[k] = losses_[k].item();
    return;
  }
  if (!out_shape_) {
    send_header(y);
  } else if (y.shape() != *out_shape_ || y.dtype() != out_dtype_) {
    fail("[pipeline] stage ", stage_, ": micro-batch ", k, " gives activations ", y.str(),
         " where the pipeline agreed on ", shape_str(*out_shape_), " ", dtype_name(out_dtype_),
         "; every micro-batch must have the same shape");
  }
  outputs_[k] = y;
  sends_.push_back(links_.to_next->send(y.detach().contiguous(), 1));
}

void StageRunner::backward(int k, double loss_scale) {
  if (!last()) grad_receives_[k]->wait();
  const auto started = std::chrono::steady_clock::now();
  if (last()) {
    (loss_scale != 1.0 ? mul(losses_[k], loss_scale) : losses_[k]).backward();
  } else {
    outputs_[k].backward(grads_[k]);
  }
  busy_s_ += seconds_since(started);
  if (!first()) {
    const Tensor g = inputs_[k].grad();
    if (!g.defined()) fail("[pipeline] stage ", stage_, ": micro-batch ", k, "'s input got no gradient");
    sends_.push_back(links_.grads_to_prev->send(g.contiguous(), 0));
  }
  for (auto* v : {&received_, &inputs_, &outputs_, &losses_, &grads_})
    (*v)[k] = Tensor();
}

}  // namespace loom::strategies::pipeline
