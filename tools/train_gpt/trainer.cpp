#include "tools/train_gpt/trainer.h"

#include <chrono>
#include <cmath>

#include <nlohmann/json.hpp>

#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/lr_schedule.h"

namespace loom::train_gpt {

namespace {

// nanoGPT's grouping: weight decay for matrices and embeddings, none for biases and norms.
std::vector<optim::ParamGroup> decay_groups(const nn::GPT& model, double weight_decay) {
  optim::ParamGroup decay{.params = {}, .weight_decay = weight_decay};
  optim::ParamGroup no_decay{.params = {}, .weight_decay = 0.0};
  for (const Tensor& p : model.parameters())
    (p.dim() >= 2 ? decay : no_decay).params.push_back(p);
  return {decay, no_decay};
}

std::unique_ptr<optim::LrSchedule> make_schedule(const TrainOptions& o) {
  if (o.schedule == "cosine") {
    return std::make_unique<optim::WarmupCosineSchedule>(o.lr, o.warmup_steps, o.steps, 0.1 * o.lr);
  }
  if (o.schedule == "constant") {
    // Linear warmup, then flat: a cosine whose floor is its peak.
    return std::make_unique<optim::WarmupCosineSchedule>(o.lr, o.warmup_steps,
                                                         std::max(o.steps, o.warmup_steps), o.lr);
  }
  fail("[train_gpt] unknown --schedule '", o.schedule, "'; expected 'constant' or 'cosine'");
}

}  // namespace

std::string metrics_json_line(const StepMetrics& m) {
  return nlohmann::json{{"step", m.step},
                        {"loss", m.loss},
                        {"lr", m.lr},
                        {"grad_norm", m.grad_norm},
                        {"tokens_per_s", m.tokens_per_s},
                        {"ms_per_step", m.ms_per_step}}
      .dump();
}

void train(nn::GPT& model, const TokenBlocks& data, const TrainOptions& options,
           const std::function<void(const StepMetrics&)>& on_step) {
  auto schedule = make_schedule(options);
  optim::AdamW optimizer(decay_groups(model, options.weight_decay),
                         {.lr = options.lr,
                          .beta1 = options.beta1,
                          .beta2 = options.beta2,
                          .eps = options.eps,
                          .weight_decay = options.weight_decay});
  std::vector<Tensor> params = model.parameters();
  for (int64_t step = 0; step < options.steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    Batch batch = data.for_step(step);
    Tensor loss = model.loss(batch.tokens, batch.targets);
    loss.backward();
    double norm = options.grad_clip > 0 ? optim::clip_grad_norm(params, options.grad_clip)
                                        : optim::grad_norm(params);
    if (!std::isfinite(norm)) {
      fail("[train_gpt] step ", step, ": the gradient norm is ", norm, " (loss ", loss.item(),
           "); training diverged, try a lower --lr or --grad-clip 1");
    }
    double lr = schedule->lr_at(step);
    schedule->apply(optimizer, step);
    optimizer.step();
    optimizer.zero_grad();
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    on_step({.step = step,
             .loss = loss.item(),
             .lr = lr,
             .grad_norm = norm,
             .ms_per_step = ms,
             .tokens_per_s = static_cast<double>(batch.tokens.numel()) / (ms / 1e3)});
  }
}

}  // namespace loom::train_gpt
