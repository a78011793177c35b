// Note [Operation times] in comm/process_group.cpp: a group times its operations with the
// coarse clock unless asked for the precise one. Either way a Work's times lie between the
// issue of its operation and the return of the call (the coarse clock's up to
// coarse_clock_lag() before), and a deadline is not shortened by the coarse clock's lag.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>

#include "comm/process_group.h"
#include "comm/store/in_process_store.h"
#include "multiprocess.h"

namespace loom::comm {
namespace {

using namespace std::chrono_literals;

// Runs one synchronous allreduce on `group` and checks its Work's times against clock reads
// around the call; `lag` is how far before the issue they may lie.
void expect_times_within_the_call(ProcessGroup& group, Clock::duration lag) {
  Tensor t = Tensor::ones({2}, DType::F32);
  const Clock::time_point before = Clock::now();
  WorkPtr work = group.allreduce(t, {.async_op = false});
  const Clock::time_point after = Clock::now();
  const auto started = work->started_at(), completed = work->completed_at();
  ASSERT_TRUE(started.has_value());
  ASSERT_TRUE(completed.has_value());
  EXPECT_LE(before - lag, *started);
  EXPECT_LE(*started, *completed);
  EXPECT_LE(*completed, after);
}

TEST(OperationTimes, PreciseTimesLieWithinTheCall) {
  ProcessGroup group(0, 1, std::make_shared<InProcessStore>(),
                     {.backend = "shm", .precise_times = true});
  for (int i = 0; i < 100; ++i)
    expect_times_within_the_call(group, Clock::duration::zero());
}

TEST(OperationTimes, CoarseTimesLagByAtMostTwoTicks) {
  ProcessGroup group(0, 1, std::make_shared<InProcessStore>(), {.backend = "shm"});
  for (int i = 0; i < 100; ++i)
    expect_times_within_the_call(group, coarse_clock_lag());
  group.time_precisely();
  for (int i = 0; i < 100; ++i)
    expect_times_within_the_call(group, Clock::duration::zero());
}

// Rank 1 never sends: rank 0's receive fails once its whole timeout has passed, not before.
TEST(OperationTimes, TimeoutsAreNeverShortened) {
  testing::expect_all_ok(
      testing::run_ranks(2, [](int rank, int size, std::shared_ptr<Store> store) {
        ProcessGroup group(rank, size, store, {.backend = "shm", .timeout = 30s});
        if (rank == 0) {
          Tensor t = Tensor::zeros({2}, DType::F32);
          const Clock::time_point before = Clock::now();
          EXPECT_THROW(group.recv(t, 1, {.timeout = 100ms})->wait(), CommError);
          EXPECT_GE(Clock::now() - before, 100ms);
          store->set("rank0-done", {1});
        } else {
          store->wait({"rank0-done"}, 30s);  // alive meanwhile: a dead peer fails sooner
        }
      }));
}

}  // namespace
}  // namespace loom::comm
