// The sharding engine: unit planning, the exact gradient norm, and the promise that every
// sharded configuration gives bitwise the weights DDP gives (same world size and global
// batch, f32 with clipping, plain and mixed precision, with accumulation). Ranks are forked
// processes.

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>

#include "kernels/cpu/exact_square_sum.h"
#include "multiprocess.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "optim/clip_grad.h"
#include "strategies/memory_report.h"
#include "strategies/registry.h"
#include "strategies/sharded/sharded_strategy.h"
#include "strategies/sharded/units.h"
#include "test_support.h"
#include "tiny_training.h"

namespace loom::strategies {
namespace {

using comm::testing::expect_all_ok;
using comm::testing::run_ranks;
using namespace std::chrono_literals;

std::vector<std::string> unit_paths(const sharded::UnitPlan& plan) {
  std::vector<std::string> out;
  for (const auto& u : plan.units)
    out.push_back(u.path);
  return out;
}

size_t index_of(const nn::Module& model, const std::string& name) {
  auto named = model.named_parameters();
  for (size_t i = 0; i < named.size(); ++i)
    if (named[i].first == name) return i;
  ADD_FAILURE() << "no parameter " << name;
  return 0;
}

TEST(ShardedUnits, PoliciesChooseUnitsAndTheTiedEmbeddingStaysInTheRoot) {
  nn::GPT model(testing::tiny_gpt_config(DType::F32), 1);
  auto whole = sharded::plan_units(model, nullptr);
  EXPECT_EQ(unit_paths(whole), std::vector<std::string>{""});
  EXPECT_FALSE(whole.policy_matched);
  EXPECT_EQ(whole.units[0].params.size(), model.parameters().size());

  auto blocks = sharded::plan_units(model, sharded::make_wrap_policy("Block"));
  EXPECT_EQ(unit_paths(blocks), (std::vector<std::string>{"", "h.0", "h.1"}));
  EXPECT_EQ(blocks.units[1].parent, 0);
  // wte, wpe, ln_f stay in the root; each block owns its 12 tensors.
  EXPECT_EQ(blocks.units[0].params.size(), 4u);
  EXPECT_EQ(blocks.units[1].params.size(), 12u);

  // Wrapping every Embedding: wpe becomes a unit, but wte is also read by the output head in
  // GPT::forward, so it belongs to the root and its own module (owning nothing) is dropped.
  auto embeddings = sharded::plan_units(model, sharded::make_wrap_policy("Embedding"));
  EXPECT_EQ(unit_paths(embeddings), (std::vector<std::string>{"", "wpe"}));
  const auto& root = embeddings.units[0].params;
  EXPECT_NE(std::find(root.begin(), root.end(), index_of(model, "wte.weight")), root.end());

  // min_params is applied bottom-up and never picks the ModuleList "h".
  auto sized = sharded::plan_units(model, sharded::wrap_min_num_params(500));
  for (const auto& u : sized.units)
    EXPECT_NE(u.path, "h");
  EXPECT_TRUE(sized.policy_matched);

  auto per_module = sharded::plan_units(model, sharded::make_wrap_policy("params"));
  // The root (holding wte), wpe, ln_f, and per block 4 Linear and 2 LayerNorm.
  EXPECT_EQ(per_module.units.size(), 1u + 1u + 1u + 2u * 6u);
}

TEST(ShardedUnits, BadSpecsAndContainersAreNamed) {
  EXPECT_THROW(sharded::make_wrap_policy("min_params:x"), Error);
  EXPECT_THROW(sharded::make_wrap_policy("Block!"), Error);
  EXPECT_EQ(sharded::make_wrap_policy("none"), nullptr);
  nn::GPT model(testing::tiny_gpt_config(DType::F32), 1);
  const nn::Module* h = model.children()[2].second.get();
  EXPECT_EQ(sharded::module_type_name(*h), "ModuleList");
  try {
    sharded::plan_units(model, nullptr, {h});
    FAIL() << "a ModuleList unit was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ModuleList"), std::string::npos) << e.what();
  }
  sharded::ShardingOptions o;
  EXPECT_THROW(sharded::apply_fsdp_sharding_strategy("FULL_SHARDS", o), Error);
  sharded::apply_fsdp_sharding_strategy("HYBRID_SHARD", o);
  EXPECT_TRUE(o.hybrid_shard);
  o.hybrid_shard = false;
  sharded::apply_fsdp_sharding_strategy("SHARD_GRAD_OP", o);
  EXPECT_EQ(o.stage, 3);
  EXPECT_FALSE(o.reshard_after_forward);
}

