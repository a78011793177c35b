// A rank that waits long for a peer sleeps until the peer publishes (Note [Doorbells] in
// comm/shm/layout.h) instead of waking thousands of times a second: on a machine whose cores
// all compute, each of those wake-ups preempted a rank's compute thread. Counted, not timed:
// the waiting process's context switches while its peer is late by 300 ms, for each kind of
// wait the shm backend has (a fast-box allreduce, a staged one, a receive). With 50 us naps
// the count was in the thousands; asleep, it is about one per liveness check (every 5 ms).

#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>

#include "comm/process_group.h"
#include "multiprocess.h"

namespace loom::comm {
namespace {

using namespace std::chrono_literals;
using testing::expect_all_ok;
using testing::run_ranks;

constexpr auto kLate = 300ms;
// Liveness checks every 5 ms give about 60 wake-ups in 300 ms; the progress thread and the
// Work's wait add a few. Naps of 50 us would give about 6,000.
constexpr long kMostSwitches = 200;

long context_switches() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_nvcsw + usage.ru_nivcsw;
}

// Rank 1 is late by kLate for `call`; rank 0 counts its own switches while it waits.
void expect_sleeps_while_peer_is_late(const std::string& what,
                                      const std::function<void(ProcessGroup&)>& call) {
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup pg(rank, size, store, {.backend = "shm", .timeout = 30s});
    call(pg);  // both ranks on time once: the group and its segment are warm
    if (rank == 1) {
      std::this_thread::sleep_for(kLate);
      call(pg);
      return;
    }
    const long before = context_switches();
    call(pg);
    const long switches = context_switches() - before;
    EXPECT_LT(switches, kMostSwitches) << what << ": rank 0 waited " << kLate.count()
                                       << " ms for its peer with " << switches
                                       << " context switches";
  }));
}

TEST(Doorbells, AWaitForASmallAllreduceSleeps) {
  expect_sleeps_while_peer_is_late("allreduce of 16 floats", [](ProcessGroup& pg) {
    Tensor t = Tensor::full({16}, pg.rank() + 1.0);
    pg.allreduce(t)->wait();
    EXPECT_EQ(t.to_vector<float>()[15], 3.0f);
  });
}

TEST(Doorbells, AWaitForAStagedAllreduceSleeps) {
  expect_sleeps_while_peer_is_late("allreduce of 1 Mi floats", [](ProcessGroup& pg) {
    Tensor t = Tensor::full({1 << 20}, pg.rank() + 1.0);
    pg.allreduce(t)->wait();
    EXPECT_EQ(t.to_vector<float>()[(1 << 20) - 1], 3.0f);
  });
}

TEST(Doorbells, AWaitForAMessageSleeps) {
  expect_sleeps_while_peer_is_late("recv of 64 Ki floats", [](ProcessGroup& pg) {
    Tensor t = Tensor::full({1 << 16}, 7.0);
    if (pg.rank() == 1) {
      pg.send(t, 0, {.tag = 3})->wait();
    } else {
      Tensor in = Tensor::zeros({1 << 16});
      pg.recv(in, 1, {.tag = 3})->wait();
      EXPECT_EQ(in.to_vector<float>()[(1 << 16) - 1], 7.0f);
    }
  });
}

}  // namespace
}  // namespace loom::comm
