#include "data/token_blocks.h"

#include <algorithm>
#include <numeric>

#include "core/tags.h"
#include "tensor/random.h"

namespace loom::data {

std::vector<int32_t> byte_tokens(const std::vector<uint8_t>& bytes) {
  return std::vector<int32_t>(bytes.begin(), bytes.end());
}

TokenBlocks::TokenBlocks(std::vector<int32_t> tokens, int64_t batch, int64_t time, int64_t vocab,
                         bool shuffle, uint64_t seed)
    : tokens_(std::move(tokens)), batch_(batch), time_(time), shuffle_(shuffle), seed_(seed) {
  if (batch <= 0 || time <= 0) tag::kTrainGpt.fail("batch and context must be positive");
  int64_t n = static_cast<int64_t>(tokens_.size());
  nblocks_ = n > 0 ? (n - 1) / (batch * time) : 0;
  if (nblocks_ == 0) {
    tag::kTrainGpt.fail("the data holds ", n, " tokens; one block of batch ", batch, " x context ",
                        time, " needs at least ", batch * time + 1,
                        " (use more data or a smaller --batch/--ctx)");
  }
  auto [smallest, largest] = std::minmax_element(tokens_.begin(), tokens_.end());
  auto outside = *smallest < 0 ? smallest : largest;
  if (*outside < 0 || *outside >= vocab) {
    tag::kTrainGpt.fail("token ", *outside, " at offset ", outside - tokens_.begin(),
                        " is outside the vocabulary of ", vocab,
                        " (data bytes are tokens: use --vocab 256 or more)");
  }
}

int64_t TokenBlocks::block_index(int64_t step, int64_t rank, int64_t world) const {
  int64_t k = 0;
  if (step < 0 || world < 1 || rank < 0 || rank >= world ||
      __builtin_mul_overflow(step, world, &k) || __builtin_add_overflow(k, rank, &k)) {
    tag::kTrainGpt.fail(
        "no data block for step ", step, " of rank ", rank, " in a world of ", world,
        "; expected step >= 0, 0 <= rank < world and step * world + rank below 2^63");
  }
  if (!shuffle_) return k % nblocks_;
  int64_t epoch = k / nblocks_;
  std::vector<int64_t> order(static_cast<size_t>(nblocks_));
  std::iota(order.begin(), order.end(), 0);
  Generator gen(seed_ + static_cast<uint64_t>(epoch));
  for (int64_t i = nblocks_ - 1; i > 0; --i) {  // Fisher-Yates with Loom's own generator
    int64_t j = static_cast<int64_t>(gen.uniform() * static_cast<double>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order[k % nblocks_];
}

Batch TokenBlocks::block(int64_t k) const {
  if (k < 0) tag::kTrainGpt.fail("data block ", k, " asked for; expected a block index >= 0");
  int64_t count = batch_ * time_;
  int64_t start = (k % nblocks_) * count;
  std::vector<int64_t> inputs(tokens_.begin() + start, tokens_.begin() + start + count);
  std::vector<int64_t> targets(tokens_.begin() + start + 1, tokens_.begin() + start + count + 1);
  return {Tensor::from_vector(inputs, {batch_, time_}),
          Tensor::from_vector(targets, {batch_, time_})};
}

std::vector<int32_t> synthetic_tokens(int64_t count, int64_t vocab, uint64_t seed) {
  Generator gen(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int32_t& t : tokens) {
    t = static_cast<int32_t>(std::min<int64_t>(
        static_cast<int64_t>(gen.uniform() * static_cast<double>(vocab)), vocab - 1));
  }
  return tokens;
}

}  // namespace loom::data
