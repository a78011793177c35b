// Generation (nn/generate.h): greedy decoding with the key/value cache gives transformers'
// generate() tokens exactly (tests/data/generation_reference.json, from
// scripts/make_generation_reference.py), the cached forward gives the whole sequence's logits,
// and the samplers keep what they promise.

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "nn/generate.h"
#include "nn/pretrained.h"

#ifndef LOOM_TEST_DATA_DIR
#error "LOOM_TEST_DATA_DIR must name tests/data (set in tests/CMakeLists.txt)"
#endif

namespace loom::nn {
namespace {

const std::filesystem::path kData = LOOM_TEST_DATA_DIR;

SamplingOptions sampling(double temperature, int64_t top_k = 0, double top_p = 1.0,
                         int64_t max_new_tokens = 64) {
  SamplingOptions o;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.max_new_tokens = max_new_tokens;
  return o;
}

std::unique_ptr<CausalLM> load(const std::string& directory) {
  const Pretrained p = load_pretrained(kData / directory, {});
  auto model = p.spec.build(0);
  model->load_state_dict(p.state);
  return model;
}

TEST(Generate, GreedyDecodingGivesTransformersTokens) {
  std::ifstream in(kData / "generation_reference.json");
  const nlohmann::json ref = nlohmann::json::parse(in);
  for (const std::string name : {"llama", "gpt2"}) {
    const auto model = load(name + "_tiny_trained");
    ASSERT_FALSE(ref.at(name).empty());
    for (const auto& c : ref.at(name)) {
      const auto prompt = c.at("prompt").get<std::vector<int64_t>>();
      const auto want = c.at("tokens").get<std::vector<int64_t>>();
      const auto got =
          generate(*model, prompt, sampling(0, 0, 1.0, static_cast<int64_t>(want.size())));
      EXPECT_EQ(got, want) << name << ", prompt of " << prompt.size() << " tokens";
    }
  }
}

// Feeding a sequence through the cache (a prompt, then one token at a time) gives the logits
// of the whole sequence's forward.
TEST(Generate, CachedForwardGivesTheWholeSequencesLogits) {
  for (const std::string name : {"llama_tiny", "gpt2_tiny"}) {
    const auto model = load(name);
    NoGradGuard no_grad;
    const std::vector<int64_t> ids{5, 77, 200, 3, 3, 91, 14, 250, 0, 42};
    const int64_t n = static_cast<int64_t>(ids.size());
    const std::vector<float> whole =
        model->forward(Tensor::from_vector(ids, {1, n})).to_vector<float>();
    KVCache cache;
    std::vector<float> cached = model->forward_cached(
        Tensor::from_vector(std::vector<int64_t>(ids.begin(), ids.begin() + 4), {1, 4}), cache)
        .to_vector<float>();
    for (int64_t t = 4; t < n; ++t) {
      const std::vector<float> row =
          model->forward_cached(Tensor::from_vector(std::vector<int64_t>{ids[t]}, {1, 1}), cache)
              .to_vector<float>();
      cached.insert(cached.end(), row.begin(), row.end());
    }
    EXPECT_EQ(cache.length, n);
    ASSERT_EQ(cached.size(), whole.size());
    for (size_t i = 0; i < whole.size(); ++i)
      ASSERT_NEAR(cached[i], whole[i], 1e-5 * std::max(1.0f, std::abs(whole[i]))) << name << " " << i;
  }
}

TEST(Generate, SamplersKeepWhatTheyPromise) {
  const std::vector<double> logits{1.0, 3.0, 3.0, 2.0, -5.0};
  EXPECT_EQ(choose_token(logits, sampling(0), 0.99), 1);  // the first of equal maxima
  // top-k 2 keeps tokens 1 and 2 (equal): the draw splits them evenly.
  EXPECT_EQ(choose_token(logits, sampling(1, 2), 0.49), 1);
  EXPECT_EQ(choose_token(logits, sampling(1, 2), 0.51), 2);
  // top-p below the largest probability keeps only the first token.
  EXPECT_EQ(choose_token(logits, sampling(1, 0, 0.01), 0.99), 1);
  // A tiny temperature is greedy; a draw of 0 takes the most likely token.
  EXPECT_EQ(choose_token(logits, sampling(1e-3), 0.4), 1);
  EXPECT_EQ(choose_token(logits, sampling(1), 0.0), 1);
  // Token 4's probability at temperature 1 is about 9e-5: only the last sliver of draws.
  EXPECT_EQ(choose_token(logits, sampling(1), 1.0 - 1e-6), 4);
  EXPECT_NE(choose_token(logits, sampling(1), 0.999), 4);
}

TEST(Generate, SamplingIsReproducibleBySeedAndStopsAtTheStopToken) {
  const auto model = load("llama_tiny");
  SamplingOptions options = sampling(1.0, 50, 1.0, 12);
  options.seed = 9;
  const auto a = generate(*model, {1, 2, 3}, options), b = generate(*model, {1, 2, 3}, options);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 12u);
  SamplingOptions stop = options;
  stop.stop_token = a[3];
  const auto c = generate(*model, {1, 2, 3}, stop);
  EXPECT_EQ(c.back(), a[3]);
  EXPECT_LE(c.size(), 4u);
  // Never reading past the context (64): after a 60-token prompt, positions 60-63 take 4
  // generated tokens, whose forwards give a 5th.
  EXPECT_EQ(generate(*model, std::vector<int64_t>(60, 7), sampling(1.0, 0, 1.0, 10)).size(), 5u);
}

TEST(Generate, RefusesBadPromptsAndOptions) {
  const auto model = load("llama_tiny");
  auto error_of = [&](const std::vector<int64_t>& prompt, const SamplingOptions& o) {
    try {
      generate(*model, prompt, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_of({}, sampling(1)).find("the prompt is empty"), std::string::npos);
  EXPECT_NE(error_of({300}, sampling(1)).find("prompt token 300 is outside the vocabulary of 256"),
            std::string::npos);
  EXPECT_NE(error_of(std::vector<int64_t>(64, 1), sampling(1)).find("no room to generate"),
            std::string::npos);
  EXPECT_NE(error_of({1}, sampling(1, 0, 0)).find("0 < top_p <= 1"), std::string::npos);
}

}  // namespace
}  // namespace loom::nn
