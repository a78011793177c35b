// Posted allreduces (Note [Posted allreduces] in comm/process_group.cpp): asynchronous
// allreduces of up to 4 KiB on the shm backend put their data out at issue and finish later. What
// users rely on: exact results however many are outstanding and in whatever order they are waited
// for, issue order kept against every other operation, completion without a wait, the group's
// destructor finishing them, and a dead peer reported quickly.

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>
#include <vector>

#include "comm/process_group.h"
#include "multiprocess.h"

namespace loom::comm {
namespace {

using namespace std::chrono_literals;
using testing::expect_all_ok;
using testing::run_ranks;

// Call i's data on `rank`: two f32 values that differ between calls and ranks.
Tensor call_data(int i, int rank) {
  Tensor t = Tensor::empty({2}, DType::F32);
  t.data<float>()[0] = static_cast<float>(i * 10 + rank);
  t.data<float>()[1] = static_cast<float>(-i - rank * 100);
  return t;
}

// The sum of call_data(i, r) over `size` ranks (exact: small integers).
std::vector<float> call_sum(int i, int size) {
  std::vector<float> sum = {0.0f, 0.0f};
  for (int r = 0; r < size; ++r) {
    sum[0] += static_cast<float>(i * 10 + r);
    sum[1] += static_cast<float>(-i - r * 100);
  }
  return sum;
}

void expect_call_result(const Tensor& t, int i, int size) {
  const std::vector<float> want = call_sum(i, size);
  EXPECT_EQ(t.data<float>()[0], want[0]) << "call " << i;
  EXPECT_EQ(t.data<float>()[1], want[1]) << "call " << i;
}

// Many more calls than may be outstanding at once, waited for last to first: later waits
// finish the earlier calls, and the issuing thread finishes the oldest as it posts.
TEST(Posted, BurstsGiveExactResultsWaitedInAnyOrder) {
  for (int size : {2, 3}) {
    SCOPED_TRACE("size " + std::to_string(size));
    expect_all_ok(run_ranks(size, [](int rank, int size, std::shared_ptr<Store> store) {
      ProcessGroup pg(rank, size, store, {.backend = "shm", .timeout = 30s});
      const int calls = 100;
      std::vector<Tensor> data;
      std::vector<WorkPtr> works;
      for (int i = 0; i < calls; ++i) {
        data.push_back(call_data(i, rank));
        works.push_back(pg.allreduce(data.back()));
      }
      for (int i = calls - 1; i >= 0; --i)
        works[static_cast<size_t>(i)]->wait();
      for (int i = 0; i < calls; ++i)
        expect_call_result(data[static_cast<size_t>(i)], i, size);
    }));
  }
}

// The largest calls that are posted (4 KiB of f32), in a burst: exact element-wise sums.
TEST(Posted, BurstsOfFourKibibyteCalls) {
  expect_all_ok(run_ranks(3, [](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup pg(rank, size, store, {.backend = "shm", .timeout = 30s});
    const int calls = 40;
    const int64_t n = 1024;
    auto value = [](int i, int r, int64_t j) { return static_cast<float>(i * 10 + r + j % 7); };
    std::vector<Tensor> data;
    std::vector<WorkPtr> works;
    for (int i = 0; i < calls; ++i) {
      Tensor t = Tensor::empty({n}, DType::F32);
      for (int64_t j = 0; j < n; ++j)
        t.data<float>()[j] = value(i, rank, j);
      data.push_back(t);
      works.push_back(pg.allreduce(data.back()));
    }
    for (const WorkPtr& w : works)
      w->wait();
    for (int i = 0; i < calls; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float want = 0.0f;
        for (int r = 0; r < size; ++r)
          want += value(i, r, j);
        ASSERT_EQ(data[static_cast<size_t>(i)].data<float>()[j], want) << "call " << i << ", " << j;
      }
    }
  }));
}

// Posted calls between a large allreduce, a broadcast and synchronous calls: every operation
// sees the data of the ones issued before it.
TEST(Posted, IssueOrderHoldsAgainstOtherOperations) {
  expect_all_ok(run_ranks(2, [](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup pg(rank, size, store, {.backend = "shm", .timeout = 30s});
    Tensor small = Tensor::full({1}, static_cast<double>(rank + 1), DType::F32);
    Tensor large = Tensor::ones({100000}, DType::F32);
    std::vector<WorkPtr> works;
    for (int round = 0; round < 20; ++round) {
      // small: 1 and 2 summed (3), then each call after doubles it: a call reads the result
      // of the calls before it, even while they are posted and not finished.
      works.push_back(pg.allreduce(small));
      works.push_back(pg.allreduce(small));
      works.push_back(pg.allreduce(large));               // queued behind the posted ones
      works.push_back(pg.broadcast(small, {.root = 0}));  // reads the posted calls' result
      pg.allreduce(small, {.async_op = false});           // finishes everything before it
      works.push_back(pg.allreduce(small));
      for (const WorkPtr& w : works)
        w->wait();
      works.clear();
      EXPECT_EQ(small.data<float>()[0], 24.0f) << "round " << round;
      small.data<float>()[0] = static_cast<float>(rank + 1);  // from scratch next round
    }
    EXPECT_EQ(large.data<float>()[0], 1048576.0f);  // doubled 20 times
  }));
}

// A call nobody waits for still completes (the progress thread finishes it), and its result
// is there once is_completed() says so.
TEST(Posted, UnwaitedCallsComplete) {
  expect_all_ok(run_ranks(2, [](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup pg(rank, size, store, {.backend = "shm", .timeout = 30s});
    Tensor t = call_data(7, rank);
    WorkPtr work = pg.allreduce(t);
    const auto start = std::chrono::steady_clock::now();
    while (!work->is_completed() && std::chrono::steady_clock::now() - start < 10s)
      std::this_thread::sleep_for(100us);
    ASSERT_TRUE(work->is_completed());
    expect_call_result(t, 7, size);
  }));
}

// Destroying the group finishes what is posted: the Works complete with the right results.
TEST(Posted, DestroyingTheGroupFinishesPostedCalls) {
  expect_all_ok(run_ranks(2, [](int rank, int size, std::shared_ptr<Store> store) {
    std::vector<Tensor> data;
    std::vector<WorkPtr> works;
    {
      ProcessGroup pg(rank, size, store, {.backend = "shm", .timeout = 30s});
      for (int i = 0; i < 5; ++i) {
        data.push_back(call_data(i, rank));
        works.push_back(pg.allreduce(data.back()));
      }
    }
    for (int i = 0; i < 5; ++i) {
      ASSERT_TRUE(works[static_cast<size_t>(i)]->is_completed()) << "call " << i;
      expect_call_result(data[static_cast<size_t>(i)], i, size);
    }
  }));
}

// A peer killed while calls are posted: they fail with a CommError naming it, well within the
// timeout, and so does the next call on the broken group.
TEST(Posted, ADeadPeerFailsThePostedCallsQuickly) {
  auto results = run_ranks(2, [](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup pg(rank, size, store, {.backend = "shm", .timeout = 30s});
    Tensor first = call_data(0, rank);
    pg.allreduce(first)->wait();  // both attached
    if (rank == 1) raise(SIGKILL);
    const auto start = std::chrono::steady_clock::now();
    std::vector<Tensor> data;
    std::vector<WorkPtr> works;
    for (int i = 0; i < 3; ++i) {
      data.push_back(call_data(i, rank));
      works.push_back(pg.allreduce(data.back()));
    }
    for (const WorkPtr& work : works) {
      try {
        work->wait();
        ADD_FAILURE() << "expected a CommError";
      } catch (const CommError& e) {
        EXPECT_NE(std::string(e.what()).find("peer 1"), std::string::npos) << e.what();
      }
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 10s);
    EXPECT_THROW(pg.allreduce(first)->wait(), CommError);
  });
  EXPECT_EQ(results[0].exit_code, 0);
  EXPECT_EQ(results[1].signal, SIGKILL);
}

}  // namespace
}  // namespace loom::comm
