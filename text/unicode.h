#pragma once
// Code point classes and UTF-8 for the tokenizer: what the split regexes of GPT-2 and Llama 3
// ask of a character (\p{L}, \p{N}, \s), and UTF-8 checked and repaired as Rust checks and
// repairs it.
//
// Note [Unicode tables]
// The tokenizer must split text exactly where Hugging Face `tokenizers` does, and that is
// where its regex engine, Oniguruma, puts \p{L}, \p{N} and \s. tokenizers 0.23.3 bundles an
// Oniguruma with Unicode 16.0's tables; neither library Debian 12 offers has them: PCRE2
// 10.42 knows Unicode 14.0 (9,272 letters and 120 digits fewer) and its UCP \s also matches
// U+180E, which stopped being a space in Unicode 6.3; ICU 72 knows Unicode 15.0 (4,924 letters
// and 80 digits fewer). So text/ carries its own ranges, generated from Unicode 16.0 by
// text/gen_unicode_tables.py into text/unicode_tables.cpp (about 800 ranges), and matches the
// two split patterns by hand (text/pre_tokenizer.h). \s is Oniguruma's definition: U+0009-
// U+000D, U+0085 and the separators Zs, Zl, Zp, i.e. the White_Space property.
// tests/text/differential_tokenizers.py checks all 1,112,064 code points against tokenizers'
// own regex engine; a tokenizers release with newer Unicode shows up there first.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::text {

// What a code point is to the split regexes. Disjoint: no letter or number is white space.
enum class CharClass : uint8_t {
  kOther = 0,   // [^\s\p{L}\p{N}]
  kLetter = 1,  // \p{L}
  kNumber = 2,  // \p{N}
  kSpace = 3,   // \s
};

// The class of every code point: a 256-entry block per value of cp >> 8, identical blocks
// shared (133 distinct blocks, 43 KB in all). Built on first use of get(), which any thread may
// call; read-only after.
class CharClasses {
 public:
  static const CharClasses& get();

  // cp <= 0x10FFFF.
  CharClass operator()(char32_t cp) const {
    return static_cast<CharClass>(blocks_[(size_t{index_[cp >> 8]} << 8) | (cp & 0xFF)]);
  }

 private:
  CharClasses();
  std::vector<uint16_t> index_;  // block number per cp >> 8
  std::vector<uint8_t> blocks_;  // CharClass values, 256 per block
};

// The code point that starts at `p` in well-formed UTF-8, and its length in bytes.
inline char32_t decode_utf8(const unsigned char* p, size_t& length) {
  const unsigned char b0 = p[0];
  if (b0 < 0x80) {
    length = 1;
    return b0;
  }
  if (b0 < 0xE0) {
    length = 2;
    return (char32_t{b0 & 0x1Fu} << 6) | (p[1] & 0x3Fu);
  }
  if (b0 < 0xF0) {
    length = 3;
    return (char32_t{b0 & 0x0Fu} << 12) | (char32_t{p[1] & 0x3Fu} << 6) | (p[2] & 0x3Fu);
  }
  length = 4;
  return (char32_t{b0 & 0x07u} << 18) | (char32_t{p[1] & 0x3Fu} << 12) |
         (char32_t{p[2] & 0x3Fu} << 6) | (p[3] & 0x3Fu);
}

// Appends the UTF-8 encoding of `cp` (<= 0x10FFFF, not a surrogate).
void append_utf8(std::string& out, char32_t cp);

// The offset of the first byte of `bytes` that does not start a well-formed UTF-8 sequence
// (Unicode's definition: no overlong forms, no surrogates, nothing above U+10FFFF, no
// truncated sequence at the end), or nullopt when all of it is well-formed.
std::optional<size_t> find_invalid_utf8(std::string_view bytes);

// `bytes` with each maximal ill-formed subsequence replaced by U+FFFD, as Rust's
// String::from_utf8_lossy does (Unicode's "substitution of maximal subparts"): "\xE2\x82"
// becomes one U+FFFD, "\xFF\xFE" two, "\xE2\x82A" U+FFFD then "A".
std::string utf8_lossy(std::string_view bytes);

}  // namespace loom::text
