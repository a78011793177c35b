// The network backends (tcp, ucx) beyond the conformance suite: their results are the shm
// backend's bits, and a dead, absent or mismatched peer is named within the timeout. ucx's
// cases are skipped in a build without UCX.

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "collective_values.h"
#include "comm/backend_registry.h"
#include "comm/process_group.h"
#include "multiprocess.h"

namespace loom::comm {
namespace {

using namespace std::chrono_literals;
using testing::expect_all_ok;
using testing::filled;
using testing::run_ranks;

class NetworkBackend : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!BackendRegistry::contains(GetParam())) {
      GTEST_SKIP() << "this build has no " << GetParam()
                   << " backend (install libucx-dev and configure again)";
    }
  }
  std::string backend() const { return GetParam(); }
};

// Expects `work` to fail with a CommError of `failure` naming `peer`; returns its message.
std::string expect_failure(const WorkPtr& work, int peer, CommFailure failure) {
  try {
    work->wait();
    ADD_FAILURE() << "expected a CommError";
  } catch (const CommError& e) {
    EXPECT_EQ(e.peer(), peer) << e.what();
    EXPECT_EQ(e.failure(), failure) << e.what();
    EXPECT_NE(std::string(e.what()).find("peer " + std::to_string(peer)), std::string::npos)
        << e.what();
    return e.what();
  }
  return "";
}

// Note [Rank-ordered reductions]: the same data reduced over the network backend and over shm
// gives the same bytes (allreduce of several sizes, reduce-scatter, reduce to every root).
TEST_P(NetworkBackend, ReductionsGiveTheShmBackendsBits) {
  expect_all_ok(run_ranks(3, [&](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup over_net(rank, size, store, {.backend = backend(), .timeout = 30s}, "net");
    ProcessGroup over_shm(rank, size, store, {.backend = "shm", .timeout = 30s}, "shm");
    auto noisy = [&](int64_t i) {
      return std::sin(static_cast<double>(i) * 0.37 + rank * 1.3) * 1e3 / (1 + i % 17);
    };
    auto same = [](const Tensor& a, const Tensor& b) {
      return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
    };
    for (DType d : {DType::F32, DType::BF16, DType::F64}) {
      for (int64_t n : {int64_t{1}, int64_t{13}, int64_t{4099}, int64_t{300001}}) {
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
          Tensor a = filled(d, n, noisy), b = a.clone();
          over_net.allreduce(a, {.op = op})->wait();
          over_shm.allreduce(b, {.op = op})->wait();
          EXPECT_TRUE(same(a, b)) << "allreduce " << dtype_name(d) << " n=" << n;
        }
      }
      Tensor input = filled(d, 3 * 1001, noisy);
      Tensor a = Tensor::empty({1001}, d), b = Tensor::empty({1001}, d);
      over_net.reduce_scatter(a, input)->wait();
      over_shm.reduce_scatter(b, input)->wait();
      EXPECT_TRUE(same(a, b)) << "reduce_scatter " << dtype_name(d);
      for (int root = 0; root < size; ++root) {
        Tensor x = filled(d, 777, noisy), y = x.clone();
        over_net.reduce(x, {.root = root})->wait();
        over_shm.reduce(y, {.root = root})->wait();
        EXPECT_TRUE(same(x, y)) << "reduce to root " << root << " " << dtype_name(d);
      }
    }
  }));
}

TEST_P(NetworkBackend, KilledRankIsNamed) {
  const auto start = std::chrono::steady_clock::now();
  auto results = run_ranks(3, [&](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup pg(rank, size, store, {.backend = backend(), .timeout = 60s});
    Tensor t = Tensor::ones({1 << 16});
    pg.allreduce(t)->wait();  // every endpoint has carried traffic
    if (rank == 2) raise(SIGKILL);
    expect_failure(pg.allreduce(t), 2, CommFailure::PeerDied);
    // The survivors leave together: one that exits as soon as it has seen rank 2 die would be
    // a dead peer too, and the other might see that first (CI once named peer 0 this way).
    store->set("saw_rank_2_die/" + std::to_string(rank), Bytes{1});
    store->wait({"saw_rank_2_die/0", "saw_rank_2_die/1"}, 20s);
  });
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s) << "dead peer detected too slowly";
  EXPECT_EQ(results[0].exit_code, 0);
  EXPECT_EQ(results[1].exit_code, 0);
  EXPECT_EQ(results[2].signal, SIGKILL);
}

TEST_P(NetworkBackend, RankThatNeverArrivesTimesOut) {
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup pg(rank, size, store, {.backend = backend(), .timeout = 10s});
    Tensor t = Tensor::ones({16});
    if (rank == 1) {
      std::this_thread::sleep_for(1500ms);  // alive, but late for the collective
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    const std::string message =
        expect_failure(pg.allreduce(t, {.timeout = 300ms}), 1, CommFailure::Timeout);
    EXPECT_NE(message.find("allreduce #0"), std::string::npos) << message;
    EXPECT_LT(std::chrono::steady_clock::now() - start, 1200ms);
  }));
}

// Ranks that reduce different sizes: each fails with a Mismatch naming the other, instead of
// reading the other's bytes as its own.
TEST_P(NetworkBackend, MismatchedSizesAreNamed) {
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup pg(rank, size, store, {.backend = backend(), .timeout = 10s});
    Tensor t = Tensor::ones({rank == 0 ? 16 : 32});
    const std::string message = expect_failure(pg.allreduce(t), 1 - rank, CommFailure::Mismatch);
    EXPECT_NE(message.find("bytes where " + std::to_string(t.nbytes()) + " were expected"),
              std::string::npos)
        << message;
  }));
}

INSTANTIATE_TEST_SUITE_P(Backends, NetworkBackend, ::testing::Values("tcp", "ucx"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace loom::comm
