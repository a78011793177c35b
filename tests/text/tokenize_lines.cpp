// The Loom side of tests/text/differential_tokenizers.py: reads requests from stdin and
// writes one answer per request to stdout, all little-endian.
//   tokenize_lines TOKENIZER.json < requests > answers
// A request is an operation byte, a uint32 byte count and that many bytes:
//   'e' text -> ids of encode(text)          'o' the same, special tokens as plain text
//   'd' uint32 ids -> decode(ids)             'D' the same, special tokens kept
//   'g' / 'l' text -> the byte lengths of its pre-tokens by GPT-2's / Llama 3's regex
//   'c' text -> one CharClass byte per code point
// An answer is a status byte (0 ok, 1 loom::Error) and a uint32 count, then for 'e', 'o',
// 'g', 'l' that many uint32, for 'd', 'D', 'c' and errors (the message) that many bytes.

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"
#include "text/pre_tokenizer.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace {

using loom::text::Tokenizer;

void put_u32(std::string& out, uint32_t value) {
  out.append(reinterpret_cast<const char*>(&value), 4);
}

void put_ids(std::string& out, const std::vector<uint32_t>& ids) {
  out.push_back(0);
  put_u32(out, static_cast<uint32_t>(ids.size()));
  if (!ids.empty()) out.append(reinterpret_cast<const char*>(ids.data()), ids.size() * 4);
}

void put_bytes(std::string& out, uint8_t status, const std::string& bytes) {
  out.push_back(static_cast<char>(status));
  put_u32(out, static_cast<uint32_t>(bytes.size()));
  out.append(bytes);
}

void answer(const Tokenizer& tokenizer, char op, const std::string& payload, std::string& out) {
  switch (op) {
    case 'e':
    case 'o': put_ids(out, tokenizer.encode(payload, {.match_special_tokens = op == 'e'})); return;
    case 'd':
    case 'D': {
      std::vector<uint32_t> ids(payload.size() / 4);
      if (!ids.empty()) std::memcpy(ids.data(), payload.data(), ids.size() * 4);
      put_bytes(out, 0, tokenizer.decode(ids, op == 'd'));
      return;
    }
    case 'g':
    case 'l': {
      std::vector<uint32_t> lengths;
      split(
          op == 'g' ? loom::text::SplitPattern::kGpt2 : loom::text::SplitPattern::kLlama3, payload,
          [&](std::string_view piece) { lengths.push_back(static_cast<uint32_t>(piece.size())); });
      put_ids(out, lengths);
      return;
    }
    case 'c': {
      const auto& classes = loom::text::CharClasses::get();
      std::string result;
      const auto* p = reinterpret_cast<const unsigned char*>(payload.data());
      for (size_t i = 0; i < payload.size();) {
        size_t length = 0;
        result.push_back(static_cast<char>(classes(loom::text::decode_utf8(p + i, length))));
        i += length;
      }
      put_bytes(out, 0, result);
      return;
    }
    default: throw loom::Error(std::string("unknown operation '") + op + "'");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: tokenize_lines TOKENIZER.json < requests > answers\n");
    return 2;
  }
  try {
    const Tokenizer tokenizer = Tokenizer::from_file(argv[1]);
    std::cin.tie(nullptr);
    const std::string input((std::istreambuf_iterator<char>(std::cin)),
                            std::istreambuf_iterator<char>());
    std::string out;
    size_t at = 0;
    while (at < input.size()) {
      if (input.size() - at < 5) throw loom::Error("truncated request header");
      const char op = input[at];
      uint32_t size = 0;
      std::memcpy(&size, input.data() + at + 1, 4);
      if (input.size() - at - 5 < size) throw loom::Error("truncated request");
      const std::string payload = input.substr(at + 5, size);
      at += 5 + size;
      try {
        answer(tokenizer, op, payload, out);
      } catch (const loom::Error& e) {
        put_bytes(out, 1, e.what());
      }
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    return std::fflush(stdout) == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenize_lines: %s\n", e.what());
    return 1;
  }
}