// A class name the model does not have (a typo of "Block") is refused naming the classes it
// has, instead of making the whole model one unit.
TEST(ShardedUnits, AClassTheModelLacksIsRefusedNamingItsClasses) {
  nn::GPT model(testing::tiny_gpt_config(DType::F32), 1);
  EXPECT_NE(sharded::make_wrap_policy("Block", model), nullptr);
  EXPECT_NE(sharded::make_wrap_policy("min_params:1000000000", model), nullptr);  // size: may match none
  try {
    sharded::make_wrap_policy("Blok", model);
    FAIL() << "the wrap policy 'Blok' was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const char* part : {"'Blok'", "Block", "Linear", "GPT"})
      EXPECT_NE(what.find(part), std::string::npos) << part << " not in: " << what;
  }
}

TEST(ExactSquareSum, AnySplitGivesTheSameSum) {
  std::mt19937 gen(7);
  std::vector<float> x(10007);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = std::ldexp(normal(gen), static_cast<int>(i % 60) - 30);  // wide exponent range
  x[5] = 1e-42f;                                                   // a subnormal
  kernels::cpu::ExactSquareSum whole;
  whole.add_squares(x.data(), static_cast<int64_t>(x.size()));
  for (size_t cut : {size_t{1}, size_t{4096}, size_t{5003}, size_t{10006}}) {
    kernels::cpu::ExactSquareSum a, b;
    a.add_squares(x.data(), static_cast<int64_t>(cut));
    b.add_squares(x.data() + cut, static_cast<int64_t>(x.size() - cut));
    b.merge(a);
    EXPECT_EQ(b.value(), whole.value()) << "cut at " << cut;
    EXPECT_EQ(kernels::cpu::ExactSquareSum::from_words(b.words()).value(), whole.value());
  }
  float pythagoras[] = {3.0f, 4.0f};
  kernels::cpu::ExactSquareSum p;
  p.add_squares(pythagoras, 2);
  EXPECT_EQ(p.value(), 25.0);
  float tiny[] = {std::ldexp(1.0f, -149), std::ldexp(1.0f, 127)};
  kernels::cpu::ExactSquareSum t;
  t.add_squares(tiny, 2);
  EXPECT_EQ(t.value(), std::ldexp(1.0, 254));  // 2^-298 is far below the double's last bit
  float bad[] = {1.0f, std::numeric_limits<float>::infinity()};
  kernels::cpu::ExactSquareSum inf;
  inf.add_squares(bad, 2);
  EXPECT_TRUE(std::isinf(inf.value()));
  bad[1] = std::numeric_limits<float>::quiet_NaN();
  kernels::cpu::ExactSquareSum nan;
  nan.add_squares(bad, 2);
  EXPECT_TRUE(std::isnan(nan.value()));
}

