#include "text/tokenizer.h"

#include <cstdio>

#include "core/regular_file.h"
#include "core/tags.h"
#include "text/byte_level.h"
#include "text/detail/tokenizer_state.h"
#include "text/unicode.h"

namespace loom::text {

Tokenizer::Tokenizer(std::unique_ptr<State> state) : state_(std::move(state)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::filesystem::path& path) {
  return from_json(read_regular_file(path, tag::kTokenizer, "Hugging Face tokenizer.json"),
                   path.string());
}

std::vector<uint32_t> Tokenizer::encode(std::string_view text, EncodeOptions options) const {
  std::vector<uint32_t> ids;
  ids.reserve(text.size() / 3);
  encode(text, ids, options);
  return ids;
}

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& out,
                       EncodeOptions options) const {
  if (const std::optional<size_t> bad = find_invalid_utf8(text)) {
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(text[*bad]));
    tag::kTokenizer.fail("the text to encode is not well-formed UTF-8: byte ", byte, " at offset ",
                         *bad, " does not start a valid sequence; expected UTF-8 text");
  }
  const State& s = *state_;
  thread_local std::vector<Segment> segments;
  s.added.split(text, options.match_special_tokens, segments);
  for (const Segment& segment : segments) {
    if (segment.token != Segment::kText) {
      out.push_back(segment.token);
      continue;
    }
    split(s.pattern, segment.text, [&](std::string_view word) { s.bpe.encode_word(word, out); });
  }
}

std::string Tokenizer::decode(std::span<const uint32_t> ids, bool skip_special_tokens) const {
  const State& s = *state_;
  std::string bytes;
  bytes.reserve(ids.size() * 4);
  for (size_t i = 0; i < ids.size(); ++i) {
    const uint32_t id = ids[i];
    if (id >= s.vocab_size) {
      tag::kTokenizer.fail("decode: id ", id, " at index ", i, " is not a token of ", s.origin,
                           "; expected ids below its vocabulary size ", s.vocab_size);
    }
    if (skip_special_tokens && s.special[id]) continue;
    bytes.append(s.decode_bytes, s.decode_offsets[id],
                 s.decode_offsets[id + 1] - s.decode_offsets[id]);
  }
  return utf8_lossy(bytes);
}

uint32_t Tokenizer::vocab_size() const {
  return state_->vocab_size;
}

std::optional<uint32_t> Tokenizer::token_id(std::string_view token) const {
  const State& s = *state_;
  for (const AddedToken& added : s.added.tokens()) {
    if (added.content == token) return added.id;
  }
  if (find_invalid_utf8(token)) return std::nullopt;
  if (const std::optional<std::string> bytes = byte_level_decode(token))
    return s.bpe.token_of(*bytes);
  const auto it = s.other_tokens.find(std::string(token));
  if (it == s.other_tokens.end()) return std::nullopt;
  return it->second;
}

uint32_t Tokenizer::document_start() const {
  return token_id("<|begin_of_text|>").value_or(end_of_text());
}

uint32_t Tokenizer::end_of_text() const {
  for (std::string_view name : {"<|endoftext|>", "<|end_of_text|>"}) {
    if (const std::optional<uint32_t> id = token_id(name)) return *id;
  }
  tag::kTokenizer.fail(state_->origin,
                       ": has no end-of-text token; expected <|endoftext|> (GPT-2) ",
                       "or <|end_of_text|> (Llama 3)");
}

const std::string& Tokenizer::origin() const {
  return state_->origin;
}

}  // namespace loom::text
