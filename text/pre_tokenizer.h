#pragma once
// The split of text into pre-tokens ("words") before BPE, by the regex of GPT-2 or of Llama 3,
// matched by hand with Oniguruma's semantics (leftmost alternative first, greedy, with
// backtracking where the patterns need it; Note [Unicode tables] in text/unicode.h says why
// not a regex library). Every character of any text is matched by some alternative of either
// pattern, so the matches tile the text: there are no gaps between them.

#include <cstddef>
#include <optional>
#include <string_view>

namespace loom::text {

enum class SplitPattern {
  kGpt2,    // GPT-2's (and tokenizers' ByteLevel use_regex)
  kLlama3,  // Llama 3's (tiktoken cl100k_base's)
};

inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Which pattern `regex` is, compared character for character; nullopt for any other regex.
std::optional<SplitPattern> split_pattern_of(std::string_view regex);

// The end of the match that starts at byte `begin` of `text` (well-formed UTF-8,
// begin < text.size()): always past `begin`, on a character boundary.
size_t match_end(SplitPattern pattern, std::string_view text, size_t begin);

// Calls piece(std::string_view) for each pre-token of `text`, in order.
template <typename Piece>
void split(SplitPattern pattern, std::string_view text, Piece&& piece) {
  size_t begin = 0;
  while (begin < text.size()) {
    const size_t end = match_end(pattern, text, begin);
    piece(text.substr(begin, end - begin));
    begin = end;
  }
}

}  // namespace loom::text