// The sum is the exact integer: 70000 values near 2 (more than one 2^16 chunk of the
// per-exponent buckets, and together more than a 64-bit bucket holds) are m 2^-23 with m
// just below 2^24, so their squares sum to S 2^-46 with
// S the integer sum of the m^2, which sits at bit 2 * 127 - 2 = 252 of the fixed-point
// accumulator: limbs 7 to 9 hold S << 28.
TEST(ExactSquareSum, IsTheExactIntegerSum) {
  __extension__ typedef unsigned __int128 Uint128;
  std::vector<float> x(70000);
  Uint128 expected = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const uint64_t m = (uint64_t{1} << 24) - 1 - (i * 104729) % (uint64_t{1} << 20);
    x[i] = std::ldexp(static_cast<float>(m), -23);
    expected += static_cast<Uint128>(m * m);
  }
  kernels::cpu::ExactSquareSum sum;
  sum.add_squares(x.data(), static_cast<int64_t>(x.size()));
  const auto words = sum.words();
  const Uint128 shifted = expected << 28;
  const uint64_t mask = (uint64_t{1} << 32) - 1;
  for (int limb = 0; limb < kernels::cpu::ExactSquareSum::kWords; ++limb) {
    int64_t want = 0;
    if (limb == 7) want = static_cast<int64_t>(static_cast<uint64_t>(shifted) & mask);
    if (limb == 8) want = static_cast<int64_t>(static_cast<uint64_t>(shifted >> 32) & mask);
    if (limb == 9) want = static_cast<int64_t>(static_cast<uint64_t>(shifted >> 64));
    EXPECT_EQ(words[static_cast<size_t>(limb)], want) << "word " << limb;
  }
}

// Four train_gpt steps of the tiny GPT in f32 with clipping that bites (grad_clip 0.05),
// under `strategy` with 2 rows per rank; returns the final weights' bits.
std::vector<float> train_f32(Strategy* strategy, int64_t accum) {
  nn::GPTConfig c = testing::tiny_gpt_config(DType::F32);
  nn::GPT model(c, 4);
  train_gpt::TrainOptions o;
  o.model = c;
  o.batch = 2;
  o.steps = 4;
  o.grad_accum = accum;
  o.lr = 1e-2;
  o.grad_clip = 0.05;
  data::TokenBlocks data(testing::tiny_corpus(), o.batch, testing::kTinyContext,
                              testing::kTinyVocab);
  train_gpt::train(
      model, data, o, [](const train_gpt::StepMetrics&) {}, strategy);
  std::vector<float> all;
  for (const Tensor& p : model.parameters()) {
    std::vector<float> v = p.to_vector<float>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

struct Variant {
  Variant(std::string name, std::function<void(StrategyConfig&)> change = nullptr,
          std::string text = "")
      : strategy(std::move(name)), adjust(std::move(change)), label(std::move(text)) {}
  std::string strategy;
  std::function<void(StrategyConfig&)> adjust;
  std::string label;
};

std::unique_ptr<Strategy> make(const std::string& name, StrategyConfig options, int rank,
                               int size, const std::shared_ptr<comm::Store>& store,
                               const std::string& group) {
  auto strategy = StrategyRegistry::create(name, std::move(options));
  auto* parallel = dynamic_cast<ParallelStrategy*>(strategy.get());
  parallel->set_process_group(std::make_shared<comm::ProcessGroup>(
      rank, size, store, comm::GroupOptions{.timeout = 30s}, group));
  strategy->setup_environment();
  return strategy;
}

void expect_bitwise_like_ddp(const std::vector<Variant>& variants, const std::string& precision,
                             int64_t accum) {
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    StrategyConfig base;
    base.precision = precision;
    auto ddp = make("ddp", base, rank, size, store, "ddp");
    const std::vector<float> reference = train_f32(ddp.get(), accum);
    ddp->teardown();
    for (size_t v = 0; v < variants.size(); ++v) {
      StrategyConfig options = base;
      if (variants[v].adjust) variants[v].adjust(options);
      std::string group = "v";  // (two steps: GCC 12 misreports "v" + to_string as -Wrestrict)
      group += std::to_string(v);
      auto s = make(variants[v].strategy, options, rank, size, store, group);
      std::vector<float> mine = train_f32(s.get(), accum);
      s->teardown();
      ASSERT_EQ(mine.size(), reference.size());
      size_t differing = 0;
      for (size_t i = 0; i < mine.size(); ++i)
        differing += mine[i] != reference[i];
      EXPECT_EQ(differing, 0u) << variants[v].strategy << " " << variants[v].label << " rank "
                               << rank << " (" << precision << ", accum " << accum << ")";
    }
  }, 240s));
}

