#pragma once
// A byte-level BPE tokenizer read from a Hugging Face tokenizer.json, whose encode and decode
// give what the `tokenizers` library (0.23) gives for the same file, for the GPT-2 and
// Llama 3 families:
//   added tokens split out of the text (text/added_tokens.h), then the text split by GPT-2's
//   or Llama 3's regex (text/pre_tokenizer.h), then each piece's bytes merged by BPE
//   (text/bpe.h); decode maps tokens back to bytes (text/byte_level.h) and repairs invalid
//   UTF-8 as Rust's from_utf8_lossy does.
// A file needing anything else (another model, a normalizer, byte fallback, another
// pre-tokenizer, regex or decoder, added tokens with lstrip, rstrip or single_word) is
// refused with one line naming the file, the field and what was expected (docs/data.md,
// "Tokenizer"). Errors are loom::Error "[tokenizer] ...".

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace loom::text {

struct EncodeOptions {
  // Added tokens marked special (<|endoftext|>, <|begin_of_text|>, ...) found in the text
  // become their ids, as tokenizers' encode does by default. false: they are encoded as the
  // plain text they are (tokenizers' encode_special_tokens = True, tiktoken's encode_ordinary,
  // what llm.c's data scripts do), so that a document cannot forge a control token.
  bool match_special_tokens = true;
};

class Tokenizer {
 public:
  // Reads and checks a tokenizer.json (a regular file: FIFOs and devices are refused).
  static Tokenizer from_file(const std::filesystem::path& path);
  // The same from the file's text; `origin` names it in messages.
  static Tokenizer from_json(std::string_view json, const std::string& origin);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // tokenizers' encode(text, add_special_tokens=False).ids: the post-processor (Llama 3's
  // <|begin_of_text|> template) is not applied. `text` must be well-formed UTF-8 (a Python
  // str always is); anything else is refused, naming the first bad byte's offset. Any thread
  // may call it, concurrently with others.
  std::vector<uint32_t> encode(std::string_view text, EncodeOptions options = {}) const;
  // The same, appended to `out`.
  void encode(std::string_view text, std::vector<uint32_t>& out, EncodeOptions options = {}) const;

  // tokenizers' decode(ids, skip_special_tokens): the tokens' bytes, with ill-formed UTF-8
  // (a multi-byte character cut between tokens) replaced by U+FFFD. Unlike tokenizers, which
  // drops an id it does not know, an id >= vocab_size() is an error naming it and its index.
  std::string decode(std::span<const uint32_t> ids, bool skip_special_tokens = true) const;

  // The number of ids: the model's vocabulary and the added tokens beyond it (50257 for
  // GPT-2, 128256 for Llama 3). Every id below it is a token.
  uint32_t vocab_size() const;
  // The id of a token written as in tokenizer.json (byte-level text for the model's tokens,
  // e.g. "Ġthe"; added tokens as their content), added tokens first, as token_to_id.
  std::optional<uint32_t> token_id(std::string_view token) const;
  // <|endoftext|> (GPT-2) or else <|end_of_text|> (Llama 3); an error naming the file when
  // it has neither.
  uint32_t end_of_text() const;
  // The token llm.c's data scripts put before each document: <|begin_of_text|> when the file
  // has it (Llama 3: tokenizer.encode('')[0]), else end_of_text() (GPT-2's <|endoftext|>).
  uint32_t document_start() const;
  // The file it was read from, for messages.
  const std::string& origin() const;

 private:
  struct State;
  explicit Tokenizer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace loom::text
