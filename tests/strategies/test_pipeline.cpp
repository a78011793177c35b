// Pipeline parallelism (strategies/pipeline/, docs/parallelism.md): schedules, partitioning,
// the device mesh, and training through real processes against single-device gradient
// accumulation over the same micro-batches.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "../comm/multiprocess.h"
#include "../comm/test_support.h"
#include "comm/error.h"
#include "nn/gpt.h"
#include "strategies/device_mesh.h"
#include "strategies/memory_report.h"
#include "strategies/pipeline/partition.h"
#include "strategies/pipeline/pipeline_strategy.h"
#include "strategies/pipeline/schedule.h"
#include "strategies/registry.h"
#include "tiny_training.h"

namespace loom::strategies {
namespace {

using comm::testing::expect_all_ok;
using comm::testing::run_ranks;
using loom::testing::error_of;
using namespace std::chrono_literals;
using pipeline::Action;

TEST(PipelineSchedules, EveryActionOnceBackwardInOrderAnd1F1BHoldsAtMostTheStagesLeft) {
  for (const std::string name : {"gpipe", "1f1b", "zero_bubble"}) {
    auto schedule = pipeline::ScheduleRegistry::create(name);
    for (int p : {1, 2, 4}) {
      for (int m : {1, 3, 8}) {
        for (int s = 0; s < p; ++s) {
          const std::vector<Action> actions = schedule->actions(s, p, m);
          EXPECT_NO_THROW(pipeline::check_actions(actions, m, 1, name));
          const int peak = pipeline::peak_in_flight(actions);
          const int expected = name == "gpipe"         ? m
                               : name == "zero_bubble" ? std::min(p, m)
                                                       : std::min(p - s, m);
          EXPECT_EQ(peak, expected) << name << " stage " << s << " of " << p;
        }
      }
    }
  }
  // p = 4, m = 8: the first stage runs 3 forwards ahead, the last one alternates from the start.
  const auto one_f_one_b = pipeline::ScheduleRegistry::create("1f1b");
  const std::vector<Action> first = one_f_one_b->actions(0, 4, 8);
  EXPECT_EQ(first[3], (Action{Action::Forward, 3}));
  EXPECT_EQ(first[4], (Action{Action::Backward, 0}));
  const std::vector<Action> last = one_f_one_b->actions(3, 4, 8);
  EXPECT_EQ(last[1], (Action{Action::Backward, 0}));
  EXPECT_DOUBLE_EQ(one_f_one_b->theoretical_bubble(4, 8), 3.0 / 11.0);

  // Interleaved: every chunk's actions once, in order; the bubble divided by the chunks.
  for (int p : {2, 4}) {
    for (int v : {2, 3}) {
      auto interleaved = pipeline::ScheduleRegistry::create("interleaved_1f1b", v);
      EXPECT_EQ(interleaved->chunks_per_stage(), v);
      for (int m : {p, 2 * p}) {
        for (int s = 0; s < p; ++s)
          EXPECT_NO_THROW(pipeline::check_actions(interleaved->actions(s, p, m), m, v, "interleaved"));
      }
    }
  }
  const auto interleaved = pipeline::ScheduleRegistry::create("interleaved_1f1b", 2);
  EXPECT_DOUBLE_EQ(interleaved->theoretical_bubble(4, 8), 3.0 / 19.0);
  EXPECT_NE(error_of([&] { interleaved->actions(0, 4, 6); }).find("a multiple of --pp 4"),
            std::string::npos);
  EXPECT_NE(error_of([] { pipeline::ScheduleRegistry::create("zigzag"); })
                .find("Available: 1f1b, gpipe, interleaved_1f1b, zero_bubble"),
            std::string::npos);
  const std::vector<Action> out_of_order = {{Action::Forward, 0}, {Action::Forward, 1},
                                            {Action::Backward, 1}, {Action::Backward, 0}};
  EXPECT_NE(error_of([&] { pipeline::check_actions(out_of_order, 2, 1, "mine"); })
                .find("backward of micro-batch 1 where 0 is due"),
            std::string::npos);
}

// Stage 1 runs both forwards before a backward, stage 0 wants B0 before F1: neither moves.
class DeadlockingSchedule : public pipeline::Schedule {
 public:
  std::string name() const override { return "deadlocking"; }
  std::vector<Action> actions(int stage, int, int) const override {
    if (stage == 0)
      return {{Action::Forward, 0}, {Action::Backward, 0}, {Action::Forward, 1}, {Action::Backward, 1}};
    return {{Action::Forward, 0}, {Action::Forward, 1}, {Action::Backward, 0}, {Action::Backward, 1}};
  }
};

TEST(PipelineSchedules, ZeroBubbleSplitsBackwardAndFillsTheBubble) {
  const auto zero_bubble = pipeline::ScheduleRegistry::create("zero_bubble");
  // p = 2, m = 4: stage 1 holds its first weight half back one micro-batch.
  const std::vector<Action> expected_last = {
      {Action::Forward, 0},        {Action::BackwardInput, 0}, {Action::Forward, 1},
      {Action::BackwardInput, 1},  {Action::BackwardWeight, 0}, {Action::Forward, 2},
      {Action::BackwardInput, 2},  {Action::BackwardWeight, 1}, {Action::Forward, 3},
      {Action::BackwardInput, 3},  {Action::BackwardWeight, 2}, {Action::BackwardWeight, 3}};
  EXPECT_EQ(zero_bubble->actions(1, 2, 4), expected_last);
  // With I and W each half a backward, 1F1B's idle (p - 1) units of 3 become (p - 1) of 1.
  EXPECT_DOUBLE_EQ(zero_bubble->theoretical_bubble(2, 4), 1.0 / 13.0);
  EXPECT_DOUBLE_EQ(zero_bubble->theoretical_bubble(4, 8), 3.0 / 27.0);
  const auto one_f_one_b = pipeline::ScheduleRegistry::create("1f1b");
  EXPECT_DOUBLE_EQ(one_f_one_b->theoretical_bubble(2, 4), 1.0 / 5.0);
  EXPECT_DOUBLE_EQ(pipeline::ScheduleRegistry::create("gpipe")->theoretical_bubble(4, 8), 3.0 / 11.0);
  // A weight half before its input half, or out of order, is refused.
  EXPECT_NE(error_of([] {
              pipeline::check_actions({{Action::Forward, 0}, {Action::BackwardWeight, 0}}, 1, 1, "mine");
            }).find("weight half of micro-batch 0 on chunk 0 where 0's is due (after its input half"),
            std::string::npos);
  EXPECT_NE(error_of([] {
              pipeline::check_actions({{Action::Forward, 0}, {Action::BackwardInput, 0}}, 1, 1, "mine");
            }).find("1 backward passes and 0 weight halves for 1 micro-batches"),
            std::string::npos);
  // Stages that wait for each other are found before a process does.
  EXPECT_NE(error_of([] { pipeline::simulate(DeadlockingSchedule(), 2, 2); })
                .find("deadlocking deadlocks: stage 0 of 2 waits forever to run the backward of "
                      "micro-batch 0"),
            std::string::npos);
}

TEST(PipelinePartition, BalanceOrParameterCounts) {
  nn::GPT model(testing::tiny_gpt_config(DType::F32), 1);  // 2 blocks: 4 layers
  EXPECT_EQ(pipeline::partition_layers(model, model, 2, {1, 3}), (std::vector<int64_t>{0, 1, 4}));
  const std::vector<int64_t> auto_split = pipeline::partition_layers(model, model, 2, {});
  EXPECT_EQ(auto_split.front(), 0);
  EXPECT_EQ(auto_split.back(), 4);
  EXPECT_EQ(auto_split.size(), 3u);
  EXPECT_NE(error_of([&] { pipeline::partition_layers(model, model, 2, {1, 2}); })
                .find("balance adds up to 3 layers; the model has 4"),
            std::string::npos);
  // By cost: the split whose most expensive chunk costs least.
  EXPECT_EQ(pipeline::partition_by_cost({5, 1, 1, 1, 4}, 2), (std::vector<int64_t>{0, 2, 5}));
  EXPECT_EQ(pipeline::partition_by_cost({1, 1, 1, 9}, 2), (std::vector<int64_t>{0, 3, 4}));
  const Tensor tokens = Tensor::zeros({2, testing::kTinyContext}, DType::I64);
  const std::vector<int64_t> times = pipeline::layer_forward_times(model, tokens, 3);
  ASSERT_EQ(times.size(), 4u);
  for (int64_t t : times)
    EXPECT_GT(t, 0);
  EXPECT_NE(error_of([&] { pipeline::partition_layers(model, model, 5, {}); })
                .find("5 stages for a model of 4 layers"),
            std::string::npos);
}

TEST(DeviceMesh, CoordinatesGroupsAndSizesThatDoNotFactor) {
  EXPECT_EQ(DeviceMesh::data_parallel_size(8, 2, 2), 2);
  EXPECT_NE(error_of([] { DeviceMesh::data_parallel_size(6, 4, 1); })
                .find("world sizes that work are multiples of 4 (4, 8, 12, ...)"),
            std::string::npos);
  expect_all_ok(run_ranks(4, [](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto world = std::make_shared<comm::ProcessGroup>(rank, size, store,
                                                      comm::GroupOptions{.timeout = 20s}, "mesh");
    DeviceMesh mesh(world, {{"dp", 2}, {"pp", 2}});
    EXPECT_EQ(mesh.coordinate("dp"), rank / 2);
    EXPECT_EQ(mesh.coordinate("pp"), rank % 2);
    EXPECT_EQ(mesh.group("pp")->rank(), rank % 2);
    EXPECT_EQ(mesh.group("dp")->rank(), rank / 2);
    EXPECT_EQ(mesh.rank_with({{"pp", 0}}), rank / 2 * 2);
    Tensor t = Tensor::from_vector<float>({static_cast<float>(rank)}, {1});
    mesh.group("dp")->allreduce(t, {.op = comm::ReduceOp::Sum})->wait();
    EXPECT_EQ(t.item(), rank % 2 == 0 ? 0.0 + 2.0 : 1.0 + 3.0);  // ranks {0, 2} and {1, 3}
    EXPECT_EQ(mesh.describe(), "dp 2 x pp 2");
  }));
}

using testing::max_difference;
using testing::Weights;

Weights train(Strategy* strategy, int64_t batch, int64_t accum, int64_t steps,
              double grad_clip = 0.05) {
  return testing::train_tiny_f32(strategy, batch, accum, steps, grad_clip);
}

// A pipeline strategy joined to a fresh group `group` of the test's ranks.
std::unique_ptr<PipelineStrategy> start_pipeline(const StrategyConfig& options, int rank, int size,
                                                 const std::shared_ptr<comm::Store>& store,
                                                 const std::string& group,
                                                 std::chrono::seconds timeout = 30s) {
  auto strategy =
      std::make_unique<PipelineStrategy>(options, options.pipeline, options.tensor_parallel);
  strategy->set_process_group(std::make_shared<comm::ProcessGroup>(
      rank, size, store, comm::GroupOptions{.timeout = timeout}, group));
  strategy->setup_environment();
  return strategy;
}

std::unique_ptr<Strategy> make_pipeline(int stages, int micro_batches, const std::string& schedule,
                                        std::vector<int64_t> balance, int rank, int size,
                                        const std::shared_ptr<comm::Store>& store,
                                        const std::string& group) {
  StrategyConfig options;
  options.pipeline.stages = stages;
  options.pipeline.micro_batches = micro_batches;
  options.pipeline.schedule = schedule;
  options.pipeline.balance = std::move(balance);
  return start_pipeline(options, rank, size, store, group);
}

// Whether any parameter but the tied wte (parameter 0) differs.
bool untied_differ(const Weights& a, const Weights& b) {
  return !std::equal(a.begin() + 1, a.end(), b.begin() + 1);
}

// One stage: exactly single-device accumulation over the same micro-batches. Two and three
// stages, any schedule and balance: after one step every parameter but the tied wte is
// bitwise that, wte within rounding (its two stages' sums are added, Megatron's order); all
// schedules and balances give bitwise the same weights; several steps stay within 1e-5.
// The one-step comparison runs without gradient clipping: clipping scales every gradient by
// one coefficient of the global norm, which the wte's rounding moves (on an AVX2 host under
// the ASan build's clang it did, so every parameter differed in its last bits).
TEST(Pipeline, MatchesSingleDeviceAccumulationOverTheSameMicroBatches) {
  const auto reference_1 = train(nullptr, 2, 2, 1, /*grad_clip=*/0);
  const auto reference_4 = train(nullptr, 2, 2, 4);
  expect_all_ok(run_ranks(1, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto s = make_pipeline(1, 2, "1f1b", {}, rank, size, store, "one");
    EXPECT_EQ(train(s.get(), 4, 1, 4), reference_4) << "one stage";
    s->teardown();
  }));
  for (int stages : {2, 3}) {
    expect_all_ok(run_ranks(stages, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
      auto gpipe = make_pipeline(stages, 2, "gpipe", {}, rank, size, store, "step");
      const auto one_step = train(gpipe.get(), 4, 1, 1, /*grad_clip=*/0);
      gpipe->teardown();
      EXPECT_LE(max_difference(one_step, reference_1), 1e-8);
      EXPECT_FALSE(untied_differ(one_step, reference_1))
          << stages << " stages: only the tied wte may differ";

      auto a = make_pipeline(stages, 2, "gpipe", {}, rank, size, store, "gpipe");
      const auto with_gpipe = train(a.get(), 4, 1, 4);
      a->teardown();
      auto b = make_pipeline(stages, 2, "1f1b", stages == 2 ? std::vector<int64_t>{1, 3}
                                                           : std::vector<int64_t>{2, 1, 1},
                             rank, size, store, "1f1b");
      const auto with_1f1b = train(b.get(), 4, 1, 4);
      b->teardown();
      EXPECT_EQ(with_gpipe, with_1f1b) << stages << " stages: schedules and balances agree";
      auto zb = make_pipeline(stages, 2, "zero_bubble", {}, rank, size, store, "zb");
      EXPECT_EQ(train(zb.get(), 4, 1, 4), with_gpipe) << stages << " stages: zero_bubble agrees";
      zb->teardown();
      if (stages == 2) {  // balanced by measured forward times: the same weights
        StrategyConfig options;
        options.pipeline.stages = 2;
        options.pipeline.micro_batches = 2;
        options.pipeline.balance_by = "time";
        auto timed = start_pipeline(options, rank, size, store, "timed");
        EXPECT_EQ(train(timed.get(), 4, 1, 4), with_gpipe) << "balanced by time";
        timed->teardown();
      }
      if (stages == 2) {  // 4 layers in 4 chunks, 2 per stage
        auto c = make_pipeline(stages, 2, "interleaved_1f1b", {}, rank, size, store, "inter");
        EXPECT_EQ(train(c.get(), 4, 1, 4), with_gpipe) << "interleaved_1f1b agrees";
        c->teardown();
      }
      EXPECT_LE(max_difference(with_gpipe, reference_4), 1e-5);
    }, 120s));
  }
}

