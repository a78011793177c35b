// Sets of token files (data/token_source.h) and TokenBlocks reading them: the same batches as
// the same tokens in memory, bit for bit, across shard boundaries; globs, mixed formats, and
// token ids past the vocabulary found when their block is read.

#include "data/token_source.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "data/token_blocks.h"
#include "test_support.h"
#include "token_file_fixtures.h"

namespace {

namespace fs = std::filesystem;
using loom::data::Batch;
using loom::data::InMemoryTokens;
using loom::data::name;
using loom::data::ShardedTokens;
using loom::data::ShardFormat;
using loom::data::synthetic_tokens;
using loom::data::TokenBlocks;
using loom::data::write_token_shard;
using loom::testing::error_of;

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << text

class ShardSets : public ::testing::Test {
 protected:
  fs::path file(const std::string& name) const { return dir_.path() / name; }
  std::string pattern(const std::string& glob) const { return (dir_.path() / glob).string(); }
  // `tokens` cut into shards of the given sizes, written as `prefix`000.bin, 001, ...
  void write_shards(const std::string& prefix, const std::vector<int32_t>& tokens,
                    const std::vector<size_t>& sizes, ShardFormat format) const {
    size_t at = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::vector<uint32_t> part(tokens.begin() + at, tokens.begin() + at + sizes[i]);
      char name[32];
      std::snprintf(name, sizeof name, "%03zu.bin", i);
      write_token_shard(file(prefix + name), part, format);
      at += sizes[i];
    }
    ASSERT_EQ(at, tokens.size());
  }
  loom::testing::TempDir dir_{"loom-shard-sets"};
};

void expect_same_batches(const TokenBlocks& from_files, const TokenBlocks& in_memory) {
  ASSERT_EQ(from_files.block_count(), in_memory.block_count());
  for (int64_t step = 0; step < 2 * in_memory.block_count(); ++step) {
    for (int64_t rank = 0; rank < 2; ++rank) {
      SCOPED_TRACE("step " + std::to_string(step) + ", rank " + std::to_string(rank));
      ASSERT_EQ(from_files.block_index(step, rank, 2), in_memory.block_index(step, rank, 2));
      const Batch a = from_files.for_step(step, rank, 2);
      const Batch b = in_memory.for_step(step, rank, 2);
      ASSERT_EQ(a.tokens.shape(), b.tokens.shape());
      ASSERT_EQ(a.tokens.to_vector<int64_t>(), b.tokens.to_vector<int64_t>());
      ASSERT_EQ(a.targets.to_vector<int64_t>(), b.targets.to_vector<int64_t>());
    }
  }
}

TEST_F(ShardSets, GlobOfThreeShardsGivesTheBatchesOfTheSameTokensInMemory) {
  struct Case {
    ShardFormat format;
    int64_t vocab;
  };
  for (const Case& c : {Case{ShardFormat::kLlmcGpt2, 50257}, Case{ShardFormat::kLlmcLlama3, 128256},
                        Case{ShardFormat::kRawU16, 50304}}) {
    SCOPED_TRACE(name(c.format));
    const std::string prefix = "train_" + std::string(name(c.format)) + "_";
    // 116 tokens in shards of 37, 50 and 29: with B*T = 16 the 7 blocks cross both boundaries.
    const std::vector<int32_t> tokens = synthetic_tokens(116, c.vocab, 11);
    write_shards(prefix, tokens, {37, 50, 29}, c.format);
    const std::optional<ShardFormat> format =
        c.format == ShardFormat::kRawU16 ? std::optional(c.format) : std::nullopt;
    auto files = std::make_shared<const ShardedTokens>(
        ShardedTokens::open(pattern(prefix + "*.bin"), format));
    ASSERT_EQ(files->shards().size(), 3u);
    EXPECT_EQ(files->format(), c.format);
    EXPECT_EQ(files->size(), 116);
    for (bool shuffle : {false, true}) {
      const TokenBlocks from_files(files, 2, 8, c.vocab, shuffle, 5);
      const TokenBlocks in_memory(tokens, 2, 8, c.vocab, shuffle, 5);
      EXPECT_EQ(from_files.block_count(), 7);
      expect_same_batches(from_files, in_memory);
    }
  }
}

TEST_F(ShardSets, ReadsCrossShardBoundariesAndSayWhereATokenIs) {
  std::vector<int32_t> tokens(30);
  std::iota(tokens.begin(), tokens.end(), 100);
  write_shards("part_", tokens, {10, 1, 19}, ShardFormat::kLlmcGpt2);
  const ShardedTokens files = ShardedTokens::open(pattern("part_*.bin"), std::nullopt);
  std::vector<int64_t> all(30);
  files.copy(0, 30, all.data());
  EXPECT_EQ(all, std::vector<int64_t>(tokens.begin(), tokens.end()));
  for (int64_t start = 0; start <= 30; ++start) {
    for (int64_t count = 0; start + count <= 30; ++count) {
      std::vector<int64_t> part(static_cast<size_t>(count));
      files.copy(start, count, part.data());
      ASSERT_EQ(part, std::vector<int64_t>(all.begin() + start, all.begin() + start + count));
    }
  }
  EXPECT_EQ(files.describe(0), "shard " + file("part_000.bin").string() + ", token 0");
  EXPECT_EQ(files.describe(10), "shard " + file("part_001.bin").string() + ", token 0");
  EXPECT_EQ(files.describe(29), "shard " + file("part_002.bin").string() + ", token 18");
  EXPECT_CONTAINS(error_of([&] { files.copy(25, 6, all.data()); }),
                  "tokens [25, 25 + 6) asked for; the token files hold 30");
}

