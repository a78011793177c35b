#pragma once
// train_gpt's command line: every flag (add_flags), bound to the fields of a CommandLine, and
// what is checked and converted once CLI11 has parsed them (finish_parsing). The strategy's
// options are filled into a StrategyConfig; which of them the chosen strategy reads is the
// registry's to say (flag_checks.h, refuse_flags_without_effect).

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <string>

#include "strategies/registry.h"
#include "tools/train_gpt/trainer.h"

namespace loom::train_gpt {

inline constexpr const char* kDataExpected =
    "--data file (llm.c token shards, text with --tokenizer, or bytes as tokens)";

struct CommandLine {
  TrainOptions train;
  std::string data_path, init_path, save_path, metrics_path, trace_path;
  std::string data_format = "auto", tokenizer_path, val_data_path;
  std::string model_config_path;  // --model-config: a Hugging Face config.json
  // --sample-every: every N steps rank 0 prints a continuation of --sample-prompt.
  int64_t sample_every = 0, sample_tokens = 64;
  std::string sample_prompt;
  double sample_temperature = 1.0;
  bool shuffle = false;
  int64_t log_interval = 10;
  std::string strategy = "single_device";
  strategies::StrategyConfig config;
  std::string preset;          // "", gpt2-small, llama-tiny or smollm-135m
  std::string model = "gpt2";  // --model: gpt2 or llama (an --init directory's config decides)
  bool save_directory = false;  // --save names a Hugging Face directory (ends in / or is one)
  int64_t save_shard_mb = 5120;  // a directory's safetensors shards (save_pretrained's 5 GB)
  double peak_tflops = 989.0;  // for the MFU line
  int threads = 0;             // 0: the machine's cores divided among its ranks
  std::string activation_checkpointing = "none";
  std::string deepspeed_config_path;
  bool estimate_only = false;
  // loom-sim (the same program under that name: docs/simulation.md): simulate rank 0 of
  // sim_world_size ranks (0: --devices x --num-nodes) instead of training; JSON with sim_json.
  bool simulate = false;
  int sim_world_size = 0;
  bool sim_json = false;
  std::string sim_cluster = "this-machine";  // a preset or a file (sim/cluster.h)
  bool sim_sweep = false;                     // rank configurations (sweep.h)
  double sim_memory_limit_gib = 0;            // the sweep's limit (0: the cluster's memory)
  bool list_strategies = false;
  // As typed; finish_parsing converts them into `config`.
  double timeout_s = std::chrono::duration<double>(loom::kDefaultTimeout).count();
  std::string backward_prefetch = "pre";
  std::string param_dtype = "f32", reduce_dtype = "f32", weights_dtype = "f32";
};

// Declares every flag on `app`, bound to `cli`'s fields (which hold the defaults).
void add_flags(CLI::App& app, CommandLine& cli);
// After app.parse: refuses empty values and outputs that cannot be written, opens --data to
// refuse a FIFO, and converts the typed timeout, dtypes and prefetch into cli.config.
void finish_parsing(const CLI::App& app, CommandLine& cli);

}  // namespace loom::train_gpt
