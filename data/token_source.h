#pragma once
// What TokenBlocks reads: a sequence of token ids, in memory (text or bytes turned into
// tokens) or memory-mapped from token files (data/token_shards.h) read as one concatenation.
// A source is immutable once built; its const methods may be called from any thread at once.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data/token_shards.h"

namespace loom::data {

class TokenSource {
 public:
  virtual ~TokenSource() = default;
  // Tokens in the source.
  virtual int64_t size() const = 0;
  // Tokens [start, start + count) widened to int64 into out[0, count), with no copy of the
  // rest. Throws loom::Error unless 0 <= start, 0 <= count and start + count <= size().
  virtual void copy(int64_t start, int64_t count, int64_t* out) const = 0;
  // Where token `offset` (0 <= offset < size()) comes from, for messages: "shard
  // data/fineweb_train_000002.bin, token 1234" or "offset 1234 of the in-memory tokens".
  virtual std::string describe(int64_t offset) const = 0;
};

// Tokens held in a vector (ids are not checked here: TokenBlocks checks them against its
// vocabulary).
class InMemoryTokens final : public TokenSource {
 public:
  explicit InMemoryTokens(std::vector<int32_t> tokens) : tokens_(std::move(tokens)) {}
  int64_t size() const override { return static_cast<int64_t>(tokens_.size()); }
  void copy(int64_t start, int64_t count, int64_t* out) const override;
  std::string describe(int64_t offset) const override;
  const std::vector<int32_t>& tokens() const { return tokens_; }

 private:
  std::vector<int32_t> tokens_;
};

// One or more token files of one format, read as their concatenation in the given order (a
// read may span shard boundaries).
class ShardedTokens final : public TokenSource {
 public:
  // `pattern` is a path or a glob(3) pattern (`*`, `?`, `[...]`); the files it matches are
  // read in the byte order of their names, each opened as TokenShard::open(file, format)
  // does. Throws loom::Error for a glob that matches nothing (naming the pattern), for a
  // refused file (TokenShard::open's errors) and for files of different formats.
  static ShardedTokens open(const std::string& pattern, std::optional<ShardFormat> format);
  // The given shards in this order; throws loom::Error for none or for mixed formats.
  explicit ShardedTokens(std::vector<TokenShard> shards);

  int64_t size() const override { return starts_.back(); }
  void copy(int64_t start, int64_t count, int64_t* out) const override;
  std::string describe(int64_t offset) const override;
  const std::vector<TokenShard>& shards() const { return shards_; }
  ShardFormat format() const { return shards_.front().format(); }

 private:
  // The shard holding token `offset` (0 <= offset < size()).
  size_t shard_of(int64_t offset) const;

  std::vector<TokenShard> shards_;
  std::vector<int64_t> starts_;  // starts_[i]: offset of shard i's first token; back(): size()
};

}  // namespace loom::data
