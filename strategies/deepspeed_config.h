#pragma once
// DeepSpeed's JSON configuration (`train_gpt --deepspeed-config FILE.json`), read with
// DeepSpeed's own keys where they map onto Loom (docs/sharding.md, "DeepSpeed
// configuration"). Every key is checked: an unknown key is an error naming it and the
// closest known key; a key Loom reads but does not act on yields a warning saying why;
// "auto" (as Hugging Face's Trainer writes) leaves Loom's value.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "strategies/registry.h"

namespace loom::strategies {

struct DeepSpeedConfig {
  std::optional<int> stage;  // zero_optimization.stage, 0-3
  // offload_optimizer.device / offload_param.device: "none", "cpu" or "nvme"
  std::string offload_optimizer = "none";
  std::string offload_param = "none";
  std::string nvme_path;                     // offload_optimizer.nvme_path
  std::string param_nvme_path;               // offload_param.nvme_path
  std::optional<int> nvme_buffer_count;      // offload_optimizer.buffer_count
  std::optional<int64_t> sub_group_size;     // zero_optimization.sub_group_size
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> micro_batch_per_gpu;  // train_micro_batch_size_per_gpu
  std::optional<int64_t> gradient_accumulation_steps;
  std::optional<double> gradient_clipping;
  // bf16: 16-bit weights (ShardingOptions::weights_dtype bf16), as DeepSpeed trains; with
  // NVMe offload, where 16-bit weights are not built, "bf16-mixed" (autocast) and a warning.
  // fp16: f16 weights and "16-mixed" for its loss scaler.
  std::optional<DType> weights_dtype;
  std::optional<std::string> precision;  // "bf16-mixed" or "16-mixed"
  LossScalerOptions loss_scaler;         // from the fp16 section, DeepSpeed's defaults
  struct Optimizer {
    // "AdamW" (DeepSpeed's Adam with adam_w_mode true is AdamW too) or "SGD"
    std::string type;
    std::optional<double> lr, weight_decay;
    std::optional<double> beta1, beta2, eps;  // AdamW
    std::optional<double> momentum, dampening;  // SGD
    std::optional<bool> nesterov;               // SGD
  };
  std::optional<Optimizer> optimizer;
  std::vector<std::string> warnings;  // keys read but not acted on, with the reason
};

// `source` names the text in errors (the file's path). Throws loom::Error: not JSON (line
// and column), an unknown key, a wrong type or value.
DeepSpeedConfig parse_deepspeed_config(const std::string& json_text, const std::string& source);
DeepSpeedConfig load_deepspeed_config(const std::string& path);

// The registered strategy the config selects (deepspeed_stage_N; stage 0 is fsdp with
// NO_SHARD) with its offload (NVMe: nvme_path, buffer_count, sub_group_size; parameters on
// NVMe need the optimizer there too, in the same directory) and precision set in
// `options`.
std::string apply_deepspeed_config(const DeepSpeedConfig& config, StrategyConfig& options);

// DeepSpeed's batch identity: train_batch_size = micro batch x accumulation x world size.
void check_deepspeed_batch_sizes(const DeepSpeedConfig& config, int64_t micro_batch,
                                 int64_t accumulation, int world_size);

}  // namespace loom::strategies
