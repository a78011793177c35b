// loom-tokenize: text files to one token file for train_gpt --data, with a Hugging Face
// tokenizer.json (text/tokenizer.h: tokenizers' ids for the GPT-2 and Llama 3 families).
//
//   loom-tokenize --tokenizer tokenizer.json --output OUT.bin [--format FORMAT] INPUT...
//
// Each INPUT (a regular file of UTF-8 text) is one document, preceded by the token llm.c's
// dev/data scripts put before each document: GPT-2's <|endoftext|> (tiktoken's eot), and for
// Llama 3 <|begin_of_text|> (they take tokenizer.encode('')[0], 128000, and call it EOT); a
// tokenizer with neither <|begin_of_text|> nor <|endoftext|> uses <|end_of_text|>. Special
// tokens' text inside a document is encoded as plain text (tiktoken's encode_ordinary,
// transformers' split_special_tokens=True, as llm.c does), so that a document cannot forge one.
// FORMAT (data/token_shards.h): llmc-gpt2 (uint16; the default when every id fits), llmc-llama3
// (uint32; the default otherwise) or raw-u16 (nanoGPT's). The output is written atomically, after
// every input is read. Prints the throughput on stderr at the end. Exit 0, 1 on an error (one
// line), CLI11's codes on bad flags.

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "core/regular_file.h"
#include "core/tags.h"
#include "data/token_shards.h"
#include "text/tokenizer.h"
#include "text/unicode.h"

namespace {

using loom::data::ShardFormat;
namespace tag = loom::tag;

int run(const std::string& tokenizer_path, const std::string& output,
        const std::optional<std::string>& format_name, const std::vector<std::string>& inputs) {
  const loom::text::Tokenizer tokenizer = loom::text::Tokenizer::from_file(tokenizer_path);
  const uint32_t separator = tokenizer.document_start();
  const bool fits_u16 = tokenizer.vocab_size() <= 65536;
  const ShardFormat format = format_name
                                 ? loom::data::parse_shard_format(*format_name)
                                 : (fits_u16 ? ShardFormat::kLlmcGpt2 : ShardFormat::kLlmcLlama3);
  if (loom::data::token_width(format) == 2 && !fits_u16) {
    tag::kLoomTokenize.fail("--format ", loom::data::name(format), " holds ids below 65536, but ",
                            tokenizer_path, " has ", tokenizer.vocab_size(),
                            "; expected --format llmc-llama3");
  }

  std::vector<uint32_t> tokens;
  double encode_seconds = 0;
  uint64_t bytes = 0;
  for (const std::string& input : inputs) {
    const std::string text = loom::read_regular_file(input, tag::kLoomTokenize, "UTF-8 text file");
    if (const std::optional<size_t> bad = loom::text::find_invalid_utf8(text)) {
      char byte[8];
      std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(text[*bad]));
      tag::kLoomTokenize.fail(input, ": byte ", byte, " at offset ", *bad,
                              " does not start a valid UTF-8 sequence; expected UTF-8 text");
    }
    const auto start = std::chrono::steady_clock::now();
    tokens.push_back(separator);
    tokenizer.encode(text, tokens, {.match_special_tokens = false});
    encode_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    bytes += text.size();
  }
  loom::data::write_token_shard(output, tokens, format);
  const double seconds = std::max(encode_seconds, 1e-9);
  std::fprintf(stderr,
               "loom-tokenize: %zu documents, each after token %u, %llu bytes -> %zu tokens (%s) "
               "in %.3f s: %.0f tokens/s, %.2f MB/s\n",
               inputs.size(), separator, static_cast<unsigned long long>(bytes), tokens.size(),
               std::string(loom::data::name(format)).c_str(), encode_seconds,
               static_cast<double>(tokens.size()) / seconds,
               static_cast<double>(bytes) / seconds / 1e6);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "loom-tokenize: text files to one llm.c token shard, with a Hugging Face tokenizer.json"};
  std::string tokenizer_path;
  std::string output;
  std::optional<std::string> format;
  std::vector<std::string> inputs;
  app.add_option("--tokenizer", tokenizer_path, "a tokenizer.json (GPT-2 or Llama 3 family)")
      ->required();
  app.add_option("--output", output, "the token file to write")->required();
  app.add_option("--format", format,
                 "llmc-gpt2, llmc-llama3 or raw-u16 (default: llmc-gpt2 when "
                 "every id fits 16 bits, else llmc-llama3)")
      ->check(CLI::IsMember({"llmc-gpt2", "llmc-llama3", "raw-u16"}));
  app.add_option("inputs", inputs, "text files, one document each")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    return run(tokenizer_path, output, format, inputs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
