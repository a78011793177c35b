#pragma once
// Added tokens (tokenizer.json's "added_tokens": <|endoftext|>, <|begin_of_text|>, ...) found
// in the input and split out before pre-tokenization, as tokenizers' AddedVocabulary does:
// leftmost-longest matching, first of the tokens with "normalized": false over the whole
// text, then of those with "normalized": true over the pieces left between (with no
// normalizer the text they see is the same, but the order of the two passes decides overlaps).

#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

namespace loom::text {

struct AddedToken {
  std::string content;  // non-empty UTF-8
  uint32_t id = 0;
  bool special = false;     // skipped by decode(skip_special_tokens); see match_special
  bool normalized = false;  // matched in the second pass
};

// A piece of the input: text to pre-tokenize, or one added token.
struct Segment {
  static constexpr uint32_t kText = std::numeric_limits<uint32_t>::max();
  std::string_view text;
  uint32_t token = kText;
};

class AddedTokens {
 public:
  // Contents must be distinct.
  explicit AddedTokens(std::vector<AddedToken> tokens);

  const std::vector<AddedToken>& tokens() const { return tokens_; }

  // Replaces `out` with the segments of `text`, in order. Without `match_special`, a special
  // token's text stays text, as with tokenizers' encode_special_tokens = True: its match is
  // still found, and skipped whole, so no other added token is matched inside it.
  void split(std::string_view text, bool match_special, std::vector<Segment>& out) const;

 private:
  // A byte trie of one pass's tokens.
  struct Node {
    std::vector<std::pair<unsigned char, uint32_t>> children;  // sorted by byte
    int32_t token = -1;                                        // index into tokens_
  };
  struct Trie {
    std::vector<Node> nodes;  // nodes[0] is the root
    bool starts[256] = {};    // the first bytes of its tokens
  };

  static void insert(Trie& trie, const std::string& content, int32_t token);
  // Appends the segments of `text` found with `trie`.
  void split_pass(const Trie& trie, std::string_view text, bool match_special,
                  std::vector<Segment>& out) const;

  std::vector<AddedToken> tokens_;
  Trie raw_;         // "normalized": false
  Trie normalized_;  // "normalized": true
};

}  // namespace loom::text
