// DeepSpeed's JSON config: what each key becomes, the warnings for keys Loom reads but does
// not act on, and the errors for unknown keys, bad values and text that is not JSON.

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>

#include "strategies/deepspeed_config.h"

namespace loom::strategies {
namespace {

// For EXPECT_PRED2, which prints both strings when it fails.
bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The error message parse_deepspeed_config gives for `text` ("" when it parses).
std::string error_of(const std::string& text) {
  try {
    parse_deepspeed_config(text, "ds.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(DeepSpeedConfig, AZeroThreeConfigMapsOntoLoom) {
  const DeepSpeedConfig c = parse_deepspeed_config(R"({
    "train_batch_size": 16,
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
             "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW",
                  "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1}},
    "zero_optimization": {"stage": 3, "overlap_comm": true,
                          "offload_optimizer": {"device": "cpu"},
                          "offload_param": {"device": "cpu", "pin_memory": false}}
  })", "ds.json");
  EXPECT_EQ(c.stage, 3);
  EXPECT_EQ(c.offload_optimizer, "cpu");
  EXPECT_EQ(c.offload_param, "cpu");
  EXPECT_EQ(c.micro_batch_per_gpu, 4);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.gradient_clipping, 1.0);
  EXPECT_EQ(c.precision, "16-mixed");  // for the loss scaler
  EXPECT_EQ(c.weights_dtype, DType::F16);
  EXPECT_EQ(c.loss_scaler.initial_scale, 4096.0);
  EXPECT_EQ(c.loss_scaler.growth_interval, 500);
  EXPECT_EQ(c.loss_scaler.min_scale, 1.0);
  EXPECT_EQ(c.loss_scaler.backoff, 0.5);  // dynamic: loss_scale 0
  ASSERT_TRUE(c.optimizer.has_value());
  EXPECT_EQ(c.optimizer->lr, 3e-4);
  EXPECT_EQ(c.optimizer->beta2, 0.95);
  EXPECT_EQ(c.optimizer->weight_decay, 0.1);
  // Only hysteresis is read without effect (overlap_comm true and pin_memory false are
  // what Loom does anyway).
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_PRED2(contains, c.warnings[0], "fp16.hysteresis");

  StrategyConfig options;
  EXPECT_EQ(apply_deepspeed_config(c, options), "deepspeed_stage_3");
  EXPECT_TRUE(options.sharding.offload_optimizer);
  EXPECT_TRUE(options.sharding.offload_params);
  EXPECT_EQ(options.precision, "16-mixed");
  EXPECT_EQ(options.sharding.weights_dtype, DType::F16);
  EXPECT_EQ(options.loss_scaler.initial_scale, 4096.0);
  check_deepspeed_batch_sizes(c, 4, 2, 2);
  EXPECT_THROW(check_deepspeed_batch_sizes(c, 4, 2, 4), Error);
}

TEST(DeepSpeedConfig, AutoLeavesLoomsValueAndStageZeroIsNoShard) {
  const DeepSpeedConfig c = parse_deepspeed_config(
      R"({"train_micro_batch_size_per_gpu": "auto", "bf16": {"enabled": true},
          "zero_optimization": {"stage": "auto", "reduce_bucket_size": "auto"}})",
      "ds.json");
  EXPECT_FALSE(c.micro_batch_per_gpu.has_value());
  EXPECT_FALSE(c.stage.has_value());
  EXPECT_FALSE(c.precision.has_value());  // DeepSpeed's bf16 mode: 16-bit weights
  EXPECT_EQ(c.weights_dtype, DType::BF16);
  ASSERT_EQ(c.warnings.size(), 1u);  // reduce_bucket_size is read but not acted on
  EXPECT_PRED2(contains, c.warnings[0], "zero_optimization.reduce_bucket_size");
  StrategyConfig options;
  EXPECT_EQ(apply_deepspeed_config(c, options), "fsdp");
  EXPECT_EQ(options.fsdp_sharding_strategy, "NO_SHARD");
  EXPECT_EQ(options.sharding.weights_dtype, DType::BF16);
  EXPECT_EQ(options.precision, "32-true");
  const DeepSpeedConfig fixed =
      parse_deepspeed_config(R"({"fp16": {"enabled": true, "loss_scale": 128}})", "ds.json");
  EXPECT_EQ(fixed.loss_scaler.initial_scale, 128.0);
  EXPECT_EQ(fixed.loss_scaler.growth, 1.0);
  EXPECT_EQ(fixed.loss_scaler.backoff, 1.0);
}

