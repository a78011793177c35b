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
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "nn/generate.h"
#include "nn/pretrained.h"
#include "strategies/deepspeed_config.h"
#include "strategies/devices.h"
#include "strategies/memory_estimate.h"
#include "strategies/memory_report.h"
#include "strategies/precision.h"
#include "strategies/registry.h"
#include "strategies/trace.h"
#include "tensor/allocator.h"
#if LOOM_WITH_CUDA
#include "tensor/cuda/caching_allocator.h"
#endif
#include "data/default_corpus.h"
#include "tools/train_gpt/command_line.h"
#include "text/unicode.h"
#include "tools/train_gpt/data_sources.h"
#include "tools/train_gpt/flag_checks.h"
#include "tools/train_gpt/progress.h"
#include "tools/train_gpt/resident_memory.h"
#include "sim/cluster.h"
#include "tools/train_gpt/simulation.h"
#include "tools/train_gpt/sweep.h"
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


// The model of --init's checkpoint (or of --model-config's file) taken into `o`; flags given
// explicitly must agree with it.
void take_init_model(const nn::ModelSpec& stored, const CLI::App& app, const CommandLine& cli,
                     TrainOptions& o) {
  auto agree = [&](const char* flag, auto given, auto value) {
    if (app.count(flag) > 0 && given != value) {
      tag::kTrainGpt.fail(flag, " ", given, " does not match the ",
                          cli.init_path.empty() ? "--model-config file" : "--init checkpoint",
                          ", which has ", value, "; drop the flag to take its value");
    }
  };
  agree("--model", cli.model, nn::architecture_name(stored.architecture));
  o.architecture = stored.architecture;
  nn::GPTConfig shared = stored.gpt;
  if (stored.architecture == nn::Architecture::kLlama) {
    const nn::LlamaConfig& l = stored.llama;
    shared.vocab_size = l.vocab_size;
    shared.context = l.context;
    shared.layers = l.layers;
    shared.heads = l.heads;
    shared.embd = l.hidden;
    agree("--kv-heads", o.llama.kv_heads, l.kv_heads);
    agree("--intermediate", o.llama.intermediate, l.intermediate);
    agree("--rope-theta", o.llama.rope_theta, l.rope_theta);
    agree("--rms-norm-eps", o.llama.rms_norm_eps, l.rms_norm_eps);
    agree("--tie-embeddings", o.llama.tie_embeddings, l.tie_embeddings);
    o.llama = l;
  }
  agree("--layers", o.model.layers, shared.layers);
  agree("--embd", o.model.embd, shared.embd);
  agree("--vocab", o.model.vocab_size, shared.vocab_size);
  agree("--ctx", o.model.context, shared.context);
  agree("--heads", o.model.heads, shared.heads);
  shared.options = o.model.options;
  o.model = shared;
}

// The class of the model's transformer blocks (for --activation-checkpointing).
const char* block_class(nn::Architecture architecture) {
  return architecture == nn::Architecture::kLlama ? "LlamaDecoderLayer" : "Block";
}

// --preset: a named model shape (explicit model flags are ignored).
void apply_preset(const std::string& preset, TrainOptions& o) {
  if (preset == "gpt2-small") {
    o.architecture = nn::Architecture::kGpt2;
    o.model.vocab_size = 50304;
    o.model.context = 1024;
    o.model.layers = 12;
    o.model.heads = 12;
    o.model.embd = 768;
  } else if (preset == "llama-tiny") {
    o.architecture = nn::Architecture::kLlama;
    o.model = nn::GPTConfig{.options = o.model.options};
    o.llama = nn::LlamaConfig{};
  } else if (preset == "smollm-135m") {  // HuggingFaceTB/SmolLM-135M's config.json
    o.architecture = nn::Architecture::kLlama;
    o.model.vocab_size = 49152;
    o.model.context = 2048;
    o.model.layers = 30;
    o.model.heads = 9;
    o.model.embd = 576;
    o.llama = nn::LlamaConfig{};
    o.llama.kv_heads = 3;
    o.llama.intermediate = 1536;
    o.llama.rope_theta = 10000.0;
    o.llama.rms_norm_eps = 1e-5;
    o.llama.tie_embeddings = true;
  }
}

