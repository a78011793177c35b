// Two threads issuing on one group (Note [Inline operations] in comm/process_group.cpp). What
// users rely on: calls one thread issues asynchronously while another runs synchronous calls
// on the same group complete, with their results, even when nobody waits on them.

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "comm/process_group.h"
#include "multiprocess.h"

namespace loom::comm {
namespace {

using namespace std::chrono_literals;
using testing::expect_all_ok;
using testing::run_ranks;

// A world of one rank, so that the two threads' collectives cannot reach the ranks in
// different orders. One thread runs synchronous allreduces back to back, each on its own
// thread; the other issues asynchronous ones, which queue behind them (or are posted between
// them), and never waits on them: the progress thread must run each. (The release of the
// group that can miss a queueing, which the progress thread's polling makes up for, lasts
// nanoseconds: this test does not provoke it reliably, only the hand-offs around it.)
TEST(IssuingThreads, CallsQueuedBehindSynchronousOnesCompleteUnwaited) {
  expect_all_ok(run_ranks(1, [](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup pg(rank, size, store, {.backend = "shm", .timeout = 30s});
    std::atomic<bool> stop{false};
    std::atomic<int> synchronous_calls{0};
    std::thread synchronous([&] {
      Tensor ones = Tensor::empty({4}, DType::F32);
      while (!stop.load()) {
        for (int j = 0; j < 4; ++j)
          ones.data<float>()[j] = 1.0f;
        pg.allreduce(ones, {.async_op = false})->wait();
        EXPECT_EQ(ones.data<float>()[3], 1.0f * static_cast<float>(size));
        synchronous_calls.fetch_add(1);
      }
    });
    const int calls = 500;
    // A call that never completes ends the loop, not the test: the synchronous thread must be
    // stopped and joined first.
    for (int i = 0; i < calls; ++i) {
      Tensor t = Tensor::empty({2}, DType::F32);
      t.data<float>()[0] = static_cast<float>(i + rank);
      t.data<float>()[1] = static_cast<float>(-i);
      WorkPtr work = pg.allreduce(t);
      const auto start = std::chrono::steady_clock::now();
      while (!work->is_completed() && std::chrono::steady_clock::now() - start < 10s)
        std::this_thread::yield();
      EXPECT_TRUE(work->is_completed()) << "call " << i << " never ran";
      if (!work->is_completed()) break;
      EXPECT_EQ(t.data<float>()[0], static_cast<float>(i));
      EXPECT_EQ(t.data<float>()[1], static_cast<float>(-i));
    }
    stop.store(true);
    synchronous.join();
    EXPECT_GT(synchronous_calls.load(), 0);
  }));
}

}  // namespace
}  // namespace loom::comm
