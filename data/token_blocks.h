#pragma once
// The data order of train_gpt, fixed so that runs compare across strategies and frameworks:
// with micro-batch B and context T the data holds nblocks = floor((N - 1) / (B*T)) blocks;
// block k starts at s = (k mod nblocks) * B*T; inputs are tokens [s, s + B*T) and targets
// [s + 1, s + B*T + 1), both read as B rows of T; step i of rank r in a world of W ranks
// reads block i*W + r. With shuffle, each pass over the data (epoch) visits the blocks in a
// seeded random permutation instead.
//
// The tokens come from a TokenSource (data/token_source.h): a vector in memory, or token
// files mapped read-only, of which a block reads only its own B*T + 1 tokens.

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "data/token_source.h"
#include "tensor/tensor.h"

namespace loom::data {

struct Batch {
  Tensor tokens;   // [B, T] i64
  Tensor targets;  // [B, T] i64
};

// Bytes as token ids 0..255. (Out of line: a caller's code may be compiled without
// optimisation, a sanitized test's for one, and a corpus is a million bytes.)
std::vector<int32_t> byte_tokens(const std::vector<uint8_t>& bytes);

// Blocks may be read from any number of threads at once (the source is immutable).
class TokenBlocks {
 public:
  // Tokens in memory (wrapped in InMemoryTokens), every one checked here: throws loom::Error
  // when the data is too short for one block or holds a token outside [0, vocab).
  TokenBlocks(std::vector<int32_t> tokens, int64_t batch, int64_t time, int64_t vocab,
              bool shuffle = false, uint64_t seed = 0);
  // Tokens of any source, checked as they are read, so that opening a large shard set scans
  // nothing: block() throws loom::Error for a token outside [0, vocab), naming where it is
  // (TokenSource::describe: the shard file and the token's index in it). Throws loom::Error
  // here for a null source and for data too short for one block.
  TokenBlocks(std::shared_ptr<const TokenSource> source, int64_t batch, int64_t time, int64_t vocab,
              bool shuffle = false, uint64_t seed = 0);
  // Bytes as tokens (ids 0..255).
  TokenBlocks(const std::vector<uint8_t>& bytes, int64_t batch, int64_t time, int64_t vocab,
              bool shuffle = false, uint64_t seed = 0)
      : TokenBlocks(byte_tokens(bytes), batch, time, vocab, shuffle, seed) {}
  int64_t block_count() const { return nblocks_; }
  // The block that step `step` of rank `rank` (of `world`) reads. Throws loom::Error unless
  // step >= 0 and 0 <= rank < world.
  int64_t block_index(int64_t step, int64_t rank, int64_t world) const;
  // The block read at `position` of the data order (position step * world + rank above):
  // position mod block_count() without shuffle, else that entry of its epoch's permutation.
  // Throws loom::Error for position < 0.
  int64_t block_at(int64_t position) const;
  // Block k mod block_count(); throws loom::Error for k < 0 and for a token outside the
  // vocabulary.
  Batch block(int64_t k) const;
  Batch for_step(int64_t step, int64_t rank = 0, int64_t world = 1) const {
    return block(block_index(step, rank, world));
  }
  const TokenSource& source() const { return *source_; }

 private:
  // The permutation of the epoch read last (shuffled data), made once per epoch rather than
  // once per block; shared by copies (it is a function of the seed and the epoch).
  struct EpochOrder {
    std::mutex mutex;
    int64_t epoch = -1;
    std::vector<int64_t> order;
  };

  std::shared_ptr<const TokenSource> source_;
  int64_t batch_, time_, vocab_, nblocks_;
  bool shuffle_;
  uint64_t seed_;
  std::shared_ptr<EpochOrder> epoch_order_ = std::make_shared<EpochOrder>();
};

// `count` token ids drawn uniformly from [0, vocab) with Loom's generator: the data of
// throughput benchmarks, where a step's cost must not depend on a corpus.
std::vector<int32_t> synthetic_tokens(int64_t count, int64_t vocab, uint64_t seed);

}  // namespace loom::data
