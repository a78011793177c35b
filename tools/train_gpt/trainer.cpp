#include "tools/train_gpt/trainer.h"

#include <chrono>
#include <cmath>
#include <optional>
#include <thread>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/tags.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "optim/lr_schedule.h"
#include "optim/sgd.h"
#include "strategies/memory_estimate.h"
#include "strategies/memory_report.h"
#include "strategies/trace.h"
#include "tensor/autocast.h"
#include "tensor/ops.h"
#include "tools/train_gpt/graphed_step.h"
#include "tools/train_gpt/train_state.h"

namespace loom::train_gpt {

namespace {

// nanoGPT's grouping: weight decay for matrices and embeddings, none for biases and norms.
std::vector<optim::ParamGroup> decay_groups(const nn::Module& model, double weight_decay) {
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
  tag::kTrainGpt.fail("unknown --schedule '", o.schedule, "'; expected 'constant' or 'cosine'");
}

}  // namespace

nn::ModelSpec model_spec(const TrainOptions& o) {
  nn::ModelSpec spec{.architecture = o.architecture, .gpt = o.model, .llama = o.llama};
  nn::LlamaConfig& l = spec.llama;
  l.layers = o.model.layers;
  l.heads = o.model.heads;
  l.hidden = o.model.embd;
  l.context = o.model.context;
  l.vocab_size = o.model.vocab_size;
  l.checkpoint_activations = o.model.checkpoint_activations;
  l.options = o.model.options;
  return spec;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const nn::Module& model, const TrainOptions& o) {
  if (o.optimizer == "adamw") {
    return std::make_unique<optim::AdamW>(decay_groups(model, o.weight_decay),
                                          optim::AdamWOptions{.lr = o.lr,
                                                              .beta1 = o.beta1,
                                                              .beta2 = o.beta2,
                                                              .eps = o.eps,
                                                              .weight_decay = o.weight_decay});
  }
  if (o.optimizer == "sgd") {
    return std::make_unique<optim::SGD>(decay_groups(model, o.weight_decay),
                                        optim::SGDOptions{.lr = o.lr,
                                                          .momentum = o.momentum,
                                                          .dampening = o.dampening,
                                                          .weight_decay = o.weight_decay,
                                                          .nesterov = o.nesterov});
  }
  tag::kTrainGpt.fail("unknown --optimizer '", o.optimizer, "'; expected 'adamw' or 'sgd'");
}

std::string metrics_json_line(const StepMetrics& m) {
  nlohmann::json by_kind = nlohmann::json::object();
  for (size_t k = 0; k < kMemoryKindCount; ++k)
    by_kind[memory_kind_name(static_cast<MemoryKind>(k))] = m.memory.peak_by_kind[k];
  nlohmann::json line{{"step", m.step},
                        {"loss", m.loss},
                        {"lr", m.lr},
                        {"grad_norm", m.grad_norm},
                        {"tokens_per_s", m.tokens_per_s},
                        {"ms_per_step", m.ms_per_step},
                        {"peak_bytes", m.memory.peak_bytes},
                        {"peak_bytes_by_kind", by_kind}};
  if (m.val_loss) line["val_loss"] = *m.val_loss;
  return line.dump();
}

namespace {

// The mean loss of `batches` validation blocks per rank (rank r of W reads positions
// i * W + r), averaged over the data-parallel ranks; every rank of the strategy calls it.
double validation_loss(nn::CausalLM& model, const data::TokenBlocks& validation,
                       int64_t batches, strategies::Strategy& s) {
  NoGradGuard no_grad;
  const int64_t world = s.data_parallel_size(), rank = s.data_parallel_rank();
  double sum = 0;
  for (int64_t i = 0; i < batches; ++i) {
    const data::Batch batch = validation.block(validation.block_at(i * world + rank));
    sum += model.loss(batch.tokens, batch.targets).item();
  }
  double mean = sum / static_cast<double>(batches);
  if (s.world_size() > 1) {
    Tensor t = Tensor::full({1}, mean, DType::F64, s.root_device());
    mean = s.all_reduce(t, comm::ReduceOp::Avg).item();
  }
  return mean;
}

// What GraphedStep cannot capture (graphed_step.h), named by its flag.
void check_cuda_graph_allowed(const strategies::Strategy& s, int64_t grad_accum,
                              const optim::AdamW* adamw) {
  if (s.name() != "single_device" || s.world_size() != 1) {
    tag::kTrainGpt.fail("--cuda-graph captures a single-device step; --strategy ", s.name(),
                        " over ", s.world_size(),
                        " ranks is not supported (use --strategy single_device)");
  }
  if (grad_accum > 1) {
    tag::kTrainGpt.fail("--cuda-graph with --grad-accum ", grad_accum,
                        ": a replayed micro-batch overwrites the gradients the others "
                        "accumulate; use --grad-accum 1");
  }
  if (s.loss_scaler() != nullptr) {
    tag::kTrainGpt.fail("--cuda-graph with a loss scaler (--precision 16-mixed): the scale is "
                        "a host value the capture would freeze; use bf16-mixed or 32-true");
  }
  if (adamw == nullptr) {
    tag::kTrainGpt.fail("--cuda-graph with --optimizer sgd: only AdamW reads its learning rate "
                        "and step from device memory, as a replayed step needs; use --optimizer "
                        "adamw");
  }
}

[[noreturn]] void fail_diverged(int64_t step, double norm, double loss) {
  tag::kTrainGpt.fail("step ", step + 1, ": the gradient norm is ", norm, " (loss ", loss,
                      "); training diverged, try a lower --lr or --grad-clip 1");
}

// One step of --cuda-graph (graphed_step.h): the whole step run, captured or replayed; the
// loss and the gradient norm read back after it. Returns {loss, norm}.
std::pair<double, double> graphed_step(GraphedStep& graphed, const data::Batch& host_batch,
                                       nn::CausalLM& model, strategies::Strategy& s,
                                       optim::Optimizer& optimizer, optim::AdamW& adamw,
                                       double grad_clip, WeightCastPlan& weight_cast_plan) {
  const data::Batch batch = graphed.stage(host_batch);
  auto loss_of_rows = [&](nn::Module& m, int64_t, int64_t) {
    return static_cast<nn::CausalLM&>(m).loss(batch.tokens, batch.targets);
  };
  const GraphedStep::Outputs out = graphed.run(
      [&] {
        optimizer.zero_grad();  // the warm-up step's: the captured backward writes anew
        std::optional<WeightCastScope> weight_casts;
        if (s.compute_dtype() != DType::F32)
          weight_casts.emplace(s.parameters_held_through_step(), &weight_cast_plan);
        Tensor loss = s.train_batch(batch.tokens, batch.targets, loss_of_rows, 1.0);
        weight_casts.reset();
        const optim::DeviceClip clip = optim::clip_grad_norm_on_device(
            model.parameters(), grad_clip > 0 ? grad_clip : optim::kInfNorm);
        adamw.set_grad_scale(grad_clip > 0 ? clip.factor : Tensor());
        s.optimizer_step(optimizer);  // the gradients stay: prepare_replay() reads them
        return GraphedStep::Outputs{loss, clip.total_norm};
      },
      [&] { adamw.prepare_replay(); });
  return {out.loss.item(), out.grad_norm.item()};
}

}  // namespace

void train(nn::CausalLM& model, const data::TokenBlocks& data, const TrainOptions& options,
           const std::function<void(const StepMetrics&)>& on_step, strategies::Strategy* strategy,
           const data::TokenBlocks* validation) {
  const strategies::StrategyOptions single_options;
  strategies::SingleDeviceStrategy single(single_options);
  strategies::Strategy& s = strategy != nullptr ? *strategy : single;
  TrainCheckpoints checkpoints(options, s);
  const int64_t first_step = checkpoints.open(model);  // before the strategy copies it
  const int64_t first_position = checkpoints.data_position();
  // dp's replicas, and a pipeline's sample for balancing its stages by time.
  s.set_model_recipe({.make_replica = [&model]() -> std::unique_ptr<nn::Module> {
                        return model.make_like();
                      },
                      .sample_input = data.for_step(0).tokens});
  s.setup_module(model);
  auto schedule = make_schedule(options);
  const std::unique_ptr<optim::Optimizer> made = make_optimizer(model, options);
  optim::Optimizer& optimizer = *made;
  s.setup_optimizer(optimizer);
  checkpoints.load_state(optimizer);
  strategies::reset_memory_peaks(s.root_device());  // peaks of training, not of setup
  const int64_t accum = std::max<int64_t>(options.grad_accum, 1);
  // Replicas read different data; the ranks of one replica (pipeline stages) the same.
  const int64_t world = s.data_parallel_size(), rank = s.data_parallel_rank();
  // The blocks every rank together has read before `step` of this run.
  auto position_before = [&](int64_t step) {
    return first_position + (step - first_step) * accum * world;
  };
  strategies::Trace* trace = strategies::current_trace();
  const bool casts_outlive_last_forward =
      strategies::weight_casts_outlive_last_forward(model_spec(options));
  const std::thread::id training_thread = std::this_thread::get_id();
  // The weights a step cast, cast together at the next step's first cast (tensor/autocast.h).
  WeightCastPlan weight_cast_plan;
  // --cuda-graph: the step captured at the second step, replayed after it.
  std::unique_ptr<GraphedStep> graphed;
  optim::AdamW* adamw = dynamic_cast<optim::AdamW*>(&optimizer);
  if (options.cuda_graph) {
    check_cuda_graph_allowed(s, accum, adamw);
    graphed = std::make_unique<GraphedStep>(s.root_device());
    adamw->set_capturable(true);
  }
  for (int64_t step = first_step; step < options.steps; ++step) {
    auto start = std::chrono::steady_clock::now();
    strategies::Trace::Span step_span(trace, "step " + std::to_string(step), "step",
                                      strategies::Trace::kMainThread, {{"step", step}});
    // Micro-step k of rank r reads the block at position_before(step) + k * world + r;
    // gradients of the accum micro-batches are summed locally (no sync) and averaged across
    // ranks once.
    double local_loss = 0, norm = 0;
    int64_t tokens = 0;
    const double lr = schedule->lr_at(step);
    if (graphed) {
      schedule->apply(optimizer, step);
      const data::Batch batch = data.block(data.block_at(position_before(step) + rank));
      std::tie(local_loss, norm) = graphed_step(*graphed, batch, model, s, optimizer, *adamw,
                                                options.grad_clip, weight_cast_plan);
      tokens = batch.tokens.numel();
      // The update has run: a replayed step cannot stop before it.
      if (!std::isfinite(norm)) fail_diverged(step, norm, local_loss);
    } else {
      // Autocast casts each weight once per step, for every micro-batch and recomputation
      // (tensor/autocast.h); the cache ends with the last micro-batch's forward where nothing
      // recomputes it (strategies/memory_estimate.h), else before the optimizer changes the
      // weights. Only this thread's forwards use it (dp's replicas run on their own threads).
      std::optional<WeightCastScope> weight_casts;
      if (s.compute_dtype() != DType::F32)
        weight_casts.emplace(s.parameters_held_through_step(), &weight_cast_plan);
      for (int64_t k = 0; k < accum; ++k) {
        const strategies::Trace::Args args = {{"step", step}, {"micro_step", k}};
        data::Batch batch = data.block(data.block_at(position_before(step) + k * world + rank));
        s.set_backward_sync(k == accum - 1);
        // The "backward" span opens when the forward on the training thread ends and closes
        // when forward_backward returns; under dp it also covers the replicas' reduction.
        std::optional<strategies::Trace::Span> backward_span;
        auto loss_of_rows = [&](nn::Module& m, int64_t row_begin, int64_t row_end) {
          const bool main_thread = &m == &model;
          std::optional<strategies::Trace::Span> span;
          if (main_thread)
            span.emplace(trace, "forward", "step", strategies::Trace::kMainThread, args);
          const int64_t rows = batch.tokens.size(0);
          Tensor loss =
              row_begin == 0 && row_end == rows
                  ? static_cast<nn::CausalLM&>(m).loss(batch.tokens, batch.targets)
                  : static_cast<nn::CausalLM&>(m).loss(
                        batch.tokens.narrow(0, row_begin, row_end - row_begin).contiguous(),
                        batch.targets.narrow(0, row_begin, row_end - row_begin).contiguous());
          if (main_thread) {
            span.reset();
            backward_span.emplace(trace, "backward", "step", strategies::Trace::kMainThread, args);
          }
          if (k == accum - 1 && !casts_outlive_last_forward &&
              std::this_thread::get_id() == training_thread)
            weight_casts.reset();
          return loss;
        };
        const double scale = accum > 1 ? 1.0 / static_cast<double>(accum) : 1.0;
        Tensor loss = s.train_batch(batch.tokens, batch.targets, loss_of_rows, scale);
        backward_span.reset();
        local_loss += loss.item() / static_cast<double>(accum);
        tokens += batch.tokens.numel();
      }
      weight_casts.reset();
      // Clipping, the lr schedule, the update and zero_grad (ended by reset() below).
      std::optional<strategies::Trace::Span> optimizer_span;
      optimizer_span.emplace(trace, "optimizer", "step", strategies::Trace::kMainThread,
                             strategies::Trace::Args{{"step", step}});
      s.unscale_gradients();
      norm = options.grad_clip > 0 ? s.clip_gradients(options.grad_clip) : s.gradient_norm();
      if (!std::isfinite(norm) && !s.skips_step()) fail_diverged(step, norm, local_loss);
      schedule->apply(optimizer, step);
      s.optimizer_step(optimizer);
      optimizer.zero_grad();
      optimizer_span.reset();
    }
    // The step's loss averaged over every rank's micro-batches (sync_dist mean).
    double loss = local_loss;
    if (world > 1) {
      Tensor mean = Tensor::full({1}, local_loss, DType::F64, s.root_device());
      loss = s.all_reduce(mean, comm::ReduceOp::Avg).item();
    }
    double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::optional<double> val_loss;
    if (validation && options.eval_every > 0 && (step + 1) % options.eval_every == 0)
      val_loss = validation_loss(model, *validation, options.eval_batches, s);
    on_step({.step = step,
             .loss = loss,
             .lr = lr,
             .grad_norm = norm,
             .ms_per_step = ms,
             .tokens_per_s = static_cast<double>(tokens * world) / (ms / 1e3),
             .memory = strategies::max_over_ranks(
                 s, strategies::local_memory_report(s.root_device())),
             .val_loss = val_loss});
    checkpoints.after_step(step + 1, position_before(step + 1), model, optimizer);
  }
  checkpoints.finish();  // an asynchronous save still being written
  s.gather_full_module();  // sharded strategies: the whole model on every rank again
}

}  // namespace loom::train_gpt
