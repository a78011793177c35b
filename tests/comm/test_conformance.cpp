// The conformance suite every backend must pass: each collective over world sizes 1 to 4
// (and 8 for allreduce), element counts 0, 1, odd and large (several pipeline rounds), every
// reduce op and dtype, checked against closed-form values. Ranks are forked processes.

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <thread>

#include "collective_values.h"
#include "comm/backend_registry.h"
#include "comm/process_group.h"
#include "multiprocess.h"

namespace loom::comm {
namespace {

using testing::contribution;
using testing::describe;
using testing::expect_all_ok;
using testing::expect_values;
using testing::expected;
using testing::filled;
using testing::kAllDtypes;
using testing::kAllOps;
using testing::kCounts;
using testing::run_ranks;
using testing::valid;

class Conformance : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  std::string backend() const { return std::get<0>(GetParam()); }
  int world() const { return std::get<1>(GetParam()); }
  void SetUp() override {
    if (!BackendRegistry::contains(backend())) {
      GTEST_SKIP() << "this build has no '" << backend() << "' backend";
    }
  }
  // Runs body on every rank with a fresh group of this backend. The hierarchical backend
  // sees hosts of 2 ranks (LOOM_HOST_ID = rank / 2): one host at world 2 (shm alone), hosts
  // of 2 and 1 ranks at world 3 (the flat path), 2 x 2 at world 4 (two levels).
  void on_ranks(const std::function<void(ProcessGroup&)>& body) {
    std::string name = backend();
    expect_all_ok(run_ranks(world(), [&](int rank, int size, std::shared_ptr<Store> store) {
      if (name == "hierarchical") setenv("LOOM_HOST_ID", std::to_string(rank / 2).c_str(), 1);
      ProcessGroup pg(rank, size, store, {.backend = name, .timeout = std::chrono::seconds(30)});
      body(pg);
    }));
  }
};

TEST_P(Conformance, AllreduceEveryOpDtypeAndCount) {
  on_ranks([](ProcessGroup& pg) {
    for (DType d : kAllDtypes)
      for (ReduceOp op : kAllOps)
        for (int64_t n : kCounts) {
          if (!valid(op, d) || (n > 1000 && d != DType::F32 && d != DType::BF16)) continue;
          Tensor t = filled(d, n, [&](int64_t i) { return contribution(op, pg.rank(), i); });
          pg.allreduce(t, {.op = op})->wait();
          expect_values(
              t, [&](int64_t i) { return expected(op, pg.size(), i, d); }, op,
              describe("allreduce", d, n, op, pg.rank()));
        }
  });
}

// Every size a small message can have, in bursts of asynchronous calls: shm sends messages up
// to 4 KiB in its fast boxes, in three layouts by size (data and stamp in one line up to 56
// bytes, lined up to 512, the stamp after the data above: Note [Lined boxes]).
TEST_P(Conformance, AllreduceEverySmallByteCount) {
  on_ranks([](ProcessGroup& pg) {
    for (DType d : {DType::U8, DType::BF16, DType::F32, DType::F64}) {
      const int64_t element = static_cast<int64_t>(dtype_size(d));
      std::vector<Tensor> burst;
      std::vector<WorkPtr> works;
      auto check_burst = [&] {
        for (size_t k = 0; k < burst.size(); ++k) {
          works[k]->wait();
          expect_values(
              burst[k], [&](int64_t i) { return expected(ReduceOp::Sum, pg.size(), i, d); },
              ReduceOp::Sum, describe("allreduce", d, burst[k].numel(), ReduceOp::Sum, pg.rank()));
        }
        burst.clear();
        works.clear();
      };
      for (int64_t n = 1; n * element <= 640; ++n) {
        burst.push_back(
            filled(d, n, [&](int64_t i) { return contribution(ReduceOp::Sum, pg.rank(), i); }));
        works.push_back(pg.allreduce(burst.back(), {.async_op = true}));
        if (burst.size() == 3) check_burst();
      }
      check_burst();
    }
  });
}

TEST_P(Conformance, AllreduceOutOfPlaceLeavesInput) {
  on_ranks([](ProcessGroup& pg) {
    for (int64_t n : kCounts) {
      Tensor in = filled(DType::F32, n,
                         [&](int64_t i) { return contribution(ReduceOp::Sum, pg.rank(), i); });
      Tensor before = in.clone();
      Tensor out = Tensor::empty({n});
      pg.allreduce(in, out)->wait();
      EXPECT_EQ(in.to_vector<float>(), before.to_vector<float>());
      expect_values(
          out, [&](int64_t i) { return expected(ReduceOp::Sum, pg.size(), i, DType::F32); },
          ReduceOp::Sum,
          describe("allreduce out of place", DType::F32, n, ReduceOp::Sum, pg.rank()));
    }
  });
}

// Results are bitwise identical on every rank, and the same whether the data is reduced in
// one large call (pipelined rounds) or many small ones (one-shot).
TEST_P(Conformance, AllreduceIsBitwiseDeterministic) {
  on_ranks([](ProcessGroup& pg) {
    const int64_t n = 200003;
    auto noisy = [&](int64_t i) {
      return std::sin(i * 0.37 + pg.rank() * 1.3) * 1e3 / (1 + i % 17);
    };
    for (DType d : {DType::F32, DType::BF16}) {
      Tensor whole = filled(d, n, noisy);
      Tensor pieces = whole.clone();
      pg.allreduce(whole)->wait();
      const int64_t piece = 1000;
      for (int64_t s = 0; s < n; s += piece) {
        Tensor part = pieces.narrow(0, s, std::min(piece, n - s)).contiguous();
        pg.allreduce(part)->wait();
        std::memcpy(static_cast<char*>(pieces.raw_data()) + s * dtype_size(d), part.raw_data(),
                    part.nbytes());
      }
      EXPECT_EQ(std::memcmp(whole.raw_data(), pieces.raw_data(), whole.nbytes()), 0)
          << dtype_name(d);
      // Every rank holds the same bytes: compare with rank 0's through a broadcast.
      Tensor reference = whole.clone();
      pg.broadcast(reference, {.root = 0})->wait();
      EXPECT_EQ(std::memcmp(whole.raw_data(), reference.raw_data(), whole.nbytes()), 0)
          << "rank " << pg.rank() << " differs from rank 0 in " << dtype_name(d);
    }
  });
}

TEST_P(Conformance, BroadcastFromEveryRoot) {
  on_ranks([](ProcessGroup& pg) {
    for (int root = 0; root < pg.size(); ++root)
      for (DType d : {DType::F32, DType::BF16, DType::I64, DType::U8})
        for (int64_t n : kCounts) {
          Tensor t = filled(
              d, n, [&](int64_t i) { return pg.rank() == root ? (i * 7 + root) % 97 : 250; });
          pg.broadcast(t, {.root = root})->wait();
          expect_values(
              t, [&](int64_t i) { return (i * 7 + root) % 97; }, ReduceOp::Sum,
              describe("broadcast", d, n, ReduceOp::Sum, pg.rank()));
        }
  });
}

TEST_P(Conformance, ReduceToEveryRoot) {
  on_ranks([](ProcessGroup& pg) {
    for (int root = 0; root < pg.size(); ++root)
      for (ReduceOp op : kAllOps)
        for (int64_t n : kCounts) {
          if (n > 1000 && op != ReduceOp::Sum) continue;
          Tensor t =
              filled(DType::F32, n, [&](int64_t i) { return contribution(op, pg.rank(), i); });
          pg.reduce(t, {.op = op, .root = root})->wait();
          if (pg.rank() == root) {
            expect_values(
                t, [&](int64_t i) { return expected(op, pg.size(), i, DType::F32); }, op,
                describe("reduce", DType::F32, n, op, pg.rank()));
          } else {
            expect_values(
                t, [&](int64_t i) { return contribution(op, pg.rank(), i); }, ReduceOp::Sum,
                describe("reduce leaves non-roots", DType::F32, n, op, pg.rank()));
          }
        }
  });
}

TEST_P(Conformance, AllGatherOutOfPlaceAndInPlace) {
  on_ranks([](ProcessGroup& pg) {
    const int64_t w = pg.size();
    for (DType d : {DType::F32, DType::F16, DType::I32, DType::U8})
      for (int64_t n : kCounts) {
        auto want = [&](int64_t j) {
          return (j / std::max<int64_t>(n, 1)) * 10 + (j % std::max<int64_t>(n, 1)) % 7;
        };
        Tensor in = filled(d, n, [&](int64_t i) { return pg.rank() * 10 + i % 7; });
        Tensor out = Tensor::zeros({w * n}, d);
        pg.all_gather(out, in)->wait();
        expect_values(out, want, ReduceOp::Sum,
                      describe("all_gather", d, n, ReduceOp::Sum, pg.rank()));
        Tensor whole = Tensor::zeros({w * n}, d);
        Tensor mine = whole.narrow(0, pg.rank() * n, n);
        Tensor source = filled(d, n, [&](int64_t i) { return pg.rank() * 10 + i % 7; });
        if (n > 0) std::memcpy(mine.raw_data(), source.raw_data(), source.nbytes());
        pg.all_gather(whole, mine)->wait();
        expect_values(whole, want, ReduceOp::Sum,
                      describe("all_gather in place", d, n, ReduceOp::Sum, pg.rank()));
      }
  });
}

TEST_P(Conformance, ReduceScatterOutOfPlaceAndInPlace) {
  on_ranks([](ProcessGroup& pg) {
    const int64_t w = pg.size();
    for (DType d : kAllDtypes)
      for (ReduceOp op : kAllOps)
        for (int64_t n : kCounts) {
          if (!valid(op, d) || (n > 1000 && d != DType::F32)) continue;
          // Element i of the full input; this rank keeps slice [rank*n, (rank+1)*n).
          Tensor in = filled(d, w * n, [&](int64_t i) { return contribution(op, pg.rank(), i); });
          Tensor out = Tensor::empty({n}, d);
          pg.reduce_scatter(out, in, {.op = op})->wait();
          auto want = [&](int64_t i) { return expected(op, pg.size(), pg.rank() * n + i, d); };
          expect_values(out, want, op, describe("reduce_scatter", d, n, op, pg.rank()));
          Tensor mine = in.narrow(0, pg.rank() * n, n);
          pg.reduce_scatter(mine, in, {.op = op})->wait();
          expect_values(mine.contiguous(), want, op,
                        describe("reduce_scatter in place", d, n, op, pg.rank()));
        }
  });
}

TEST_P(Conformance, AllToAll) {
  on_ranks([](ProcessGroup& pg) {
    const int64_t w = pg.size();
    for (DType d : {DType::F32, DType::I64, DType::BF16})
      for (int64_t n : kCounts) {
        if (n > 1000 && d != DType::F32) continue;
        // Rank r sends piece j (n elements) to rank j: value r*64 + j*8 + i%7 (exact in bf16).
        Tensor in = filled(d, w * n, [&](int64_t i) {
          return pg.rank() * 64 + (i / std::max<int64_t>(n, 1)) * 8 +
                 (i % std::max<int64_t>(n, 1)) % 7;
        });
        Tensor out = Tensor::zeros({w * n}, d);
        pg.all_to_all(out, in)->wait();
        // Piece r of the output came from rank r.
        expect_values(
            out,
            [&](int64_t i) {
              int64_t src = i / std::max<int64_t>(n, 1);
              return src * 64 + pg.rank() * 8 + (i % std::max<int64_t>(n, 1)) % 7;
            },
            ReduceOp::Sum, describe("all_to_all", d, n, ReduceOp::Sum, pg.rank()));
      }
  });
}

// Point-to-point needs a peer other than the rank itself: instantiated from world size 2.
class ConformancePointToPoint : public Conformance {};

TEST_P(ConformancePointToPoint, SendRecvAroundARing) {
  on_ranks([](ProcessGroup& pg) {
    const int next = (pg.rank() + 1) % pg.size(), prev = (pg.rank() + pg.size() - 1) % pg.size();
    for (int64_t n : kCounts) {
      Tensor out = filled(DType::F32, n, [&](int64_t i) { return pg.rank() * 100000.0 + i; });
      Tensor in = Tensor::zeros({n});
      // Even ranks send first, odd ranks receive first: large messages exceed any buffer.
      WorkPtr a, b;
      if (pg.rank() % 2 == 0) {
        a = pg.send(out, next, {.tag = 7});
        b = pg.recv(in, prev, {.tag = 7});
      } else {
        b = pg.recv(in, prev, {.tag = 7});
        a = pg.send(out, next, {.tag = 7});
      }
      a->wait();
      b->wait();
      expect_values(
          in, [&](int64_t i) { return prev * 100000.0 + i; }, ReduceOp::Sum,
          describe("recv", DType::F32, n, ReduceOp::Sum, pg.rank()));
    }
  });
}

TEST_P(Conformance, BarrierAndAsyncCompletion) {
  on_ranks([](ProcessGroup& pg) {
    std::vector<Tensor> tensors;
    std::vector<WorkPtr> works;
    for (int k = 0; k < 20; ++k) {
      tensors.push_back(Tensor::full({1000}, k + 1.0));
      works.push_back(pg.allreduce(tensors.back()));
    }
    works.push_back(pg.barrier());
    for (auto& w : works)
      w->wait();
    for (int k = 0; k < 20; ++k) {
      EXPECT_TRUE(works[k]->is_completed());
      EXPECT_EQ(tensors[k].to_vector<float>()[999], (k + 1.0f) * pg.size());
    }
  });
}

TEST_P(Conformance, BlockingCallsReturnCompleted) {
  on_ranks([](ProcessGroup& pg) {
    Tensor queued = Tensor::full({100000}, 1.0);
    WorkPtr behind = pg.allreduce(queued);  // may still be running when the next call comes
    for (int k = 0; k < 50; ++k) {
      Tensor t = Tensor::full({2}, k);
      WorkPtr w = pg.allreduce(t, {.async_op = false});
      EXPECT_TRUE(w->is_completed());
      EXPECT_EQ(t.to_vector<float>()[1], k * pg.size());
    }
    behind->wait();
    EXPECT_EQ(queued.to_vector<float>()[99999], pg.size());
  });
}

// Small asynchronous collectives may run on the thread that waits for them (Note [Claimable
// operations]); one nobody waits for still completes on its own, and ones queued behind
// each other all complete, in order.
TEST_P(Conformance, SmallAsyncCallsCompleteWithOrWithoutAWaiter) {
  on_ranks([](ProcessGroup& pg) {
    for (int k = 0; k < 50; ++k) {  // waited for at once
      Tensor t = Tensor::full({2}, k);
      pg.allreduce(t)->wait();
      EXPECT_EQ(t.to_vector<float>()[0], k * pg.size());
    }
    // Nobody waits: issued right after the calls above (the progress thread polls) and after
    // the group sat idle for a while (it sleeps until woken); Note [Idle progress thread].
    for (const char* when : {"right after other calls", "on a group idle for 20 ms"}) {
      Tensor alone = Tensor::full({2}, 1.0);
      WorkPtr unwaited = pg.allreduce(alone);
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (!unwaited->is_completed() && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      EXPECT_TRUE(unwaited->is_completed())
          << "a small async call nobody waits for must start, " << when;
      EXPECT_EQ(alone.to_vector<float>()[1], pg.size()) << when;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    std::vector<Tensor> tensors;
    std::vector<WorkPtr> works;
    for (int k = 0; k < 5; ++k) {
      tensors.push_back(Tensor::full({3}, k));
      works.push_back(pg.allreduce(tensors.back()));
    }
    for (int k = 4; k >= 0; --k)  // waited for in reverse
      works[k]->wait();
    for (int k = 0; k < 5; ++k)
      EXPECT_EQ(tensors[k].to_vector<float>()[2], k * pg.size());
  });
}

TEST_P(Conformance, SplitByParity) {
  on_ranks([](ProcessGroup& pg) {
    auto sub = pg.split(pg.rank() % 2, -pg.rank());  // keys reverse the order
    ASSERT_NE(sub, nullptr);
    int members = (pg.size() + 1 - pg.rank() % 2) / 2;
    EXPECT_EQ(sub->size(), members);
    Tensor t = Tensor::full({5}, pg.rank());
    sub->allreduce(t)->wait();
    double want = 0;
    for (int r = pg.rank() % 2; r < pg.size(); r += 2)
      want += r;
    EXPECT_EQ(t.to_vector<float>()[0], want);
    // The highest rank of the color has key -rank, the smallest: new rank 0.
    int highest = pg.rank() % 2 + 2 * (members - 1);
    EXPECT_EQ(sub->rank(), (highest - pg.rank()) / 2);
    EXPECT_EQ(pg.split(-1, 0), nullptr);
  });
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
  return std::get<0>(info.param) + "_world" + std::to_string(std::get<1>(info.param));
}

TEST_P(Conformance, TrafficCountsCallsAndNcclTestsSizes) {
  on_ranks([](ProcessGroup& pg) {
    Tensor t = Tensor::zeros({10});
    pg.allreduce(t)->wait();
    pg.allreduce(t)->wait();
    Tensor full = Tensor::zeros({5 * pg.size()}), part = Tensor::zeros({5});
    pg.all_gather(full, part)->wait();
    pg.reduce_scatter(part, full)->wait();
    const auto traffic = pg.traffic();
    EXPECT_EQ(traffic.at("allreduce").calls, 2);
    EXPECT_EQ(traffic.at("allreduce").bytes, 80);
    // The whole buffer, as nccl-tests' size column: every rank's part together.
    EXPECT_EQ(traffic.at("all_gather").bytes, 20 * pg.size());
    EXPECT_EQ(traffic.at("reduce_scatter").bytes, 20 * pg.size());
    EXPECT_EQ(traffic.count("broadcast"), 0u);
  });
}

INSTANTIATE_TEST_SUITE_P(Backends, Conformance,
                         ::testing::Combine(::testing::Values("shm", "tcp", "ucx", "hierarchical"),
                                            ::testing::Values(1, 2, 3, 4)),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Backends, ConformancePointToPoint,
                         ::testing::Combine(::testing::Values("shm", "tcp", "ucx", "hierarchical"),
                                            ::testing::Values(2, 3, 4)),
                         param_name);

// Eight ranks on a small machine: allreduce only (the ranks outnumber the cores).
TEST(ConformanceEightRanks, AllreduceSum) {
  expect_all_ok(run_ranks(8, [](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup pg(rank, size, store, {.backend = "shm", .timeout = std::chrono::seconds(60)});
    for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{300001}}) {
      Tensor t =
          filled(DType::F32, n, [&](int64_t i) { return contribution(ReduceOp::Sum, rank, i); });
      pg.allreduce(t)->wait();
      expect_values(
          t, [&](int64_t i) { return expected(ReduceOp::Sum, size, i, DType::F32); }, ReduceOp::Sum,
          describe("allreduce", DType::F32, n, ReduceOp::Sum, rank));
    }
  }));
}

}  // namespace
}  // namespace loom::comm