TEST(DeepSpeedConfig, UnknownKeysNameTheClosestKnownOne) {
  EXPECT_PRED2(contains, error_of(R"({"zero_optimization": {"stag": 2}})"), "unknown key 'zero_optimization.stag'; did you mean "
                        "'zero_optimization.stage'?");
  EXPECT_PRED2(contains, error_of(R"({"gradient_cliping": 1.0})"), "did you mean 'gradient_clipping'");
  EXPECT_PRED2(contains, error_of(R"({"zero_optimization": {"offload_param": {"devise": "cpu"}}})"), "'zero_optimization.offload_param.device'");
}

TEST(DeepSpeedConfig, NotJsonGivesLineAndColumn) {
  const std::string text = "{\n  \"zero_optimization\": {\n    \"stage\": 2\n    \"overlap_comm\": true\n  }\n}\n";
  const std::string message = error_of(text);
  EXPECT_PRED2(contains, message, "ds.json is not valid JSON at line 4, column");
  EXPECT_PRED2(contains, message, "expected '}'");
}

TEST(DeepSpeedConfig, BadValuesAreNamed) {
  EXPECT_PRED2(contains, error_of(R"({"zero_optimization": {"stage": 4}})"), "zero_optimization.stage: expected an integer 0-3, got 4");
  EXPECT_PRED2(contains, error_of(R"({"zero_optimization": {"stage": "three"}})"), "expected an integer 0-3, got \"three\"");
  EXPECT_PRED2(contains, error_of(R"({"zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}})"), "offload_param needs stage 3");
  EXPECT_PRED2(contains, error_of(R"({"zero_optimization": {"offload_optimizer": {"device": "disk"}}})"), "\"none\", \"cpu\" or \"nvme\"");
  EXPECT_PRED2(contains, error_of(R"({"bf16": {"enabled": true}, "fp16": {"enabled": true}})"), "bf16 and fp16 are both enabled");
  EXPECT_PRED2(contains, error_of(R"({"fp16": {"enabled": true}, "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}})"), "fp16 with NVMe offload is not built");
  const DeepSpeedConfig bf16_nvme = parse_deepspeed_config(
      R"({"bf16": {"enabled": true}, "zero_optimization": {"stage": 3,
          "offload_optimizer": {"device": "nvme", "nvme_path": "/x"}}})", "ds.json");
  EXPECT_FALSE(bf16_nvme.weights_dtype.has_value());  // not built with NVMe: autocast instead
  EXPECT_EQ(bf16_nvme.precision, "bf16-mixed");
  ASSERT_EQ(bf16_nvme.warnings.size(), 1u);
  EXPECT_PRED2(contains, bf16_nvme.warnings[0], "16-bit weights are not built with NVMe");
  EXPECT_PRED2(contains, error_of(R"({"optimizer": {"type": "Lamb"}})"), "'Lamb' is unknown");
  EXPECT_PRED2(contains, error_of(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})"), "adam_w_mode false (L2 weight decay) is not built");
  EXPECT_PRED2(contains, error_of(R"([1, 2])"), "the top level: expected an object");
  EXPECT_PRED2(contains, error_of(R"({"optimizer": {"type": "AdamW", "params": {"eps": 0}}})"), "optimizer.params.eps: expected a number above 0, got 0");
  EXPECT_PRED2(contains, error_of(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 1.0]}}})"), "two numbers in [0, 1), got [0.9,1.0]");
  StrategyConfig options;
  DeepSpeedConfig nvme = parse_deepspeed_config(
      R"({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": "/x"}}})",
      "ds.json");
  try {
    apply_deepspeed_config(nvme, options);
    ADD_FAILURE() << "offload_param on nvme without the optimizer there";
  } catch (const Error& e) {
    EXPECT_PRED2(contains, std::string(e.what()), "needs offload_optimizer on \"nvme\" too");
  }
  DeepSpeedConfig two_paths = parse_deepspeed_config(
      R"({"zero_optimization": {"stage": 3,
          "offload_optimizer": {"device": "nvme", "nvme_path": "/a"},
          "offload_param": {"device": "nvme", "nvme_path": "/b"}}})", "ds.json");
  try {
    apply_deepspeed_config(two_paths, options);
    ADD_FAILURE() << "two NVMe directories";
  } catch (const Error& e) {
    EXPECT_PRED2(contains, std::string(e.what()), "give them the same directory");
  }
  DeepSpeedConfig no_path = parse_deepspeed_config(
      R"({"zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme"}}})", "ds.json");
  try {
    apply_deepspeed_config(no_path, options);
    ADD_FAILURE() << "nvme without nvme_path";
  } catch (const Error& e) {
    EXPECT_PRED2(contains, std::string(e.what()), "needs offload_optimizer.nvme_path");
  }
}

