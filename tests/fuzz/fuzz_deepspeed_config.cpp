// Fuzzes the DeepSpeed configuration reader (strategies/deepspeed_config.h) with the input
// as the file's text, and then what train_gpt does with a config it read: apply it to the
// strategy options and check DeepSpeed's batch identity with the micro batch and the
// accumulation the config gave (train_gpt takes both from it; its flags' defaults, 8 and 1,
// otherwise).
//
// Contract: parse_deepspeed_config, apply_deepspeed_config and check_deepspeed_batch_sizes
// throw loom::Error for a config that is not valid JSON or not a valid config. That is all
// this harness catches: a nlohmann::json exception escaping the reader (type_error,
// out_of_range, ...), any other exception, or a sanitizer report (signed overflow in the
// batch arithmetic, for one) is a finding.

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "strategies/deepspeed_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace ls = loom::strategies;
  const std::string text(reinterpret_cast<const char*>(data), size);
  ls::DeepSpeedConfig config;
  try {
    config = ls::parse_deepspeed_config(text, "fuzz.json");
    ls::StrategyConfig options;
    ls::apply_deepspeed_config(config, options);
  } catch (const loom::Error&) {
    return 0;
  }
  for (int world_size : {1, 2, 1024}) {
    try {
      ls::check_deepspeed_batch_sizes(config, config.micro_batch_per_gpu.value_or(8),
                                      config.gradient_accumulation_steps.value_or(1), world_size);
    } catch (const loom::Error&) {
    }
  }
  return 0;
}
