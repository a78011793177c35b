// Intra-op threads (kernels/cpu/thread_pool.h): the fixed partition covers the range exactly
// once, errors reach the caller, and the optimizer steps give the same bits on any number of
// threads.

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <functional>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/exact_square_sum.h"
#include "kernels/cpu/thread_pool.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/sgd.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace loom {
namespace {

using kernels::cpu::parallel_for;
using kernels::cpu::set_num_threads;

struct ThreadsGuard {
  ~ThreadsGuard() { set_num_threads(1); }
};

TEST(ThreadPool, EveryIndexOnceInFixedChunks) {
  ThreadsGuard restore;
  set_num_threads(3);
  std::vector<std::atomic<int>> hits(1000);
  std::vector<std::pair<int64_t, int64_t>> chunks(3, {-1, -1});
  std::atomic<int> calls{0};
  parallel_for(1000, 100, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      hits[static_cast<size_t>(i)]++;
    chunks[static_cast<size_t>(calls++)] = {begin, end};
  });
  for (const auto& h : hits)
    EXPECT_EQ(h.load(), 1);
  EXPECT_EQ(calls.load(), 3);
  std::sort(chunks.begin(), chunks.end());
  using Range = std::pair<int64_t, int64_t>;
  EXPECT_EQ(chunks, (std::vector<Range>{{0, 333}, {333, 666}, {666, 1000}}));
  // Below the grain: one chunk, on the caller.
  calls = 0;
  parallel_for(50, 100, [&](int64_t, int64_t) { calls++; });
  EXPECT_EQ(calls.load(), 1);
}

// Jobs back to back with 1 to 4 chunks on 4 threads, so that workers without a chunk in
// one job race the next job's posting (Note [Spinning workers]): every index once, always.
TEST(ThreadPool, ManyShortJobsBackToBack) {
  ThreadsGuard restore;
  set_num_threads(4);
  std::vector<int> hits(4);
  for (int job = 0; job < 20000; ++job) {
    const int64_t n = 1 + job % 4;
    std::fill(hits.begin(), hits.end(), 0);
    parallel_for(n, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i)
        hits[static_cast<size_t>(i)]++;
    });
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(hits[static_cast<size_t>(i)], 1) << "job " << job << ", index " << i;
  }
}

TEST(ThreadPool, ErrorsReachTheCallerAndBadCountsAreRefused) {
  ThreadsGuard restore;
  set_num_threads(2);
  EXPECT_THROW(parallel_for(100, 1,
                            [](int64_t begin, int64_t) {
                              if (begin > 0) throw Error("chunk failed");
                            }),
               Error);
  int after = 0;
  parallel_for(10, 1, [&](int64_t, int64_t) { after = 1; });  // the pool still works
  EXPECT_EQ(after, 1);
  EXPECT_THROW(set_num_threads(0), Error);
}