// Applies a DeepSpeed config to the run: it selects the strategy (returned) and sets what it
// names (batch, accumulation, clipping, precision, AdamW's hyper-parameters). A flag given
// explicitly must agree with it; DeepSpeed's defaults hold for what it leaves out
// (gradient_clipping absent: no clipping).
std::string take_deepspeed_config(const strategies::DeepSpeedConfig& config, const CLI::App& app,
                                  TrainOptions& o, strategies::StrategyConfig& options) {
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

// The model is built on the meta device (tensor/meta.h): shapes only, so a model of any size
// is estimated in moments without its memory.
void print_memory_estimate(const nn::CausalLM& model, const std::string& strategy,
                           const strategies::StrategyConfig& options, int world,
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
  const strategies::MicroBatchEstimate micro = strategies::estimate_micro_batch(
      model_spec(o), o.batch, o.model.context, *strategies::make_precision(options.precision),
      o.grad_accum, options.sharding.weights_dtype,
      strategies::StrategyRegistry::entry(strategy).kind != strategies::StrategyKind::Sharded);
  std::printf("  %-16s %10.2f MiB (%lld bytes: one micro-batch of %lld x %lld tokens, forward "
              "and backward run on the meta device)\n",
              "activations", static_cast<double>(micro.activation_bytes) / (1 << 20),
              static_cast<long long>(micro.activation_bytes), static_cast<long long>(o.batch),
              static_cast<long long>(o.model.context));
  if (e.nvme_bytes > 0) {
    std::printf("  %-16s %10.2f MiB (master weights and optimizer state in the swap file)\n",
                "nvme", static_cast<double>(e.nvme_bytes) / (1 << 20));
  }
  const MetaCostTotals& costs = micro.costs;
  const double gemm = costs.of(OpClass::Gemm).flops, attention = costs.of(OpClass::Attention).flops;
  std::printf("compute per micro-batch (the meta device's op costs): %.0f FLOP in GEMMs, %.0f in "
              "attention, %.0f in other ops; %.0f bytes read and written\n",
              gemm, attention, costs.total().flops - gemm - attention,
              costs.total().bytes_read + costs.total().bytes_written);
}

// What resolve() decides before any rank starts.
struct Plan {
  std::optional<strategies::DeepSpeedConfig> deepspeed;
  std::optional<nn::Pretrained> init;  // --init's model and weights
  std::optional<text::Tokenizer> tokenizer;  // --tokenizer's, or the --init directory's
  std::filesystem::path tokenizer_path;
  std::unique_ptr<strategies::Strategy> strategy;
};

// The strategy and the model from the command line: a DeepSpeed config, or --pp / --tp
// without --strategy, choose the strategy; the registry's entry says what kind it is and which
// flags it reads. Every check that can fail before a rank starts is made here.
Plan resolve(const CLI::App& app, CommandLine& cli) {
  TrainOptions& o = cli.train;
  strategies::StrategyConfig& config = cli.config;
  const strategies::pipeline::PipelineOptions& pipeline = config.pipeline;
  Plan plan;
  std::string& strategy_name = cli.strategy;
  if (!cli.deepspeed_config_path.empty()) {
    plan.deepspeed = strategies::load_deepspeed_config(cli.deepspeed_config_path);
    strategy_name = take_deepspeed_config(*plan.deepspeed, app, o, config);
  }
  // --pp (with or without --tp) runs the pipeline, --tp alone model_parallel, when no
  // strategy is named; each with data parallelism across the rest of the ranks.
  if (app.count("--strategy") == 0 && !plan.deepspeed) {
    if (pipeline.stages > 1) {
      strategy_name = "pipeline";
    } else if (config.tensor_parallel.size > 1) {
      strategy_name = "model_parallel";
    }
  }
  const strategies::StrategyKind kind = strategies::StrategyRegistry::entry(strategy_name).kind;
  const bool pipelined = kind == strategies::StrategyKind::Pipeline;
  refuse_flags_without_effect(app, o, strategy_name, config);
  if ((pipelined || kind == strategies::StrategyKind::TensorParallel) &&
      app.count("--devices") == 0)
    config.devices = std::to_string(pipeline.stages * config.tensor_parallel.size);
  if (pipelined && o.batch % pipeline.micro_batches != 0) {
    tag::kTrainGpt.fail("--batch ", o.batch, " does not split into --micro-batches ",
                        pipeline.micro_batches, "; use a --batch that ", pipeline.micro_batches,
                        " divides");
  }
  if (pipeline.schedule == "interleaved_1f1b" && pipeline.micro_batches % pipeline.stages != 0) {
    tag::kTrainGpt.fail("--pp-schedule interleaved_1f1b needs --micro-batches a multiple of --pp ",
                        pipeline.stages, ", got ", pipeline.micro_batches);
  }
  plan.strategy = strategies::StrategyRegistry::create(strategy_name, config);

  o.architecture = nn::parse_architecture(cli.model);
  if (!cli.init_path.empty() && !cli.model_config_path.empty()) {
    tag::kTrainGpt.fail("--model-config describes a model to initialise afresh and --init one to "
                        "load (with its own config); give one of them");
  }
  if (!cli.init_path.empty()) {
    plan.init = nn::load_pretrained(cli.init_path, model_spec(o));
    take_init_model(plan.init->spec, app, cli, o);
  }
  if (!cli.model_config_path.empty()) {
    const std::string text =
        read_regular_file(cli.model_config_path, tag::kTrainGpt, "a config.json");
    take_init_model(nn::spec_from_hf_config(text, cli.model_config_path), app, cli, o);
  }
  apply_preset(cli.preset, o);
  plan.tokenizer_path = !cli.tokenizer_path.empty() ? std::filesystem::path(cli.tokenizer_path)
                        : plan.init                 ? plan.init->tokenizer
                                                    : std::filesystem::path();
  if (!plan.tokenizer_path.empty()) {
    plan.tokenizer = text::Tokenizer::from_file(plan.tokenizer_path);
    const int64_t ids = plan.tokenizer->vocab_size();
    if (app.count("--vocab") == 0 && !plan.init && cli.preset.empty()) o.model.vocab_size = ids;
    if (ids > o.model.vocab_size) {
      tag::kTrainGpt.fail("the tokenizer ", plan.tokenizer_path.string(), " has ", ids,
                          " ids but the model's vocabulary is ", o.model.vocab_size,
                          "; use --vocab ", ids, " or more");
    }
  }
  if (pipelined && (o.eval_every > 0 || cli.sample_every > 0)) {
    tag::kTrainGpt.fail("--eval-every and --sample-every run the whole model on every rank; a "
                        "pipeline's stages hold parts of it (not implemented for pipelines)");
  }
  if (kind == strategies::StrategyKind::TensorParallel && cli.sample_every > 0) {
    tag::kTrainGpt.fail("--sample-every is not implemented under tensor parallelism (the "
                        "key/value cache of generation runs on a whole model)");
  }
  if (const char* block = block_class(o.architecture);
      cli.activation_checkpointing != "none" && cli.activation_checkpointing != block) {
    tag::kTrainGpt.fail("--activation-checkpointing ", cli.activation_checkpointing,
                        " names no module of --model ", nn::architecture_name(o.architecture),
                        " (its blocks are ", block, ")");
  }
  // An estimate and a simulation allocate nothing of the model.
  if (!cli.estimate_only && !cli.simulate) check_model_fits(o.model, o.batch);
  const bool llama = o.architecture == nn::Architecture::kLlama;
  if (llama) model_spec(o).llama.validate();
  // Model-parallel sizes that cannot split this model: one clear error before any rank starts.
  // (Llama's key/value heads split when --tp divides them, replicated when it is a multiple.)
  const int tp = config.tensor_parallel.size;
  const int64_t kv = o.llama.kv_heads;
  if (tp > 1 && (o.model.heads % tp != 0 || o.model.vocab_size % tp != 0 ||
                 (llama && (o.llama.intermediate % tp != 0 || (kv % tp != 0 && tp % kv != 0))))) {
    tag::kTrainGpt.fail("--tp ", tp, " must divide --heads (", o.model.heads,
                        ") and the vocabulary (", o.model.vocab_size, ")",
                        llama ? " and --intermediate (" + std::to_string(o.llama.intermediate) +
                                    "), and divide --kv-heads (" + std::to_string(kv) +
                                    ") or be a multiple of it"
                              : std::string());
  }
  if (const int64_t chunks = static_cast<int64_t>(pipeline.stages) *
                             (pipeline.schedule == "interleaved_1f1b" ? pipeline.chunks : 1);
      pipelined && chunks > o.model.layers + 2) {
    tag::kTrainGpt.fail("--pp ", pipeline.stages, " needs ", chunks,
                        " model chunks but the model has ", o.model.layers + 2,
                        " layers (the embedding, ", o.model.layers, " blocks, the head)");
  }
  o.model.checkpoint_activations = cli.activation_checkpointing != "none";
  return plan;
}

// Starts or joins the ranks, trains, and prints the summary (rank 0).
int train_and_report(CommandLine& cli, Plan& plan) {
  TrainOptions& o = cli.train;
  const strategies::pipeline::PipelineOptions& pipeline = cli.config.pipeline;
  strategies::Strategy& strategy = *plan.strategy;
  strategy.setup_environment();
  check_devices(cli.config.devices, strategy);
  check_same_flags_on_every_rank(
      strategy, {{"--batch", static_cast<double>(o.batch)},
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
  const bool chief = strategy.is_global_zero();
  // PyTorch's default too: the cores shared out among the ranks on this machine.
  int threads = cli.threads;
  if (threads == 0) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    threads = std::max(1, cores / std::max(1, strategy.local_world_size()));
  }
  kernels::cpu::set_num_threads(threads);
  if (const auto& deepspeed = plan.deepspeed) {
    strategies::check_deepspeed_batch_sizes(*deepspeed, o.batch, o.grad_accum,
                                            strategy.world_size());
    for (const std::string& warning : deepspeed->warnings)
      if (chief)
        std::fprintf(stderr, "%swarning: %s\n", tag::kDeepspeedConfig.prefix().c_str(),
                     warning.c_str());
    if (chief) std::printf("train_gpt: --deepspeed-config selects %s\n", cli.strategy.c_str());
  }
  const nn::ModelSpec spec = model_spec(o);
  const ResidentMemory before_model = resident_memory();
  const std::unique_ptr<nn::CausalLM> built = spec.build(o.seed);
  nn::CausalLM& model = *built;
  if (plan.init) {
    model.load_state_dict(plan.init->state);
    plan.init->state.clear();  // the model holds the weights now: no second copy for the run
  }

  const text::Tokenizer* tokenizer = plan.tokenizer ? &*plan.tokenizer : nullptr;
  const BlockShape shape{.batch = o.batch,
                         .time = o.model.context,
                         .vocab = o.model.vocab_size,
                         .shuffle = cli.shuffle,
                         .seed = o.seed};
  std::optional<data::TokenBlocks> training;
  if (cli.preset == "gpt2-small") {
    training.emplace(
        data::synthetic_tokens(8 * o.batch * o.model.context + 1, o.model.vocab_size, o.seed),
        o.batch, o.model.context, o.model.vocab_size, cli.shuffle, o.seed);
  } else if (!cli.data_path.empty()) {
    training.emplace(open_blocks(cli.data_path, cli.data_format, tokenizer, "--data", shape));
  } else if (tokenizer) {
    const std::vector<uint8_t> corpus = data::default_corpus();
    training.emplace(text_blocks(std::string(corpus.begin(), corpus.end()), *tokenizer, shape));
  } else {
    training.emplace(data::byte_tokens(data::default_corpus()), o.batch, o.model.context,
                     o.model.vocab_size, cli.shuffle, o.seed);
  }
  const data::TokenBlocks& data = *training;
  std::optional<data::TokenBlocks> validation;
  if (!cli.val_data_path.empty()) {
    BlockShape in_order = shape;
    in_order.shuffle = false;
    validation.emplace(
        open_blocks(cli.val_data_path, cli.data_format, tokenizer, "--val-data", in_order));
  }
  // --sample-every's prompt: the text given, else the document-start token (with a tokenizer)
  // or a newline byte.
  std::vector<int64_t> sample_prompt;
  if (tokenizer && !cli.sample_prompt.empty()) {
    for (uint32_t id : tokenizer->encode(cli.sample_prompt)) sample_prompt.push_back(id);
  } else if (tokenizer) {
    sample_prompt = {tokenizer->document_start()};
  } else {
    for (unsigned char c : cli.sample_prompt.empty() ? std::string("\n") : cli.sample_prompt)
      sample_prompt.push_back(c);
  }

  std::ofstream metrics;
  if (chief && !cli.metrics_path.empty()) {
    metrics.open(cli.metrics_path, std::ios::trunc);
    if (!metrics) tag::kTrainGpt.fail("cannot write --metrics file '", cli.metrics_path, "'");
  }
  if (chief)
    std::printf(
        "train_gpt: %s, %lld parameters (%lld layers, %lld heads, embd %lld, ctx %lld, vocab "
        "%lld); %lld blocks of %lld x %lld tokens from %s\n",
        nn::architecture_name(o.architecture).c_str(),
        static_cast<long long>(model.parameter_count()), static_cast<long long>(o.model.layers),
        static_cast<long long>(o.model.heads), static_cast<long long>(o.model.embd),
        static_cast<long long>(o.model.context), static_cast<long long>(o.model.vocab_size),
        static_cast<long long>(data.block_count()), static_cast<long long>(o.batch),
        static_cast<long long>(o.model.context),
        cli.preset == "gpt2-small" ? "synthetic tokens"
        : cli.data_path.empty() ? (tokenizer ? "the built-in corpus, tokenized" : "the built-in corpus")
                            : cli.data_path.c_str());
  if (chief && strategy.world_size() > 1) {
    const std::string name = strategy.communication_backend();
    const std::string backend = name.empty() ? "" : ", backend " + name;
    std::printf("train_gpt: strategy %s over %d ranks (batch %lld per rank)%s\n",
                strategy.name().c_str(), strategy.world_size(), static_cast<long long>(o.batch),
                backend.c_str());
  }
  if (chief) std::printf("train_gpt: intra-op threads per rank: %d\n", threads);
  if (chief && strategy.root_device().is_cpu() &&
      strategies::make_precision(cli.config.precision)->compute_dtype() == DType::BF16) {
    std::printf("train_gpt: bf16 matrix products on this CPU's bf16 instructions: %s\n",
                kernels::cpu::bf16_gemm_instructions());
  }

  std::unique_ptr<strategies::Trace> trace;
  if (!cli.trace_path.empty()) {
    trace = std::make_unique<strategies::Trace>();
    strategies::set_current_trace(trace.get());
  }
  Progress progress(stdout, isatty(fileno(stdout)) != 0, o.steps, cli.log_interval);
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
        if (chief && m.val_loss)
          std::printf("step %lld: val loss %.4f\n", static_cast<long long>(m.step + 1), *m.val_loss);
        if (cli.sample_every > 0 && (m.step + 1) % cli.sample_every == 0) {
          nn::SamplingOptions sampling;
          sampling.max_new_tokens = cli.sample_tokens;
          sampling.temperature = cli.sample_temperature;
          sampling.seed = o.seed + static_cast<uint64_t>(m.step);
          if (tokenizer) sampling.stop_token = tokenizer->end_of_text();
          // Every rank: a sharded model's forward gathers its parameters collectively.
          std::vector<int64_t> ids = nn::generate(model, sample_prompt, sampling);
          ids.insert(ids.begin(), sample_prompt.begin(), sample_prompt.end());
          std::string text;
          if (tokenizer) {
            text = tokenizer->decode(std::vector<uint32_t>(ids.begin(), ids.end()));
          } else {  // bytes, shown as UTF-8 with U+FFFD where they are not
            std::string bytes;
            for (int64_t id : ids) bytes.push_back(static_cast<char>(id));
            text = text::utf8_lossy(bytes);
          }
          if (chief)
            std::printf("step %lld: sample: %s\n", static_cast<long long>(m.step + 1), text.c_str());
        }
        if (metrics.is_open()) {
          metrics << metrics_json_line(m) << '\n';
          if (!metrics.flush())
            tag::kTrainGpt.fail("writing --metrics file '", cli.metrics_path, "' failed at step ",
                                m.step + 1, ": ", std::strerror(errno));
        }
      },
      &strategy, validation ? &*validation : nullptr);
  if (chief) progress.finish();
  if (trace) {
    strategies::set_current_trace(nullptr);
    std::string path =
        strategies::trace_path_for_rank(cli.trace_path, strategy.rank(), strategy.world_size());
    trace->write(path, strategy.rank());
    if (chief) std::printf("train_gpt: trace written to %s\n", path.c_str());
  }
  if (chief && cli.save_directory) {
    nn::save_pretrained(cli.save_path, model, spec, plan.tokenizer_path, cli.save_shard_mb << 20);
  } else if (chief && !cli.save_path.empty()) {
    nn::save_weights_file(cli.save_path, model, spec);
  }
  for (const std::string& line : strategy.training_report())  // collective
    if (chief) std::printf("%s\n", line.c_str());
  strategy.barrier();
  if (!chief) return 0;
  if (const strategies::LossScaler* scaler = strategy.loss_scaler()) {
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
      static_cast<double>(memory.peak_bytes) / (1 << 20), cli.save_path.empty() ? "" : ", saved to ",
      cli.save_path.c_str());
  std::printf("peak memory by kind (largest rank): %s\n",
              strategies::peak_by_kind_text(memory).c_str());
  // Everything the process holds (allocator caches, libraries' buffers, --init's copy while
  // it loads), for comparing with a peer's RSS; this rank's only.
  const ResidentMemory after = resident_memory();
  std::printf("process memory (this rank): peak RSS %.1f MiB, %.1f MiB above the %.1f MiB "
              "before the model was built\n",
              static_cast<double>(after.peak_bytes) / (1 << 20),
              static_cast<double>(after.peak_bytes - before_model.current_bytes) / (1 << 20),
              static_cast<double>(before_model.current_bytes) / (1 << 20));
  if (steady.steps() > 0 && strategy.root_device().is_cuda()) {
    // nanoGPT's estimate of the FLOPs of a training step per token: 6 per parameter
    // (forward and backward of every matmul) plus attention's 12 * layers * ctx * embd.
    const double flops_per_token = model.flops_per_token(o.model.context);
    const double achieved_tflops = flops_per_token * steady.tokens_per_s() / 1e12;
    std::printf(
        "steady state (steps %lld-%lld): %.2f ms/step, %.0f tokens/s, %.1f TFLOP/s, "
        "MFU %.1f%% of %.0f TFLOP/s, device %s\n",
        static_cast<long long>(steady.first_step()), static_cast<long long>(o.steps - 1),
        steady.ms_per_step(), steady.tokens_per_s(), achieved_tflops,
        100.0 * achieved_tflops / cli.peak_tflops, cli.peak_tflops, strategy.root_device().str().c_str());
#if LOOM_WITH_CUDA
    cuda::CachingStats caching = cuda::caching_stats(strategy.root_device().index);
    std::printf("peak memory: %.1f MiB allocated, %.1f MiB reserved by the caching allocator\n",
                static_cast<double>(caching.peak_allocated_bytes) / (1 << 20),
                static_cast<double>(caching.peak_reserved_bytes) / (1 << 20));
#endif
  }
  return 0;
}

