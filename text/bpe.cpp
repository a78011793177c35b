#include "text/bpe.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <limits>
#include <queue>

namespace loom::text {

namespace {

constexpr uint32_t kNoToken = std::numeric_limits<uint32_t>::max();
constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();
// Words up to this many symbols merge by a quadratic search over a flat array, which beats a
// heap at the lengths of real words; longer ones (a run of letters thousands long) use the heap.
constexpr size_t kSmallWord = 48;

uint64_t pair_key(uint32_t left, uint32_t right) {
  return (uint64_t{left} << 32) | right;
}

std::atomic<uint64_t> next_bpe_serial{1};

// A hash of a short byte string, never 0: eight bytes at a time, multiplied and folded.
uint64_t hash_bytes(std::string_view bytes) {
  uint64_t h = 0x9E3779B97F4A7C15ull * (bytes.size() + 1);
  for (size_t i = 0; i < bytes.size(); i += 8) {
    uint64_t chunk = 0;
    std::memcpy(&chunk, bytes.data() + i, std::min<size_t>(8, bytes.size() - i));
    h = (h ^ chunk) * 0xBF58476D1CE4E5B9ull;
    h ^= h >> 31;
  }
  return h | 1;
}

// Note [Word cache]
// Most words of a text are words it has had before, and merging one costs a few dozen lookups
// of the merge table, so encode_word remembers recent words (tokenizers does too). The cache is
// per thread, so it needs no lock: a shared map behind a reader-writer lock (tokenizers'
// design) made encoding slower than no cache at all here (lookups missing the CPU's caches,
// and two atomic operations per word). It is direct-mapped, one 64-byte line per word: a word
// of up to 22 bytes that became up to 8 tokens, stored whole, replaced by the next word with
// its hash's slot. It belongs to one Bpe at a time (by serial number, never reused), and is
// cleared when the thread encodes with another.
class WordCache {
 public:
  static constexpr size_t kMaxBytes = 22;
  static constexpr size_t kMaxTokens = 8;

  // The tokens of `word` if cached for `owner`, appended to `out`.
  bool find(uint64_t owner, std::string_view word, uint64_t hash, std::vector<uint32_t>& out) {
    if (owner != owner_) return false;
    const Slot& slot = slots_[hash & (kSlots - 1)];
    if (slot.hash != hash || slot.bytes != word.size() ||
        std::memcmp(slot.word, word.data(), word.size()) != 0) {
      return false;
    }
    out.insert(out.end(), slot.tokens, slot.tokens + slot.count);
    return true;
  }

  void insert(uint64_t owner, std::string_view word, uint64_t hash,
              std::span<const uint32_t> tokens) {
    if (tokens.size() > kMaxTokens) return;
    if (owner != owner_) {
      slots_.assign(kSlots, Slot{});
      owner_ = owner;
    }
    Slot& slot = slots_[hash & (kSlots - 1)];
    slot.hash = hash;
    slot.bytes = static_cast<uint8_t>(word.size());
    slot.count = static_cast<uint8_t>(tokens.size());
    std::memcpy(slot.word, word.data(), word.size());
    std::copy(tokens.begin(), tokens.end(), slot.tokens);
  }

 private:
  static constexpr size_t kSlots = 16384;  // 1 MiB per thread that encodes
  struct alignas(64) Slot {
    uint64_t hash = 0;
    uint8_t bytes = 0;
    uint8_t count = 0;
    char word[kMaxBytes];
    uint32_t tokens[kMaxTokens];
  };
  static_assert(sizeof(Slot) == 64);

  uint64_t owner_ = 0;
  std::vector<Slot> slots_;
};

thread_local WordCache word_cache;

}  // namespace

// (left, right) -> (rank, result), open addressing with linear probing: one multiply and
// usually one cache line per lookup, where std::unordered_map chases a node pointer.
class Bpe::MergeTable {
 public:
  struct Value {
    uint32_t rank = kNoRank;
    uint32_t result = kNoToken;
  };

  explicit MergeTable(std::span<const MergeRule> rules) {
    size_t capacity = 16;
    while (capacity < rules.size() * 2)
      capacity *= 2;
    shift_ = 64 - std::countr_zero(capacity);
    mask_ = capacity - 1;
    slots_.resize(capacity);
    for (size_t rank = 0; rank < rules.size(); ++rank) {
      const MergeRule& rule = rules[rank];
      Slot& slot = find_slot(pair_key(rule.left, rule.right));
      slot.key = pair_key(rule.left, rule.right);
      slot.value = {static_cast<uint32_t>(rank), rule.result};  // a later duplicate wins
    }
  }

