// Memory by kind: what train_gpt's steps measure per rank (strategies/memory_report.h) under
// DDP and every sharded configuration, against the estimator (strategies/memory_estimate.h),
// which must land within 5% for each kind it predicts. Ranks are forked processes.

#include <gtest/gtest.h>

#include <cmath>

#include "multiprocess.h"
#include "nn/gpt.h"
#include "strategies/memory_estimate.h"
#include "strategies/registry.h"
#include "test_support.h"
#include "tiny_training.h"

namespace loom::strategies {
namespace {

using comm::testing::expect_all_ok;
using comm::testing::run_ranks;
using namespace std::chrono_literals;

// A model where parameters, not padding, dominate each unit.
nn::GPTConfig model_config() {
  nn::GPTConfig c = testing::tiny_gpt_config(DType::F32);
  c.layers = 3;
  c.embd = 32;
  return c;
}

// The peaks by kind (largest rank) over two train_gpt steps under `name`.
MemoryReport measure(const std::string& name, const StrategyConfig& options, int rank, int size,
                     const std::shared_ptr<comm::Store>& store, const std::string& group) {
  auto strategy = StrategyRegistry::create(name, options);
  dynamic_cast<ParallelStrategy&>(*strategy).set_process_group(std::make_shared<comm::ProcessGroup>(
      rank, size, store, comm::GroupOptions{.timeout = 30s}, group));
  strategy->setup_environment();
  nn::GPT model(model_config(), 3);
  train_gpt::TrainOptions o;
  o.model = model_config();
  o.batch = 2;
  o.steps = 2;
  data::TokenBlocks data(testing::tiny_corpus(), o.batch, testing::kTinyContext,
                              testing::kTinyVocab);
  MemoryReport last;
  train_gpt::train(
      model, data, o, [&](const train_gpt::StepMetrics& m) { last = m.memory; }, strategy.get());
  strategy->teardown();
  return last;
}

struct Case {
  std::string strategy;
  std::string wrap;  // auto_wrap_policy ("" keeps the name's default)
  std::string fsdp_sharding_strategy = "FULL_SHARD";
  bool nvme = false;  // swap file in a temporary directory, small sub-groups, 2 buffers
  DType weights = DType::F32;  // ShardingOptions::weights_dtype
};

TEST(MemoryEstimate, MatchesWhatTrainingStepsMeasureWithinFivePercent) {
  const std::vector<Case> cases = {
      {"ddp", ""},
      {"deepspeed_stage_1", ""},
      {"deepspeed_stage_2", ""},
      {"deepspeed_stage_2", "Block"},
      {"deepspeed_stage_2_offload", ""},
      {"deepspeed_stage_3", ""},
      {"deepspeed_stage_3_offload", ""},
      {"fsdp", "Block"},
      {"fsdp", "Block", "SHARD_GRAD_OP"},
      {"fsdp", "", "NO_SHARD"},
      {"fsdp_cpu_offload", "Block"},
      {"deepspeed_stage_3_offload_nvme", "", "FULL_SHARD", true},
      {"deepspeed_stage_1", "", "FULL_SHARD", false, DType::BF16},
      {"deepspeed_stage_2", "Block", "FULL_SHARD", false, DType::BF16},
      {"deepspeed_stage_2_offload", "", "FULL_SHARD", false, DType::BF16},
      {"deepspeed_stage_3", "", "FULL_SHARD", false, DType::BF16},
      {"deepspeed_stage_3_offload", "", "FULL_SHARD", false, DType::BF16},
      {"fsdp", "", "NO_SHARD", false, DType::F16},
  };
  const loom::testing::TempDir swap("loom-nvme");
  const std::string& swap_dir = swap.path();
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    for (size_t i = 0; i < cases.size(); ++i) {
      StrategyConfig options;
      if (cases[i].nvme) {
        options.sharding.nvme_path = swap_dir;
        options.sharding.sub_group_size = 4096;
        options.sharding.nvme_buffer_count = 2;
      }
      options.sharding.auto_wrap_policy = cases[i].wrap;
      options.sharding.weights_dtype = cases[i].weights;
      options.fsdp_sharding_strategy = cases[i].fsdp_sharding_strategy;
      std::string group = "m";
      group += std::to_string(i);
      const MemoryReport measured = measure(cases[i].strategy, options, rank, size, store, group);
      const MemoryEstimate estimate =
          estimate_memory(nn::GPT(model_config(), 3), cases[i].strategy, size, options);
      for (MemoryKind kind : {MemoryKind::Parameters, MemoryKind::Gradients,
                              MemoryKind::OptimizerState, MemoryKind::Communication,
                              MemoryKind::Offloaded}) {
        const double want = static_cast<double>(estimate.peak(kind));
        const double got = static_cast<double>(measured.peak(kind));
        EXPECT_LE(std::abs(got - want), 0.05 * want)
            << cases[i].strategy << " wrap '" << cases[i].wrap << "' "
            << cases[i].fsdp_sharding_strategy << " weights " << cases[i].weights << ": "
            << memory_kind_name(kind)
            << " measured " << got << " bytes, estimated " << want;
      }
      EXPECT_GT(measured.peak(MemoryKind::Activations), 0);
    }
  }, 240s));
}