auto wrap(const std::string& spec) {
  return [spec](StrategyConfig& o) { o.sharding.auto_wrap_policy = spec; };
}

TEST(ShardedStrategies, EveryStageAndPolicyMatchesDdpBitwise) {
  expect_bitwise_like_ddp(
      {{"deepspeed_stage_1"},
       {"deepspeed_stage_2"},
       {"deepspeed_stage_2_offload"},
       {"deepspeed_stage_3"},  // every module with parameters is a unit
       {"deepspeed_stage_3_offload"},
       {"fsdp"},
       {"fsdp", wrap("Block"), "Block units"},
       {"fsdp", wrap("Embedding"), "wpe unit, tied wte in the root"},
       {"fsdp",
        [](StrategyConfig& o) {
          o.sharding.auto_wrap_policy = "min_params:300";
          o.sharding.forward_prefetch = true;
          o.sharding.backward_prefetch = sharded::BackwardPrefetch::Post;
          o.sharding.limit_all_gathers = false;
        },
        "min_params, prefetch forward and post-backward, two ahead"},
       {"fsdp",
        [](StrategyConfig& o) {
          o.fsdp_sharding_strategy = "SHARD_GRAD_OP";
          o.sharding.auto_wrap_policy = "Block";
          o.sharding.backward_prefetch = sharded::BackwardPrefetch::None;
        },
        "SHARD_GRAD_OP, no prefetch"},
       {"fsdp", [](StrategyConfig& o) { o.fsdp_sharding_strategy = "NO_SHARD"; }, "NO_SHARD"},
       {"fsdp_cpu_offload", wrap("Block"), "Block units"}},
      "32-true", 1);
}

// SGD with momentum and weight decay in place of AdamW: its momentum buffers are sharded
// like AdamW's moments, and every stage still gives bitwise DDP's weights.
// Also returns how many elements the optimizer held (`held`).
std::vector<float> train_sgd(Strategy* strategy, int64_t& held) {
  nn::GPT model(testing::tiny_gpt_config(DType::F32), 4);
  strategy->setup_module(model);
  optim::SGD optimizer(model.parameters(),
                       {.lr = 0.05, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true});
  strategy->setup_optimizer(optimizer);
  data::TokenBlocks data(testing::tiny_corpus(), 2, testing::kTinyContext,
                              testing::kTinyVocab);
  for (int64_t step = 0; step < 4; ++step) {
    data::Batch b = data.for_step(step, strategy->rank(), strategy->world_size());
    strategy->backward(model.loss(b.tokens, b.targets));
    strategy->optimizer_step(optimizer);
    optimizer.zero_grad();
  }
  // The optimizer held this rank's shard only; the whole model comes back for the comparison.
  held = 0;
  for (const Tensor& p : optimizer.parameters())
    held += p.numel();
  strategy->gather_full_module();
  strategy->teardown();
  std::vector<float> all;
  for (const Tensor& p : model.parameters()) {
    std::vector<float> v = p.to_vector<float>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

TEST(ShardedStrategies, SgdStateIsShardedAndMatchesDdpBitwise) {
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto ddp = make("ddp", {}, rank, size, store, "ddp");
    int64_t all = 0;
    const std::vector<float> reference = train_sgd(ddp.get(), all);
    for (const std::string name : {"deepspeed_stage_1", "deepspeed_stage_3", "fsdp_cpu_offload"}) {
      auto sharded = make(name, {}, rank, size, store, name);
      int64_t held = 0;
      const std::vector<float> mine = train_sgd(sharded.get(), held);
      EXPECT_LE(held, all / 2 + 64) << name << ": the optimizer steps about half (one element of padding per unit at most)";
      ASSERT_EQ(mine.size(), reference.size());
      EXPECT_EQ(std::memcmp(mine.data(), reference.data(), mine.size() * sizeof(float)), 0)
          << name << " rank " << rank << ": not bitwise DDP's weights";
    }
  }, 240s));
}

