#pragma once
// Shared by the strategy tests: a tiny GPT, a corpus folded into its vocabulary, and a short
// train_gpt run whose final weights are compared across strategies.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "data/default_corpus.h"
#include "multiprocess.h"
#include "nn/gpt.h"
#include "strategies/registry.h"
#include "tools/train_gpt/trainer.h"

namespace loom::strategies::testing {

inline constexpr int64_t kTinyVocab = 64;
inline constexpr int64_t kTinyContext = 8;

inline nn::GPTConfig tiny_gpt_config(DType dtype = DType::F64) {
  nn::GPTConfig c;
  c.vocab_size = kTinyVocab;
  c.context = kTinyContext;
  c.layers = 2;
  c.heads = 2;
  c.embd = 16;
  c.options.dtype = dtype;
  return c;
}

// The built-in corpus with every byte folded into the tiny vocabulary.
inline std::vector<uint8_t> tiny_corpus(size_t bytes = 1 << 14) {
  std::vector<uint8_t> data = data::default_corpus(bytes);
  for (uint8_t& b : data)
    b %= kTinyVocab;
  return data;
}

// Every parameter of `model`, flattened in registration order.
inline std::vector<double> flat_parameters(const nn::Module& model) {
  std::vector<double> all;
  for (const Tensor& p : model.parameters()) {
    std::vector<double> v = p.to_vector<double>();
    all.insert(all.end(), v.begin(), v.end());
  }
  return all;
}

// Three train_gpt steps (f64, lr 1e-2, no clipping) under `strategy` (null: single_device)
// with `batch` rows per rank and `accum` micro-batches per step; returns the final weights.
inline std::vector<double> train_tiny(Strategy* strategy, int64_t batch, int64_t accum = 1) {
  nn::GPTConfig c = tiny_gpt_config();
  nn::GPT model(c, 4);
  train_gpt::TrainOptions o;
  o.model = c;
  o.batch = batch;
  o.steps = 3;
  o.grad_accum = accum;
  o.lr = 1e-2;
  o.grad_clip = 0;
  data::TokenBlocks data(tiny_corpus(), batch, kTinyContext, kTinyVocab);
  train_gpt::train(
      model, data, o, [](const train_gpt::StepMetrics&) {}, strategy);
  return flat_parameters(model);
}

// Per parameter, its final f32 values.
using Weights = std::vector<std::vector<float>>;

// The f32 tiny GPT trained by train_gpt (lr 1e-2, clipping at 0.05) for `steps` steps of
// `batch` rows per replica in `accum` micro-batches under `strategy` (null: single_device);
// its final weights, whole (train() gathers split models at the end).
inline Weights train_tiny_f32(Strategy* strategy, int64_t batch, int64_t accum, int64_t steps,
                              double grad_clip = 0.05) {
  nn::GPTConfig c = tiny_gpt_config(DType::F32);
  nn::GPT model(c, 4);
  train_gpt::TrainOptions o;
  o.model = c;
  o.batch = batch;
  o.steps = steps;
  o.grad_accum = accum;
  o.lr = 1e-2;
  o.grad_clip = grad_clip;
  data::TokenBlocks data(tiny_corpus(), batch, kTinyContext, kTinyVocab);
  train_gpt::train(model, data, o, [](const train_gpt::StepMetrics&) {}, strategy);
  Weights out;
  for (const Tensor& p : model.parameters())
    out.push_back(p.to_vector<float>());
  return out;
}

inline double max_difference(const Weights& a, const Weights& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t j = 0; j < a[i].size(); ++j)
      worst = std::max(worst, std::abs(static_cast<double>(a[i][j]) - b[i][j]));
  return worst;
}

// Weights through a file: a reference trained by one job of forked ranks, read by another.
inline void write_weights(const std::filesystem::path& path, const Weights& w) {
  std::ofstream out(path, std::ios::binary);
  for (const auto& p : w)
    out.write(reinterpret_cast<const char*>(p.data()),
              static_cast<std::streamsize>(p.size() * sizeof(float)));
}

// What write_weights wrote, in the sizes of `like`; empty when the file holds another count.
inline Weights read_weights(const std::filesystem::path& path, const Weights& like) {
  std::ifstream in(path, std::ios::binary);
  Weights out;
  for (const auto& p : like) {
    out.emplace_back(p.size());
    in.read(reinterpret_cast<char*>(out.back().data()),
            static_cast<std::streamsize>(p.size() * sizeof(float)));
  }
  if (!in || in.peek() != std::char_traits<char>::eof()) return {};
  return out;
}

// The reference for a data-parallel composition (dp 2 x pp, dp 2 x tp): DDP over 2 forked
// ranks, train_tiny_f32(batch, accum, steps), rank 0's weights written to `path`.
inline void write_ddp_reference(const std::filesystem::path& path, int64_t batch, int64_t accum,
                                int64_t steps) {
  comm::testing::expect_all_ok(comm::testing::run_ranks(
      2, [&](int rank, int size, std::shared_ptr<comm::Store> store) {
        auto ddp = StrategyRegistry::create("ddp");
        dynamic_cast<ParallelStrategy&>(*ddp).set_process_group(
            std::make_shared<comm::ProcessGroup>(
                rank, size, store, comm::GroupOptions{.timeout = std::chrono::seconds(30)},
                "ddp-reference"));
        ddp->setup_environment();
        const Weights w = train_tiny_f32(ddp.get(), batch, accum, steps);
        ddp->teardown();
        if (rank == 0) write_weights(path, w);
      }));
}

// How far weights trained by strategies that split the GEMMs differently (tensor and sequence
// parallelism against one device or DDP) may drift apart by rounding alone in
// train_tiny_f32's 3 AdamW steps (lr 1e-2): Adam divides each gradient by its own magnitude,
// so rounding-level differences in near-zero gradient elements reach the weights at about
// 1e-5 (measured 2026-12-04: 2.1e-6 without accumulation, 8.5e-6 and 1.06e-5 with it). A
// wrong reduction (a gradient summed twice, a shard missing) moves them by about lr.
inline constexpr double kWithinRounding = 3e-5;

// `w` is within rounding (kWithinRounding) of the weights write_ddp_reference wrote to `path`.
inline void expect_near_reference(const std::filesystem::path& path, const Weights& w, int rank) {
  const Weights reference = read_weights(path, w);
  ASSERT_FALSE(reference.empty()) << "the reference holds another model";
  EXPECT_LE(max_difference(w, reference), kWithinRounding) << "rank " << rank;
}

}  // namespace loom::strategies::testing