// dp 2 x pp 2 on 4 ranks: the two replicas read different data and average; the result is
// within rounding of DDP over 2 ranks with accumulation over the same micro-batches.
TEST(Pipeline, ComposesWithDataParallelism) {
  loom::testing::TempDir dir;
  const auto reference_file = dir.path() / "ddp.weights";
  testing::write_ddp_reference(reference_file, 2, 2, 3);
  expect_all_ok(run_ranks(4, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto s = make_pipeline(2, 2, "1f1b", {}, rank, size, store, "dp-pp");
    EXPECT_EQ(s->data_parallel_size(), 2);
    const Weights w = train(s.get(), 4, 1, 3);
    s->teardown();
    testing::expect_near_reference(reference_file, w, rank);
  }, 120s));
}

// ZeRO-1 inside each stage's dp group: bitwise the weights of plain averaging.
TEST(Pipeline, ZeroOneInsideTheStagesMatchesDdpInsideThemBitwise) {
  expect_all_ok(run_ranks(4, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto ddp = make_pipeline(2, 2, "1f1b", {}, rank, size, store, "pp-ddp");
    const auto with_ddp = train(ddp.get(), 4, 1, 3);
    ddp->teardown();
    StrategyConfig options;
    options.pipeline = {.stages = 2, .micro_batches = 2, .schedule = "1f1b", .chunks = 2,
                        .balance = {}, .data_parallel = "deepspeed_stage_1"};
    auto zero1 = start_pipeline(options, rank, size, store, "pp-zero1");
    EXPECT_EQ(train(zero1.get(), 4, 1, 3), with_ddp) << "rank " << rank;
    zero1->teardown();
  }, 120s));
}

