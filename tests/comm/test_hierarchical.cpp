// The hierarchical backend beyond the conformance suite (which runs it on one host, on
// hosts of unequal sizes and on 2 x 2 hosts): the layout it finds from the host keys, and its
// results against the flat network path's bits (Note [Hierarchical collectives]), and the
// network between hosts it uses (LOOM_HIERARCHICAL_NETWORK). Hosts are simulated with
// LOOM_HOST_ID in each forked rank.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "collective_values.h"
#include "comm/backend_registry.h"
#include "comm/hierarchical/hierarchical_backend.h"
#include "comm/process_group.h"
#include "comm/store/store.h"
#include "multiprocess.h"

namespace loom::comm {
namespace {

using namespace std::chrono_literals;
using testing::expect_all_ok;
using testing::filled;
using testing::run_ranks;

class Hierarchical : public ::testing::Test {};

// Every rank of a group whose rank r has host id host_of[r] finds `hosts` hosts, its own
// host's size, and whether collectives take two levels.
void expect_layout(const std::vector<int>& host_of, int hosts, bool two_levels) {
  const int w = static_cast<int>(host_of.size());
  expect_all_ok(run_ranks(w, [&](int rank, int size, std::shared_ptr<Store> store) {
    setenv("LOOM_HOST_ID", std::to_string(host_of[static_cast<size_t>(rank)]).c_str(), 1);
    hierarchical::HierarchicalBackend backend(
        {.rank = rank, .size = size, .store = store, .timeout = 30s, .group_name = "layout"});
    EXPECT_EQ(backend.hosts(), hosts);
    const int mine = host_of[static_cast<size_t>(rank)];
    EXPECT_EQ(backend.local_size(), std::count(host_of.begin(), host_of.end(), mine));
    EXPECT_EQ(backend.two_levels(), two_levels);
    backend.barrier(deadline_after(30s));
  }));
}

TEST_F(Hierarchical, FindsHostsFromTheirKeys) {
  expect_layout({0, 0, 1, 1}, 2, true);
  // Ranks not numbered host by host, or hosts of different sizes: the flat path.
  expect_layout({0, 1, 0, 1}, 2, false);
  expect_layout({0, 0, 1}, 2, false);
  // One rank per host: nothing to gain from two levels.
  expect_layout({0, 1, 2}, 3, false);
}

// Exact reductions (Max, integer Sum) give the flat tcp path's bits; a floating Sum is the
// same from run to run and close to the flat one.
TEST_F(Hierarchical, TwoLevelsMatchTheFlatPath) {
  expect_all_ok(run_ranks(4, [](int rank, int size, std::shared_ptr<Store> store) {
    setenv("LOOM_HOST_ID", std::to_string(rank / 2).c_str(), 1);
    ProcessGroup layered(rank, size, store, {.backend = "hierarchical", .timeout = 30s}, "h");
    ProcessGroup flat(rank, size, store, {.backend = "tcp", .timeout = 30s}, "f");
    auto noisy = [&](int64_t i) {
      return std::sin(static_cast<double>(i) * 0.37 + rank * 1.3) * 1e3 / (1 + i % 17);
    };
    auto same = [](const Tensor& a, const Tensor& b) {
      return std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
    };
    for (int64_t n : {int64_t{1}, int64_t{1001}, int64_t{300001}}) {
      Tensor a = filled(DType::F32, n, noisy), b = a.clone();
      layered.allreduce(a, {.op = ReduceOp::Max})->wait();
      flat.allreduce(b, {.op = ReduceOp::Max})->wait();
      EXPECT_TRUE(same(a, b)) << "max, n=" << n;
      Tensor i = filled(DType::I64, n, [&](int64_t k) { return (k * 7919 + rank) % 100003; });
      Tensor j = i.clone();
      layered.allreduce(i)->wait();
      flat.allreduce(j)->wait();
      EXPECT_TRUE(same(i, j)) << "i64 sum, n=" << n;
      Tensor x = filled(DType::F32, n, noisy), y = x.clone(), again = x.clone();
      layered.allreduce(x)->wait();
      layered.allreduce(again)->wait();
      flat.allreduce(y)->wait();
      EXPECT_TRUE(same(x, again)) << "f32 sum run to run, n=" << n;
      const float* p = x.data<float>();
      const float* q = y.data<float>();
      for (int64_t k = 0; k < n; ++k)
        ASSERT_NEAR(p[k], q[k], 1e-3 * (1 + std::fabs(q[k]))) << "f32 sum, n=" << n << " at " << k;
    }
  }));
}

// LOOM_HIERARCHICAL_NETWORK picks the network between hosts (ucx where the build has it; tcp
// always), and a value it does not know is refused naming the variable.
TEST_F(Hierarchical, NetworkIsChosenByItsVariable) {
  std::vector<std::string> networks = {"tcp"};
  if (BackendRegistry::contains("ucx")) networks.push_back("ucx");
  for (const std::string& network : networks) {
    expect_all_ok(run_ranks(4, [&](int rank, int size, std::shared_ptr<Store> store) {
      setenv("LOOM_HOST_ID", std::to_string(rank / 2).c_str(), 1);
      setenv("LOOM_HIERARCHICAL_NETWORK", network.c_str(), 1);
      ProcessGroup pg(rank, size, store, {.backend = "hierarchical", .timeout = 30s}, "n");
      Tensor t = Tensor::full({1001}, static_cast<float>(rank + 1));
      pg.allreduce(t)->wait();
      EXPECT_EQ(t.data<float>()[1000], 10.0f) << network;
    }));
  }
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<Store> store) {
    setenv("LOOM_HOST_ID", std::to_string(rank).c_str(), 1);
    setenv("LOOM_HIERARCHICAL_NETWORK", "infiniband", 1);
    try {
      ProcessGroup pg(rank, size, store, {.backend = "hierarchical", .timeout = 30s}, "bad");
      ADD_FAILURE() << "expected LOOM_HIERARCHICAL_NETWORK=infiniband to be refused";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("LOOM_HIERARCHICAL_NETWORK='infiniband'"),
                std::string::npos)
          << e.what();
    }
  }));
}

}  // namespace
}  // namespace loom::comm
