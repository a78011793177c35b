#include "text/unicode.h"

#include <span>
#include <unordered_map>

#include "text/detail/unicode_tables.h"

namespace loom::text {

namespace {

constexpr char32_t kCodePoints = 0x110000;
constexpr size_t kBlock = 256;

void paint(std::vector<uint8_t>& classes, std::span<const detail::CodePointRange> ranges,
           CharClass value) {
  for (const detail::CodePointRange& range : ranges) {
    for (char32_t cp = range.first; cp <= range.last; ++cp)
      classes[cp] = static_cast<uint8_t>(value);
  }
}

// The length of the well-formed UTF-8 sequence at bytes[0..size) (size >= 1), or, negated,
// the length of its maximal ill-formed subpart: the bytes that could still have begun a
// well-formed sequence (at least 1). Unicode 16.0, Table 3-7.
int sequence_length(const unsigned char* bytes, size_t size) {
  const unsigned char b0 = bytes[0];
  if (b0 < 0x80) return 1;
  int length = 0;
  unsigned char low = 0x80;  // the range the second byte must be in
  unsigned char high = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    length = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    length = 3;
    if (b0 == 0xE0) low = 0xA0;   // no overlong forms
    if (b0 == 0xED) high = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    length = 4;
    if (b0 == 0xF0) low = 0x90;   // no overlong forms
    if (b0 == 0xF4) high = 0x8F;  // nothing above U+10FFFF
  } else {
    return -1;  // a continuation byte, C0, C1 or F5-FF
  }
  for (int i = 1; i < length; ++i) {
    if (static_cast<size_t>(i) >= size) return -i;
    const unsigned char b = bytes[i];
    const bool ok = i == 1 ? (b >= low && b <= high) : (b >= 0x80 && b <= 0xBF);
    if (!ok) return -i;
  }
  return length;
}

}  // namespace

CharClasses::CharClasses() : index_(kCodePoints / kBlock) {
  std::vector<uint8_t> classes(kCodePoints, static_cast<uint8_t>(CharClass::kOther));
  paint(classes, detail::letter_ranges(), CharClass::kLetter);
  paint(classes, detail::number_ranges(), CharClass::kNumber);
  paint(classes, detail::white_space_ranges(), CharClass::kSpace);
  std::unordered_map<std::string, uint16_t> seen;  // block content -> block number
  for (size_t block = 0; block < index_.size(); ++block) {
    std::string content(reinterpret_cast<const char*>(classes.data() + block * kBlock), kBlock);
    auto [it, inserted] = seen.try_emplace(std::move(content), static_cast<uint16_t>(seen.size()));
    if (inserted) blocks_.insert(blocks_.end(), it->first.begin(), it->first.end());
    index_[block] = it->second;
  }
}

const CharClasses& CharClasses::get() {
  static const CharClasses classes;
  return classes;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::optional<size_t> find_invalid_utf8(std::string_view bytes) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t i = 0;
  while (i < bytes.size()) {
    // Eight ASCII bytes at a time: most text is mostly ASCII.
    while (i + 8 <= bytes.size()) {
      uint64_t word;
      __builtin_memcpy(&word, data + i, 8);
      if ((word & 0x8080808080808080ull) != 0) break;
      i += 8;
    }
    if (i == bytes.size()) break;
    const int length = sequence_length(data + i, bytes.size() - i);
    if (length < 0) return i;
    i += static_cast<size_t>(length);
  }
  return std::nullopt;
}

std::string utf8_lossy(std::string_view bytes) {
  const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const int length = sequence_length(data + i, bytes.size() - i);
    if (length > 0) {
      out.append(bytes.substr(i, static_cast<size_t>(length)));
      i += static_cast<size_t>(length);
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      i += static_cast<size_t>(-length);
    }
  }
  return out;
}

}  // namespace loom::text