// FSDP's MixedPrecision: bf16 parameter shards and gradient reduction put half the bytes on
// the wire, train within a small distance of f32, and leave the f32 master weights
// unrounded (what the gathered model, and so --save, holds).
struct MixedRun {
  std::vector<double> losses;
  int64_t gathered_bytes = 0, reduced_bytes = 0;
  std::vector<float> weights;
};

MixedRun train_mixed(Strategy* strategy) {
  nn::GPT model(testing::tiny_gpt_config(DType::F32), 4);
  strategy->setup_module(model);
  optim::AdamW optimizer(model.parameters(), {.lr = 1e-2});
  strategy->setup_optimizer(optimizer);
  data::TokenBlocks data(testing::tiny_corpus(), 2, testing::kTinyContext,
                              testing::kTinyVocab);
  MixedRun run;
  auto& group = *dynamic_cast<ParallelStrategy&>(*strategy).process_group();
  auto setup = group.traffic();  // setup's own collectives (parameter checks) aside
  for (int64_t step = 0; step < 4; ++step) {
    data::Batch b = data.for_step(step, strategy->rank(), strategy->world_size());
    Tensor loss = model.loss(b.tokens, b.targets);
    strategy->backward(loss);
    strategy->optimizer_step(optimizer);
    optimizer.zero_grad();
    run.losses.push_back(strategy->all_reduce(loss.detach()).item());
  }
  auto traffic = group.traffic();
  run.gathered_bytes = traffic["all_gather"].bytes - setup["all_gather"].bytes;
  run.reduced_bytes = traffic["reduce_scatter"].bytes - setup["reduce_scatter"].bytes;
  strategy->gather_full_module();
  strategy->teardown();
  for (const Tensor& p : model.parameters()) {
    std::vector<float> v = p.to_vector<float>();
    run.weights.insert(run.weights.end(), v.begin(), v.end());
  }
  return run;
}

TEST(ShardedStrategies, LowPrecisionParametersHalveTheWireAndKeepF32Masters) {
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    StrategyConfig options;
    options.sharding.auto_wrap_policy = "Block";
    const MixedRun f32 = train_mixed(make("fsdp", options, rank, size, store, "f32").get());
    options.sharding.param_dtype = DType::BF16;
    options.sharding.reduce_dtype = DType::BF16;
    const MixedRun bf16 = train_mixed(make("fsdp", options, rank, size, store, "bf16").get());
    EXPECT_EQ(2 * bf16.gathered_bytes, f32.gathered_bytes);
    EXPECT_EQ(2 * bf16.reduced_bytes, f32.reduced_bytes);
    for (size_t s = 0; s < f32.losses.size(); ++s)
      EXPECT_NEAR(bf16.losses[s], f32.losses[s], 2e-2) << "step " << s;
    EXPECT_NE(bf16.losses, f32.losses) << "bf16 changed nothing";
    // The masters are f32: some weight is not a bf16 value (its low 16 bits are not zero).
    size_t unrounded = 0;
    for (float w : bf16.weights) {
      uint32_t bits = 0;
      std::memcpy(&bits, &w, 4);
      unrounded += (bits & 0xffffu) != 0;
    }
    EXPECT_GT(unrounded, bf16.weights.size() / 2);

    StrategyConfig stage2;
    stage2.sharding.param_dtype = DType::BF16;
    auto s = make("deepspeed_stage_2", stage2, rank, size, store, "lp-stage2");
    nn::GPT model(testing::tiny_gpt_config(DType::F32), 4);
    EXPECT_THROW(s->setup_module(model), Error);  // whole parameters are the masters
    s->teardown();
  }, 240s));
}

