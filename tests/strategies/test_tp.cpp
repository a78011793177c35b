// Tensor parallelism (strategies/tp/, nn/tensor_parallel.h, docs/parallelism.md): splitting
// and joining parameters, and GPT trained over 2 tensor-parallel ranks (alone and with data
// parallelism) against one device and DDP, in real processes.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <vector>

#include "../comm/multiprocess.h"
#include "../comm/test_support.h"
#include "nn/gpt.h"
#include "strategies/registry.h"
#include "strategies/tp/model_parallel_strategy.h"
#include "tiny_training.h"

namespace loom::strategies {
namespace {

using comm::testing::expect_all_ok;
using comm::testing::run_ranks;
using loom::testing::error_of;
using namespace std::chrono_literals;

TEST(TensorParallelSplit, PartsJoinBackIntoTheWhole) {
  std::vector<float> values(4 * 12);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>(i);
  const Tensor whole = Tensor::from_vector<float>(values, {4, 12});
  for (const nn::TensorParallelSplit split : {nn::TensorParallelSplit{1, 3}, {1, 1}, {0, 1}}) {
    std::vector<Tensor> parts;
    for (int r = 0; r < 2; ++r) {
      parts.push_back(nn::take_split(whole, split, r, 2));
      // A part of its own: a view would keep the whole weight alive on every rank.
      EXPECT_EQ(parts.back().storage()->nbytes(), sizeof(float) * 4 * 6) << split.dim;
      EXPECT_TRUE(parts.back().is_contiguous());
    }
    EXPECT_EQ(nn::join_splits(parts, split).to_vector<float>(), values);
  }
  // q, k, v blocks of 4 columns each, split by head: rank 1 holds columns 2-3, 6-7, 10-11.
  const Tensor part = nn::take_split(whole, {1, 3}, 1, 2);
  EXPECT_EQ(part.shape(), (Shape{4, 6}));
  EXPECT_EQ(part.to_vector<float>()[0], 2.0f);
  EXPECT_EQ(part.to_vector<float>()[2], 6.0f);
  EXPECT_NE(error_of([&] { nn::take_split(whole, {1, 3}, 0, 3); }).find("does not split"),
            std::string::npos);
}

using testing::max_difference;
using testing::Weights;

Weights train(Strategy* strategy, int64_t batch, int64_t steps) {
  return testing::train_tiny_f32(strategy, batch, 1, steps);
}

std::unique_ptr<Strategy> make(const std::string& name, int tp, int rank, int size,
                               const std::shared_ptr<comm::Store>& store, const std::string& group,
                               bool sequence_parallel = false) {
  StrategyConfig options;
  options.tensor_parallel.size = tp;
  options.tensor_parallel.sequence_parallel = sequence_parallel;
  auto strategy = StrategyRegistry::create(name, options);
  dynamic_cast<ParallelStrategy&>(*strategy).set_process_group(std::make_shared<comm::ProcessGroup>(
      rank, size, store, comm::GroupOptions{.timeout = 30s}, group));
  strategy->setup_environment();
  return strategy;
}

// tp 2: within rounding of one device (row-parallel sums add in another order), and bitwise
// the same from one run to the next.
TEST(TensorParallel, TwoRanksMatchOneDeviceAndRepeatThemselves) {
  const auto reference = train(nullptr, 4, 4);
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto a = make("model_parallel", 2, rank, size, store, "tp-a");
    const auto first = train(a.get(), 4, 4);
    a->teardown();
    auto b = make("model_parallel", 2, rank, size, store, "tp-b");
    const auto second = train(b.get(), 4, 4);
    b->teardown();
    EXPECT_EQ(first, second) << "tensor parallel runs are deterministic";
    ASSERT_EQ(first.size(), reference.size());
    EXPECT_LE(max_difference(first, reference), testing::kWithinRounding);
  }, 120s));
}

// Sequence parallelism (the activations between split layers split by position): within
// rounding of one device, and deterministic.
TEST(TensorParallel, SequenceParallelismMatchesOneDevice) {
  const auto reference = train(nullptr, 4, 4);
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto a = make("model_parallel", 2, rank, size, store, "sp-a", true);
    const auto first = train(a.get(), 4, 4);
    a->teardown();
    auto b = make("model_parallel", 2, rank, size, store, "sp-b", true);
    EXPECT_EQ(train(b.get(), 4, 4), first) << "deterministic";
    b->teardown();
    EXPECT_LE(max_difference(first, reference), testing::kWithinRounding);
  }, 120s));
}

// Sequence parallelism with gradient accumulation: the replicated parameters' shares are summed
// over tp once per optimizer step, on the accumulated gradients (summing them after every
// backward counted the earlier micro-batches tp times over until 2026-12-03).
TEST(TensorParallel, SequenceParallelismAccumulatesLikeOneDevice) {
  const auto reference = testing::train_tiny_f32(nullptr, 4, 2, 3);
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto s = make("model_parallel", 2, rank, size, store, "sp-accum", true);
    const auto w = testing::train_tiny_f32(s.get(), 4, 2, 3);
    s->teardown();
    EXPECT_LE(max_difference(w, reference), testing::kWithinRounding);
  }, 120s));
}

// dp 2 x tp 2 on 4 ranks against DDP on 2 ranks: the same batches, within rounding.
TEST(TensorParallel, ComposesWithDataParallelism) {
  loom::testing::TempDir dir;
  const auto reference_file = dir.path() / "ddp.weights";
  testing::write_ddp_reference(reference_file, 2, 1, 3);
  expect_all_ok(run_ranks(4, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto s = make("model_parallel", 2, rank, size, store, "dp-tp");
    EXPECT_EQ(s->data_parallel_size(), 2);
    const Weights w = train(s.get(), 2, 3);
    s->teardown();
    testing::expect_near_reference(reference_file, w, rank);
  }, 120s));
}

// dp 2 x tp 2 with sequence parallelism and accumulation: the reducer's buckets sum the
// replicated parameters over tp, then average over dp; DDP's weights within rounding.
TEST(TensorParallel, SequenceParallelComposesWithDataParallelismAndAccumulation) {
  loom::testing::TempDir dir;
  const auto reference_file = dir.path() / "ddp.weights";
  testing::write_ddp_reference(reference_file, 2, 2, 3);
  expect_all_ok(run_ranks(4, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto s = make("model_parallel", 2, rank, size, store, "dp-sp", true);
    const Weights w = testing::train_tiny_f32(s.get(), 2, 2, 3);
    s->teardown();
    testing::expect_near_reference(reference_file, w, rank);
  }, 120s));
}

TEST(TensorParallel, SizesThatDoNotSplitTheModelAreRefused) {
  expect_all_ok(run_ranks(3, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto s = make("model_parallel", 3, rank, size, store, "three");
    nn::GPT model(testing::tiny_gpt_config(DType::F32), 4);  // 2 heads
    EXPECT_NE(error_of([&] { s->setup_module(model); }).find("--tp 3 must divide the heads (2)"),
              std::string::npos);
    s->teardown();
  }));
}

}  // namespace
}  // namespace loom::strategies
