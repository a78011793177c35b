// sync_dist: Mean/Sum/Max/Min of per-rank scalars and vectors over forked ranks, world sizes
// 1, 2 and 3, against closed forms.

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "multiprocess.h"
#include "strategies/metric_sync.h"

namespace loom::strategies {
namespace {

using comm::testing::expect_all_ok;
using comm::testing::run_ranks;

class MetricSync : public ::testing::TestWithParam<int> {};

// Rank r contributes r + 1.5 (scalar) and {r + 1.5, -2r, 10 * (r % 2)} (vector).
TEST_P(MetricSync, ScalarClosedForms) {
  expect_all_ok(run_ranks(GetParam(), [](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto pg = std::make_shared<comm::ProcessGroup>(rank, size, store);
    double local = rank + 1.5;
    double sum = size * (size - 1) / 2.0 + 1.5 * size;
    EXPECT_DOUBLE_EQ(sync_dist(*pg, local, SyncOp::Sum), sum);
    EXPECT_DOUBLE_EQ(sync_dist(*pg, local, SyncOp::Mean), sum / size);
    EXPECT_DOUBLE_EQ(sync_dist(*pg, local, SyncOp::Max), size - 1 + 1.5);
    EXPECT_DOUBLE_EQ(sync_dist(*pg, local, SyncOp::Min), 1.5);
  }));
}

TEST_P(MetricSync, VectorClosedForms) {
  expect_all_ok(run_ranks(GetParam(), [](int rank, int size, std::shared_ptr<comm::Store> store) {
    auto pg = std::make_shared<comm::ProcessGroup>(rank, size, store);
    std::vector<double> local = {rank + 1.5, -2.0 * rank, 10.0 * (rank % 2)};
    double tri = size * (size - 1) / 2.0;  // sum of ranks
    double odd = size / 2;                 // ranks with rank % 2 == 1
    std::vector<double> sum = {tri + 1.5 * size, -2.0 * tri, 10.0 * odd};
    EXPECT_EQ(sync_dist(*pg, local, SyncOp::Sum), sum);
    std::vector<double> mean = sync_dist(*pg, local, SyncOp::Mean);
    ASSERT_EQ(mean.size(), 3u);
    for (size_t i = 0; i < 3; ++i)
      EXPECT_DOUBLE_EQ(mean[i], sum[i] / size) << i;
    EXPECT_EQ(sync_dist(*pg, local, SyncOp::Max),
              (std::vector<double>{size - 1 + 1.5, 0.0, size > 1 ? 10.0 : 0.0}));
    EXPECT_EQ(sync_dist(*pg, local, SyncOp::Min),
              (std::vector<double>{1.5, -2.0 * (size - 1), 0.0}));
    EXPECT_TRUE(sync_dist(*pg, std::vector<double>{}, SyncOp::Sum).empty());
    // The input is not modified.
    EXPECT_EQ(local, (std::vector<double>{rank + 1.5, -2.0 * rank, 10.0 * (rank % 2)}));
  }));
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, MetricSync, ::testing::Values(1, 2, 3),
                         [](const auto& info) { return "world" + std::to_string(info.param); });

}  // namespace
}  // namespace loom::strategies