  // The merge of (left, right); rank kNoRank when there is none.
  Value find(uint32_t left, uint32_t right) const {
    const uint64_t key = pair_key(left, right);
    for (size_t i = index(key);; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.key == key) return slot.value;
      if (slot.key == kEmpty) return {};
    }
  }

 private:
  // No token id is kNoToken, so no pair's key is all ones.
  static constexpr uint64_t kEmpty = std::numeric_limits<uint64_t>::max();
  struct Slot {
    uint64_t key = kEmpty;
    Value value;
  };

  size_t index(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }
  Slot& find_slot(uint64_t key) {
    size_t i = index(key);
    while (slots_[i].key != kEmpty && slots_[i].key != key)
      i = (i + 1) & mask_;
    return slots_[i];
  }

  std::vector<Slot> slots_;
  int shift_ = 0;
  size_t mask_ = 0;
};

// Byte string -> token, open addressing over one arena of the strings: a hash compare in the
// slot, then one comparison of the bytes.
class Bpe::TokenTable {
 public:
  explicit TokenTable(const std::vector<std::optional<std::string>>& tokens) {
    size_t count = 0;
    for (const auto& token : tokens)
      count += token.has_value();
    size_t capacity = 16;
    while (capacity < count * 2)
      capacity *= 2;
    mask_ = capacity - 1;
    slots_.resize(capacity);
    for (size_t id = 0; id < tokens.size(); ++id) {
      if (!tokens[id]) continue;
      const std::string& bytes = *tokens[id];
      const uint64_t hash = hash_bytes(bytes);
      size_t i = hash & mask_;
      while (slots_[i].hash != 0)
        i = (i + 1) & mask_;  // texts are distinct (the vocabulary's keys)
      slots_[i] = {hash, static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(bytes.size()),
                   static_cast<uint32_t>(id)};
      arena_ += bytes;
    }
  }

  std::optional<uint32_t> find(std::string_view bytes) const {
    const uint64_t hash = hash_bytes(bytes);
    for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.hash == 0) return std::nullopt;
      if (slot.hash == hash && slot.length == bytes.size() &&
          std::memcmp(arena_.data() + slot.offset, bytes.data(), bytes.size()) == 0) {
        return slot.id;
      }
    }
  }

 private:
  struct Slot {
    uint64_t hash = 0;  // 0: empty
    uint32_t offset = 0;
    uint32_t length = 0;
    uint32_t id = 0;
  };
  std::vector<Slot> slots_;
  std::string arena_;
  size_t mask_ = 0;
};

Bpe::Bpe(const std::vector<std::optional<std::string>>& tokens, std::span<const MergeRule> merges,
         bool ignore_merges)
    : merges_(std::make_unique<MergeTable>(merges)),
      ids_(std::make_unique<TokenTable>(tokens)),
      serial_(next_bpe_serial.fetch_add(1)),
      ignore_merges_(ignore_merges) {
  std::fill(std::begin(byte_tokens_), std::end(byte_tokens_), kNoToken);
  for (size_t id = 0; id < tokens.size(); ++id) {
    if (tokens[id] && tokens[id]->size() == 1)
      byte_tokens_[static_cast<uint8_t>((*tokens[id])[0])] = static_cast<uint32_t>(id);
  }
}

Bpe::~Bpe() = default;
Bpe::Bpe(Bpe&&) noexcept = default;
Bpe& Bpe::operator=(Bpe&&) noexcept = default;

std::optional<uint32_t> Bpe::token_of(std::string_view bytes) const {
  return ids_->find(bytes);
}

bool Bpe::covers_every_byte() const {
  return std::none_of(std::begin(byte_tokens_), std::end(byte_tokens_),
                      [](uint32_t id) { return id == kNoToken; });
}

void Bpe::encode_word(std::string_view word, std::vector<uint32_t>& out) const {
  if (word.size() == 1) {
    const uint32_t id = byte_tokens_[static_cast<uint8_t>(word[0])];
    if (id != kNoToken) out.push_back(id);
    return;
  }
  // Note [Word cache]
  const bool cacheable = word.size() <= WordCache::kMaxBytes;
  const uint64_t hash = cacheable ? hash_bytes(word) : 0;
  if (cacheable && word_cache.find(serial_, word, hash, out)) return;
  const size_t first = out.size();
  const std::optional<uint32_t> token = ignore_merges_ ? ids_->find(word) : std::nullopt;
  if (token) {
    out.push_back(*token);
  } else {
    merge(word, out);
  }
  if (cacheable) word_cache.insert(serial_, word, hash, std::span(out).subspan(first));
}

