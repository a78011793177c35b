#include "tools/train_gpt/command_line.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>

#include "core/regular_file.h"
#include "core/tags.h"
#include "strategies/pipeline/schedule.h"
#include "tools/train_gpt/data_sources.h"
#include "tools/train_gpt/flag_checks.h"

namespace loom::train_gpt {

namespace {

std::vector<std::string> names_of(const std::vector<std::pair<std::string, std::string>>& listed) {
  std::vector<std::string> names;
  for (const auto& [name, description] : listed)
    names.push_back(name);
  return names;
}

}  // namespace

void add_flags(CLI::App& app, CommandLine& cli) {
  app.add_option("--data", cli.data_path,
                 "training data (default: the built-in corpus): llm.c .bin token shards or a "
                 "glob of them, nanoGPT's raw uint16 tokens (--data-format raw-u16), text "
                 "(tokenized with --tokenizer), or any file whose bytes are the tokens "
                 "(docs/data.md)");
  app.add_option("--data-format", cli.data_format,
                 "how --data and --val-data are read: auto (llm.c shards by their magic, else "
                 "text with --tokenizer, else bytes), bytes, text, llmc-gpt2, llmc-llama3, "
                 "raw-u16")
      ->check(CLI::IsMember(std::vector<std::string>(std::begin(kDataFormats),
                                                     std::end(kDataFormats))))
      ->capture_default_str();
  app.add_option("--tokenizer", cli.tokenizer_path,
                 "a Hugging Face tokenizer.json (byte-level BPE: the GPT-2 and Llama 3 "
                 "families) for text data and samples; default: the --init directory's")
      ->check(CLI::ExistingFile);
  app.add_option("--val-data", cli.val_data_path,
                 "validation data, read as --data is; its loss is reported every --eval-every "
                 "steps");
  app.add_option("--eval-every", cli.train.eval_every,
                 "steps between validation losses (0: never; needs --val-data)")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--eval-batches", cli.train.eval_batches,
                 "validation blocks per rank in each evaluation")
      ->check(kAtLeastOne)
      ->capture_default_str();
  app.add_option("--sample-every", cli.sample_every,
                 "steps between printed samples of the model (0: never)")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--sample-tokens", cli.sample_tokens, "tokens per sample")
      ->check(kAtLeastOne)
      ->capture_default_str();
  app.add_option("--sample-prompt", cli.sample_prompt,
                 "the samples' prompt (default: the document-start token with a tokenizer, else a "
                 "newline)");
  app.add_option("--sample-temperature", cli.sample_temperature,
                 "the samples' temperature (0: greedy)")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--init", cli.init_path,
                 "start from these weights: a Hugging Face model directory (config.json and "
                 "model.safetensors or its shards) or a .safetensors file (docs/models.md)")
      ->check(CLI::ExistingPath);
  app.add_option("--save", cli.save_path,
                 "write the trained weights here: a .safetensors file, or, when PATH ends in / or "
                 "is a directory, a Hugging Face model directory with config.json");
  app.add_option("--save-shard-mb", cli.save_shard_mb,
                 "a --save directory's weights in safetensors shards of at most this many MiB, "
                 "listed by model.safetensors.index.json (as save_pretrained's max_shard_size)")
      ->check(bounded(1, true, int64_t{1} << 30))
      ->capture_default_str();
  app.add_option("--model", cli.model,
                 "gpt2 (GPT-2: learned positions, LayerNorm, GELU) or llama (RMSNorm, rotary "
                 "positions, SwiGLU, grouped-query attention)")
      ->check(CLI::IsMember({"gpt2", "llama"}))
      ->capture_default_str();
  app.add_option("--model-config", cli.model_config_path,
                 "the model from a Hugging Face config.json (model_type gpt2 or llama), "
                 "initialised afresh; explicit model flags must agree with it")
      ->check(CLI::ExistingFile);
  app.add_option("--kv-heads", cli.train.llama.kv_heads,
                 "llama: key/value heads (num_key_value_heads), dividing --heads")
      ->check(bounded(1, true, 4096))
      ->capture_default_str();
  app.add_option("--intermediate", cli.train.llama.intermediate,
                 "llama: the SwiGLU MLP's width (intermediate_size)")
      ->check(bounded(1, true, 1 << 20))
      ->capture_default_str();
  app.add_option("--rope-theta", cli.train.llama.rope_theta, "llama: the rotary base")
      ->check(kPositive)
      ->capture_default_str();
  app.add_option("--rms-norm-eps", cli.train.llama.rms_norm_eps, "llama: RMSNorm's epsilon")
      ->check(kPositive)
      ->capture_default_str();
  app.add_flag("--tie-embeddings", cli.train.llama.tie_embeddings,
               "llama: the output projection is the token embedding (tie_word_embeddings)");
  app.add_option("--checkpoint-dir", cli.train.checkpoint_dir,
                 "resumable checkpoints go here (docs/checkpoints.md)");
  app.add_option("--save-every", cli.train.save_every, "save a checkpoint every K steps (0: never)")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--keep-last", cli.train.keep_last, "keep the N newest checkpoints (0: all)")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_flag("--async-save", cli.train.async_save,
               "write checkpoints in a background thread while training goes on");
  app.add_option("--checkpoint-format", cli.train.checkpoint_format,
                 "full (weights gathered into model.safetensors), sharded (every rank writes "
                 "its part), auto (sharded under the sharded strategies)")
      ->check(CLI::IsMember({"auto", "full", "sharded"}))
      ->capture_default_str();
  app.add_option("--resume", cli.train.resume,
                 "auto (the newest committed checkpoint under --checkpoint-dir, if any) or a "
                 "checkpoint directory");
  app.add_option("--metrics", cli.metrics_path, "write one JSON object per step here (.jsonl)");
  app.add_option("--trace", cli.trace_path,
                 "write a Chrome/Perfetto trace (forward, backward, optimizer, DDP buckets) here; "
                 "with several ranks, rank R writes FILE with .rankR before the extension");
  app.add_option("--layers", cli.train.model.layers, "transformer blocks")
      ->check(bounded(1, true, 4096))
      ->capture_default_str();
  app.add_option("--heads", cli.train.model.heads, "attention heads")
      ->check(bounded(1, true, 4096))
      ->capture_default_str();
  app.add_option("--embd", cli.train.model.embd, "embedding width")
      ->check(bounded(1, true, 1 << 18))
      ->capture_default_str();
  app.add_option("--ctx", cli.train.model.context, "context length (sequence length)")
      ->check(bounded(1, true, 1 << 22))
      ->capture_default_str();
  app.add_option("--vocab", cli.train.model.vocab_size, "vocabulary size")
      ->check(bounded(1, true, 1 << 24))
      ->capture_default_str();
  app.add_option("--batch", cli.train.batch, "sequences per step (per rank)")
      ->check(bounded(1, true, 1 << 24))
      ->capture_default_str();
  app.add_option("--steps", cli.train.steps, "optimizer steps")
      ->check(kAtLeastOne)
      ->capture_default_str();
  app.add_option("--lr", cli.train.lr, "peak learning rate")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--optimizer", cli.train.optimizer,
                 "adamw or sgd (with --momentum, --dampening, "
                 "--nesterov; --lr and --weight-decay apply to both)")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  app.add_option("--momentum", cli.train.momentum, "SGD momentum")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--dampening", cli.train.dampening, "SGD dampening")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_flag("--nesterov", cli.train.nesterov, "SGD: Nesterov momentum");
  app.add_option("--beta1", cli.train.beta1, "AdamW beta1")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  app.add_option("--beta2", cli.train.beta2, "AdamW beta2")
      ->check(CLI::Range(0.0, 0.999999))
      ->capture_default_str();
  app.add_option("--eps", cli.train.eps, "AdamW epsilon")->check(kPositive)->capture_default_str();
  app.add_option("--weight-decay", cli.train.weight_decay,
                 "AdamW weight decay (parameters with >= 2 dims)")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--grad-clip", cli.train.grad_clip, "clip the global gradient norm (0 = off)")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--seed", cli.train.seed, "initialisation seed")
      ->check(kSeed)
      ->capture_default_str();
  app.add_option("--warmup-steps", cli.train.warmup_steps, "linear warmup steps")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--schedule", cli.train.schedule, "learning-rate schedule after warmup")
      ->check(CLI::IsMember({"constant", "cosine"}))
      ->capture_default_str();
  app.add_flag("--shuffle", cli.shuffle, "visit blocks in a seeded random order per epoch");
  app.add_option("--strategy", cli.strategy, "a registered strategy name (see --list-strategies)")
      ->capture_default_str();
  app.add_option("--accelerator,--device", cli.config.accelerator,
                 "cpu, cuda or auto (auto is the CPU; see docs/cuda.md)")
      ->check(CLI::IsMember({"cpu", "cuda", "gpu", "auto"}))
      ->capture_default_str();
  app.add_flag("--cuda-graph", cli.train.cuda_graph,
               "capture the whole step as a CUDA graph at the second step and replay it after "
               "(single device, --device cuda, AdamW; docs/cuda.md)");
  app.add_option("--preset", cli.preset,
                 "gpt2-small: 12 layers, 12 heads, embd 768, ctx 1024, vocab 50304 on synthetic "
                 "tokens (the GPU benchmark config); llama-tiny: --model llama's defaults; "
                 "smollm-135m: SmolLM-135M's shape (30 layers, hidden 576, 9 heads, 3 key/value "
                 "heads, intermediate 1536, vocab 49152, ctx 2048, tied). Explicit model flags "
                 "are ignored")
      ->check(CLI::IsMember({"gpt2-small", "llama-tiny", "smollm-135m"}));
  app.add_option("--peak-tflops", cli.peak_tflops,
                 "the device's peak dense TFLOP/s for the MFU line (default: H100/H200 SXM bf16)")
      ->check(kPositive)
      ->capture_default_str();
  app.add_option("--devices", cli.config.devices,
                 "devices per node: auto, N, -1 or a list like 0,2")
      ->capture_default_str();
  app.add_option("--precision", cli.config.precision,
                 "32-true, bf16-mixed or 16-mixed (mixed: matmuls round to bf16/f16, emulated on "
                 "the CPU; 16-mixed adds a dynamic loss scaler)")
      ->capture_default_str();
  app.add_option("--process-group-backend", cli.config.process_group_backend,
                 "auto, or a registered backend: shm, tcp, hierarchical, ucx, nccl (auto: nccl "
                 "for GPUs that each rank owns, hierarchical when the job spans hosts, else shm; "
                 "shm also serves loomrun's --nnodes when every node is this machine)")
      ->capture_default_str();
  app.add_option("--timeout", cli.timeout_s,
                 "seconds a collective may wait for a peer before every rank stops with an "
                 "error naming it (PyTorch's init_process_group timeout)")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  app.add_option("--threads", cli.threads,
                 "intra-op threads per rank for every CPU kernel and the optimizer step (0: this "
                 "machine's cores divided among the ranks on it; results are the same bits on any "
                 "count)")
      ->check(CLI::Range(0, 1 << 16))
      ->capture_default_str();
  app.add_option("--grad-accum", cli.train.grad_accum, "micro-batches per optimizer step")
      ->check(kAtLeastOne)
      ->capture_default_str();
  app.add_option("--ddp-comm-hook", cli.config.ddp.comm_hook,
                 "DDP communication hook: allreduce, bf16_compress, fp16_compress, powersgd")
      ->capture_default_str();
  auto& powersgd = cli.config.ddp.powersgd;
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
  app.add_option("--bucket-cap-mb", cli.config.ddp.bucket_cap_mb, "DDP bucket size cap")
      ->check(kPositive)
      ->capture_default_str();
  app.add_option("--local-sgd-period", cli.config.ddp.local_sgd_period,
                 "DDP: after warm-up, average parameters every K steps instead of gradients "
                 "every step (0 = off)")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--local-sgd-warmup", cli.config.ddp.local_sgd_warmup,
                 "DDP: steps of ordinary gradient averaging before local SGD starts")
      ->check(kNonNegative)
      ->capture_default_str();
  app.add_option("--activation-checkpointing", cli.activation_checkpointing,
                 "recompute the activations of each module of this class during backward "
                 "instead of keeping them: the model's block class (Block for gpt2, "
                 "LlamaDecoderLayer for llama) or none")
      ->check(CLI::IsMember({"none", "Block", "LlamaDecoderLayer"}))
      ->capture_default_str();
  strategies::pipeline::PipelineOptions& pipeline = cli.config.pipeline;
  app.add_option("--pp", pipeline.stages,
                 "pipeline stages (docs/parallelism.md); above 1 selects --strategy pipeline, "
                 "with the data-parallel size the world divided by it")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--tp", cli.config.tensor_parallel.size,
                 "tensor-parallel size (docs/parallelism.md); above 1 selects --strategy "
                 "model_parallel, with the data-parallel size the world divided by it")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_flag("--sequence-parallel", cli.config.tensor_parallel.sequence_parallel,
               "with --tp: split the activations between the split layers by sequence position "
               "(Megatron-LM's sequence parallelism)");
  app.add_option("--micro-batches", pipeline.micro_batches,
                 "pipeline: each data-parallel rank's --batch rows split into this many")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  app.add_option("--pp-schedule", pipeline.schedule,
                 "pipeline schedule: gpipe, 1f1b, interleaved_1f1b or zero_bubble")
      ->check(CLI::IsMember(names_of(strategies::pipeline::ScheduleRegistry::list())))
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
  strategies::sharded::ShardingOptions& sharding = cli.config.sharding;
  app.add_option("--wrap-policy", sharding.auto_wrap_policy,
                 "sharded strategies: which modules are units: none (the whole model), params "
                 "(every module owning parameters), min_params:N, or a class name such as Block "
                 "(default: none; params for deepspeed_stage_3*)");
  app.add_option("--fsdp-sharding-strategy", cli.config.fsdp_sharding_strategy,
                 "fsdp names: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD (shard inside "
                 "each node, replicate across nodes)")
      ->capture_default_str();
  app.add_flag("--forward-prefetch", sharding.forward_prefetch,
               "stage 3: all-gather the next unit while the current one runs forward");
  app.add_option("--backward-prefetch", cli.backward_prefetch,
                 "stage 3: when backward all-gathers the next unit: pre, post or none")
      ->check(CLI::IsMember({"pre", "post", "none"}))
      ->capture_default_str();
  app.add_option("--param-dtype", cli.param_dtype,
                 "stage 3: store and all-gather parameter shards in f32, bf16 or f16 (FSDP's "
                 "MixedPrecision param_dtype; master weights stay f32)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  app.add_option("--reduce-dtype", cli.reduce_dtype,
                 "sharded strategies: reduce gradients in f32, bf16 or f16 (FSDP's reduce_dtype)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  app.add_option("--weights-dtype", cli.weights_dtype,
                 "sharded strategies: keep the model's weights, and so its computation and "
                 "gradients, in bf16 or f16 with f32 master weights in the optimizer "
                 "(DeepSpeed's bf16/fp16 modes; distinct from --precision, which keeps f32 "
                 "weights and autocasts)")
      ->check(CLI::IsMember({"f32", "bf16", "f16"}))
      ->capture_default_str();
  app.add_option("--nvme-path", sharding.nvme_path,
                 "NVMe offload (deepspeed_stage_3_offload_nvme, or any strategy that offloads the "
                 "optimizer): directory for the swap file holding master weights and optimizer "
                 "state");
  app.add_option("--deepspeed-config", cli.deepspeed_config_path,
                 "DeepSpeed's JSON config: zero_optimization (stage, offload), batch sizes, "
                 "gradient_clipping, bf16/fp16, optimizer; it selects the strategy "
                 "(docs/sharding.md)");
  app.add_flag("--estimate-memory", cli.estimate_only,
               "print the per-rank memory each kind needs under --strategy on --devices ranks "
               "(parameters, gradients, optimizer state, communication, offloaded, and one "
               "micro-batch's activations from a run on the meta device) and exit");
  app.add_flag("--list-strategies", cli.list_strategies,
               "print the registered strategies and exit");
  app.add_option("--log-interval", cli.log_interval, "steps between plain progress lines")
      ->check(kAtLeastOne)
      ->capture_default_str();
}