// ZeRO-Infinity's optimizer offload: the swap directory, buffer count and sub-group size
// reach the engine's options; DeepSpeed's 1e9 style of writing sizes is accepted.
TEST(DeepSpeedConfig, NvmeOffloadOfTheOptimizerMaps) {
  DeepSpeedConfig config = parse_deepspeed_config(R"({
      "zero_optimization": {"stage": 3, "sub_group_size": 1e8,
        "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme", "buffer_count": 5,
                              "pipeline_read": true},
        "offload_param": {"device": "cpu"}}})",
                                                  "ds.json");
  StrategyConfig options;
  EXPECT_EQ(apply_deepspeed_config(config, options), "deepspeed_stage_3");
  EXPECT_TRUE(options.sharding.offload_optimizer);
  EXPECT_TRUE(options.sharding.offload_params);
  EXPECT_EQ(options.sharding.nvme_path, "/local_nvme");
  EXPECT_EQ(options.sharding.nvme_buffer_count, 5);
  EXPECT_EQ(options.sharding.sub_group_size, 100000000);
  ASSERT_EQ(config.warnings.size(), 1u);
  EXPECT_PRED2(contains, config.warnings[0], "pipeline_read");
  EXPECT_FALSE(options.sharding.nvme_params);  // offload_param is on the cpu here
  DeepSpeedConfig infinity = parse_deepspeed_config(R"({"zero_optimization": {"stage": 3,
      "offload_optimizer": {"device": "nvme", "nvme_path": "/local_nvme"},
      "offload_param": {"device": "nvme", "nvme_path": "/local_nvme"}}})", "ds.json");
  StrategyConfig both;
  apply_deepspeed_config(infinity, both);
  EXPECT_TRUE(both.sharding.nvme_params);
  EXPECT_TRUE(both.sharding.offload_params);
  EXPECT_PRED2(contains, error_of(R"({"zero_optimization": {"sub_group_size": 1.5}})"),
               "sub_group_size: expected an integer");
}

TEST(DeepSpeedConfig, SgdWithItsParameters) {
  DeepSpeedConfig config = parse_deepspeed_config(R"({"optimizer": {"type": "SGD", "params":
      {"lr": 0.05, "momentum": 0.9, "nesterov": true, "weight_decay": 0.01}}})", "ds.json");
  ASSERT_TRUE(config.optimizer.has_value());
  EXPECT_EQ(config.optimizer->type, "SGD");
  EXPECT_EQ(config.optimizer->lr, 0.05);
  EXPECT_EQ(config.optimizer->momentum, 0.9);
  EXPECT_EQ(config.optimizer->nesterov, true);
  EXPECT_EQ(config.optimizer->weight_decay, 0.01);
  EXPECT_FALSE(config.optimizer->beta1.has_value());
  EXPECT_PRED2(contains, error_of(R"({"optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.99]}}})"),
               "optimizer.params.betas belongs to Adam/AdamW, not SGD");
  EXPECT_PRED2(contains, error_of(R"({"optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}})"),
               "optimizer.params.momentum belongs to SGD, not AdamW");
}

TEST(DeepSpeedConfig, MissingFileIsNamed) {
  try {
    load_deepspeed_config("/nonexistent/ds_config.json");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_PRED2(contains, std::string(e.what()), "'/nonexistent/ds_config.json'");
  }
  try {
    load_deepspeed_config("/tmp");
    FAIL() << "expected an error for a folder";
  } catch (const Error& e) {
    EXPECT_PRED2(contains, std::string(e.what()), "'/tmp' is a folder");
  }
  char path[] = "/tmp/loom_ds_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  {
    std::ofstream out(path);
    out << R"({"zero_optimization": {"stage": 1}})";
  }
  EXPECT_EQ(load_deepspeed_config(path).stage, 1);
  std::remove(path);
}

}  // namespace
}  // namespace loom::strategies