// 16-mixed: a loss scale that overflows on the last stage skips the step on every stage
// (the ranks agree), backs off the same way everywhere, and training goes on.
TEST(Pipeline, LossScalerSkipsTheStepOnEveryStage) {
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    StrategyConfig options;
    options.precision = "16-mixed";
    options.loss_scaler.initial_scale = 1e38;  // the scaled loss overflows at first
    options.pipeline.stages = 2;
    options.pipeline.micro_batches = 2;
    auto s = start_pipeline(options, rank, size, store, "scaler");
    const auto weights = train(s.get(), 4, 1, 4);
    const LossScaler* scaler = s->loss_scaler();
    ASSERT_NE(scaler, nullptr);
    EXPECT_GE(scaler->skipped_steps(), 1) << "rank " << rank;
    Tensor mine = Tensor::full({2}, 0.0, DType::F64);
    mine.data<double>()[0] = static_cast<double>(scaler->skipped_steps());
    mine.data<double>()[1] = scaler->scale();
    Tensor high = mine.clone();
    s->all_reduce(high, comm::ReduceOp::Max);
    EXPECT_EQ(high.to_vector<double>(), mine.to_vector<double>()) << "the ranks agree";
    for (const auto& p : weights)
      for (float v : p)
        ASSERT_TRUE(std::isfinite(v));
    s->teardown();
  }, 120s));
}