// HYBRID_SHARD on 4 ranks in two shard groups of 2 ("nodes"): each rank holds half the
// parameters (not a quarter), and the weights match DDP's on 4 ranks. Not bitwise: the
// two-level sum ((a+b)+(c+d)) associates differently from the flat one (docs/sharding.md).
TEST(ShardedStrategies, HybridShardShardsInsideGroupsAndMatchesDdp) {
  expect_all_ok(run_ranks(4, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto ddp = make("ddp", {}, rank, size, store, "ddp");
    const std::vector<float> reference = train_f32(ddp.get(), 1);
    ddp->teardown();

    StrategyConfig options;
    options.fsdp_sharding_strategy = "HYBRID_SHARD";
    options.sharding.shard_group_size = 2;
    options.sharding.auto_wrap_policy = "Block";
    auto hybrid = make("fsdp", options, rank, size, store, "hsdp");
    const std::vector<float> mine = train_f32(hybrid.get(), 1);
    hybrid->teardown();
    ASSERT_EQ(mine.size(), reference.size());
    double worst = 0;
    for (size_t i = 0; i < mine.size(); ++i)
      worst = std::max(worst, std::abs(static_cast<double>(mine[i]) - reference[i]));
    EXPECT_LE(worst, 1e-6) << "rank " << rank;

    auto probe = make("fsdp", options, rank, size, store, "hsdp-memory");
    nn::GPT model(testing::tiny_gpt_config(DType::F32), 4);
    const int64_t total_bytes = model.parameter_count() * 4;
    const size_t parameters = static_cast<size_t>(MemoryKind::Parameters);
    probe->setup_module(model);
    const auto shards = static_cast<int64_t>(
        allocator_for(Device::cpu()).stats().current_by_kind[parameters]);
    EXPECT_GE(shards, total_bytes / 2);
    EXPECT_LE(shards, total_bytes / 2 + 3 * 4) << "half the model per rank, plus padding";
    probe->teardown();
  }, 240s));
}

// NVMe offload's swap files go to a temporary directory; the tests check that they left
// nothing in it.
struct SwapDir : loom::testing::TempDir {
  SwapDir() : TempDir("loom-nvme") {}
};

auto nvme(const SwapDir& dir, int64_t sub_group_size, int buffers, std::string wrap_policy = "") {
  return [path = dir.path(), sub_group_size, buffers, wrap_policy](StrategyConfig& o) {
    o.sharding.nvme_path = path;
    o.sharding.sub_group_size = sub_group_size;
    o.sharding.nvme_buffer_count = buffers;
    if (!wrap_policy.empty()) o.sharding.auto_wrap_policy = wrap_policy;
  };
}

// Sub-groups smaller than one parameter (split pieces), a sub-group spanning several, one
// buffer (no overlap) and several.
TEST(ShardedStrategies, NvmeOffloadMatchesDdpBitwise) {
  SwapDir dir;
  expect_bitwise_like_ddp(
      {{"deepspeed_stage_3_offload_nvme", nvme(dir, 1000, 2), "sub-groups of 1000, 2 buffers"},
       {"deepspeed_stage_2_offload", nvme(dir, 300, 1), "sub-groups of 300, 1 buffer"},
       {"fsdp_cpu_offload", nvme(dir, 1 << 30, 4, "Block"), "one sub-group per group"},
       {"deepspeed_stage_3_offload_nvme",
        [&dir](StrategyConfig& o) {
          nvme(dir, 2048, 3)(o);
          o.sharding.forward_prefetch = true;
          o.sharding.backward_prefetch = sharded::BackwardPrefetch::Post;
        },
        "parameter shards read ahead by prefetching"}},
      "32-true", 1);
  EXPECT_TRUE(dir.empty());
}

