// Resharding on load (docs/checkpoints.md): a checkpoint saved under one strategy and world
// size, loaded under another and saved again, holds bitwise the same tensors (weights,
// optimizer state, counters), hop after hop through replicating, sharded, hybrid, offloaded,
// NVMe, pipeline and tensor-parallel strategies on 1 to 4 ranks. Each hop runs in real
// processes.

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "../comm/multiprocess.h"
#include "../comm/test_support.h"
#include "nn/gpt.h"
#include "strategies/checkpoint/checkpoint_reader.h"
#include "strategies/checkpoint/directory.h"
#include "strategies/checkpoint/distributed_state.h"
#include "strategies/registry.h"
#include "tiny_training.h"

namespace loom::strategies {
namespace {

namespace fs = std::filesystem;
using comm::testing::expect_all_ok;
using comm::testing::run_ranks;
using namespace std::chrono_literals;

struct Hop {
  std::string strategy;
  int world;
  std::function<void(StrategyConfig&, const fs::path& scratch)> adjust = nullptr;
};

std::unique_ptr<Strategy> make(const Hop& hop, int rank, const std::shared_ptr<comm::Store>& store,
                               const fs::path& scratch) {
  StrategyConfig options;
  if (hop.adjust) hop.adjust(options, scratch);
  auto strategy = StrategyRegistry::create(hop.strategy, std::move(options));
  if (auto* parallel = dynamic_cast<ParallelStrategy*>(strategy.get())) {
    parallel->set_process_group(std::make_shared<comm::ProcessGroup>(
        rank, hop.world, store, comm::GroupOptions{.timeout = 30s}, "reshard"));
  }
  strategy->setup_environment();
  return strategy;
}

train_gpt::TrainOptions tiny_options(const std::string& optimizer) {
  train_gpt::TrainOptions o;
  o.model = testing::tiny_gpt_config(DType::F32);
  o.batch = 2;
  o.lr = 1e-2;
  o.optimizer = optimizer;
  o.momentum = 0.9;
  return o;
}

// Three steps of train_gpt under the first hop, saving a checkpoint at step 3.
void train_and_save(const Hop& hop, const std::string& optimizer, const fs::path& root,
                    const fs::path& scratch) {
  expect_all_ok(run_ranks(hop.world, [&](int rank, int, std::shared_ptr<comm::Store> store) {
    auto strategy = make(hop, rank, store, scratch);
    train_gpt::TrainOptions o = tiny_options(optimizer);
    o.steps = 3;
    o.save_every = 3;
    o.checkpoint_dir = root;
    nn::GPT model(o.model, 4);
    data::TokenBlocks data(testing::tiny_corpus(), o.batch, testing::kTinyContext,
                                testing::kTinyVocab);
    train_gpt::train(model, data, o, [](const train_gpt::StepMetrics&) {}, strategy.get());
    strategy->teardown();
  }, 120s));
}

// Loads `from` under `hop` into a model initialised differently, then saves it to `to`.
void load_and_save(const Hop& hop, const std::string& optimizer, const fs::path& from,
                   const fs::path& to, const fs::path& scratch) {
  expect_all_ok(run_ranks(hop.world, [&](int rank, int, std::shared_ptr<comm::Store> store) {
    auto strategy = make(hop, rank, store, scratch);
    const train_gpt::TrainOptions o = tiny_options(optimizer);
    nn::GPT model(o.model, 99);
    strategy->setup_module(model);
    auto made = train_gpt::make_optimizer(model, o);
    strategy->setup_optimizer(*made);
    checkpoint::load_checkpoint(*strategy, model, made.get(), from, "tensors.");
    checkpoint::save_checkpoint(*strategy, model, made.get(), to, {},
                                "{\"strategy\": \"" + hop.strategy + "\", \"world_size\": " +
                                    std::to_string(hop.world) + "}");
    strategy->teardown();
  }, 120s));
}

// Every tensor of `b` is bitwise the one of the same name in `a`, and they hold the same
// names.
void expect_same_tensors(const fs::path& a, const fs::path& b, const std::string& label) {
  checkpoint::CheckpointReader x(a), y(b);
  std::vector<std::string> names_a, names_b;
  for (const auto& [name, entry] : x.index().tensors)
    names_a.push_back(name);
  for (const auto& [name, entry] : y.index().tensors)
    names_b.push_back(name);
  ASSERT_EQ(names_a, names_b) << label;
  for (const std::string& name : names_a) {
    const Tensor u = x.read(name), v = y.read(name);
    ASSERT_EQ(u.shape(), v.shape()) << label << " " << name;
    EXPECT_EQ(std::memcmp(u.raw_data(), v.raw_data(), u.nbytes()), 0) << label << " " << name;
  }
}

// Rewrites `from` as 2 tensor-parallel ranks would hold it: every 2-D tensor (weights and
// their optimizer state) split into two blocks of columns (boxes), the rest into two runs.
void rewrite_as_column_blocks(const fs::path& from, const fs::path& to) {
  checkpoint::CheckpointReader reader(from);
  std::vector<std::vector<checkpoint::TensorPiece>> ranks(2);
  for (const auto& [name, entry] : reader.index().tensors) {
    const Tensor whole = reader.read(name);
    if (entry.shape.size() == 2) {
      const int64_t cols = entry.shape[1], half = cols / 2;
      for (int r = 0; r < 2; ++r) {
        const int64_t first = r == 0 ? 0 : half, count = r == 0 ? half : cols - half;
        Tensor block = whole.narrow(1, first, count).contiguous();
        ranks[r].push_back({name, entry.shape, 0, block.reshape({block.numel()}), {0, first},
                            {entry.shape[0], count}});
      }
      continue;
    }
    const Tensor flat = whole.reshape({whole.numel()});
    const int64_t n = flat.numel();
    for (int r = 0; r < 2; ++r) {
      const int64_t lo = n * r / 2, hi = n * (r + 1) / 2;
      if (lo < hi) ranks[r].push_back({name, entry.shape, lo, flat.narrow(0, lo, hi - lo).contiguous()});
    }
  }
  fs::create_directories(to);
  for (int r = 0; r < 2; ++r)
    checkpoint::write_pieces(to / checkpoint::rank_file(r), ranks[r]);
  checkpoint::write_index(to, 2);
  std::ofstream(to / checkpoint::Directory::kMarker) << "";
}

void expect_hops_keep_the_state(const std::vector<Hop>& hops, const std::string& optimizer,
                                bool column_blocks = false) {
  loom::testing::TempDir dir;
  const fs::path scratch = dir.path() / "nvme";
  fs::create_directories(scratch);
  train_and_save(hops[0], optimizer, dir.path() / "run", scratch);
  const fs::path first = dir.path() / "run" / "step-00000003";
  ASSERT_TRUE(checkpoint::Directory::is_committed(first));
  fs::path previous = first;
  if (column_blocks) {
    previous = dir.path() / "columns";
    rewrite_as_column_blocks(first, previous);
    expect_same_tensors(first, previous, "column blocks");
  }
  std::string path_so_far = hops[0].strategy + "/" + std::to_string(hops[0].world);
  for (size_t h = 1; h < hops.size(); ++h) {
    const fs::path next = dir.path() / ("hop-" + std::to_string(h));
    load_and_save(hops[h], optimizer, previous, next, scratch);
    path_so_far += " -> " + hops[h].strategy + "/" + std::to_string(hops[h].world);
    expect_same_tensors(first, next, path_so_far);
    previous = next;
  }
  EXPECT_TRUE(fs::is_empty(scratch)) << "NVMe swap files left behind";
}

void block_units(StrategyConfig& o, const fs::path&) {
  o.sharding.auto_wrap_policy = "Block";
}

auto tensor_parallel(int size) {
  return [size](StrategyConfig& o, const fs::path&) { o.tensor_parallel.size = size; };
}

auto stages(int count) {
  return [count](StrategyConfig& o, const fs::path&) { o.pipeline.stages = count; };
}

TEST(Resharding, AdamWStateSurvivesEveryStrategyAndWorldSize) {
  expect_hops_keep_the_state(
      {{"ddp", 2},
       {"deepspeed_stage_3", 3, block_units},
       {"deepspeed_stage_1", 2},
       {"fsdp", 4,
        [](StrategyConfig& o, const fs::path&) {
          o.fsdp_sharding_strategy = "HYBRID_SHARD";
          o.sharding.shard_group_size = 2;
          o.sharding.auto_wrap_policy = "Block";
        }},
       {"pipeline", 2, stages(2)},
       {"pipeline", 4, stages(2)},  // dp 2 x pp 2
       {"pipeline", 4,
        [](StrategyConfig& o, const fs::path&) {  // dp 2 x pp 2, ZeRO-1 inside the stages
          o.pipeline.stages = 2;
          o.pipeline.data_parallel = "deepspeed_stage_1";
        }},
       {"pipeline", 3, stages(3)},
       {"model_parallel", 2, tensor_parallel(2)},
       {"model_parallel", 2,
        [](StrategyConfig& o, const fs::path&) {
          o.tensor_parallel.size = 2;
          o.tensor_parallel.sequence_parallel = true;
        }},
       {"model_parallel", 4, tensor_parallel(2)},  // dp 2 x tp 2
       {"pipeline", 4,
        [](StrategyConfig& o, const fs::path&) {  // pp 2 x tp 2
          o.pipeline.stages = 2;
          o.tensor_parallel.size = 2;
        }},
       {"single_device", 1},
       {"fsdp", 2,
        [](StrategyConfig& o, const fs::path&) {  // every rank a replica (stage 0)
          o.fsdp_sharding_strategy = "NO_SHARD";
        }},
       {"fsdp_cpu_offload", 2}},
      "adamw");
}

// The layout a tensor-parallel strategy writes (blocks of columns) loads everywhere.
TEST(Resharding, ColumnBlocksLoadUnderEveryKindOfStrategy) {
  expect_hops_keep_the_state({{"ddp", 2},
                              {"deepspeed_stage_3", 3, block_units},
                              {"pipeline", 2, stages(2)},
                              {"single_device", 1}},
                             "adamw", /*column_blocks=*/true);
}

// 16-bit weights (ShardingOptions::weights_dtype): checkpoints hold the f32 masters, so the
// state survives hops through every stage with bf16 weights, host offload, and f32 strategies.
TEST(Resharding, SixteenBitWeightsKeepTheirF32Masters) {
  auto bf16 = [](StrategyConfig& o, const fs::path&) { o.sharding.weights_dtype = DType::BF16; };
  expect_hops_keep_the_state({{"deepspeed_stage_2", 2, bf16},
                              {"deepspeed_stage_3", 3,
                               [](StrategyConfig& o, const fs::path&) {
                                 o.sharding.weights_dtype = DType::BF16;
                                 o.sharding.auto_wrap_policy = "Block";
                               }},
                              {"ddp", 2},
                              {"fsdp", 2,
                               [](StrategyConfig& o, const fs::path&) {
                                 o.fsdp_sharding_strategy = "NO_SHARD";  // stage 0
                                 o.sharding.weights_dtype = DType::BF16;
                               }},
                              {"deepspeed_stage_1", 3, bf16},
                              {"deepspeed_stage_3_offload", 2, bf16},
                              {"single_device", 1}},
                             "adamw");
}

TEST(Resharding, SgdMomentumSurvivesNvmeSubGroups) {
  auto nvme = [](StrategyConfig& o, const fs::path& scratch) {
    o.sharding.nvme_path = scratch;
    o.sharding.sub_group_size = 100;  // sub-groups cut through parameters
    o.sharding.nvme_buffer_count = 2;
  };
  expect_hops_keep_the_state({{"deepspeed_stage_2", 2},
                              {"deepspeed_stage_3_offload_nvme", 3, nvme},
                              {"ddp", 1}},
                             "sgd");
}

}  // namespace
}  // namespace loom::strategies