// 1F1B and zero_bubble hold at most p micro-batches' activations on a stage, GPipe all m:
// with p = 2 and m = 8 the first stage's peak activation memory is several times smaller.
TEST(Pipeline, OneFOneBHoldsFewerActivationsThanGPipe) {
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    int64_t peak[3] = {0, 0, 0};
    int i = 0;
    for (const std::string schedule : {"gpipe", "1f1b", "zero_bubble"}) {
      auto s = make_pipeline(2, 8, schedule, {2, 2}, rank, size, store, "memory-" + schedule);
      train(s.get(), 16, 1, 2);  // train() resets the peaks after setup
      peak[i++] = local_memory_report(Device::cpu()).peak(MemoryKind::Activations);
      s->teardown();
    }
    if (rank == 0) {
      EXPECT_LT(peak[1] * 2, peak[0]) << "1f1b " << peak[1] << " B, gpipe " << peak[0] << " B";
      EXPECT_LT(peak[2] * 2, peak[0]) << "zero_bubble " << peak[2] << " B, gpipe " << peak[0] << " B";
      std::printf("stage 0 peak activations: gpipe %lld B, 1f1b %lld B, zero_bubble %lld B\n",
                  static_cast<long long>(peak[0]), static_cast<long long>(peak[1]),
                  static_cast<long long>(peak[2]));
    }
  }, 120s));
}

// A stage that dies mid-batch: its neighbour fails with a CommError within the timeout.
TEST(Pipeline, ADeadStageIsACommErrorNotAHang) {
  const auto results = run_ranks(2, [](int rank, int size, std::shared_ptr<comm::Store> store) {
    StrategyConfig options;
    options.pipeline.stages = 2;
    options.pipeline.micro_batches = 2;
    auto s = start_pipeline(options, rank, size, store, "dead", 5s);
    nn::GPT model(testing::tiny_gpt_config(DType::F32), 4);
    s->setup_module(model);
    Tensor tokens = Tensor::zeros({4, testing::kTinyContext}, DType::I64);
    if (rank == 1) _exit(0);  // the last stage is gone before the first batch
    const auto start = std::chrono::steady_clock::now();
    std::string e = "no error";
    try {
      s->train_batch(tokens, tokens);
    } catch (const loom::CommError& error) {
      e = error.what();
    }
    EXPECT_NE(e.find("peer 1"), std::string::npos) << e;
    EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
    _exit(::testing::Test::HasFailure() ? 1 : 0);
  });
  EXPECT_EQ(results[0].exit_code, 0);
}

}  // namespace
}  // namespace loom::strategies
