#pragma once
// The training loop of train_gpt, as a function so that tests can run it in-process.
// One step: read the step's block, forward, backward, clip (optional), set the scheduled lr,
// AdamW step, drop the gradients.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/token_blocks.h"
#include "nn/pretrained.h"
#include "optim/optimizer.h"
#include "strategies/memory_report.h"
#include "strategies/strategy.h"

namespace loom::train_gpt {

struct TrainOptions {
  // The sizes every architecture shares (layers, heads, embd: Llama's hidden size, context,
  // vocabulary) and GPT-2's whole configuration.
  nn::GPTConfig model;
  // --model, and Llama's own settings (its shared sizes are model's).
  nn::Architecture architecture = nn::Architecture::kGpt2;
  nn::LlamaConfig llama;
  int64_t batch = 8;  // per rank
  int64_t steps = 200;
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.1;  // only for parameters with 2 or more dimensions
  std::string optimizer = "adamw";  // or "sgd", with the three below (torch.optim.SGD's)
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  double grad_clip = 1.0;     // 0 = off
  uint64_t seed = 0;
  int64_t warmup_steps = 0;
  std::string schedule = "constant";  // or "cosine" (to 0.1 x lr at the last step)
  int64_t grad_accum = 1;             // micro-batches per optimizer step
  // Validation (train()'s `validation` data): every eval_every steps (0: never), the mean loss
  // of eval_batches blocks per rank, averaged over the ranks.
  int64_t eval_every = 0;
  int64_t eval_batches = 8;
  // Resumable checkpoints (train_state.h): every save_every steps (0: never) under
  // checkpoint_dir, keeping the keep_last newest (0: all); resume "" (no), "auto" (the newest
  // committed checkpoint under checkpoint_dir, if any) or a checkpoint's path.
  std::string checkpoint_dir;
  int64_t save_every = 0;
  int keep_last = 0;
  std::string resume;
  bool async_save = false;  // write checkpoints in the background (train_state.h)
  // "full": the weights gathered into model.safetensors (Hugging Face layout), "sharded":
  // every rank writes the parts it holds; "auto": sharded under the sharded strategies.
  std::string checkpoint_format = "auto";
  // --cuda-graph: the single-device CUDA step captured at the second step and replayed after
  // it (graphed_step.h).
  bool cuda_graph = false;
};

struct StepMetrics {
  int64_t step;
  double loss;       // mean training loss of this step's forward
  double lr;         // learning rate used by this step's update
  double grad_norm;  // global gradient norm before clipping
  double ms_per_step;
  double tokens_per_s;  // all ranks together
  // Peak tensor bytes so far, the largest over ranks (strategies/memory_report.h).
  strategies::MemoryReport memory;
  std::optional<double> val_loss;  // after this step's evaluation (TrainOptions::eval_every)
};

// One line of the --metrics JSONL file: {"step", "loss", "lr", "grad_norm", "tokens_per_s",
// "ms_per_step", "peak_bytes", "peak_bytes_by_kind": {"activations", "parameters",
// "gradients", "optimizer_state", "communication", "offloaded"}, and "val_loss" after an
// evaluation}, no trailing newline.
std::string metrics_json_line(const StepMetrics& m);

// The optimizer train() builds for `model`: options.optimizer (AdamW or SGD) over nanoGPT's
// groups (weight decay for parameters of 2 or more dimensions, none for the others).
std::unique_ptr<optim::Optimizer> make_optimizer(const nn::Module& model,
                                                 const TrainOptions& options);
// The model options describe: the architecture with the shared sizes filled in.
nn::ModelSpec model_spec(const TrainOptions& options);

// Trains `model` in place on `data` and calls on_step after each step. `strategy` (already
// through setup_environment) spreads the work; null means single_device. The data order:
// micro-step k of a step reads, on rank r of W data-parallel ranks, the block at position
// p + k * W + r, p being the blocks all ranks read before (so a resumed run goes on where its
// checkpoint stopped, at any world size). `validation`: the data of options.eval_every.
void train(nn::CausalLM& model, const data::TokenBlocks& data, const TrainOptions& options,
           const std::function<void(const StepMetrics&)>& on_step,
           strategies::Strategy* strategy = nullptr,
           const data::TokenBlocks* validation = nullptr);

}  // namespace loom::train_gpt