void finish_parsing(const CLI::App& app, CommandLine& cli) {
  refuse_empty_values(app);
  cli.config.timeout = loom::Duration(std::max<int64_t>(1, std::llround(cli.timeout_s * 1000)));
  cli.save_directory = !cli.save_path.empty() && (cli.save_path.back() == '/' ||
                                                  std::filesystem::is_directory(cli.save_path));
  if (cli.save_directory) {
    std::string dir = cli.save_path;
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    check_output_path("--save", dir, /*directory=*/true);
  } else {
    check_output_path("--save", cli.save_path);
  }
  if (app.count("--save-shard-mb") > 0 && !cli.save_directory) {
    tag::kTrainGpt.fail("--save-shard-mb shards a model directory; give --save a directory (a "
                        "path ending in /) or drop the flag");
  }
  check_output_path("--metrics", cli.metrics_path);
  check_output_path("--trace", cli.trace_path);
  check_output_path("--checkpoint-dir", cli.train.checkpoint_dir, /*directory=*/true);
  // Opened (not read) now, so that a FIFO is refused before any work; a glob's files are
  // checked as the shard set opens.
  for (const std::string& path : {cli.data_path, cli.val_data_path}) {
    if (path.empty() || is_glob(path)) continue;
    uint64_t size = 0;
    open_regular_file(path, tag::kTrainGpt, kDataExpected, size);
  }
  if (cli.train.eval_every > 0 && cli.val_data_path.empty())
    tag::kTrainGpt.fail("--eval-every needs --val-data (the data the validation loss reads)");
  if (!cli.val_data_path.empty() && cli.train.eval_every == 0)
    tag::kTrainGpt.fail("--val-data is read only with --eval-every N (steps between evaluations)");
  strategies::sharded::ShardingOptions& sharding = cli.config.sharding;
  sharding.param_dtype = parse_dtype(cli.param_dtype);
  sharding.reduce_dtype = parse_dtype(cli.reduce_dtype);
  sharding.weights_dtype = parse_dtype(cli.weights_dtype);
  using strategies::sharded::BackwardPrefetch;
  sharding.backward_prefetch = cli.backward_prefetch == "pre"    ? BackwardPrefetch::Pre
                               : cli.backward_prefetch == "post" ? BackwardPrefetch::Post
                                                                 : BackwardPrefetch::None;
}

}  // namespace loom::train_gpt
