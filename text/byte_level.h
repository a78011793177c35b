#pragma once
// GPT-2's byte-level alphabet (openai/gpt-2 encoder.py, bytes_to_unicode; tokenizers'
// ByteLevel): every byte is one printable code point, so a vocabulary of strings covers every
// byte sequence. Bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves; the other 68
// (controls, space, DEL, NBSP, soft hyphen) become U+0100.. in byte order (space is U+0120,
// shown as 'Ġ'). A tokenizer.json's BPE vocabulary and merges are written in this alphabet;
// text/ keeps them as the raw bytes they stand for.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace loom::text {

// The code point byte `b` is written as.
char32_t byte_level_char(uint8_t b);

// The bytes a string of byte-level code points stands for, or nullopt when `token` (UTF-8)
// holds a code point outside the alphabet (an added token such as "<|end of text|>" with a
// real space, which ByteLevel's decoder then passes through as its own UTF-8).
std::optional<std::string> byte_level_decode(std::string_view token);

// `bytes` written in the byte-level alphabet (UTF-8).
std::string byte_level_encode(std::string_view bytes);

}  // namespace loom::text
