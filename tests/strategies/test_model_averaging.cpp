// Periodic model averaging (local SGD) under DDPStrategy: the averaging schedule, local SGD
// at period 1 equal to DDP for plain SGD, ranks that drift apart between averaging steps and
// agree bitwise right after one, and warm-up steps that are DDP bit for bit. Ranks are forked
// processes.

#include <gtest/gtest.h>

#include "multiprocess.h"
#include "optim/sgd.h"
#include "strategies/ddp/ddp_strategy.h"
#include "strategies/model_averaging.h"
#include "strategies/strategy.h"
#include "tensor/ops.h"

namespace loom::strategies {
namespace {

using comm::testing::expect_all_ok;
using comm::testing::run_ranks;
using namespace std::chrono_literals;

constexpr double kLr = 0.1;

// loss = sum(0.5 w*w + w*x) + sum(v*y): w's gradient depends on w, v's does not.
class Tiny : public nn::Module {
 public:
  Tiny() {
    w = register_parameter("w", Tensor::from_vector<double>({0.5, -1.0, 2.0}, {3}));
    v = register_parameter("v", Tensor::from_vector<double>({1.0, 3.0}, {2}));
  }
  Tensor w, v;
};

double x_value(int rank, int step, int i) {
  return 0.3 * (rank + 1) + 0.1 * step + 0.05 * i;
}
double y_value(int rank, int step, int i) {
  return (rank % 2 == 0 ? 1.0 : -0.7) * (rank + 1) + 0.2 * step - 0.1 * i;
}
Tensor x_of(int rank, int step) {
  return Tensor::from_vector<double>(
      {x_value(rank, step, 0), x_value(rank, step, 1), x_value(rank, step, 2)}, {3});
}
Tensor y_of(int rank, int step) {
  return Tensor::from_vector<double>({y_value(rank, step, 0), y_value(rank, step, 1)}, {2});
}

std::vector<double> flat(const Tiny& m) {
  std::vector<double> all = m.w.to_vector<double>();
  std::vector<double> v = m.v.to_vector<double>();
  all.insert(all.end(), v.begin(), v.end());
  return all;
}

// One training step on rank `rank`; returns v's gradient as the backward left it.
std::vector<double> train_step(Strategy& s, Tiny& m, optim::SGD& sgd, int rank, int step) {
  sgd.zero_grad();
  Tensor loss = sum(m.w * m.w * 0.5 + m.w * x_of(rank, step)) + sum(m.v * y_of(rank, step));
  s.backward(loss);
  std::vector<double> grad_v = m.v.grad().to_vector<double>();
  s.optimizer_step(sgd);
  return grad_v;
}

// DDP over `group`, with local SGD when period > 0; the weights after every step.
std::vector<std::vector<double>> run(std::shared_ptr<comm::ProcessGroup> group, int period,
                                     int warmup, int steps,
                                     std::vector<std::vector<double>>* grads_v = nullptr) {
  DDPOptions options;  // (named: GCC 12 misreports a designated temporary here)
  options.local_sgd_period = period;
  options.local_sgd_warmup = warmup;
  DDPStrategy ddp({}, options);
  ddp.set_process_group(group);
  ddp.setup_environment();
  Tiny model;
  ddp.setup_module(model);
  optim::SGD sgd(model.parameters(), {.lr = kLr});
  std::vector<std::vector<double>> out;
  for (int t = 0; t < steps; ++t) {
    ddp.set_backward_sync(true);  // after warm-up this must not bring gradient sync back
    std::vector<double> g = train_step(ddp, model, sgd, group->rank(), t);
    if (grads_v) grads_v->push_back(g);
    out.push_back(flat(model));
  }
  ddp.teardown();
  return out;
}

std::shared_ptr<comm::ProcessGroup> group_of(int rank, int size,
                                             std::shared_ptr<comm::Store> store) {
  return std::make_shared<comm::ProcessGroup>(rank, size, store,
                                              comm::GroupOptions{.timeout = 30s});
}

// Rank 0's copy of `mine`.
std::vector<double> from_rank0(comm::ProcessGroup& group, const std::vector<double>& mine) {
  Tensor t = Tensor::from_vector(mine, {static_cast<int64_t>(mine.size())});
  group.broadcast(t, {.root = 0})->wait();
  return t.to_vector<double>();
}

TEST(PeriodicModelAverager, AveragesOnTheScheduleAndRejectsBadArguments) {
  PeriodicModelAverager a(3, 2);
  std::vector<int64_t> averaging;
  for (int64_t s = 0; s < 10; ++s)
    if (a.averages_at(s)) averaging.push_back(s);
  EXPECT_EQ(averaging, (std::vector<int64_t>{2, 5, 8}));
  PeriodicModelAverager every(1, 0);
  for (int64_t s = 0; s < 4; ++s)
    EXPECT_TRUE(every.averages_at(s));
  EXPECT_THROW(PeriodicModelAverager(0, 0), Error);
  EXPECT_THROW(PeriodicModelAverager(2, -1), Error);
  Tiny model;
  DDPOptions negative;
  negative.local_sgd_period = -1;
  EXPECT_THROW(DDPStrategy({}, negative).setup_module(model), Error);
}

TEST(PeriodicModelAverager, CountsEveryCallAndAveragesInPlace) {
  expect_all_ok(run_ranks(2, [](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto group = group_of(rank, size, store);
    PeriodicModelAverager a(2, 1);
    Tensor p = Tensor::full({4}, rank == 0 ? 1.0 : 3.0, DType::F64);
    Tensor q = Tensor::full({2}, rank == 0 ? 2.0f : 4.0f, DType::F32);
    a.average_parameters({p, q}, *group);  // step 0: warm-up, untouched
    EXPECT_EQ(p.to_vector<double>()[0], rank == 0 ? 1.0 : 3.0);
    a.average_parameters({p, q}, *group);  // step 1: averages
    EXPECT_EQ(p.to_vector<double>(), std::vector<double>(4, 2.0));
    EXPECT_EQ(q.to_vector<float>(), std::vector<float>(2, 3.0f));
    EXPECT_EQ(a.step(), 2);
  }));
}

class LocalSGD : public ::testing::TestWithParam<int> {};

TEST_P(LocalSGD, PeriodOneMatchesDDPForPlainSGD) {
  const int world = GetParam();
  const int steps = 5;
  expect_all_ok(run_ranks(world, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto group = group_of(rank, size, store);
    std::vector<std::vector<double>> ddp = run(group, 0, 0, steps);
    std::vector<std::vector<double>> grads_v;
    std::vector<std::vector<double>> local = run(group, 1, 0, steps, &grads_v);
    for (int t = 0; t < steps; ++t) {
      for (size_t i = 0; i < local[t].size(); ++i)
        EXPECT_NEAR(local[t][i], ddp[t][i], 1e-12) << "rank " << rank << " step " << t;
      EXPECT_EQ(from_rank0(*group, local[t]), local[t]) << "rank " << rank << " step " << t;
      // Gradients stay local: v's gradient is this rank's y, not the average.
      for (int i = 0; i < 2; ++i)
        EXPECT_EQ(grads_v[t][i], y_value(rank, t, i)) << "rank " << rank << " step " << t;
    }
    // Closed form for the linear part: v_T = v_0 - lr * sum_t mean_r y(r, t).
    for (int i = 0; i < 2; ++i) {
      double expected = i == 0 ? 1.0 : 3.0;
      for (int t = 0; t < steps; ++t) {
        double mean = 0;
        for (int r = 0; r < size; ++r)
          mean += y_value(r, t, i);
        expected -= kLr * mean / size;
      }
      EXPECT_NEAR(local.back()[3 + i], expected, 1e-12) << "rank " << rank;
    }
  }));
}

TEST_P(LocalSGD, RanksDriftBetweenAveragingStepsAndWarmupIsDDP) {
  const int world = GetParam();
  const int warmup = 2, period = 3, steps = 9;
  expect_all_ok(run_ranks(world, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto group = group_of(rank, size, store);
    std::vector<std::vector<double>> ddp = run(group, 0, 0, warmup);
    std::vector<std::vector<double>> grads_v;
    std::vector<std::vector<double>> local = run(group, period, warmup, steps, &grads_v);
    for (int t = 0; t < steps; ++t) {
      std::vector<double> zero = from_rank0(*group, local[t]);
      if (t < warmup) {
        EXPECT_EQ(local[t], ddp[t]) << "rank " << rank << " warm-up step " << t;
        EXPECT_EQ(local[t], zero) << "rank " << rank << " warm-up step " << t;
      } else if ((t - warmup) % period == 0) {
        EXPECT_EQ(local[t], zero) << "rank " << rank << " averaging step " << t;
      } else if (rank != 0) {
        EXPECT_NE(local[t], zero) << "rank " << rank << " local step " << t;
      }
      if (t >= warmup) {
        for (int i = 0; i < 2; ++i)
          EXPECT_EQ(grads_v[t][i], y_value(rank, t, i)) << "rank " << rank << " step " << t;
      }
    }
  }));
}

INSTANTIATE_TEST_SUITE_P(Worlds, LocalSGD, ::testing::Values(2, 3));

}  // namespace
}  // namespace loom::strategies
