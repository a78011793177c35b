#include "data/token_blocks.h"

#include <algorithm>
#include <memory>
#include <numeric>

#include "core/tags.h"
#include "tensor/random.h"

namespace loom::data {

std::vector<int32_t> byte_tokens(const std::vector<uint8_t>& bytes) {
  return std::vector<int32_t>(bytes.begin(), bytes.end());
}

TokenBlocks::TokenBlocks(std::vector<int32_t> tokens, int64_t batch, int64_t time, int64_t vocab,
                         bool shuffle, uint64_t seed)
    : TokenBlocks(std::make_shared<const InMemoryTokens>(std::move(tokens)), batch, time, vocab,
                  shuffle, seed) {
  // In memory every token is checked at once (block() checks them again as it reads them);
  // the source is the InMemoryTokens made just above.
  const std::vector<int32_t>& all = static_cast<const InMemoryTokens&>(*source_).tokens();
  auto [smallest, largest] = std::minmax_element(all.begin(), all.end());
  auto outside = *smallest < 0 ? smallest : largest;
  if (*outside < 0 || *outside >= vocab) {
    tag::kTrainGpt.fail("token ", *outside, " at offset ", outside - all.begin(),
                        " is outside the vocabulary of ", vocab,
                        " (data bytes are tokens: use --vocab 256 or more)");
  }
}

TokenBlocks::TokenBlocks(std::shared_ptr<const TokenSource> source, int64_t batch, int64_t time,
                         int64_t vocab, bool shuffle, uint64_t seed)
    : source_(std::move(source)),
      batch_(batch),
      time_(time),
      vocab_(vocab),
      shuffle_(shuffle),
      seed_(seed) {
  if (source_ == nullptr) tag::kTrainGpt.fail("no token source given");
  if (batch <= 0 || time <= 0) tag::kTrainGpt.fail("batch and context must be positive");
  int64_t n = source_->size();
  nblocks_ = n > 0 ? (n - 1) / (batch * time) : 0;
  if (nblocks_ == 0) {
    tag::kTrainGpt.fail("the data holds ", n, " tokens; one block of batch ", batch, " x context ",
                        time, " needs at least ", batch * time + 1,
                        " (use more data or a smaller --batch/--ctx)");
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
  return block_at(k);
}

int64_t TokenBlocks::block_at(int64_t k) const {
  if (k < 0) tag::kTrainGpt.fail("data position ", k, " asked for; expected a position >= 0");
  if (!shuffle_) return k % nblocks_;
  const int64_t epoch = k / nblocks_;
  std::lock_guard<std::mutex> lock(epoch_order_->mutex);
  std::vector<int64_t>& order = epoch_order_->order;
  if (epoch_order_->epoch != epoch) {
    order.resize(static_cast<size_t>(nblocks_));
    std::iota(order.begin(), order.end(), 0);
    Generator gen(seed_ + static_cast<uint64_t>(epoch));
    for (int64_t i = nblocks_ - 1; i > 0; --i) {  // Fisher-Yates with Loom's own generator
      int64_t j = static_cast<int64_t>(gen.uniform() * static_cast<double>(i + 1));
      std::swap(order[i], order[j]);
    }
    epoch_order_->epoch = epoch;
  }
  return order[k % nblocks_];
}

Batch TokenBlocks::block(int64_t k) const {
  if (k < 0) tag::kTrainGpt.fail("data block ", k, " asked for; expected a block index >= 0");
  const int64_t count = batch_ * time_;
  const int64_t start = (k % nblocks_) * count;
  // Tokens [start, start + count] read once, straight into the two tensors: the targets are
  // the inputs shifted by one, plus the token after the block.
  Tensor inputs = Tensor::empty({batch_, time_}, DType::I64);
  Tensor targets = Tensor::empty({batch_, time_}, DType::I64);
  int64_t* in = inputs.data<int64_t>();
  int64_t* out = targets.data<int64_t>();
  source_->copy(start, count, in);
  std::copy(in + 1, in + count, out);
  source_->copy(start + count, 1, out + count - 1);
  for (int64_t i = 0; i <= count; ++i) {
    const int64_t id = i < count ? in[i] : out[count - 1];
    if (id < 0 || id >= vocab_) [[unlikely]] {
      tag::kData.fail(source_->describe(start + i), ": token id ", id,
                      " is outside the vocabulary of ", vocab_,
                      "; expected ids below --vocab (the tokenizer's vocabulary size or more)");
    }
  }
  return {std::move(inputs), std::move(targets)};
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