TEST_F(ShardSets, MatchesAreReadInNameOrderAndAPlainPathIsOneFile) {
  write_token_shard(file("s_b.bin"), std::vector<uint32_t>{2}, ShardFormat::kLlmcGpt2);
  write_token_shard(file("s_a.bin"), std::vector<uint32_t>{1}, ShardFormat::kLlmcGpt2);
  write_token_shard(file("s_c.bin"), std::vector<uint32_t>{3}, ShardFormat::kLlmcGpt2);
  write_token_shard(file("val.bin"), std::vector<uint32_t>{9}, ShardFormat::kLlmcGpt2);
  for (const char* glob : {"s_*.bin", "s_?.bin", "s_[abc].bin"}) {
    const ShardedTokens files = ShardedTokens::open(pattern(glob), std::nullopt);
    std::vector<int64_t> all(3);
    files.copy(0, 3, all.data());
    EXPECT_EQ(all, (std::vector<int64_t>{1, 2, 3})) << glob;
  }
  const ShardedTokens one = ShardedTokens::open(file("val.bin").string(), std::nullopt);
  EXPECT_EQ(one.size(), 1);
  EXPECT_CONTAINS(error_of([&] { ShardedTokens::open(file("nope.bin").string(), std::nullopt); }),
                  "nope.bin: cannot open for reading: No such file or directory");
}

TEST_F(ShardSets, GlobMatchingNothingIsRefusedNamingIt) {
  const std::string glob = pattern("fineweb_train_*.bin");
  EXPECT_CONTAINS(error_of([&] { ShardedTokens::open(glob, std::nullopt); }),
                  "[data] the pattern '" + glob + "' matches no file");
}

TEST_F(ShardSets, MixedFormatsAreRefused) {
  write_token_shard(file("mix_0.bin"), std::vector<uint32_t>{1, 2}, ShardFormat::kLlmcGpt2);
  write_token_shard(file("mix_1.bin"), std::vector<uint32_t>{3, 4}, ShardFormat::kLlmcLlama3);
  EXPECT_CONTAINS(
      error_of([&] { ShardedTokens::open(pattern("mix_*.bin"), std::nullopt); }),
      "token files of different formats in one data set: " + file("mix_0.bin").string() +
          " is llmc-gpt2 but " + file("mix_1.bin").string() + " is llmc-llama3");
  // Named, the format is every file's: the llama3 file is refused by its magic.
  EXPECT_CONTAINS(
      error_of([&] { ShardedTokens::open(pattern("mix_*.bin"), ShardFormat::kLlmcGpt2); }),
      "mix_1.bin: header magic 20240801 is llmc-llama3's");
  EXPECT_CONTAINS(error_of([] { ShardedTokens(std::vector<loom::data::TokenShard>{}); }),
                  "no token files given");
}

// A token id past the vocabulary is found when its block is read, not when the files are
// opened, and the message names the file and the token's index in it.
TEST_F(ShardSets, TokenPastTheVocabularyIsNamedWhenItsBlockIsRead) {
  std::vector<int32_t> tokens = synthetic_tokens(3 * 40, 50257, 3);
  tokens[40 + 21] = 60000;  // in shard 001, index 21: block 3 (tokens 48..63 of B*T = 16)
  tokens[112] = 50257;      // shard 002 index 32: only a target, the last of block 6
  write_shards("vocab_", tokens, {40, 40, 40}, ShardFormat::kLlmcGpt2);
  auto files = std::make_shared<const ShardedTokens>(
      ShardedTokens::open(pattern("vocab_*.bin"), std::nullopt));
  const TokenBlocks blocks(files, 2, 8, 50257);  // opens without scanning
  EXPECT_NO_THROW(blocks.block(0));
  EXPECT_NO_THROW(blocks.block(1));
  EXPECT_NO_THROW(blocks.block(2));
  EXPECT_EQ(error_of([&] { blocks.block(3); }),
            "[data] shard " + file("vocab_001.bin").string() +
                ", token 21: token id 60000 is outside the vocabulary of 50257; expected ids below "
                "--vocab (the tokenizer's vocabulary size or more)");
  EXPECT_NO_THROW(blocks.block(5));
  EXPECT_CONTAINS(error_of([&] { blocks.block(6); }), "shard " + file("vocab_002.bin").string() +
                                                          ", token 32: token id 50257 is outside");
  // In memory the same tokens are refused at once, as before.
  EXPECT_CONTAINS(error_of([&] { TokenBlocks(tokens, 2, 8, 50257); }),
                  "[train_gpt] token 60000 at offset 61 is outside the vocabulary of 50257");
  // In memory behind a source, they are checked as blocks are read, naming the offset.
  const TokenBlocks lazy(std::make_shared<const InMemoryTokens>(tokens), 2, 8, 50257);
  EXPECT_CONTAINS(error_of([&] { lazy.block(3); }),
                  "offset 61 of the in-memory tokens: token id 60000 is outside the vocabulary");
}

TEST_F(ShardSets, TooFewTokensForABlockIsRefusedAtConstruction) {
  write_token_shard(file("short.bin"), std::vector<uint32_t>(16, 1), ShardFormat::kLlmcGpt2);
  auto files = std::make_shared<const ShardedTokens>(
      ShardedTokens::open(file("short.bin").string(), std::nullopt));
  EXPECT_CONTAINS(error_of([&] { TokenBlocks(files, 2, 8, 50257); }),
                  "the data holds 16 tokens; one block of batch 2 x context 8 needs at least 17");
  EXPECT_CONTAINS(error_of([] { TokenBlocks(std::shared_ptr<const InMemoryTokens>(), 2, 8, 256); }),
                  "no token source given");
}

}  // namespace
