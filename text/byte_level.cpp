#include "text/byte_level.h"

#include <array>

#include "text/unicode.h"

namespace loom::text {

namespace {

struct Alphabet {
  std::array<char32_t, 256> char_of_byte{};
  std::array<int16_t, 324> byte_of_char{};  // -1 where the code point is not in the alphabet

  constexpr Alphabet() {
    for (int16_t& b : byte_of_char)
      b = -1;
    char32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      char_of_byte[b] = printable ? static_cast<char32_t>(b) : next++;
      byte_of_char[char_of_byte[b]] = static_cast<int16_t>(b);
    }
  }
};

constexpr Alphabet kAlphabet;
static_assert(kAlphabet.char_of_byte[' '] == 0x120 && kAlphabet.char_of_byte[0xAD] == 0x143);

}  // namespace

char32_t byte_level_char(uint8_t b) {
  return kAlphabet.char_of_byte[b];
}

std::optional<std::string> byte_level_decode(std::string_view token) {
  std::string bytes;
  bytes.reserve(token.size());
  const auto* p = reinterpret_cast<const unsigned char*>(token.data());
  const auto* end = p + token.size();
  while (p < end) {
    size_t length = 0;
    const char32_t cp = decode_utf8(p, length);
    if (cp >= kAlphabet.byte_of_char.size() || kAlphabet.byte_of_char[cp] < 0) return std::nullopt;
    bytes.push_back(static_cast<char>(kAlphabet.byte_of_char[cp]));
    p += length;
  }
  return bytes;
}

std::string byte_level_encode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes)
    append_utf8(out, kAlphabet.char_of_byte[static_cast<uint8_t>(c)]);
  return out;
}

}  // namespace loom::text