// loom-sim's report of one simulated rank (simulation.h), as text or one JSON object.
void print_simulation(const SimulatedRank& r, const std::string& strategy, bool json) {
  if (json) {
    std::printf("%s\n", simulated_rank_json(r).c_str());
    return;
  }
  if (r.stages.empty()) {
    std::printf("loom-sim: rank 0 of %d simulated ranks under %s, %lld parameters\n",
                r.world_size, strategy.c_str(), static_cast<long long>(r.parameters));
  } else {
    std::printf("loom-sim: the first rank of each of %zu stages of %d simulated ranks under %s, "
                "%lld parameters\n",
                r.stages.size(), r.world_size, strategy.c_str(),
                static_cast<long long>(r.parameters));
    std::printf(
        "stage  world rank   step ms  compute ms  exposed comm ms  bubble ms    peak MiB\n");
    for (const SimulatedRank& s : r.stages) {
      std::printf("%5d  %10d  %8.3f  %10.3f  %15.3f  %9.3f  %10.2f\n", s.stage, s.rank,
                  s.step_s * 1e3, s.compute_s * 1e3, s.exposed_comm_s * 1e3, s.bubble_s * 1e3,
                  static_cast<double>(s.peak_bytes) / (1 << 20));
    }
    std::printf("the job (per rank: the largest peak of each kind, the slowest stage's step):\n");
  }
  std::printf("peak memory per rank: %.2f MiB on the device\n",
              static_cast<double>(r.peak_bytes) / (1 << 20));
  if (!r.fits_device_memory()) {
    std::printf("  over the device's %.2f MiB: this job would not fit as configured (--sweep "
                "rejects such configurations)\n",
                static_cast<double>(r.device_memory_bytes) / (1 << 20));
  }
  for (size_t k = 0; k < kMemoryKindCount; ++k) {
    std::printf("  %-16s %12.2f MiB\n", memory_kind_name(static_cast<MemoryKind>(k)),
                static_cast<double>(r.peak_bytes_by_kind[k]) / (1 << 20));
  }
  std::printf("per step: %.4g FLOP, %.4g bytes read and written by the ops; collectives (this "
              "rank's buffers):\n",
              r.compute.flops, r.compute.bytes_read + r.compute.bytes_written);
  for (const auto& [op, bytes] : r.comm_bytes())
    std::printf("  %-16s %12.2f MiB\n", op.c_str(), static_cast<double>(bytes) / (1 << 20));
  std::printf("step time on %s: %.3f ms (compute %.3f ms, exposed communication %.3f ms, "
              "pipeline bubble %.3f ms; communication streams busy %.3f ms)\n",
              r.cluster.c_str(), r.step_s * 1e3, r.compute_s * 1e3, r.exposed_comm_s * 1e3,
              r.bubble_s * 1e3, r.comm_busy_s * 1e3);
  std::printf("model FLOPs %.4g per step per rank: %.2f TFLOP/s per rank, MFU %.1f%%\n",
              r.model_flops, r.step_s > 0 ? r.model_flops / r.step_s / 1e12 : 0.0, 100 * r.mfu);
}