// AdamW and SGD over 300k elements: 1 thread and 4 give identical parameters and state.
std::vector<float> steps_with(int threads, bool adamw) {
  set_num_threads(threads);
  std::vector<float> init(300000), grad(300000);
  for (size_t i = 0; i < init.size(); ++i) {
    init[i] = 0.001f * static_cast<float>(i % 997) - 0.3f;
    grad[i] = 0.01f * static_cast<float>((i * 7919) % 1009) - 5.0f;
  }
  Tensor p = Tensor::from_vector(init, {300000}).set_requires_grad(true);
  std::unique_ptr<optim::Optimizer> opt;
  if (adamw)
    opt = std::make_unique<optim::AdamW>(std::vector<Tensor>{p}, optim::AdamWOptions{.lr = 1e-2});
  else
    opt = std::make_unique<optim::SGD>(
        std::vector<Tensor>{p}, optim::SGDOptions{.lr = 0.1, .momentum = 0.9, .nesterov = true});
  for (int step = 0; step < 3; ++step) {
    p.set_grad(Tensor::from_vector(grad, {300000}));
    opt->step();
  }
  std::vector<float> out = p.to_vector<float>();
  for (const Tensor& s : opt->state_tensors(p)) {
    std::vector<float> v = s.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(ThreadPool, OptimizerStepsAreBitwiseTheSameOnAnyThreadCount) {
  ThreadsGuard restore;
  for (bool adamw : {true, false}) {
    const std::vector<float> one = steps_with(1, adamw);
    const std::vector<float> four = steps_with(4, adamw);
    ASSERT_EQ(one.size(), four.size());
    EXPECT_EQ(std::memcmp(one.data(), four.data(), one.size() * sizeof(float)), 0)
        << (adamw ? "AdamW" : "SGD");
  }
}

// The exact sum of squares (gradient norms) split over threads: the same words on any count.
TEST(ThreadPool, ExactSquareSumIsTheSameOnAnyThreadCount) {
  ThreadsGuard restore;
  std::vector<float> x(300001);
  for (size_t i = 0; i < x.size(); ++i)
    x[i] = 1e-3f * static_cast<float>((i * 7919) % 2003) - 1.0f;
  std::vector<std::array<int64_t, kernels::cpu::ExactSquareSum::kWords>> words;
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    kernels::cpu::ExactSquareSum sum;
    sum.add_squares(x.data(), static_cast<int64_t>(x.size()));
    words.push_back(sum.words());
  }
  EXPECT_EQ(words[0], words[1]);
  EXPECT_EQ(words[0], words[2]);
}

// The sum is exact whatever the length's remainder after the kernel's interleaved sets of
// buckets: 0^2 + 1^2 + ... + (n-1)^2 = (n-1) n (2n-1) / 6, below 2^53 here, so a double holds
// it exactly; any split of the vector, merged, gives the same words.
TEST(ThreadPool, ExactSquareSumIsTheClosedFormForAnyLength) {
  ThreadsGuard restore;
  set_num_threads(1);
  for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{4}, int64_t{5}, int64_t{65537},
                    int64_t{100003}}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i)
      x[static_cast<size_t>(i)] = static_cast<float>(i);
    kernels::cpu::ExactSquareSum whole, first, second;
    whole.add_squares(x.data(), n);
    EXPECT_EQ(whole.value(), static_cast<double>((n - 1) * n * (2 * n - 1) / 6)) << n;
    first.add_squares(x.data(), n / 3);
    second.add_squares(x.data() + n / 3, n - n / 3);
    first.merge(second);
    EXPECT_EQ(first.words(), whole.words()) << n;
  }
}

// Causal attention with grouped key/value heads over several key tiles (kernels/cpu/
// attention.cpp: 64-row query tiles, 256-column key tiles): output and gradients the same bits
// on 1, 2 and 3 threads, although the backward's dK and dV sum over a group of query heads.
std::vector<float> attention_with(int threads) {
  set_num_threads(threads);
  Generator gen(5);
  auto random = [&](const Shape& shape) {
    Tensor t = Tensor::empty(shape);
    normal_(t, 0.0, 1.0, gen);
    return t;
  };
  Tensor q = random({2, 4, 300, 16}).set_requires_grad(true);
  Tensor k = random({2, 2, 300, 16}).set_requires_grad(true);
  Tensor v = random({2, 2, 300, 16}).set_requires_grad(true);
  Tensor out = causal_attention(q, k, v);
  sum(mul(out, random(out.shape()))).backward();
  std::vector<float> all = out.contiguous().to_vector<float>();
  for (const Tensor& t : {q.grad(), k.grad(), v.grad()}) {
    const std::vector<float> g = t.contiguous().to_vector<float>();
    all.insert(all.end(), g.begin(), g.end());
  }
  return all;
}

// run(threads) on 2 and 3 threads gives the bits it gives on 1.
void expect_the_same_bits_on_any_thread_count(const std::function<std::vector<float>(int)>& run) {
  ThreadsGuard restore;
  const std::vector<float> one = run(1);
  for (int threads : {2, 3}) {
    const std::vector<float> more = run(threads);
    ASSERT_EQ(one.size(), more.size());
    EXPECT_EQ(std::memcmp(one.data(), more.data(), one.size() * sizeof(float)), 0)
        << threads << " threads";
  }
}

