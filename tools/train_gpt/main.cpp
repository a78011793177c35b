// train_gpt: trains a GPT-2-style model on bytes (vocab 256), the way a user of the library
// would write a trainer. With no flags it trains the default small model on the embedded
// default corpus. See README.md for the flags.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <optional>
#include <thread>

#include "core/regular_file.h"
#include "core/tags.h"
#include "kernels/cpu/thread_pool.h"
#include "nn/gpt_io.h"
#include "strategies/deepspeed_config.h"
#include "strategies/devices.h"
#include "strategies/memory_estimate.h"
#include "strategies/memory_report.h"
#include "strategies/pipeline/pipeline_strategy.h"
#include "strategies/registry.h"
#include "strategies/sharded/sharded_strategy.h"
#include "strategies/trace.h"
#include "tensor/allocator.h"
#if LOOM_WITH_CUDA
#include "tensor/cuda/caching_allocator.h"
#endif
#include "data/default_corpus.h"
#include "tools/train_gpt/flag_checks.h"
#include "tools/train_gpt/progress.h"
#include "tools/train_gpt/trainer.h"

namespace {

using namespace loom;

using namespace loom::train_gpt;

// Throughput over the steps after warm-up (the first steps pay for cuBLASLt heuristics, the
// allocator's first segments and lazy initialisation): steps from first_step() on.
class Throughput {
 public:
  explicit Throughput(int64_t steps) : first_(steps > 4 ? 2 : 0) {}
  void add(const StepMetrics& m) {
    if (m.step < first_) return;
    ms_ += m.ms_per_step;
    tokens_ += m.tokens_per_s * m.ms_per_step / 1e3;
    ++count_;
  }
  int64_t first_step() const { return first_; }
  int64_t steps() const { return count_; }
  double ms_per_step() const { return count_ ? ms_ / static_cast<double>(count_) : 0.0; }
  double tokens_per_s() const { return ms_ > 0 ? tokens_ / (ms_ / 1e3) : 0.0; }

