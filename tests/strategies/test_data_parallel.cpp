// dp: gradients of replicas over row slices, reduced into the master, against one
// forward/backward on the whole batch; and train_gpt's loop under dp against single_device.

#include <gtest/gtest.h>

#include <cmath>

#include "data/default_corpus.h"
#include "strategies/dp/data_parallel.h"
#include "strategies/registry.h"
#include "tiny_training.h"
#include "tools/train_gpt/trainer.h"

namespace loom::strategies {
namespace {

nn::GPTConfig tiny_config() {
  return testing::tiny_gpt_config();
}

data::Batch batch_of(int64_t rows) {
  std::vector<uint8_t> bytes = data::default_corpus(1 << 12);
  for (uint8_t& b : bytes)
    b %= 64;
  return data::TokenBlocks(bytes, rows, 8, 64).block(1);
}

// The gradients (flattened, parameter order) and loss of `strategy` on a batch of `rows`.
std::vector<double> gradients(Strategy& strategy, int64_t rows, double* loss_out) {
  nn::GPTConfig config = tiny_config();
  nn::GPT model(config, 7);
  if (auto* dp = dynamic_cast<DataParallelStrategy*>(&strategy)) {
    dp->set_replica_factory([config] { return std::make_unique<nn::GPT>(config, 99); });
  }
  strategy.setup_module(model);
  data::Batch batch = batch_of(rows);
  auto loss_of_rows = [&](nn::Module& m, int64_t begin, int64_t end) {
    return static_cast<nn::GPT&>(m).loss(batch.tokens.narrow(0, begin, end - begin).contiguous(),
                                         batch.targets.narrow(0, begin, end - begin).contiguous());
  };
  *loss_out = strategy.forward_backward(loss_of_rows, rows).item();
  std::vector<double> all;
  for (const Tensor& p : model.parameters()) {
    EXPECT_TRUE(p.grad().defined());
    std::vector<double> v = p.grad().to_vector<double>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

void expect_near_all(const std::vector<double>& a, const std::vector<double>& b, double tol) {
  ASSERT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]));
  EXPECT_LE(worst, tol);
}

TEST(DataParallel, GradientsMatchSingleDevice) {
  for (int64_t rows : {6, 7, 2}) {
    SingleDeviceStrategy single(StrategyOptions{});
    double reference_loss = 0;
    std::vector<double> reference = gradients(single, rows, &reference_loss);
    for (const char* devices : {"2", "3"}) {
      SCOPED_TRACE(std::string("rows ") + std::to_string(rows) + " devices " + devices);
      auto dp = StrategyRegistry::create("dp", {.devices = devices});
      EXPECT_EQ(dp->name(), "dp");
      double loss = 0;
      std::vector<double> mine = gradients(*dp, rows, &loss);
      EXPECT_NEAR(loss, reference_loss, 1e-12);
      expect_near_all(mine, reference, 1e-12);
    }
  }
}

TEST(DataParallel, GradientsAccumulateAcrossCalls) {
  SingleDeviceStrategy single(StrategyOptions{});
  double loss = 0;
  std::vector<double> once = gradients(single, 5, &loss);
  nn::GPTConfig config = tiny_config();
  nn::GPT model(config, 7);
  auto dp = StrategyRegistry::create("dp", {.devices = "2"});
  dynamic_cast<DataParallelStrategy&>(*dp).set_replica_factory(
      [config] { return std::make_unique<nn::GPT>(config, 1); });
  dp->setup_module(model);
  data::Batch batch = batch_of(5);
  auto loss_of_rows = [&](nn::Module& m, int64_t begin, int64_t end) {
    return static_cast<nn::GPT&>(m).loss(batch.tokens.narrow(0, begin, end - begin).contiguous(),
                                         batch.targets.narrow(0, begin, end - begin).contiguous());
  };
  dp->forward_backward(loss_of_rows, 5, 0.5);
  dp->forward_backward(loss_of_rows, 5, 0.5);
  std::vector<double> twice;
  for (const Tensor& p : model.parameters()) {
    std::vector<double> v = p.grad().to_vector<double>();
    twice.insert(twice.end(), v.begin(), v.end());
  }
  expect_near_all(twice, once, 1e-12);
}

TEST(DataParallel, RejectsBadDevicesAndMissingFactory) {
  EXPECT_THROW(StrategyRegistry::create("dp", {.devices = "0"}), Error);
  EXPECT_THROW(StrategyRegistry::create("dp", {.devices = "two"}), Error);
  EXPECT_EQ(DataParallelStrategy(StrategyOptions{}).num_replicas(), 1);
  nn::GPT model(tiny_config(), 0);
  DataParallelStrategy dp({.devices = "2"});
  dp.setup_module(model);
  data::Batch batch = batch_of(2);
  auto loss_of_rows = [&](nn::Module& m, int64_t, int64_t) {
    return static_cast<nn::GPT&>(m).loss(batch.tokens, batch.targets);
  };
  EXPECT_THROW(dp.forward_backward(loss_of_rows, 2), Error);
}

TEST(DataParallel, TrainLoopMatchesSingleDevice) {
  for (int64_t batch : {4, 5}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    std::vector<double> reference = testing::train_tiny(nullptr, batch);
    auto dp = StrategyRegistry::create("dp", {.devices = "2"});
    expect_near_all(testing::train_tiny(dp.get(), batch), reference, 1e-10);
  }
}

}  // namespace
}  // namespace loom::strategies
