#pragma once
// A byte-level BPE model: a vocabulary of byte strings and ranked merges, applied to one
// pre-token ("word") at a time exactly as tokenizers' BPE applies them (models/bpe/word.rs,
// merge_all): while any adjacent pair of symbols has a merge, merge the pair of lowest rank,
// the leftmost of equals. Recent words are cached per thread (Note [Word cache] in bpe.cpp).

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::text {

// One merge rule: the pair (left, right) becomes `result` (the token of their concatenation).
struct MergeRule {
  uint32_t left;
  uint32_t right;
  uint32_t result;
};

class Bpe {
 public:
  // `tokens[id]` is the byte string of token `id`, or nullopt for a token no byte string
  // stands for (one whose text is not in the byte-level alphabet: BPE never produces it).
  // `merges` in rank order (the rank is the index; a pair listed twice keeps its later rank,
  // as in tokenizers). With `ignore_merges` a word that is a token is that token, whatever
  // the merges would make of it (tokenizers' BPE ignore_merges, Llama 3's setting).
  Bpe(const std::vector<std::optional<std::string>>& tokens, std::span<const MergeRule> merges,
      bool ignore_merges);
  ~Bpe();
  Bpe(Bpe&&) noexcept;
  Bpe& operator=(Bpe&&) noexcept;

  // Appends the tokens of `word` (bytes) to `out`. A byte with no token of its own is
  // dropped, as tokenizers drops it when the model has no unknown token. Any thread may call
  // it, concurrently with others.
  void encode_word(std::string_view word, std::vector<uint32_t>& out) const;

  // The token whose byte string is `bytes`.
  std::optional<uint32_t> token_of(std::string_view bytes) const;
  // Whether every one of the 256 bytes is a token.
  bool covers_every_byte() const;

  // The merge algorithm without the cache or ignore_merges, for the tests: the simple
  // quadratic search for short words and the heap for long ones must agree.
  void merge_for_test(std::string_view word, bool use_heap, std::vector<uint32_t>& out) const;

 private:
  class MergeTable;
  class TokenTable;

  void merge(std::string_view word, std::vector<uint32_t>& out) const;
  void merge_small(std::span<uint32_t> ids, std::vector<uint32_t>& out) const;
  void merge_large(std::span<uint32_t> ids, std::vector<uint32_t>& out) const;

  std::unique_ptr<MergeTable> merges_;
  std::unique_ptr<TokenTable> ids_;  // byte string -> token
  uint64_t serial_ = 0;              // this model's words in the per-thread cache
  uint32_t byte_tokens_[256];        // kNoToken where a byte has no token
  bool ignore_merges_ = false;
};

}  // namespace loom::text
