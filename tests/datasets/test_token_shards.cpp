// One token file (data/token_shards.h): each format written and read back, llm.c's layout
// checked against a writer restating its Python, and every refusal with its message.

#include "data/token_shards.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdint>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "test_support.h"
#include "token_file_fixtures.h"

namespace {

namespace fs = std::filesystem;
using loom::data::name;
using loom::data::parse_shard_format;
using loom::data::ShardFormat;
using loom::data::TokenShard;
using loom::data::write_token_shard;
using loom::testing::error_of;
using loom::testing::read_bytes;
using loom::testing::write_bytes;
using loom::testing::write_like_llmc;

constexpr int32_t kGpt2Magic = 20240520;
constexpr int32_t kLlama3Magic = 20240801;

// Every test's files in a directory of its own, removed with them at the end.
class TokenShards : public ::testing::Test {
 protected:
  fs::path file(const std::string& name) const { return dir_.path() / name; }
  loom::testing::TempDir dir_{"loom-token-shards"};
};

std::vector<int64_t> all_tokens(const TokenShard& shard) {
  std::vector<int64_t> tokens(static_cast<size_t>(shard.size()));
  shard.copy(0, shard.size(), tokens.data());
  return tokens;
}

std::vector<int64_t> widened(const std::vector<uint32_t>& tokens) {
  return std::vector<int64_t>(tokens.begin(), tokens.end());
}

#define EXPECT_CONTAINS(text, part) \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << text

TEST_F(TokenShards, FormatNamesRoundTrip) {
  for (ShardFormat format :
       {ShardFormat::kLlmcGpt2, ShardFormat::kLlmcLlama3, ShardFormat::kRawU16})
    EXPECT_EQ(parse_shard_format(name(format)), format);
  EXPECT_EQ(name(ShardFormat::kLlmcGpt2), "llmc-gpt2");
  EXPECT_EQ(name(ShardFormat::kLlmcLlama3), "llmc-llama3");
  EXPECT_EQ(name(ShardFormat::kRawU16), "raw-u16");
  const std::string error = error_of([] { parse_shard_format("llmc"); });
  EXPECT_CONTAINS(error, "[data] unknown token file format 'llmc'");
  EXPECT_CONTAINS(error, "expected llmc-gpt2, llmc-llama3 or raw-u16");
}

TEST_F(TokenShards, EachFormatRoundTrips) {
  const std::vector<uint32_t> small = {0, 1, 50256, 65535, 7, 65534, 42};
  const std::vector<uint32_t> large = {0, 65536, 128255, 4294967295u, 1, 100000};
  struct Case {
    ShardFormat format;
    const std::vector<uint32_t>& tokens;
    int64_t bytes;
  };
  for (const Case& c : {Case{ShardFormat::kLlmcGpt2, small, 1024 + 7 * 2},
                        Case{ShardFormat::kLlmcLlama3, large, 1024 + 6 * 4},
                        Case{ShardFormat::kRawU16, small, 7 * 2}}) {
    SCOPED_TRACE(name(c.format));
    const fs::path path = file(std::string(name(c.format)) + ".bin");
    write_token_shard(path, c.tokens, c.format);
    EXPECT_EQ(static_cast<int64_t>(fs::file_size(path)), c.bytes);
    const TokenShard shard = TokenShard::open(path, c.format);
    EXPECT_EQ(shard.format(), c.format);
    EXPECT_EQ(shard.path(), path);
    EXPECT_EQ(shard.size(), static_cast<int64_t>(c.tokens.size()));
    EXPECT_EQ(all_tokens(shard), widened(c.tokens));
    int64_t middle[3] = {};
    shard.copy(2, 3, middle);
    EXPECT_EQ(std::vector<int64_t>(middle, middle + 3),
              widened({c.tokens[2], c.tokens[3], c.tokens[4]}));
    shard.copy(shard.size(), 0, middle);  // an empty read at the end is fine
    EXPECT_CONTAINS(error_of([&] { shard.copy(5, 3, middle); }), "tokens [5, 5 + 3) asked for");
    EXPECT_CONTAINS(error_of([&] { shard.copy(-1, 1, middle); }), "the shard holds");
  }
  EXPECT_EQ(dir_.entries(), 3u);  // no temporary file left by the atomic writes
}

TEST_F(TokenShards, LlmcFormatsAreRecognisedByTheirMagic) {
  write_token_shard(file("gpt2.bin"), std::vector<uint32_t>{1, 2, 3}, ShardFormat::kLlmcGpt2);
  write_token_shard(file("llama3.bin"), std::vector<uint32_t>{70000, 2}, ShardFormat::kLlmcLlama3);
  const TokenShard gpt2 = TokenShard::open(file("gpt2.bin"), std::nullopt);
  EXPECT_EQ(gpt2.format(), ShardFormat::kLlmcGpt2);
  EXPECT_EQ(all_tokens(gpt2), (std::vector<int64_t>{1, 2, 3}));
  const TokenShard llama3 = TokenShard::open(file("llama3.bin"), std::nullopt);
  EXPECT_EQ(llama3.format(), ShardFormat::kLlmcLlama3);
  EXPECT_EQ(all_tokens(llama3), (std::vector<int64_t>{70000, 2}));
}

// The writer against llm.c's own layout (token_file_fixtures.h restates its Python), and the
// reader on files written that way.
TEST_F(TokenShards, LlmcLayoutMatchesItsPythonWriterByteForByte) {
  const std::vector<uint16_t> gpt2 = {50256, 15496, 995, 0, 65535, 13};
  write_like_llmc(file("python_gpt2.bin"), kGpt2Magic, 1, 6, gpt2);
  write_token_shard(file("loom_gpt2.bin"), std::vector<uint32_t>(gpt2.begin(), gpt2.end()),
                    ShardFormat::kLlmcGpt2);
  EXPECT_EQ(read_bytes(file("loom_gpt2.bin")), read_bytes(file("python_gpt2.bin")));
  const TokenShard from_python = TokenShard::open(file("python_gpt2.bin"), std::nullopt);
  EXPECT_EQ(from_python.format(), ShardFormat::kLlmcGpt2);
  EXPECT_EQ(all_tokens(from_python), std::vector<int64_t>(gpt2.begin(), gpt2.end()));

  const std::vector<uint32_t> llama3 = {128000, 9906, 1917, 0, 128001};
  write_like_llmc(file("python_llama3.bin"), kLlama3Magic, 7, 5, llama3);
  write_token_shard(file("loom_llama3.bin"), llama3, ShardFormat::kLlmcLlama3);
  EXPECT_EQ(read_bytes(file("loom_llama3.bin")), read_bytes(file("python_llama3.bin")));
  const TokenShard llama3_shard =
      TokenShard::open(file("python_llama3.bin"), ShardFormat::kLlmcLlama3);
  EXPECT_EQ(all_tokens(llama3_shard), widened(llama3));

  // nanoGPT: np.array(ids, dtype=np.uint16).tofile(f), nothing else.
  loom::testing::write_raw_tokens(file("python_raw.bin"), gpt2);
  write_token_shard(file("loom_raw.bin"), std::vector<uint32_t>(gpt2.begin(), gpt2.end()),
                    ShardFormat::kRawU16);
  EXPECT_EQ(read_bytes(file("loom_raw.bin")), read_bytes(file("python_raw.bin")));
  EXPECT_EQ(all_tokens(TokenShard::open(file("python_raw.bin"), ShardFormat::kRawU16)),
            std::vector<int64_t>(gpt2.begin(), gpt2.end()));
}

TEST_F(TokenShards, MovedShardKeepsItsMapping) {
  write_token_shard(file("a.bin"), std::vector<uint32_t>{5, 6, 7}, ShardFormat::kLlmcGpt2);
  TokenShard first = TokenShard::open(file("a.bin"), std::nullopt);
  TokenShard second = std::move(first);
  EXPECT_EQ(first.size(), 0);  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(all_tokens(second), (std::vector<int64_t>{5, 6, 7}));
  write_token_shard(file("b.bin"), std::vector<uint32_t>{8}, ShardFormat::kLlmcGpt2);
  second = TokenShard::open(file("b.bin"), std::nullopt);  // unmaps a.bin's mapping
  EXPECT_EQ(all_tokens(second), (std::vector<int64_t>{8}));
}

TEST_F(TokenShards, WriterRefusesTokensItCannotStore) {
  const std::vector<uint32_t> tokens = {1, 2, 70000, 3};
  for (ShardFormat format : {ShardFormat::kLlmcGpt2, ShardFormat::kRawU16}) {
    const std::string error = error_of([&] { write_token_shard(file("x.bin"), tokens, format); });
    EXPECT_CONTAINS(error, "token 70000 at index 2 does not fit " + std::string(name(format)));
    EXPECT_CONTAINS(error, "write llmc-llama3 (uint32 tokens) instead");
  }
  EXPECT_CONTAINS(error_of([&] { write_token_shard(file("x.bin"), {}, ShardFormat::kLlmcGpt2); }),
                  "no tokens to write");
  // 2^31 tokens: more than an llm.c header's int32 counts. The range is mapped, not written:
  // the count is refused before any token is read.
  const size_t count = size_t{1} << 31;
  void* range =
      ::mmap(nullptr, count * 4, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  ASSERT_NE(range, MAP_FAILED);
  const std::span<const uint32_t> huge(static_cast<const uint32_t*>(range), count);
  for (ShardFormat format : {ShardFormat::kLlmcGpt2, ShardFormat::kLlmcLlama3}) {
    EXPECT_CONTAINS(error_of([&] { write_token_shard(file("x.bin"), huge, format); }),
                    "2147483648 tokens do not fit the int32 count of an " +
                        std::string(name(format)) + " header");
  }
  ::munmap(range, count * 4);
  EXPECT_EQ(dir_.entries(), 0u);  // nothing written
}

TEST_F(TokenShards, UnknownMagicIsRefusedPointingAtRawU16) {
  // A nanoGPT file: its first two uint16 tokens read as the first int32.
  loom::testing::write_raw_tokens(file("nanogpt.bin"), std::vector<uint16_t>{57, 1, 3, 4});
  const std::string error = error_of([&] { TokenShard::open(file("nanogpt.bin"), std::nullopt); });
  EXPECT_CONTAINS(error, "[data] " + file("nanogpt.bin").string() + ": the first int32 is 65593");
  EXPECT_CONTAINS(error, "not an llm.c magic (20240520 for llmc-gpt2, 20240801 for llmc-llama3)");
  EXPECT_CONTAINS(
      error, "nanoGPT's raw uint16 files have no header: read them with --data-format raw-u16");
  // Named as an llm.c format, the message says that format's magic.
  EXPECT_CONTAINS(
      error_of([&] { TokenShard::open(file("nanogpt.bin"), ShardFormat::kLlmcLlama3); }),
      "the first int32 is 65593, not llmc-llama3's magic 20240801");
  // Read as what it is, it opens.
  EXPECT_EQ(all_tokens(TokenShard::open(file("nanogpt.bin"), ShardFormat::kRawU16)),
            (std::vector<int64_t>{57, 1, 3, 4}));
  // Too short for even the magic.
  write_bytes(file("tiny.bin"), "ab");
  EXPECT_CONTAINS(error_of([&] { TokenShard::open(file("tiny.bin"), std::nullopt); }),
                  "2 bytes, too short for llm.c's 1024-byte header");
}

TEST_F(TokenShards, FormatOtherThanTheNamedOneIsRefused) {
  write_like_llmc(file("llama3.bin"), kLlama3Magic, 7, 2, std::vector<uint32_t>{1, 2});
  EXPECT_CONTAINS(error_of([&] { TokenShard::open(file("llama3.bin"), ShardFormat::kLlmcGpt2); }),
                  "header magic 20240801 is llmc-llama3's; expected llmc-gpt2's 20240520");
}

TEST_F(TokenShards, WrongVersionIsRefused) {
  write_like_llmc(file("v7.bin"), kGpt2Magic, 7, 2, std::vector<uint16_t>{1, 2});
  EXPECT_CONTAINS(error_of([&] { TokenShard::open(file("v7.bin"), std::nullopt); }),
                  "header version 7 with magic 20240520; expected version 1 (llmc-gpt2)");
  write_like_llmc(file("v1.bin"), kLlama3Magic, 1, 2, std::vector<uint32_t>{1, 2});
  EXPECT_CONTAINS(error_of([&] { TokenShard::open(file("v1.bin"), ShardFormat::kLlmcLlama3); }),
                  "header version 1 with magic 20240801; expected version 7 (llmc-llama3)");
}

TEST_F(TokenShards, CountDisagreeingWithTheSizeIsRefused) {
  const std::vector<uint16_t> nine(9, 3);
  write_like_llmc(file("truncated.bin"), kGpt2Magic, 1, 10, nine);
  EXPECT_CONTAINS(error_of([&] { TokenShard::open(file("truncated.bin"), std::nullopt); }),
                  "the header counts 10 tokens but the file holds 9 tokens (18 bytes after the "
                  "1024-byte header, 2 per llmc-gpt2 token); the file is truncated or overlong");
  write_like_llmc(file("overlong.bin"), kLlama3Magic, 7, 10, std::vector<uint32_t>(11, 3));
  EXPECT_CONTAINS(error_of([&] { TokenShard::open(file("overlong.bin"), std::nullopt); }),
                  "the header counts 10 tokens but the file holds 11 tokens (44 bytes");
  write_like_llmc(file("stray.bin"), kLlama3Magic, 7, 2, std::vector<uint16_t>(5, 3));
  EXPECT_CONTAINS(error_of([&] { TokenShard::open(file("stray.bin"), std::nullopt); }),
                  "the header counts 2 tokens but the file holds 2 tokens and 2 stray byte(s)");
  write_like_llmc(file("negative.bin"), kGpt2Magic, 1, -4, nine);
  EXPECT_CONTAINS(error_of([&] { TokenShard::open(file("negative.bin"), std::nullopt); }),
                  "the header counts -4 tokens but the file holds 9 tokens");
  // A header cut short.
  write_bytes(file("half_header.bin"), read_bytes(file("truncated.bin")).substr(0, 512));
  EXPECT_CONTAINS(error_of([&] { TokenShard::open(file("half_header.bin"), std::nullopt); }),
                  "512 bytes, shorter than the 1024-byte header of llmc-gpt2");
}

TEST_F(TokenShards, EmptyShardsAreRefused) {
  write_like_llmc(file("zero.bin"), kGpt2Magic, 1, 0, std::vector<uint16_t>{});
  EXPECT_CONTAINS(error_of([&] { TokenShard::open(file("zero.bin"), std::nullopt); }),
                  "the header counts 0 tokens; expected at least one");
  write_bytes(file("empty.bin"), "");
  for (std::optional<ShardFormat> format :
       {std::optional<ShardFormat>(), std::optional(ShardFormat::kRawU16)}) {
    EXPECT_CONTAINS(
        error_of([&] { TokenShard::open(file("empty.bin"), format); }),
        file("empty.bin").string() + ": the file is empty; expected at least one token");
  }
}

TEST_F(TokenShards, OddSizedRawFileIsRefused) {
  write_bytes(file("odd.bin"), "abcde");
  EXPECT_CONTAINS(error_of([&] { TokenShard::open(file("odd.bin"), ShardFormat::kRawU16); }),
                  "5 bytes, an odd size; a raw-u16 file holds 2-byte tokens");
}

TEST_F(TokenShards, OnlyRegularFilesAreRead) {
  ASSERT_EQ(::mkfifo(file("fifo").c_str(), 0600), 0);
  const auto started = std::chrono::steady_clock::now();
  // Without a writer, a blocking open of a FIFO would never return.
  EXPECT_CONTAINS(error_of([&] { TokenShard::open(file("fifo"), std::nullopt); }),
                  "fifo: is not a regular file (a FIFO, device, socket or directory); expected "
                  "token file (an llm.c .bin shard or raw uint16 tokens)");
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::seconds(5));
  fs::create_directory(file("dir.bin"));
  EXPECT_CONTAINS(error_of([&] { TokenShard::open(file("dir.bin"), ShardFormat::kRawU16); }),
                  "dir.bin: is not a regular file");
  EXPECT_CONTAINS(error_of([&] { TokenShard::open("/dev/zero", ShardFormat::kRawU16); }),
                  "/dev/zero: is not a regular file");
  EXPECT_CONTAINS(error_of([&] { TokenShard::open(file("missing.bin"), std::nullopt); }),
                  "missing.bin: cannot open for reading: No such file or directory");
}

}  // namespace