// Between steps the parameter shards, the master shards and AdamW's moments are on disk
// only; during a step at most buffer_count sub-groups (master and two moments each) are
// added to host memory.
TEST(ShardedStrategies, NvmeOffloadKeepsTheOptimizerOnDisk) {
  SwapDir dir;
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    StrategyConfig options;
    nvme(dir, 1024, 2)(options);
    auto s = make("deepspeed_stage_3_offload_nvme", options, rank, size, store, "nvme");
    nn::GPTConfig c = testing::tiny_gpt_config(DType::F32);
    nn::GPT model(c, 4);
    s->setup_module(model);
    optim::AdamW optimizer(model.parameters());
    s->setup_optimizer(optimizer);
    data::TokenBlocks data(testing::tiny_corpus(), 2, testing::kTinyContext,
                                testing::kTinyVocab);
    const size_t offloaded = static_cast<size_t>(MemoryKind::Offloaded);
    auto host_offloaded = [&] {
      return static_cast<int64_t>(allocator_for(Device::cpu()).stats().current_by_kind[offloaded]);
    };
    const int64_t between_steps = host_offloaded();
    for (int64_t step = 0; step < 2; ++step) {
      data::Batch b = data.for_step(step, rank, size);
      reset_memory_peaks(Device::cpu());
      s->backward(model.loss(b.tokens, b.targets));
      s->optimizer_step(optimizer);
      const int64_t peak = local_memory_report(Device::cpu()).peak(MemoryKind::Offloaded);
      EXPECT_LE(peak - between_steps, 2 * 3 * 1024 * 4) << "step " << step;
      EXPECT_EQ(host_offloaded(), between_steps) << "step " << step;
    }
    const std::vector<Tensor> masters = optimizer.param_groups()[0].params;
    EXPECT_GT(masters.size(), 3u);  // sub-groups of 1024 elements
    // Between steps the host holds the sub-groups' gradients only: the parameter shards are
    // on disk too (nvme_params).
    int64_t gradient_bytes = 0;
    for (const Tensor& m : optimizer.parameters())
      gradient_bytes += m.nbytes();
    EXPECT_EQ(between_steps, gradient_bytes);
    for (const Tensor& m : masters) {
      EXPECT_FALSE(m.storage()->materialized());
      EXPECT_LE(m.numel(), 1024);
      const std::vector<Tensor> state = optimizer.state_tensors(m);
      EXPECT_EQ(state.size(), 2u);
      for (const Tensor& t : state)
        EXPECT_FALSE(t.storage()->materialized());
    }
    auto* sharded = dynamic_cast<ShardedStrategy*>(s.get());
    const sharded::SwapFile* file = sharded->engine()->swap_file();
    ASSERT_NE(file, nullptr);
    EXPECT_GT(file->bytes_read(), 0u);
    EXPECT_EQ(file->directory(), dir.path());
    EXPECT_THROW(optimizer.state_dict(), Error);  // the moments are not in memory
    s->teardown();
  }));
  EXPECT_TRUE(dir.empty());
}

TEST(ShardedStrategies, AccumulationAndMixedPrecisionMatchDdpBitwise) {
  SwapDir dir;
  std::vector<Variant> variants = {{"deepspeed_stage_1"},
                                   {"deepspeed_stage_2"},
                                   {"fsdp", wrap("Block"), "Block units"},
                                   {"deepspeed_stage_3_offload_nvme", nvme(dir, 500, 2), "NVMe"}};
  expect_bitwise_like_ddp(variants, "32-true", 2);
  expect_bitwise_like_ddp(variants, "bf16-mixed", 1);
  expect_bitwise_like_ddp(variants, "16-mixed", 1);
}