void Bpe::merge(std::string_view word, std::vector<uint32_t>& out) const {
  uint32_t small[kSmallWord];
  std::vector<uint32_t> large;
  uint32_t* ids = small;
  if (word.size() > kSmallWord) {
    large.resize(word.size());
    ids = large.data();
  }
  size_t count = 0;
  for (char c : word) {
    const uint32_t id = byte_tokens_[static_cast<uint8_t>(c)];
    if (id != kNoToken) ids[count++] = id;
  }
  if (count <= kSmallWord) {
    merge_small({ids, count}, out);
  } else {
    merge_large({ids, count}, out);
  }
}

void Bpe::merge_for_test(std::string_view word, bool use_heap, std::vector<uint32_t>& out) const {
  std::vector<uint32_t> ids;
  for (char c : word) {
    const uint32_t id = byte_tokens_[static_cast<uint8_t>(c)];
    if (id != kNoToken) ids.push_back(id);
  }
  if (use_heap) {
    merge_large(ids, out);
  } else {
    merge_small(ids, out);
  }
}

// The lowest-ranked pair, leftmost among equals, over a flat array: O(n^2) for n symbols,
// with n below kSmallWord (and usually below 10) the fastest way.
void Bpe::merge_small(std::span<uint32_t> ids, std::vector<uint32_t>& out) const {
  size_t n = ids.size();
  if (n == 0) return;
  MergeTable::Value pairs[kSmallWord];  // pairs[i]: the merge of ids[i], ids[i + 1]
  std::vector<MergeTable::Value> large_pairs;
  MergeTable::Value* pair = pairs;
  if (n > kSmallWord) {
    large_pairs.resize(n);
    pair = large_pairs.data();
  }
  for (size_t i = 0; i + 1 < n; ++i)
    pair[i] = merges_->find(ids[i], ids[i + 1]);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i) {
      if (pair[i].rank < pair[best].rank) best = i;
    }
    if (pair[best].rank == kNoRank) break;
    ids[best] = pair[best].result;
    std::copy(ids.begin() + best + 2, ids.begin() + n, ids.begin() + best + 1);
    if (best + 2 < n) std::copy(pair + best + 2, pair + n - 1, pair + best + 1);
    --n;
    if (best > 0) pair[best - 1] = merges_->find(ids[best - 1], ids[best]);
    if (best + 1 < n) pair[best] = merges_->find(ids[best], ids[best + 1]);
  }
  out.insert(out.end(), ids.begin(), ids.begin() + n);
}

// tokenizers' merge_all: symbols in a linked list, candidate merges in a heap ordered by
// (rank, position); an entry whose pair has changed since it was pushed is skipped.
void Bpe::merge_large(std::span<uint32_t> ids, std::vector<uint32_t>& out) const {
  const size_t n = ids.size();
  if (n == 0) return;
  struct Symbol {
    uint32_t id;
    int32_t prev;
    int32_t next;  // -1 at the ends
    bool alive;
  };
  struct Candidate {
    uint32_t rank;
    uint32_t pos;
    bool operator>(const Candidate& other) const {
      return rank != other.rank ? rank > other.rank : pos > other.pos;
    }
  };
  std::vector<Symbol> symbols(n);
  for (size_t i = 0; i < n; ++i) {
    symbols[i] = {ids[i], static_cast<int32_t>(i) - 1, i + 1 < n ? static_cast<int32_t>(i + 1) : -1,
                  true};
  }
  std::vector<Candidate> storage;
  storage.reserve(n);
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue(std::greater<>{},
                                                                               std::move(storage));
  for (size_t i = 0; i + 1 < n; ++i) {
    const MergeTable::Value merge = merges_->find(ids[i], ids[i + 1]);
    if (merge.rank != kNoRank) queue.push({merge.rank, static_cast<uint32_t>(i)});
  }
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    Symbol& right = symbols[static_cast<size_t>(left.next)];
    const MergeTable::Value merge = merges_->find(left.id, right.id);
    if (merge.rank != top.rank) continue;  // the pair at pos changed since this was pushed
    left.id = merge.result;
    right.alive = false;
    left.next = right.next;
    if (right.next >= 0)
      symbols[static_cast<size_t>(right.next)].prev = static_cast<int32_t>(top.pos);
    if (left.prev >= 0) {
      const MergeTable::Value before =
          merges_->find(symbols[static_cast<size_t>(left.prev)].id, left.id);
      if (before.rank != kNoRank) queue.push({before.rank, static_cast<uint32_t>(left.prev)});
    }
    if (left.next >= 0) {
      const MergeTable::Value after =
          merges_->find(left.id, symbols[static_cast<size_t>(left.next)].id);
      if (after.rank != kNoRank) queue.push({after.rank, top.pos});
    }
  }
  for (const Symbol& symbol : symbols) {
    if (symbol.alive) out.push_back(symbol.id);
  }
}

}  // namespace loom::text
