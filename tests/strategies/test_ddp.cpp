// DDP's gradient reducer: bucket layout, equivalence with single-device training on the
// foundation's data order, bitwise agreement across ranks and bucket sizes, no_sync
// accumulation, unused parameters, and mismatched models. Ranks are forked processes.

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "comm/store/in_process_store.h"
#include "data/default_corpus.h"
#include "data/token_blocks.h"
#include "multiprocess.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "strategies/ddp/reducer.h"
#include "strategies/parameter_sync.h"
#include "tensor/ops.h"
#include "tiny_training.h"

namespace loom::strategies {
namespace {

using comm::testing::expect_all_ok;
using comm::testing::run_ranks;
using namespace std::chrono_literals;

nn::GPTConfig tiny(DType dtype = DType::F64) {
  return testing::tiny_gpt_config(dtype);
}
std::vector<uint8_t> corpus() {
  return testing::tiny_corpus();
}

std::vector<std::string> names_of(const nn::GPT& model) {
  std::vector<std::string> names;
  for (auto& [name, p] : model.named_parameters())
    names.push_back(name);
  return names;
}

// Trains `steps` AdamW steps with DDP over `pg` on micro-batches of `batch` and returns the
// final weights.
std::vector<double> train_ddp(comm::ProcessGroup& pg, int steps, int64_t batch,
                              const ReducerOptions& options, DType dtype = DType::F64) {
  nn::GPT model(tiny(dtype), 1);
  verify_same_parameters(model.named_parameters(), pg);
  broadcast_parameters(model.parameters(), pg);
  Reducer reducer(model.parameters(), pg.shared_from_this(), options, names_of(model));
  optim::AdamW opt(model.parameters(), {.lr = 1e-2, .weight_decay = 0.0});
  data::TokenBlocks data(corpus(), batch, 8, 64);
  for (int step = 0; step < steps; ++step) {
    data::Batch b = data.for_step(step, pg.rank(), pg.size());
    Tensor loss = model.loss(b.tokens, b.targets);
    reducer.prepare_for_backward(loss);
    loss.backward();
    reducer.finalize_backward();
    opt.step();
    opt.zero_grad();
  }
  return testing::flat_parameters(model);
}

TEST(Reducer, BucketsFollowReverseOrderCapsAndDtypes) {
  auto store = std::make_shared<comm::InProcessStore>();
  auto pg = std::make_shared<comm::ProcessGroup>(0, 1, store);
  auto leaf = [](int64_t n, DType d) { return Tensor::zeros({n}, d).set_requires_grad(true); };
  // 1 MiB = 262144 f32 elements.
  std::vector<Tensor> params = {leaf(100000, DType::F32), leaf(100000, DType::F32),
                                leaf(100000, DType::F32), leaf(10, DType::F64),
                                leaf(200000, DType::F32)};
  Reducer reducer(params, pg, {.bucket_cap_mb = 1, .first_bucket_mb = 1});
  // Reverse order: 4 alone (800 KB; 4+3 would mix dtypes), 3 alone (then f32 again),
  // 2 and 1 (800 KB), then 0.
  std::vector<std::vector<size_t>> want = {{4}, {3}, {2, 1}, {0}};
  EXPECT_EQ(reducer.bucket_assignment(), want);
}

TEST(Reducer, DdpMatchesSingleDeviceOnTheSameGlobalBatch) {
  // Reference: one process, batch W*B: step i reads the same tokens as the W ranks together.
  const int world = 2, steps = 4;
  const int64_t micro = 2;
  std::vector<double> reference;
  {  // its progress thread ends here: the ranks are forked from a single-threaded process
    auto store = std::make_shared<comm::InProcessStore>();
    auto single =
        std::make_shared<comm::ProcessGroup>(0, 1, store, comm::GroupOptions{}, "single");
    reference = train_ddp(*single, steps, micro * world, {});
  }
  expect_all_ok(run_ranks(world, [&](int rank, int size, std::shared_ptr<comm::Store> s) {
    auto pg =
        std::make_shared<comm::ProcessGroup>(rank, size, s, comm::GroupOptions{.timeout = 30s});
    std::vector<double> mine = train_ddp(*pg, steps, micro, {});
    ASSERT_EQ(mine.size(), reference.size());
    double worst = 0;
    for (size_t i = 0; i < mine.size(); ++i)
      worst = std::max(worst, std::abs(mine[i] - reference[i]));
    // f64: the two runs differ only in the order of the gradient sums.
    EXPECT_LT(worst, 1e-11) << "rank " << rank;
  }));
}

TEST(Reducer, RanksAgreeBitwiseWhateverTheBucketSize) {
  expect_all_ok(run_ranks(3, [](int rank, int size, std::shared_ptr<comm::Store> s) {
    auto pg =
        std::make_shared<comm::ProcessGroup>(rank, size, s, comm::GroupOptions{.timeout = 30s});
    std::vector<double> small =
        train_ddp(*pg, 3, 1, {.bucket_cap_mb = 0.001, .first_bucket_mb = 0.001}, DType::F32);
    std::vector<double> large = train_ddp(*pg, 3, 1, {}, DType::F32);
    std::vector<double> copied =
        train_ddp(*pg, 3, 1, {.gradient_as_bucket_view = false}, DType::F32);
    EXPECT_EQ(small, large);
    EXPECT_EQ(copied, large);
    // Every rank holds the same bits: compare with rank 0's through a broadcast.
    Tensor mine = Tensor::from_vector(large, {static_cast<int64_t>(large.size())});
    Tensor theirs = mine.clone();
    pg->broadcast(theirs, {.root = 0})->wait();
    EXPECT_EQ(std::memcmp(mine.raw_data(), theirs.raw_data(), mine.nbytes()), 0) << "rank " << rank;
  }));
}

TEST(Reducer, NoSyncAccumulationMatchesALargerBatch) {
  // K micro-batches of B with no_sync on all but the last, loss scaled by 1/K, equal one
  // batch of K*B (the K micro-batches are the rows of the larger batch).
  const int K = 3;
  expect_all_ok(run_ranks(2, [&](int rank, int size, std::shared_ptr<comm::Store> s) {
    auto pg =
        std::make_shared<comm::ProcessGroup>(rank, size, s, comm::GroupOptions{.timeout = 30s});
    data::TokenBlocks big(corpus(), K, 8, 64);
    data::Batch b = big.for_step(0, rank, size);
    auto grads_of = [&](bool accumulate) {
      nn::GPT model(tiny(), 1);
      Reducer reducer(model.parameters(), pg, {});
      if (accumulate) {
        for (int k = 0; k < K; ++k) {
          reducer.set_sync(k == K - 1);
          Tensor rows = b.tokens.narrow(0, k, 1).contiguous(),
                 next = b.targets.narrow(0, k, 1).contiguous();
          Tensor loss = mul(model.loss(rows, next), 1.0 / K);
          reducer.prepare_for_backward(loss);
          loss.backward();
          reducer.finalize_backward();
        }
      } else {
        Tensor loss = model.loss(b.tokens, b.targets);
        reducer.prepare_for_backward(loss);
        loss.backward();
        reducer.finalize_backward();
      }
      std::vector<double> all;
      for (const Tensor& p : model.parameters()) {
        std::vector<double> g = p.grad().to_vector<double>();
        all.insert(all.end(), g.begin(), g.end());
      }
      return all;
    };
    std::vector<double> accumulated = grads_of(true), whole = grads_of(false);
    for (size_t i = 0; i < whole.size(); ++i)
      ASSERT_NEAR(accumulated[i], whole[i], 1e-12) << i;
  }));
}

TEST(Reducer, UnusedParametersNeedFindUnused) {
  expect_all_ok(run_ranks(2, [](int rank, int size, std::shared_ptr<comm::Store> s) {
    auto pg =
        std::make_shared<comm::ProcessGroup>(rank, size, s, comm::GroupOptions{.timeout = 30s});
    Tensor used = Tensor::full({4}, 1.0).set_requires_grad(true);
    Tensor unused = Tensor::full({4}, 2.0).set_requires_grad(true);
    {
      Reducer reducer({used, unused}, pg, {}, {"used", "unused"});
      Tensor loss = sum(mul(used, rank + 1.0));
      reducer.prepare_for_backward(loss);
      loss.backward();
      try {
        reducer.finalize_backward();
        ADD_FAILURE() << "expected an error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("parameter unused received no gradient"),
                  std::string::npos)
            << e.what();
      }
    }
    // The first reducer's bucket of `used` went out alone; start clean with a fresh group.
    auto fresh = pg->split(0, rank);
    used.set_grad(Tensor());
    unused.set_grad(Tensor());
    Reducer reducer({used, unused}, fresh, {.find_unused_parameters = true}, {"used", "unused"});
    Tensor loss = sum(mul(used, rank + 1.0));
    reducer.prepare_for_backward(loss);
    loss.backward();
    reducer.finalize_backward();
    EXPECT_EQ(used.grad().to_vector<double>(), std::vector<double>(4, 1.5));  // (1 + 2) / 2
    EXPECT_EQ(unused.grad().to_vector<double>(), std::vector<double>(4, 0.0));
  }));
}

TEST(Reducer, StaticGraphReusesTheUnusedSet) {
  expect_all_ok(run_ranks(2, [](int rank, int size, std::shared_ptr<comm::Store> s) {
    auto pg =
        std::make_shared<comm::ProcessGroup>(rank, size, s, comm::GroupOptions{.timeout = 30s});
    Tensor used = Tensor::full({4}, 1.0).set_requires_grad(true);
    Tensor unused = Tensor::full({4}, 2.0).set_requires_grad(true);
    Reducer reducer({used, unused}, pg, {.find_unused_parameters = true, .static_graph = true},
                    {"used", "unused"});
    for (int step = 0; step < 3; ++step) {
      used.set_grad(Tensor());
      unused.set_grad(Tensor());
      Tensor loss = sum(mul(used, rank + 1.0 + step));
      reducer.prepare_for_backward(loss);
      loss.backward();
      reducer.finalize_backward();
      EXPECT_EQ(used.grad().to_vector<double>(), std::vector<double>(4, 1.5 + step));
      EXPECT_EQ(unused.grad().to_vector<double>(), std::vector<double>(4, 0.0));
    }
  }));
}

TEST(Reducer, ARankThatSkipsBackwardIsReportedNotAHang) {
  auto start = std::chrono::steady_clock::now();
  expect_all_ok(run_ranks(2, [](int rank, int size, std::shared_ptr<comm::Store> s) {
    auto pg =
        std::make_shared<comm::ProcessGroup>(rank, size, s, comm::GroupOptions{.timeout = 500ms});
    Tensor w = Tensor::full({4}, 1.0).set_requires_grad(true);
    Reducer reducer({w}, pg, {}, {"w"});
    if (rank == 1) {
      std::this_thread::sleep_for(1500ms);  // alive, but never runs this backward
      return;
    }
    Tensor loss = sum(w);
    reducer.prepare_for_backward(loss);
    loss.backward();
    try {
      reducer.finalize_backward();
      ADD_FAILURE() << "expected a CommError";
    } catch (const CommError& e) {
      std::string what = e.what();
      EXPECT_NE(what.find("gradient bucket 0 was not reduced"), std::string::npos) << what;
      EXPECT_NE(what.find("peer 1"), std::string::npos) << what;
      EXPECT_NE(what.find("did every rank run backward"), std::string::npos) << what;
    }
  }));
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(Reducer, MismatchedModelsAreNamed) {
  expect_all_ok(run_ranks(2, [](int rank, int size, std::shared_ptr<comm::Store> s) {
    auto pg =
        std::make_shared<comm::ProcessGroup>(rank, size, s, comm::GroupOptions{.timeout = 30s});
    nn::GPTConfig c = tiny();
    if (rank == 1) c.embd = 32;  // different widths
    nn::GPT model(c, 0);
    try {
      verify_same_parameters(model.named_parameters(), *pg);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("parameter 0 'wte.weight'"), std::string::npos)
          << e.what();
    }
  }));
}

}  // namespace
}  // namespace loom::strategies