int run(int argc, char** argv) {
  // train_gpt owns its process: freed host memory stays in glibc's heap and serves requests
  // of any size (tensor/allocator.h), so its RSS follows its peak of live tensors.
  loom::use_process_heap_for_cpu_blocks();
  CommandLine cli;
  cli.simulate = std::filesystem::path(argv[0]).filename() == "loom-sim";
  CLI::App app{cli.simulate ? "loom-sim: simulate one rank of a train_gpt job of any size "
                              "(docs/simulation.md); takes train_gpt's flags"
                            : "train_gpt: train a GPT-2-style model on bytes with Loom"};
  add_flags(app, cli);
  if (cli.simulate) {
    app.add_option("--world-size", cli.sim_world_size,
                   "the simulated ranks (default: --devices x --num-nodes)")
        ->check(CLI::Range(1, 1 << 20));
    app.add_flag("--json", cli.sim_json, "print one JSON object");
    app.add_flag("--sweep", cli.sim_sweep,
                 "rank the strategies, micro-batch sizes and activation checkpointing by "
                 "predicted throughput (docs/simulation.md, \"Sweep\")");
    app.add_option("--memory-limit-gib", cli.sim_memory_limit_gib,
                   "--sweep's device memory per rank (default: the cluster's)")
        ->check(CLI::PositiveNumber);
    app.add_option("--cluster", cli.sim_cluster,
                   "the simulated cluster: a preset (default this-machine; " +
                       CLI::detail::join(sim::cluster_presets(), ", ") +
                       ") or a cluster description's JSON file (docs/simulation.md)");
  }
  CLI11_PARSE(app, argc, argv);
  finish_parsing(app, cli);
  if (cli.list_strategies) {
    for (auto& [name, description] : strategies::StrategyRegistry::list())
      std::printf("%-34s %s\n", name.c_str(), description.c_str());
    return 0;
  }
  Plan plan = resolve(app, cli);
  if (cli.simulate) {
    const int world =
        cli.sim_world_size > 0
            ? cli.sim_world_size
            : strategies::parse_devices(cli.config.devices, plan.strategy->accelerator()).count *
                  cli.config.num_nodes;
    for (const char* flag : {"--data", "--save", "--checkpoint-dir", "--resume", "--metrics",
                             "--val-data", "--sample-every", "--init"}) {
      if (app.count(flag) > 0 && !cli.sim_json)
        std::printf("loom-sim: %s is not simulated (it only moves data); ignored\n", flag);
    }
    if (cli.train.cuda_graph) {
      if (!cli.sim_json) {
        std::printf("loom-sim: --cuda-graph is not simulated (the device model has no measured "
                    "cost of a replayed launch); ignored\n");
      }
      cli.train.cuda_graph = false;  // the simulated step runs eagerly on the meta device
    }
    const sim::Cluster cluster = sim::load_cluster(cli.sim_cluster);
    if (cli.sim_sweep) {
      const Sweep result = sweep(cli.train, cli.config, world, cluster,
                                 cli.sim_memory_limit_gib * 1024.0 * 1024.0 * 1024.0);
      std::printf("%s%s", cli.sim_json ? sweep_json(result).c_str() : sweep_text(result).c_str(),
                  cli.sim_json ? "\n" : "");
      return 0;
    }
    const SimulatedRank simulated =
        simulate_rank(model_spec(cli.train), cli.train, *plan.strategy, cli.strategy, cli.config,
                      world, cluster, /*record_trace=*/!cli.trace_path.empty());
    print_simulation(simulated, cli.strategy, cli.sim_json);
    if (!cli.trace_path.empty()) {
      std::vector<std::pair<int, const strategies::Trace*>> ranks;
      for (const auto& [rank, trace] : simulated.traces)
        ranks.emplace_back(rank, trace.get());
      strategies::Trace::write_ranks(cli.trace_path, ranks);
      if (!cli.sim_json) {
        std::printf("loom-sim: the simulated timeline (both steps) is in %s\n",
                    cli.trace_path.c_str());
      }
    }
    return 0;
  }
  if (cli.estimate_only) {
    const int world =
        strategies::parse_devices(cli.config.devices, plan.strategy->accelerator()).count *
        cli.config.num_nodes;
    nn::ModelSpec spec = model_spec(cli.train);
    spec.gpt.options.device = spec.llama.options.device = Device::meta();
    print_memory_estimate(*spec.build(cli.train.seed), cli.strategy, cli.config, world,
                          cli.train);
    return 0;
  }
  return train_and_report(cli, plan);
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
