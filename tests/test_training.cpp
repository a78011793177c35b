// train_gpt's pieces: the data order, checkpoints of the model, and a short run whose loss falls.

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "data/default_corpus.h"
#include "data/token_blocks.h"
#include "nn/gpt_io.h"
#include "tools/train_gpt/trainer.h"

namespace loom::train_gpt {
namespace {

using data::Batch;
using data::default_corpus;
using data::synthetic_tokens;
using data::TokenBlocks;

std::vector<uint8_t> counting_bytes(size_t n) {
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i)
    bytes[i] = static_cast<uint8_t>(i % 251);
  return bytes;
}

TEST(DataOrder, BlocksFollowTheDocumentedFormula) {
  // N = 50 tokens, B = 2, T = 4: nblocks = floor(49 / 8) = 6.
  TokenBlocks data(counting_bytes(50), 2, 4, 256);
  EXPECT_EQ(data.block_count(), 6);
  // Step 3 of rank 1 in a world of 4 reads block 13, which wraps to block 1: start s = 8.
  EXPECT_EQ(data.block_index(3, 1, 4), 13 % 6);
  Batch b = data.for_step(3, 1, 4);
  EXPECT_EQ(b.tokens.shape(), Shape({2, 4}));
  EXPECT_EQ(b.tokens.to_vector<int64_t>(), std::vector<int64_t>({8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(b.targets.to_vector<int64_t>(), std::vector<int64_t>({9, 10, 11, 12, 13, 14, 15, 16}));
  // The last block's targets end exactly at token 48 (s + B*T + 1 <= N).
  EXPECT_EQ(data.block(5).targets.to_vector<int64_t>().back(), 48);
}

TEST(DataOrder, ShuffleVisitsEveryBlockOncePerEpoch) {
  TokenBlocks data(counting_bytes(8 * 10 + 1), 2, 4, 256, /*shuffle=*/true, 7);
  std::vector<int64_t> seen;
  for (int64_t step = 0; step < 10; ++step)
    seen.push_back(data.block_index(step, 0, 1));
  std::vector<int64_t> sorted = seen;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 10; ++i)
    EXPECT_EQ(sorted[i], i);
  EXPECT_NE(seen, sorted);  // a permutation, not the identity (for this seed)
}

TEST(DataOrder, ClearErrorsForUnusableData) {
  EXPECT_THROW(TokenBlocks(counting_bytes(8), 2, 4, 256), Error);  // fewer than B*T+1 tokens
  try {
    TokenBlocks(counting_bytes(100), 2, 4, 50);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary of 50"), std::string::npos);
  }
}

TEST(DataOrder, SyntheticTokensCoverTheVocabularyReproducibly) {
  std::vector<int32_t> tokens = synthetic_tokens(20000, 50304, 3);
  EXPECT_EQ(tokens, synthetic_tokens(20000, 50304, 3));
  EXPECT_NE(tokens, synthetic_tokens(20000, 50304, 4));
  auto [low, high] = std::minmax_element(tokens.begin(), tokens.end());
  EXPECT_GE(*low, 0);
  EXPECT_LT(*high, 50304);
  EXPECT_GT(*high, 50000);  // ids above a byte's range occur
  TokenBlocks data(tokens, 4, 1024, 50304);
  EXPECT_EQ(data.block_count(), 4);
  Batch batch = data.block(1);
  EXPECT_EQ(batch.tokens.to_vector<int64_t>()[0], tokens[4096]);
  EXPECT_EQ(batch.targets.to_vector<int64_t>()[0], tokens[4097]);
  EXPECT_THROW(TokenBlocks(std::vector<int32_t>(100, -1), 2, 4, 50), Error);
}

// The built-in corpus is the same bytes whatever compiler built Loom: its draws come in a
// fixed order (a GCC and a clang build once differed from the second sentence on, where C++
// left two draws unsequenced). The digest is FNV-1a 64 of the default 1 MiB.
TEST(DefaultCorpus, IsTheSameBytesWhateverTheCompiler) {
  std::vector<uint8_t> text = default_corpus();
  ASSERT_EQ(text.size(), size_t{1} << 20);
  const std::string start(text.begin(), text.begin() + 120);
  EXPECT_EQ(start,
            "The shuttle folds the red thread in the market while the weaver remembers seven "
            "spools by the window. The old loom count");
  uint64_t digest = 14695981039346656037ull;
  for (uint8_t byte : text)
    digest = (digest ^ byte) * 1099511628211ull;
  EXPECT_EQ(digest, 0x7949f6164d831bb7ull);
  std::vector<uint8_t> shorter = default_corpus(1000);
  EXPECT_TRUE(std::equal(shorter.begin(), shorter.end(), text.begin()));  // a prefix
}

nn::GPTConfig small_config() {
  nn::GPTConfig c;
  c.vocab_size = 256;
  c.context = 32;
  c.layers = 2;
  c.heads = 2;
  c.embd = 32;
  return c;
}

TEST(Training, LossFallsOnTheDefaultCorpus) {
  TrainOptions o;
  o.model = small_config();
  o.batch = 4;
  o.steps = 80;
  o.lr = 3e-3;
  nn::GPT model(o.model, 0);
  TokenBlocks data(default_corpus(1 << 16), o.batch, o.model.context, o.model.vocab_size);
  std::vector<double> losses;
  train(model, data, o, [&](const StepMetrics& m) {
    EXPECT_EQ(m.step, static_cast<int64_t>(losses.size()));
    EXPECT_GT(m.tokens_per_s, 0);
    losses.push_back(m.loss);
  });
  ASSERT_EQ(losses.size(), 80u);
  EXPECT_NEAR(losses.front(), std::log(256.0), 0.3);
  double tail = 0;
  for (size_t i = 70; i < 80; ++i)
    tail += losses[i] / 10;
  EXPECT_LT(tail, 3.0) << "first loss " << losses.front();
}

TEST(Training, SameSeedSameLosses) {
  TrainOptions o;
  o.model = small_config();
  o.model.layers = 1;
  o.batch = 2;
  o.steps = 5;
  TokenBlocks data(default_corpus(1 << 14), o.batch, o.model.context, o.model.vocab_size);
  std::vector<double> a, b;
  nn::GPT m1(o.model, 3), m2(o.model, 3);
  train(m1, data, o, [&](const StepMetrics& m) { a.push_back(m.loss); });
  train(m2, data, o, [&](const StepMetrics& m) { b.push_back(m.loss); });
  EXPECT_EQ(a, b);
}

TEST(Training, MetricsLineHasTheDocumentedFields) {
  strategies::MemoryReport memory;
  memory.peak_bytes = 4096;
  memory.peak_by_kind = {1000, 2000, 3000, 4000, 5000, 6000};
  std::string line = metrics_json_line({.step = 0,
                                        .loss = 2.5,
                                        .lr = 1e-3,
                                        .grad_norm = 0.75,
                                        .ms_per_step = 4,
                                        .tokens_per_s = 256000,
                                        .memory = memory,
                                        .val_loss = std::nullopt});
  EXPECT_EQ(line, R"({"grad_norm":0.75,"loss":2.5,"lr":0.001,"ms_per_step":4.0,"peak_bytes":4096,)"
                  R"("peak_bytes_by_kind":{"activations":1000,"communication":5000,)"
                  R"("gradients":3000,"offloaded":6000,"optimizer_state":4000,"parameters":2000},)"
                  R"("step":0,"tokens_per_s":256000.0})");
  // After an evaluation (--eval-every), the validation loss too.
  const std::string evaluated = metrics_json_line({.step = 3,
                                                   .loss = 2.5,
                                                   .lr = 1e-3,
                                                   .grad_norm = 0.75,
                                                   .ms_per_step = 4,
                                                   .tokens_per_s = 256000,
                                                   .memory = memory,
                                                   .val_loss = 3.25});
  EXPECT_NE(evaluated.find(R"("val_loss":3.25)"), std::string::npos) << evaluated;
}

TEST(GptCheckpoint, SaveAndLoadRoundTripsExactly) {
  nn::GPT model(small_config(), 11);
  auto path = std::filesystem::temp_directory_path() / "loom_test_gpt_roundtrip.safetensors";
  nn::save_gpt(path, model);
  safetensors::Contents contents = safetensors::load(path);
  std::filesystem::remove(path);
  nn::GPTConfig config = nn::gpt_config_from_checkpoint(contents, /*heads_if_unknown=*/1);
  EXPECT_EQ(config.layers, 2);
  EXPECT_EQ(config.heads, 2);  // from the loom.heads metadata
  EXPECT_EQ(config.embd, 32);
  EXPECT_EQ(config.context, 32);
  nn::GPT restored(config, 99);
  restored.load_state_dict(nn::gpt_state_from_checkpoint(contents));
  Tensor tokens = Tensor::from_vector<int64_t>({1, 2, 3, 4}, {1, 4});
  EXPECT_EQ(model.forward(tokens).to_vector<float>(), restored.forward(tokens).to_vector<float>());
}

TEST(GptCheckpoint, HuggingFaceExtrasAreIgnored) {
  nn::GPT model(small_config(), 0);
  safetensors::Contents contents;
  for (auto& [name, t] : model.state_dict())
    contents.tensors.emplace("transformer." + name, t);
  contents.tensors.emplace("lm_head.weight", model.state_dict().at("wte.weight"));
  contents.tensors.emplace("transformer.h.0.attn.bias", Tensor::ones({1, 1, 32, 32}));
  nn::StateDict state = nn::gpt_state_from_checkpoint(contents);
  EXPECT_EQ(state.size(), model.state_dict().size());
  EXPECT_NO_THROW(model.load_state_dict(state));
  EXPECT_EQ(nn::gpt_config_from_checkpoint(contents, 4).heads, 4);
}

}  // namespace
}  // namespace loom::train_gpt