TEST(MemoryEstimate, ZeroFormulasHoldForOneUnitOnFourRanks) {
  // The ZeRO paper's per-parameter bytes for fp32 AdamW (no padding with these sizes'
  // multiples of 4): DDP 16; stage 1: 4 + 4 + 8/N; stage 3 with one unit gathered whole.
  nn::GPT model(model_config(), 3);
  const int64_t p = model.parameter_count();
  const int64_t padded = (p + 3) / 4 * 4;
  MemoryEstimate ddp = estimate_memory(model, "ddp", 4);
  EXPECT_EQ(ddp.model_states(), 16 * p);
  MemoryEstimate one = estimate_memory(model, "deepspeed_stage_1", 4);
  EXPECT_EQ(one.peak(MemoryKind::Parameters), 4 * padded);
  EXPECT_EQ(one.peak(MemoryKind::Gradients), 4 * padded);
  EXPECT_EQ(one.peak(MemoryKind::OptimizerState), 8 * padded / 4);
  StrategyConfig whole;
  whole.sharding.auto_wrap_policy = "none";
  MemoryEstimate three = estimate_memory(model, "deepspeed_stage_3", 4, whole);
  EXPECT_EQ(three.units, 1);
  EXPECT_EQ(three.peak(MemoryKind::OptimizerState), 8 * padded / 4);
  EXPECT_EQ(three.peak(MemoryKind::Parameters), 4 * padded / 4 + 4 * padded);
  // 16-bit weights, the paper's own accounting: 2 + 2 + K/N with K = 12 (f32 masters and
  // two moments), plus the f32 copy of the gradient shard the step reads (4/N).
  StrategyConfig bf16;
  bf16.sharding.weights_dtype = DType::BF16;
  MemoryEstimate one16 = estimate_memory(model, "deepspeed_stage_1", 4, bf16);
  EXPECT_EQ(one16.peak(MemoryKind::Parameters), 2 * padded);
  EXPECT_EQ(one16.peak(MemoryKind::Gradients), 2 * padded + 4 * padded / 4);
  EXPECT_EQ(one16.peak(MemoryKind::OptimizerState), 12 * padded / 4);
  bf16.sharding.auto_wrap_policy = "none";
  MemoryEstimate three16 = estimate_memory(model, "deepspeed_stage_3", 4, bf16);
  EXPECT_EQ(three16.peak(MemoryKind::Parameters), 2 * padded / 4 + 2 * padded);
  EXPECT_EQ(three16.peak(MemoryKind::Gradients), 2 * padded / 4 + 2 * padded);
  EXPECT_EQ(three16.peak(MemoryKind::OptimizerState), 12 * padded / 4);
  EXPECT_THROW(estimate_memory(model, "dp", 2), Error);
  EXPECT_THROW(estimate_memory(model, "deepspeed_stage_9", 2), Error);
}

}  // namespace
}  // namespace loom::strategies