TEST(ShardedStrategies, StageThreeHoldsOnlyShardsAndOneUnitAtATime) {
  expect_all_ok(run_ranks(2, [](int rank, int size, std::shared_ptr<comm::Store> store) {
    StrategyConfig options;
    options.sharding.auto_wrap_policy = "Block";
    auto s = make("fsdp", options, rank, size, store, "fsdp");
    nn::GPTConfig c = testing::tiny_gpt_config(DType::F32);
    c.layers = 4;
    nn::GPT model(c, 4);
    const int64_t total_bytes = model.parameter_count() * 4;
    s->setup_module(model);
    optim::AdamW optimizer(model.parameters());
    s->setup_optimizer(optimizer);
    data::TokenBlocks data(testing::tiny_corpus(), 2, testing::kTinyContext,
                                testing::kTinyVocab);
    data::Batch b = data.for_step(0, rank, size);
    reset_memory_peaks(Device::cpu());
    const size_t parameters = static_cast<size_t>(MemoryKind::Parameters);
    const int64_t shards = static_cast<int64_t>(
        allocator_for(Device::cpu()).stats().current_by_kind[parameters]);
    s->backward(model.loss(b.tokens, b.targets));
    s->optimizer_step(optimizer);
    const int64_t gathered_peak =
        local_memory_report(Device::cpu()).peak(MemoryKind::Parameters) - shards;
    auto* sharded = dynamic_cast<ShardedStrategy*>(s.get());
    EXPECT_EQ(sharded->engine()->unit_count(), 5u);
    // Between steps only the shards are held: half the parameters, padding adding less than
    // one element per rank and unit.
    EXPECT_LE(shards, total_bytes / 2 + 5 * 4);
    EXPECT_GE(shards, total_bytes / 2);
    // The root (embeddings, final norm) stays gathered through a step; of the blocks at most
    // two (one running, one prefetched) are gathered with it.
    nn::GPT probe(c, 4);
    int64_t block_bytes = 0, root_bytes = total_bytes;
    for (const auto& [name, p] : probe.named_parameters())
      if (name.rfind("h.0.", 0) == 0) block_bytes += p.numel() * 4;
    root_bytes -= 4 * block_bytes;
    EXPECT_LE(gathered_peak, root_bytes + 2 * block_bytes + 5 * 8);
    EXPECT_GE(gathered_peak, root_bytes + 2 * block_bytes);
    s->teardown();
  }));
}

TEST(ShardedStrategies, MisuseIsExplained) {
  expect_all_ok(run_ranks(2, [](int rank, int size, std::shared_ptr<comm::Store> store) {
    nn::GPTConfig c = testing::tiny_gpt_config(DType::F32);
    {
      StrategyConfig options;
      options.sharding.offload_params = true;
      auto s = make("deepspeed_stage_2", options, rank, size, store, "a");
      nn::GPT model(c, 1);
      EXPECT_THROW(s->setup_module(model), Error);
      s->teardown();
    }
    {
      // A model destroyed before its strategy (a Fabric declared first, say) is not touched.
      const StrategyConfig defaults;
      auto s = make("fsdp", defaults, rank, size, store, "short-lived");
      {
        nn::GPT model(c, 1);
        s->setup_module(model);
      }
      s->teardown();
    }
    {
      StrategyConfig options;
      options.fsdp_sharding_strategy = "HYBRID_SHARD";
      options.sharding.shard_group_size = 3;  // 2 ranks do not split into groups of 3
      auto s = make("fsdp", options, rank, size, store, "hybrid");
      nn::GPT model(c, 1);
      try {
        s->setup_module(model);
        ADD_FAILURE() << "a world of 2 in shard groups of 3 was accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("must be a multiple of the shard group size 3"),
                  std::string::npos)
            << e.what();
      }
      s->teardown();
    }
    {
      const StrategyConfig defaults;
      auto s = make("deepspeed_stage_3", defaults, rank, size, store, "b");
      nn::GPT model(c, 1);
      s->setup_module(model);
      optim::AdamW optimizer(model.parameters());
      EXPECT_THROW(s->optimizer_step(optimizer), Error);  // not set up
      Tensor stray = Tensor::zeros({3}).set_requires_grad(true);
      optim::AdamW other(std::vector<Tensor>{stray});
      EXPECT_THROW(s->setup_optimizer(other), Error);
      s->teardown();
    }
    {
      // Models that differ across ranks are named before anything is sharded.
      const StrategyConfig defaults;
      auto s = make("fsdp", defaults, rank, size, store, "c");
      nn::GPTConfig mine = c;
      mine.embd = rank == 0 ? 16 : 24;
      nn::GPT model(mine, 1);
      EXPECT_THROW(s->setup_module(model), Error);
    }
  }));
}

}  // namespace
}  // namespace loom::strategies
