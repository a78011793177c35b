#include "text/pre_tokenizer.h"

#include <array>

#include "text/unicode.h"

namespace loom::text {

namespace {

constexpr std::array<CharClass, 128> make_ascii_classes() {
  std::array<CharClass, 128> classes{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z')) {
      classes[c] = CharClass::kLetter;
    } else if (c >= '0' && c <= '9') {
      classes[c] = CharClass::kNumber;
    } else if ((c >= '\t' && c <= '\r') || c == ' ') {
      classes[c] = CharClass::kSpace;
    } else {
      classes[c] = CharClass::kOther;
    }
  }
  return classes;
}

constexpr std::array<CharClass, 128> kAsciiClasses = make_ascii_classes();

bool is_newline(unsigned char c) {
  return c == '\r' || c == '\n';
}

// The text being split, with the class of the character at a byte offset.
class Text {
 public:
  explicit Text(std::string_view text)
      : s_(reinterpret_cast<const unsigned char*>(text.data())),
        n_(text.size()),
        classes_(CharClasses::get()) {}

  size_t size() const { return n_; }
  unsigned char byte(size_t i) const { return s_[i]; }

  // The class of the character at i (< size()) and its length in bytes.
  CharClass at(size_t i, size_t& length) const {
    if (s_[i] < 0x80) {
      length = 1;
      return kAsciiClasses[s_[i]];
    }
    return classes_(decode_utf8(s_ + i, length));
  }

  // The end of the run of characters of class `c` that starts at i.
  size_t run(size_t i, CharClass c) const {
    while (i < n_) {
      size_t length = 0;
      if (at(i, length) != c) break;
      i += length;
    }
    return i;
  }

  // \s+(?!\S)|\s+ at a white-space character i: the whole run when it ends the text or is
  // one character, else all of it but its last character (which the next match starts with).
  // With `newlines`, \s*[\r\n]+ first: the run up to and including its last \r or \n.
  size_t space_run(size_t i, bool newlines) const {
    size_t end = i;
    size_t last = i;         // where the run's last character starts
    size_t newline_end = 0;  // past the run's last \r or \n; 0 while there is none
    while (end < n_) {
      size_t length = 0;
      if (at(end, length) != CharClass::kSpace) break;
      if (is_newline(s_[end])) newline_end = end + 1;
      last = end;
      end += length;
    }
    if (newlines && newline_end != 0) return newline_end;
    if (end == n_ || last == i) return end;
    return last;
  }

 private:
  const unsigned char* s_;
  size_t n_;
  const CharClasses& classes_;
};

// The contractions 's|'t|'re|'ve|'m|'ll|'d at i: where the match ends, or 0 for none. With
// fold_case (Llama 3's (?i:...)), in either case as Oniguruma folds: 's' also matches U+017F
// LATIN SMALL LETTER LONG S (UTF-8 C5 BF); no other of these letters has a non-ASCII case
// variant.
size_t contraction_end(const Text& t, size_t i, bool fold_case) {
  const size_t n = t.size();
  if (t.byte(i) != '\'' || i + 1 >= n) return 0;
  // b | 0x20 lowers an ASCII letter; it is compared with letters only.
  auto letter = [&](size_t k) -> unsigned char {
    return fold_case ? t.byte(k) | 0x20 : t.byte(k);
  };
  switch (letter(i + 1)) {
    case 's':
    case 't':
    case 'm':
    case 'd': return i + 2;
    case 'r':
    case 'v': return i + 2 < n && letter(i + 2) == 'e' ? i + 3 : 0;
    case 'l': return i + 2 < n && letter(i + 2) == 'l' ? i + 3 : 0;
    default:
      return fold_case && t.byte(i + 1) == 0xC5 && i + 2 < n && t.byte(i + 2) == 0xBF ? i + 3
                                                                                       : 0;
  }
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t gpt2_match_end(const Text& t, size_t i) {
  const size_t n = t.size();
  if (const size_t end = contraction_end(t, i, /*fold_case=*/false)) return end;
  // " ?X+" for X a letter, a number or another non-space: one space joins the run after it.
  if (t.byte(i) == ' ' && i + 1 < n) {
    size_t length = 0;
    const CharClass next = t.at(i + 1, length);
    if (next != CharClass::kSpace) return t.run(i + 1 + length, next);
  }
  size_t length = 0;
  const CharClass c = t.at(i, length);
  if (c != CharClass::kSpace) return t.run(i + length, c);
  return t.space_run(i, /*newlines=*/false);
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t llama3_match_end(const Text& t, size_t i) {
  const size_t n = t.size();
  if (const size_t end = contraction_end(t, i, /*fold_case=*/true)) return end;
  size_t length = 0;
  const CharClass c = t.at(i, length);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c == CharClass::kLetter) return t.run(i + length, CharClass::kLetter);
  if (c != CharClass::kNumber && !is_newline(t.byte(i)) && i + length < n) {
    size_t next_length = 0;
    if (t.at(i + length, next_length) == CharClass::kLetter)
      return t.run(i + length + next_length, CharClass::kLetter);
  }
  // \p{N}{1,3}
  if (c == CharClass::kNumber) {
    size_t end = i + length;
    for (int count = 1; count < 3 && end < n; ++count) {
      size_t next_length = 0;
      if (t.at(end, next_length) != CharClass::kNumber) break;
      end += next_length;
    }
    return end;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t end = 0;
  if (t.byte(i) == ' ' && i + 1 < n) {
    size_t next_length = 0;
    if (t.at(i + 1, next_length) == CharClass::kOther)
      end = t.run(i + 1 + next_length, CharClass::kOther);
  }
  if (end == 0 && c == CharClass::kOther) end = t.run(i + length, CharClass::kOther);
  if (end != 0) {
    while (end < n && is_newline(t.byte(end)))
      ++end;
    return end;
  }
  // \s*[\r\n]+|\s+(?!\S)|\s+
  return t.space_run(i, /*newlines=*/true);
}

}  // namespace

std::optional<SplitPattern> split_pattern_of(std::string_view regex) {
  if (regex == kGpt2Pattern) return SplitPattern::kGpt2;
  if (regex == kLlama3Pattern) return SplitPattern::kLlama3;
  return std::nullopt;
}

size_t match_end(SplitPattern pattern, std::string_view text, size_t begin) {
  const Text t(text);
  return pattern == SplitPattern::kGpt2 ? gpt2_match_end(t, begin) : llama3_match_end(t, begin);
}

}  // namespace loom::text