 private:
  int64_t first_;
  int64_t count_ = 0;
  double ms_ = 0, tokens_ = 0;
};

// At least this many steps before "more than half were skipped" fails a run (a loss scale
// finding its level skips a few steps at the start).
constexpr int64_t kSkipLimitSteps = 20;

constexpr const char* kDataExpected = "--data file (its bytes are the tokens)";

// --data's bytes; only a regular file is read (a FIFO would block, /dev/zero never end).
std::vector<uint8_t> read_bytes(const std::string& path) {
  const std::string bytes = read_regular_file(path, tag::kTrainGpt, kDataExpected);
  return {bytes.begin(), bytes.end()};
}

// The architecture from --init's file; flags given explicitly must agree with it.
nn::GPTConfig config_from_init(const safetensors::Contents& contents, const nn::GPTConfig& flags,
                               const CLI::App& app) {
  nn::GPTConfig file = nn::gpt_config_from_checkpoint(contents, flags.heads);
  auto agree = [&](const char* flag, int64_t given, int64_t stored) {
    if (app.count(flag) > 0 && given != stored) {
      tag::kTrainGpt.fail(flag, " ", given, " does not match the --init checkpoint, which has ",
                          stored, "; drop the flag to take the checkpoint's value");
    }
  };
  agree("--layers", flags.layers, file.layers);
  agree("--embd", flags.embd, file.embd);
  agree("--vocab", flags.vocab_size, file.vocab_size);
  agree("--ctx", flags.context, file.context);
  agree("--heads", flags.heads, file.heads);
  return file;
}

// Applies a DeepSpeed config to the run: it selects the strategy (returned) and sets what it
// names (batch, accumulation, clipping, precision, AdamW's hyper-parameters). A flag given
// explicitly must agree with it; DeepSpeed's defaults hold for what it leaves out
// (gradient_clipping absent: no clipping).
std::string take_deepspeed_config(const strategies::DeepSpeedConfig& config, const CLI::App& app,
                                  TrainOptions& o, strategies::StrategyOptions& options) {
  if (app.count("--strategy") > 0) {
    tag::kTrainGpt.fail(
        "--deepspeed-config selects the strategy itself (deepspeed_stage_N from "
        "zero_optimization.stage); drop --strategy");
  }
  auto take = [&](const char* flag, auto value, auto& target) {
    if (app.count(flag) > 0 && target != value) {
      tag::kTrainGpt.fail(flag, " ", target, " disagrees with --deepspeed-config, which gives ",
                          value, "; drop the flag or change the file");
    }
    target = value;
  };
  if (!config.nvme_path.empty()) take("--nvme-path", config.nvme_path, options.sharding.nvme_path);
  if (config.micro_batch_per_gpu) take("--batch", *config.micro_batch_per_gpu, o.batch);
  if (config.gradient_accumulation_steps)
    take("--grad-accum", *config.gradient_accumulation_steps, o.grad_accum);
  take("--grad-clip", config.gradient_clipping.value_or(0.0), o.grad_clip);
  if (config.precision) take("--precision", *config.precision, options.precision);
  if (const auto& opt = config.optimizer) {
    take("--optimizer", std::string(opt->type == "SGD" ? "sgd" : "adamw"), o.optimizer);
    if (opt->momentum) take("--momentum", *opt->momentum, o.momentum);
    if (opt->dampening) take("--dampening", *opt->dampening, o.dampening);
    if (opt->nesterov) take("--nesterov", *opt->nesterov, o.nesterov);
    if (opt->lr) take("--lr", *opt->lr, o.lr);
    if (opt->beta1) take("--beta1", *opt->beta1, o.beta1);
    if (opt->beta2) take("--beta2", *opt->beta2, o.beta2);
    if (opt->eps) take("--eps", *opt->eps, o.eps);
    if (opt->weight_decay) take("--weight-decay", *opt->weight_decay, o.weight_decay);
  }
  return strategies::apply_deepspeed_config(config, options);
}

void print_memory_estimate(const nn::GPT& model, const std::string& strategy,
                           const strategies::StrategyOptions& options, int world,
                           const TrainOptions& o) {
  // Per-parameter state tensors: AdamW's two moments, SGD's momentum buffer (if any).
  const int states = o.optimizer == "sgd" ? (o.momentum != 0.0 ? 1 : 0) : 2;
  const strategies::MemoryEstimate e =
      strategies::estimate_memory(model, strategy, world, options, states);
  std::printf("memory estimate per rank: %s on %d rank(s), %lld parameters, %lld unit(s), %s\n",
              strategy.c_str(), world, static_cast<long long>(model.parameter_count()),
              static_cast<long long>(e.units), o.optimizer == "sgd" ? "SGD" : "AdamW");
  for (size_t k = 0; k < kMemoryKindCount; ++k) {
    const auto kind = static_cast<MemoryKind>(k);
    if (kind == MemoryKind::Activations) continue;
    std::printf("  %-16s %10.2f MiB\n", memory_kind_name(kind),
                static_cast<double>(e.peak(kind)) / (1 << 20));
  }
  std::printf("  %-16s %10.2f MiB (parameters + gradients + optimizer_state)\n", "model states",
              static_cast<double>(e.model_states()) / (1 << 20));
  std::printf("  %-16s %10s (not estimated: train a few steps and read the summary's peak by "
              "kind)\n", "activations", "-");
  if (e.nvme_bytes > 0) {
    std::printf("  %-16s %10.2f MiB (master weights and optimizer state in the swap file)\n",
                "nvme", static_cast<double>(e.nvme_bytes) / (1 << 20));
  }
}

int run(int argc, char** argv) {
  CLI::App app{"train_gpt: train a GPT-2-style model on bytes with Loom"};
  TrainOptions o;
  std::string data_path, init_path, save_path, metrics_path, trace_path;
  bool shuffle = false;
  int64_t log_interval = 10;
  std::string strategy_name = "single_device";
  strategies::StrategyOptions strategy_options;
  app.add_option("--data", data_path, "training data; bytes are tokens (default: built-in corpus)")
      ->check(CLI::ExistingFile);
  app.add_option("--init", init_path, "start from these weights (.safetensors, GPT-2 layout)")
      ->check(CLI::ExistingFile);
  app.add_option("--save", save_path, "write the trained weights here (.safetensors)");
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "resumable checkpoints go here (docs/checkpoints.md)");
  app.add_option("--save-every", o.save_every, "save a checkpoint every K steps (0: never)")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--keep-last", o.keep_last, "keep the N newest checkpoints (0: all)")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_flag("--async-save", o.async_save,
               "write checkpoints in a background thread while training goes on");
  app.add_option("--checkpoint-format", o.checkpoint_format,
                 "full (weights gathered into model.safetensors), sharded (every rank writes "
                 "its part), auto (sharded under the sharded strategies)")
      ->check(CLI::IsMember({"auto", "full", "sharded"}))
      ->capture_default_str();
  app.add_option("--resume", o.resume,
                 "auto (the newest committed checkpoint under --checkpoint-dir, if any) or a "
                 "checkpoint directory");
  app.add_option("--metrics", metrics_path, "write one JSON object per step here (.jsonl)");
  app.add_option("--trace", trace_path,
                 "write a Chrome/Perfetto trace (forward, backward, optimizer, DDP buckets) here; "
                 "with several ranks, rank R writes FILE with .rankR before the extension");
  app.add_option("--layers", o.model.layers, "transformer blocks")
      ->check(bounded(1, true, 4096))
      ->capture_default_str();
  app.add_option("--heads", o.model.heads, "attention heads")
      ->check(bounded(1, true, 4096))
      ->capture_default_str();
  app.add_option("--embd", o.model.embd, "embedding width")
      ->check(bounded(1, true, 1 << 18))
      ->capture_default_str();
  app.add_option("--ctx", o.model.context, "context length (sequence length)")
      ->check(bounded(1, true, 1 << 22))
      ->capture_default_str();
  app.add_option("--vocab", o.model.vocab_size, "vocabulary size")
      ->check(bounded(1, true, 1 << 24))
      ->capture_default_str();
  app.add_option("--batch", o.batch, "sequences per step (per rank)")
      ->check(bounded(1, true, 1 << 24))
      ->capture_default_str();
  app.add_option("--steps", o.steps, "optimizer steps")
      ->check(kAtLeastOne)
      ->capture_default_str();
  app.add_option("--lr", o.lr, "peak learning rate")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--optimizer", o.optimizer, "adamw or sgd (with --momentum, --dampening, "
                 "--nesterov; --lr and --weight-decay apply to both)")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  app.add_option("--momentum", o.momentum, "SGD momentum")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--dampening", o.dampening, "SGD dampening")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_flag("--nesterov", o.nesterov, "SGD: Nesterov momentum");
  app.add_option("--beta1", o.beta1, "AdamW beta1")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  app.add_option("--beta2", o.beta2, "AdamW beta2")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  app.add_option("--eps", o.eps, "AdamW epsilon")
      ->check(kPositive)
      ->capture_default_str();
  app.add_option("--weight-decay", o.weight_decay, "AdamW weight decay (parameters with >= 2 dims)")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--grad-clip", o.grad_clip, "clip the global gradient norm (0 = off)")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--seed", o.seed, "initialisation seed")->check(kSeed)->capture_default_str();
  app.add_option("--warmup-steps", o.warmup_steps, "linear warmup steps")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--schedule", o.schedule, "learning-rate schedule after warmup")
      ->check(CLI::IsMember({"constant", "cosine"}))
      ->capture_default_str();
  app.add_flag("--shuffle", shuffle, "visit blocks in a seeded random order per epoch");
  app.add_option("--strategy", strategy_name, "a registered strategy name (see --list-strategies)")
      ->capture_default_str();
  app.add_option("--accelerator,--device", strategy_options.accelerator,
                 "cpu, cuda or auto (auto is the CPU; see docs/cuda.md)")
      ->check(CLI::IsMember({"cpu", "cuda", "gpu", "auto"}))
      ->capture_default_str();
  std::string preset;
  app.add_option("--preset", preset,
                 "gpt2-small: 12 layers, 12 heads, embd 768, ctx 1024, vocab 50304 on synthetic "
                 "tokens (the GPU benchmark config; explicit model flags are ignored)")
      ->check(CLI::IsMember({"gpt2-small"}));
  double peak_tflops = 989.0;
  app.add_option("--peak-tflops", peak_tflops,
                 "the device's peak dense TFLOP/s for the MFU line (default: H100/H200 SXM bf16)")
      ->check(kPositive)
      ->capture_default_str();
  app.add_option("--devices", strategy_options.devices,
                 "devices per node: auto, N, -1 or a list like 0,2")
      ->capture_default_str();
  app.add_option("--precision", strategy_options.precision,
                 "32-true, bf16-mixed or 16-mixed (mixed: matmuls round to bf16/f16, emulated on "
                 "the CPU; 16-mixed adds a dynamic loss scaler)")
      ->capture_default_str();
  app.add_option("--process-group-backend", strategy_options.process_group_backend,
                 "auto, shm, ucx or nccl (auto: nccl for GPUs that each rank owns, ucx when the "
                 "job spans hosts, else shm; shm also serves loomrun's --nnodes when every node "
                 "is this machine)")
      ->capture_default_str();
  double timeout_s = std::chrono::duration<double>(strategy_options.timeout).count();
  app.add_option("--timeout", timeout_s,
                 "seconds a collective may wait for a peer before every rank stops with an "
                 "error naming it (PyTorch's init_process_group timeout)")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  int threads = 0;
  app.add_option("--threads", threads,
                 "intra-op threads per rank for every CPU kernel and the optimizer step (0: this "
                 "machine's cores divided among the ranks on it; results are the same bits on any "
                 "count)")
      ->check(CLI::Range(0, 1 << 16))
      ->capture_default_str();
  app.add_option("--grad-accum", o.grad_accum, "micro-batches per optimizer step")
      ->check(kAtLeastOne)
      ->capture_default_str();
  app.add_option("--ddp-comm-hook", strategy_options.ddp.comm_hook,
                 "DDP communication hook: allreduce, bf16_compress, fp16_compress, powersgd")
      ->capture_default_str();
  auto& powersgd = strategy_options.ddp.powersgd;
  app.add_option("--powersgd-rank", powersgd.matrix_approximation_rank,
                 "--ddp-comm-hook powersgd: the rank of each gradient matrix's approximation")
      ->check(kAtLeastOne)
      ->capture_default_str();
  app.add_option("--powersgd-start-iter", powersgd.start_powersgd_iter,
                 "--ddp-comm-hook powersgd: backward passes of plain allreduce before "
                 "compression starts")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--powersgd-warm-start", powersgd.warm_start,
                 "--ddp-comm-hook powersgd: reuse the last iteration's Q (true) or draw a fresh "
                 "random one each time (false)")
      ->capture_default_str();
  app.add_option("--bucket-cap-mb", strategy_options.ddp.bucket_cap_mb, "DDP bucket size cap")
      ->check(kPositive)
      ->capture_default_str();
  app.add_option("--local-sgd-period", strategy_options.local_sgd_period,
                 "DDP: after warm-up, average parameters every K steps instead of gradients "
                 "every step (0 = off)")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--local-sgd-warmup", strategy_options.local_sgd_warmup,
                 "DDP: steps of ordinary gradient averaging before local SGD starts")
      ->check(kNonNegative)
      ->capture_default_str();
  std::string activation_checkpointing = "none";
  app.add_option("--activation-checkpointing", activation_checkpointing,
                 "recompute the activations of each module of this class during backward "
                 "instead of keeping them: Block (each transformer block) or none")
      ->check(CLI::IsMember({"none", "Block"}))
      ->capture_default_str();
  strategies::pipeline::PipelineOptions& pipeline = strategy_options.pipeline;
  app.add_option("--pp", pipeline.stages,
                 "pipeline stages (docs/parallelism.md); above 1 selects --strategy pipeline, "
                 "with the data-parallel size the world divided by it")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--tp", strategy_options.tensor_parallel,
                 "tensor-parallel size (docs/parallelism.md); above 1 selects --strategy "
                 "model_parallel, with the data-parallel size the world divided by it")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_flag("--sequence-parallel", strategy_options.sequence_parallel,
               "with --tp: split the activations between the split layers by sequence position "
               "(Megatron-LM's sequence parallelism)");
  app.add_option("--micro-batches", pipeline.micro_batches,
                 "pipeline: each data-parallel rank's --batch rows split into this many")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--pp-schedule", pipeline.schedule,
                 "pipeline schedule: gpipe, 1f1b, interleaved_1f1b or zero_bubble")
      ->check(CLI::IsMember({"gpipe", "1f1b", "interleaved_1f1b", "zero_bubble"}))
      ->capture_default_str();
  app.add_option("--pp-chunks", pipeline.chunks,
                 "interleaved_1f1b: model chunks (virtual stages) per stage")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--pp-dp", pipeline.data_parallel,
                 "pipeline: data parallelism inside each stage's replicas: ddp, or "
                 "deepspeed_stage_1 (optimizer state sharded over them)")
      ->check(CLI::IsMember({"ddp", "deepspeed_stage_1"}))
      ->capture_default_str();
  app.add_option("--pp-balance-by", pipeline.balance_by,
                 "pipeline without --pp-balance: balance stages by each layer's parameters, or "
                 "by its forward time measured on the first micro-batch")
      ->check(CLI::IsMember({"parameters", "time"}))
      ->capture_default_str();
  app.add_option("--pp-balance", pipeline.balance,
                 "pipeline: layers per stage (per chunk under interleaved_1f1b), e.g. 2,3 (the "
                 "embedding, each block and the head count as layers; default: balanced by "
                 "parameter count)")
      ->delimiter(',');
  strategies::sharded::ShardingOptions& sharding = strategy_options.sharding;
  app.add_option("--wrap-policy", sharding.auto_wrap_policy,
                 "sharded strategies: which modules are units: none (the whole model), params "
                 "(every module owning parameters), min_params:N, or a class name such as Block "
                 "(default: none; params for deepspeed_stage_3*)");
  app.add_option("--fsdp-sharding-strategy", strategy_options.fsdp_sharding_strategy,
                 "fsdp names: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD (shard inside "
                 "each node, replicate across nodes)")
      ->capture_default_str();
  app.add_flag("--forward-prefetch", sharding.forward_prefetch,
               "stage 3: all-gather the next unit while the current one runs forward");
  std::string backward_prefetch = "pre";
  app.add_option("--backward-prefetch", backward_prefetch,
                 "stage 3: when backward all-gathers the next unit: pre, post or none")
      ->check(CLI::IsMember({"pre", "post", "none"}))
      ->capture_default_str();
  std::string param_dtype = "f32", reduce_dtype = "f32";
  app.add_option("--param-dtype", param_dtype,
                 "stage 3: store and all-gather parameter shards in f32, bf16 or f16 (FSDP's "
                 "MixedPrecision param_dtype; master weights stay f32)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  app.add_option("--reduce-dtype", reduce_dtype,
                 "sharded strategies: reduce gradients in f32, bf16 or f16 (FSDP's reduce_dtype)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  app.add_option("--nvme-path", sharding.nvme_path,
                 "NVMe offload (deepspeed_stage_3_offload_nvme, or any strategy that offloads the "
                 "optimizer): directory for the swap file holding master weights and optimizer "
                 "state");
  std::string deepspeed_config_path;
  app.add_option("--deepspeed-config", deepspeed_config_path,
                 "DeepSpeed's JSON config: zero_optimization (stage, offload), batch sizes, "
                 "gradient_clipping, bf16/fp16, optimizer; it selects the strategy "
                 "(docs/sharding.md)");
  bool estimate_only = false;
  app.add_flag("--estimate-memory", estimate_only,
               "print the per-rank memory each kind needs under --strategy on --devices ranks "
               "(parameters, gradients, optimizer state, communication, offloaded) and exit");
  bool list_strategies = false;
  app.add_flag("--list-strategies", list_strategies, "print the registered strategies and exit");
  app.add_option("--log-interval", log_interval, "steps between plain progress lines")
      ->check(kAtLeastOne)
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  refuse_empty_values(app);
  strategy_options.timeout =
      loom::Duration(std::max<int64_t>(1, std::llround(timeout_s * 1000)));
  check_output_path("--save", save_path);
  check_output_path("--metrics", metrics_path);
  check_output_path("--trace", trace_path);
  check_output_path("--checkpoint-dir", o.checkpoint_dir, /*directory=*/true);
  if (!data_path.empty()) {  // opened (not read) now, so that a FIFO is refused before any work
    uint64_t size = 0;
    open_regular_file(data_path, tag::kTrainGpt, kDataExpected, size);
  }
  sharding.param_dtype = parse_dtype(param_dtype);
  sharding.reduce_dtype = parse_dtype(reduce_dtype);
  sharding.backward_prefetch = backward_prefetch == "pre"    ? strategies::sharded::BackwardPrefetch::Pre
                               : backward_prefetch == "post" ? strategies::sharded::BackwardPrefetch::Post
                                                             : strategies::sharded::BackwardPrefetch::None;
  if (list_strategies) {
    for (auto& [name, description] : strategies::StrategyRegistry::available_strategies()) {
      std::printf("%-34s %s\n", name.c_str(), description.c_str());
    }
    return 0;
  }
  std::optional<strategies::DeepSpeedConfig> deepspeed;
  if (!deepspeed_config_path.empty()) {
    deepspeed = strategies::load_deepspeed_config(deepspeed_config_path);
    strategy_name = take_deepspeed_config(*deepspeed, app, o, strategy_options);
  }
  // --pp (with or without --tp) runs the pipeline, --tp alone model_parallel; each with data
  // parallelism across the rest of the ranks.
  if (pipeline.stages > 1 && strategy_name == "single_device") strategy_name = "pipeline";
  if (strategy_options.tensor_parallel > 1 && strategy_name == "single_device")
    strategy_name = "model_parallel";
  if (strategy_options.tensor_parallel > 1 && strategy_name != "model_parallel" &&
      strategy_name != "pipeline") {
    tag::kTrainGpt.fail("--tp ", strategy_options.tensor_parallel,
                        " runs the model_parallel "
                        "strategy (data parallel over the rest of the ranks); drop --strategy ",
                        strategy_name);
  }
  if ((strategy_name == "model_parallel" || strategy_name == "pipeline") &&
      app.count("--devices") == 0)
    strategy_options.devices = std::to_string(pipeline.stages * strategy_options.tensor_parallel);
  if (pipeline.stages > 1 && strategy_name != "pipeline") {
    tag::kTrainGpt.fail("--pp ", pipeline.stages,
                        " runs the pipeline strategy (data parallel over "
                        "the rest of the ranks); drop --strategy ",
                        strategy_name);
  }
  if (strategy_name == "pipeline" && pipeline.micro_batches > 0 &&
      o.batch % pipeline.micro_batches != 0) {
    tag::kTrainGpt.fail("--batch ", o.batch, " does not split into --micro-batches ",
                        pipeline.micro_batches, "; use a --batch that ", pipeline.micro_batches,
                        " divides");
  }
  if (pipeline.schedule == "interleaved_1f1b" && pipeline.micro_batches % pipeline.stages != 0) {
    tag::kTrainGpt.fail("--pp-schedule interleaved_1f1b needs --micro-batches a multiple of --pp ",
                        pipeline.stages, ", got ", pipeline.micro_batches);
  }
  std::unique_ptr<strategies::Strategy> strategy =
      strategies::StrategyRegistry::get(strategy_name, strategy_options);
  check_sharding_flags(app, *strategy);
  refuse_flags_without_effect(app, o, *strategy, strategy_options);

  std::optional<safetensors::Contents> init;
  if (!init_path.empty()) {
    init = safetensors::load(init_path);
    o.model = config_from_init(*init, o.model, app);
  }
  if (preset == "gpt2-small") {
    o.model.vocab_size = 50304;
    o.model.context = 1024;
    o.model.layers = 12;
    o.model.heads = 12;
    o.model.embd = 768;
  }
  check_model_fits(o.model, o.batch);
  if (estimate_only) {
    const int world =
        strategies::parse_devices(strategy_options.devices, strategy->accelerator()).count *
        strategy_options.num_nodes;
    print_memory_estimate(nn::GPT(o.model, o.seed), strategy_name, strategy_options, world, o);
    return 0;
  }
  // Model-parallel sizes that cannot split this model: one clear error before any rank starts.
  if (const int tp = strategy_options.tensor_parallel;
      tp > 1 && (o.model.heads % tp != 0 || o.model.vocab_size % tp != 0)) {
    tag::kTrainGpt.fail("--tp ", tp, " must divide --heads (", o.model.heads,
                        ") and the vocabulary (", o.model.vocab_size, ")");
  }
  if (const int64_t chunks = static_cast<int64_t>(pipeline.stages) *
                             (pipeline.schedule == "interleaved_1f1b" ? pipeline.chunks : 1);
      strategy_name == "pipeline" && chunks > o.model.layers + 2) {
    tag::kTrainGpt.fail("--pp ", pipeline.stages, " needs ", chunks,
                        " model chunks but the model has ", o.model.layers + 2,
                        " layers (the embedding, ", o.model.layers, " blocks, the head)");
  }
  strategy->setup_environment();
  check_devices(strategy_options.devices, *strategy);
  check_same_flags_on_every_rank(
      *strategy, {{"--batch", static_cast<double>(o.batch)},
                  {"--ctx", static_cast<double>(o.model.context)},
                  {"--layers", static_cast<double>(o.model.layers)},
                  {"--heads", static_cast<double>(o.model.heads)},
                  {"--embd", static_cast<double>(o.model.embd)},
                  {"--vocab", static_cast<double>(o.model.vocab_size)},
                  {"--steps", static_cast<double>(o.steps)},
                  {"--grad-accum", static_cast<double>(o.grad_accum)},
                  {"--micro-batches", static_cast<double>(pipeline.micro_batches)},
                  {"--seed", static_cast<double>(o.seed)},
                  {"--lr", o.lr},
                  {"--grad-clip", o.grad_clip}});
  const bool chief = strategy->is_global_zero();
  // PyTorch's default too: the cores shared out among the ranks on this machine.
  if (threads == 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / std::max(1, strategy->local_world_size()));
  }
  kernels::cpu::set_num_threads(threads);
  if (deepspeed) {
    strategies::check_deepspeed_batch_sizes(*deepspeed, o.batch, o.grad_accum,
                                            strategy->world_size());
    for (const std::string& warning : deepspeed->warnings)
      if (chief)
        std::fprintf(stderr, "%swarning: %s\n", tag::kDeepspeedConfig.prefix().c_str(),
                     warning.c_str());
    if (chief) std::printf("train_gpt: --deepspeed-config selects %s\n", strategy_name.c_str());
  }
  o.model.checkpoint_activations = activation_checkpointing == "Block";
  nn::GPT model(o.model, o.seed);
  if (init) model.load_state_dict(nn::gpt_state_from_checkpoint(*init));

  std::vector<int32_t> token_ids;
  if (!preset.empty()) {
    token_ids =
        data::synthetic_tokens(8 * o.batch * o.model.context + 1, o.model.vocab_size, o.seed);
  } else {
    token_ids =
        data::byte_tokens(data_path.empty() ? data::default_corpus() : read_bytes(data_path));
  }
  data::TokenBlocks data(std::move(token_ids), o.batch, o.model.context, o.model.vocab_size,
                         shuffle, o.seed);

  std::ofstream metrics;
  if (chief && !metrics_path.empty()) {
    metrics.open(metrics_path, std::ios::trunc);
    if (!metrics) tag::kTrainGpt.fail("cannot write --metrics file '", metrics_path, "'");
  }
  if (chief)
    std::printf(
        "train_gpt: %lld parameters (%lld layers, %lld heads, embd %lld, ctx %lld, vocab %lld); "
        "%lld blocks of %lld x %lld tokens from %s\n",
        static_cast<long long>(model.parameter_count()), static_cast<long long>(o.model.layers),
        static_cast<long long>(o.model.heads), static_cast<long long>(o.model.embd),
        static_cast<long long>(o.model.context), static_cast<long long>(o.model.vocab_size),
        static_cast<long long>(data.block_count()), static_cast<long long>(o.batch),
        static_cast<long long>(o.model.context),
        !preset.empty()     ? "synthetic tokens"
        : data_path.empty() ? "the built-in corpus"
                            : data_path.c_str());
  if (chief && strategy->world_size() > 1) {
    const auto* parallel = dynamic_cast<const strategies::ParallelStrategy*>(strategy.get());
    const std::string backend = parallel != nullptr && parallel->process_group()
                                    ? ", backend " + parallel->process_group()->backend_name()
                                    : "";
    std::printf("train_gpt: strategy %s over %d ranks (batch %lld per rank)%s\n",
                strategy->name().c_str(), strategy->world_size(), static_cast<long long>(o.batch),
                backend.c_str());
  }
  if (chief) std::printf("train_gpt: intra-op threads per rank: %d\n", threads);

  std::unique_ptr<strategies::Trace> trace;
  if (!trace_path.empty()) {
    trace = std::make_unique<strategies::Trace>();
    strategies::set_current_trace(trace.get());
  }
  Progress progress(stdout, isatty(fileno(stdout)) != 0, o.steps, log_interval);
  double first_loss = 0, last_loss = 0, total_ms = 0, tokens = 0;
  int64_t steps_run = 0, first_step = -1;  // this run's (a resumed run starts later)
  strategies::MemoryReport memory;  // the training steps' peaks, largest over ranks
  Throughput steady(o.steps);
  train(
      model, data, o,
      [&](const StepMetrics& m) {
        if (first_step < 0) {
          first_step = m.step;
          first_loss = m.loss;
        }
        ++steps_run;
        last_loss = m.loss;
        memory = m.memory;
        total_ms += m.ms_per_step;
        tokens += m.tokens_per_s * m.ms_per_step / 1e3;
        steady.add(m);
        if (chief) progress.update(m.step, m.loss, m.tokens_per_s, m.lr);
        if (metrics.is_open()) {
          metrics << metrics_json_line(m) << '\n';
          if (!metrics.flush())
            tag::kTrainGpt.fail("writing --metrics file '", metrics_path, "' failed at step ",
                                m.step + 1, ": ", std::strerror(errno));
        }
      },
      strategy.get());
  if (chief) progress.finish();
  if (trace) {
    strategies::set_current_trace(nullptr);
    std::string path =
        strategies::trace_path_for_rank(trace_path, strategy->rank(), strategy->world_size());
    trace->write(path, strategy->rank());
    if (chief) std::printf("train_gpt: trace written to %s\n", path.c_str());
  }
  if (chief && !save_path.empty()) nn::save_gpt(save_path, model);
  if (auto* pp = dynamic_cast<strategies::PipelineStrategy*>(strategy.get())) {
    const std::vector<double> bubbles = pp->measured_bubbles();  // collective
    if (chief) {
      std::string measured;
      for (double b : bubbles)
        measured += (measured.empty() ? "" : " ") + std::to_string(b).substr(0, 5);
      std::string layers;
      const std::vector<int64_t>& bounds = pp->layer_bounds();
      for (size_t c = 0; c + 1 < bounds.size(); ++c)
        layers += (c ? "," : "") + std::to_string(bounds[c + 1] - bounds[c]);
      std::printf("pipeline: %s, %d micro-batches, %s, layers per chunk %s: bubble per stage %s "
                  "(theory %.3f)\n",
                  pp->mesh().describe().c_str(), strategy_options.pipeline.micro_batches,
                  pp->schedule().name().c_str(), layers.c_str(), measured.c_str(),
                  pp->theoretical_bubble());
    }
  }
  strategy->barrier();
  if (!chief) return 0;
  if (const strategies::LossScaler* scaler = strategy->loss_scaler()) {
    std::printf("loss scaler: %lld step(s) skipped for inf/NaN gradients, final scale %g\n",
                static_cast<long long>(scaler->skipped_steps()), scaler->scale());
    // A run that learnt nothing must not end as if it had: every step skipped, or more than
    // half of them in a run of at least kSkipLimitSteps (in a shorter one, the overflows of a
    // loss scale still finding its level can be most of the steps).
    const int64_t skipped = scaler->skipped_steps();
    if (skipped >= o.steps || (o.steps >= kSkipLimitSteps && 2 * skipped > o.steps)) {
      tag::kTrainGpt.fail(skipped, " of the ", o.steps, " steps were skipped by the loss scaler "
                          "(their gradients were inf or NaN; final loss scale ", scaler->scale(),
                          "): the run diverged or its loss scale is wrong; lower --lr, use "
                          "bf16-mixed, or let the scale adapt (a dynamic loss scale)");
    }
  }

  const std::string resumed =
      first_step > 0 ? " (steps " + std::to_string(first_step + 1) + "-" +
                           std::to_string(o.steps) + ", resumed)"
                     : "";
  std::printf(
      "summary: %lld steps%s, loss %.4f -> %.4f, %.1f ms/step, %.0f tokens/s, "
      "peak tensor memory %.1f MiB%s%s\n",
      static_cast<long long>(steps_run), resumed.c_str(), first_loss, last_loss,
      steps_run ? total_ms / static_cast<double>(steps_run) : 0.0,
      total_ms > 0 ? tokens / (total_ms / 1e3) : 0.0,
      static_cast<double>(memory.peak_bytes) / (1 << 20), save_path.empty() ? "" : ", saved to ",
      save_path.c_str());
  std::printf("peak memory by kind (largest rank): %s\n",
              strategies::peak_by_kind_text(memory).c_str());
  if (steady.steps() > 0 && strategy->root_device().is_cuda()) {
    // nanoGPT's estimate of the FLOPs of a training step per token: 6 per parameter
    // (forward and backward of every matmul) plus attention's 12 * layers * ctx * embd.
    const double flops_per_token = 6.0 * static_cast<double>(model.parameter_count()) +
                                   12.0 * static_cast<double>(o.model.layers * o.model.context *
                                                              o.model.embd);
    const double achieved_tflops = flops_per_token * steady.tokens_per_s() / 1e12;
    std::printf(
        "steady state (steps %lld-%lld): %.2f ms/step, %.0f tokens/s, %.1f TFLOP/s, "
        "MFU %.1f%% of %.0f TFLOP/s, device %s\n",
        static_cast<long long>(steady.first_step()), static_cast<long long>(o.steps - 1),
        steady.ms_per_step(), steady.tokens_per_s(), achieved_tflops,
        100.0 * achieved_tflops / peak_tflops, peak_tflops, strategy->root_device().str().c_str());
#if LOOM_WITH_CUDA
    cuda::CachingStats caching = cuda::caching_stats(strategy->root_device().index);
    std::printf("peak memory: %.1f MiB allocated, %.1f MiB reserved by the caching allocator\n",
                static_cast<double>(caching.peak_allocated_bytes) / (1 << 20),
                static_cast<double>(caching.peak_reserved_bytes) / (1 << 20));
#endif
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {  // from the standard library: still one line, no abort
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
