#include "tools/train_gpt/trainer.h"

#include <chrono>
#include <cmath>
#include <optional>

#include <nlohmann/json.hpp>

#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/lr_schedule.h"
#include "strategies/trace.h"
#include "tensor/ops.h"

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
           const std::function<void(const StepMetrics&)>& on_step, strategies::Strategy* strategy) {
  strategies::SingleDeviceStrategy single(strategies::StrategyOptions{});
  strategies::Strategy& s = strategy != nullptr ? *strategy : single;
  s.setup_module(model);
  auto schedule = make_schedule(options);
  optim::AdamW optimizer(decay_groups(model, options.weight_decay),
                         {.lr = options.lr,
                          .beta1 = options.beta1,
                          .beta2 = options.beta2,
                          .eps = options.eps,
                          .weight_decay = options.weight_decay});
  s.setup_optimizer(optimizer);
  std::vector<Tensor> params = model.parameters();
  const int64_t accum = std::max<int64_t>(options.grad_accum, 1);
  const int64_t world = s.world_size(), rank = s.rank();
  strategies::Trace* trace = strategies::current_trace();
  for (int64_t step = 0; step < options.steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    strategies::Trace::Span step_span(trace, "step " + std::to_string(step), "step",
                                      strategies::Trace::kMainThread, {{"step", step}});
    // Micro-step m = step * accum + k of rank r reads block m * world + r; gradients of the
    // accum micro-batches are summed locally (no sync) and averaged across ranks once.
    double local_loss = 0;
    int64_t tokens = 0;
    for (int64_t k = 0; k < accum; ++k) {
      const strategies::Trace::Args args = {{"step", step}, {"micro_step", k}};
      Batch batch = data.for_step(step * accum + k, rank, world);
      Tensor loss;
      {
        strategies::Trace::Span span(trace, "forward", "step", strategies::Trace::kMainThread,
                                     args);
        loss = model.loss(batch.tokens, batch.targets);
        local_loss += loss.item() / static_cast<double>(accum);
      }
      tokens += batch.tokens.numel();
      s.set_backward_sync(k == accum - 1);
      strategies::Trace::Span span(trace, "backward", "step", strategies::Trace::kMainThread, args);
      s.backward(accum > 1 ? mul(loss, 1.0 / static_cast<double>(accum)) : loss);
    }
    // Clipping, the lr schedule, the update and zero_grad (ended by reset() below).
    std::optional<strategies::Trace::Span> optimizer_span;
    optimizer_span.emplace(trace, "optimizer", "step", strategies::Trace::kMainThread,
                           strategies::Trace::Args{{"step", step}});
    double norm = options.grad_clip > 0 ? optim::clip_grad_norm(params, options.grad_clip)
                                        : optim::grad_norm(params);
    if (!std::isfinite(norm)) {
      fail("[train_gpt] step ", step, ": the gradient norm is ", norm, " (loss ", local_loss,
           "); training diverged, try a lower --lr or --grad-clip 1");
    }
    double lr = schedule->lr_at(step);
    schedule->apply(optimizer, step);
    s.optimizer_step(optimizer);
    optimizer.zero_grad();
    optimizer_span.reset();
    // The step's loss averaged over every rank's micro-batches (sync_dist mean).
    double loss = local_loss;
    if (world > 1) {
      loss = s.all_reduce(Tensor::full({1}, local_loss, DType::F64), comm::ReduceOp::Avg).item();
    }
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    on_step({.step = step,
             .loss = loss,
             .lr = lr,
             .grad_norm = norm,
             .ms_per_step = ms,
             .tokens_per_s = static_cast<double>(tokens * world) / (ms / 1e3)});
  }
}

}  // namespace loom::train_gpt