TEST(ThreadPool, GroupedAttentionIsBitwiseTheSameOnAnyThreadCount) {
  expect_the_same_bits_on_any_thread_count(attention_with);
}

// The classifier's loss and gradients over a vocabulary wide enough for several chunks of
// rows (Note [The classifier without its logits]).
std::vector<float> linear_cross_entropy_with(int threads) {
  set_num_threads(threads);
  const int64_t rows = 600, width = 32, vocab = 30000;  // two chunks of 300 rows
  Generator gen(5);
  Tensor x = Tensor::empty({rows, width}, DType::F32);
  Tensor w = Tensor::empty({vocab, width}, DType::F32);
  uniform_(x, -1.0, 1.0, gen);
  uniform_(w, -1.0, 1.0, gen);
  x.set_requires_grad(true);
  w.set_requires_grad(true);
  std::vector<int64_t> picks;
  for (int64_t r = 0; r < rows; ++r)
    picks.push_back((r * 2654435761) % vocab);
  Tensor loss = linear_cross_entropy(x, w, Tensor::from_vector(picks, {rows}));
  loss.backward();
  std::vector<float> out{static_cast<float>(loss.item())};
  for (const Tensor& t : {x.grad(), w.grad()}) {
    const std::vector<float> v = t.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(ThreadPool, LinearCrossEntropyIsBitwiseTheSameOnAnyThreadCount) {
  expect_the_same_bits_on_any_thread_count(linear_cross_entropy_with);
}

// The fused bias + GELU and residual + layer norm on rows wide enough to split by columns
// and by rows (Notes [Bias and GELU in one pass]; kernels/cpu/layer_norm.h).
std::vector<float> fused_ops_with(int threads) {
  set_num_threads(threads);
  const int64_t rows = 64, width = 1024;
  Generator gen(7);
  auto leaf = [&](const Shape& shape) {
    Tensor t = Tensor::empty(shape, DType::F32);
    uniform_(t, -2.0, 2.0, gen);
    return t.set_requires_grad(true);
  };
  Tensor x = leaf({rows, width}), r = leaf({rows, width}), b = leaf({width}), w = leaf({width});
  AddNorm h = add_layer_norm(x, r, w, b);
  Tensor y = bias_gelu(h.normed, b);
  sum(add(mul(y, y), h.sum)).backward();
  std::vector<float> out;
  for (const Tensor& t : {y, h.sum, x.grad(), r.grad(), b.grad(), w.grad()}) {
    const std::vector<float> v = t.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(ThreadPool, FusedBiasGeluAndAddLayerNormAreBitwiseTheSameOnAnyThreadCount) {
  expect_the_same_bits_on_any_thread_count(fused_ops_with);
}

// Two training steps of a GPT large enough that every kernel splits its work (GEMM blocks,
// attention heads, rows, columns; kernels/cpu/thread_pool.h): 1, 2 and 3 threads give the
// same loss and weights, bit for bit.
std::vector<float> gpt_steps_with(int threads) {
  set_num_threads(threads);
  nn::GPTConfig config{
      .vocab_size = 96, .context = 64, .layers = 2, .heads = 4, .embd = 64, .options = {}};
  nn::GPT model(config, 3);
  optim::AdamW optimizer(model.parameters(), {.lr = 1e-2});
  std::vector<int64_t> tokens(8 * 64), targets(8 * 64);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int64_t>((i * 31 + 7) % 96);
    targets[i] = static_cast<int64_t>((i * 17 + 3) % 96);
  }
  std::vector<float> out;
  for (int step = 0; step < 2; ++step) {
    Tensor loss = model.loss(Tensor::from_vector(tokens, {8, 64}), Tensor::from_vector(targets, {8, 64}));
    out.push_back(static_cast<float>(loss.item()));
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
  }
  for (const Tensor& p : model.parameters()) {
    const std::vector<float> v = p.to_vector<float>();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

TEST(ThreadPool, TrainingStepsAreBitwiseTheSameOnAnyThreadCount) {
  expect_the_same_bits_on_any_thread_count(gpt_steps_with);
}

}  // namespace
}  // namespace loom
