// Always-on consistency of collectives on the shm backend (Note [Fingerprints]): ranks whose
// collectives differ in kind, count, dtype, reduce op or root fail fast with a CommError,
// debug mode or not, and one of them names both views.

#include <gtest/gtest.h>

#include <chrono>
#include <functional>

#include "comm/process_group.h"
#include "multiprocess.h"

namespace loom::comm {
namespace {

using namespace std::chrono_literals;
using testing::expect_all_ok;
using testing::run_ranks;

// What one rank calls; the ranks of a case call different things.
using Call = std::function<WorkPtr(ProcessGroup& pg, int rank)>;

struct Case {
  std::string name;
  Call before = nullptr;  // run first on every rank and expected to succeed (may be null)
  Call call;    // the mismatched collective
  std::vector<std::string> views;  // the error of at least one rank contains all of these
  std::vector<std::string> also = {};  // some rank's error contains each of these
};

// Runs `c` on `size` ranks: every rank must fail well within the group's 30 s timeout, and at
// least one rank's message must name both views. Each rank posts its message to the store.
void expect_mismatch_reported(const Case& c, int size = 2) {
  SCOPED_TRACE(c.name);
  expect_all_ok(run_ranks(size, [&](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup pg(rank, size, store, {.backend = "shm", .timeout = 30s});
    if (c.before) c.before(pg, rank)->wait();
    const auto start = std::chrono::steady_clock::now();
    std::string message = "no error";
    try {
      c.call(pg, rank)->wait();
    } catch (const CommError& e) {
      message = e.what();
    }
    EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << message;
    store->set("error/" + std::to_string(rank), to_bytes(message));
    if (rank != 0) return;
    bool named = false;
    std::string all;
    for (int r = 0; r < size; ++r) {
      std::string m = to_string(store->get("error/" + std::to_string(r), 20s));
      EXPECT_NE(m, "no error") << "rank " << r << " did not fail";
      bool has_all = m.find("runs a different collective") != std::string::npos;
      for (const std::string& view : c.views)
        has_all = has_all && m.find(view) != std::string::npos;
      named = named || has_all;
      all += "\n  rank " + std::to_string(r) + ": " + m;
    }
    EXPECT_TRUE(named) << "no rank named both views:" << all;
    for (const std::string& part : c.also) {
      EXPECT_NE(all.find(part), std::string::npos) << "'" << part << "' not in:" << all;
    }
  }));
}

Tensor ones(int64_t n, DType dtype = DType::F32) {
  return Tensor::ones({n}, dtype);
}

TEST(Fingerprints, DifferentCountsFailOnEveryPath) {
  // Fast box (16 B) against one-shot (16 KiB), box against box (4 and 2 KiB; lined 100 and
  // 120 B; one line 40 B against lined 80 B: Note [Lined boxes]), one-shot against one-shot,
  // and multi-round.
  for (auto [mine, theirs] : {std::pair<int64_t, int64_t>{4, 4096},
                              {1024, 512},
                              {25, 30},
                              {10, 20},
                              {4096, 2048},
                              {(1 << 20) + 1, 1 << 20}}) {
    expect_mismatch_reported(
        {.name = "allreduce of " + std::to_string(mine) + " and " + std::to_string(theirs),
         // (Captured by name: clang 14 cannot capture structured bindings.)
         .call =
             [mine = mine, theirs = theirs](ProcessGroup& pg, int rank) {
               Tensor t = ones(rank == 0 ? mine : theirs);
               return pg.allreduce(t);
             },
         .views = {"allreduce sum f32 x " + std::to_string(mine),
                   "allreduce sum f32 x " + std::to_string(theirs)}});
  }
}

TEST(Fingerprints, DifferentKindDtypeOpOrRootFail) {
  expect_mismatch_reported({.name = "allreduce against broadcast",
                            .call = [](ProcessGroup& pg, int rank) {
                              Tensor t = ones(1024);
                              return rank == 0 ? pg.allreduce(t) : pg.broadcast(t);
                            },
                            .views = {"allreduce sum f32 x 1024", "broadcast root 0 f32 x 1024"}});
  expect_mismatch_reported({.name = "f32 against f64",
                            .call = [](ProcessGroup& pg, int rank) {
                              Tensor t = ones(8, rank == 0 ? DType::F32 : DType::F64);
                              return pg.allreduce(t);
                            },
                            .views = {"allreduce sum f32 x 8", "allreduce sum f64 x 8"}});
  expect_mismatch_reported({.name = "sum against max",
                            .call = [](ProcessGroup& pg, int rank) {
                              Tensor t = ones(8);
                              return pg.allreduce(t, {.op = rank == 0 ? ReduceOp::Sum
                                                                      : ReduceOp::Max});
                            },
                            .views = {"allreduce sum f32 x 8", "allreduce max f32 x 8"}});
  expect_mismatch_reported({.name = "reduce to root 0 against root 1",
                            .call = [](ProcessGroup& pg, int rank) {
                              Tensor t = ones(8);
                              return pg.reduce(t, {.root = rank});
                            },
                            .views = {"reduce sum root 0 f32 x 8", "reduce sum root 1 f32 x 8"}});
  expect_mismatch_reported({.name = "all_gather against barrier",
                            .call = [](ProcessGroup& pg, int rank) {
                              if (rank == 1) return pg.barrier();
                              Tensor in = ones(4), out = ones(8);
                              return pg.all_gather(out, in);
                            },
                            .views = {"all_gather f32 x 4", "barrier"}});
}

// A round in which nobody waits (every rank the root of its own broadcast) cannot be checked
// then; the chain carries it to the next collective, whose error names the broadcasts.
TEST(Fingerprints, UncheckedRoundIsReportedAtTheNextCollective) {
  expect_mismatch_reported({.name = "broadcasts from two roots, then an allreduce",
                            .before =
                                [](ProcessGroup& pg, int rank) {
                                  Tensor t = ones(1024);
                                  return pg.broadcast(t, {.root = rank});
                                },
                            .call =
                                [](ProcessGroup& pg, int) {
                                  Tensor t = ones(1024);
                                  return pg.allreduce(t);
                                },
                            .views = {"broadcast root 0 f32 x 1024 (collective #0)",
                                      "broadcast root 1 f32 x 1024 (collective #0)"}});
}

// Rank 0 broadcasts first, unchecked, and then waits in an allreduce for a rank that found
// the mismatch and gave up: rank 0 learns it from rank 1's control block at once.
TEST(Fingerprints, ARankWaitingForOneThatGaveUpFailsFast) {
  expect_mismatch_reported(
      {.name = "broadcast only on rank 0",
       .call =
           [](ProcessGroup& pg, int rank) {
             Tensor t = ones(1024);
             if (rank == 0) pg.broadcast(t)->wait();
             return pg.allreduce(t);
           },
       .views = {"broadcast root 0 f32 x 1024 (collective #0)",
                 "allreduce sum f32 x 1024 (collective #0)"},
       .also = {"rank 0: peer 1 gave up on the group"}});
}

// One rank out of three differs; the other two fail fast too (a peer gave up), not at the
// deadline.
TEST(Fingerprints, EveryRankOfALargerGroupFailsFast) {
  expect_mismatch_reported({.name = "rank 2 all_to_all",
                            .call =
                                [](ProcessGroup& pg, int rank) {
                                  if (rank == 2) {
                                    Tensor in = ones(3 * 1000), out = ones(3 * 1000);
                                    return pg.all_to_all(out, in);
                                  }
                                  Tensor in = ones(3 * 1000), out = ones(1000);
                                  return pg.reduce_scatter(out, in);
                                },
                            .views = {"reduce_scatter sum f32 x 1000", "all_to_all f32 x 3000"}},
                           3);
}

// The same collectives in the same order never trip the check, whatever path each takes.
TEST(Fingerprints, MatchingCollectivesPass) {
  expect_all_ok(run_ranks(3, [](int rank, int size, std::shared_ptr<Store> store) {
    ProcessGroup pg(rank, size, store, {.backend = "shm", .timeout = 30s});
    for (int64_t n : {0, 1, 14, 15, 4096, (1 << 18) + 3}) {
      Tensor t = ones(n);
      pg.allreduce(t)->wait();
      pg.reduce(t, {.root = 2})->wait();
      pg.broadcast(t, {.root = 1})->wait();
      Tensor gathered = ones(n * size);
      pg.all_gather(gathered, t)->wait();
      pg.reduce_scatter(t, gathered)->wait();
      Tensor exchanged = ones(n * size);
      pg.all_to_all(exchanged, gathered)->wait();
      pg.barrier()->wait();
    }
    for (int i = 0; i < 40; ++i) {  // past the fast boxes' and records' 16 slots
      Tensor t = ones(2);
      pg.allreduce(t, {.async_op = false})->wait();
      EXPECT_EQ(t.to_vector<float>()[0], 3.0f);
    }
  }));
}

}  // namespace
}  // namespace loom::comm
