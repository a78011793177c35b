#pragma once
// The tokens --data and --val-data name (docs/data.md, "train_gpt's data"): token files
// (llm.c's .bin shards, recognised by their magic, or a glob of them; nanoGPT's raw uint16
// files with --data-format raw-u16), memory-mapped; a text file tokenized with --tokenizer
// (one document, preceded by Tokenizer::document_start() as llm.c's scripts and loom-tokenize
// do); or, without a tokenizer, a file's bytes as tokens 0..255.

#include <memory>
#include <string>

#include "data/token_blocks.h"
#include "text/tokenizer.h"

namespace loom::train_gpt {

// What --data-format accepts: auto, bytes, text, llmc-gpt2, llmc-llama3, raw-u16.
inline constexpr const char* kDataFormats[] = {"auto",      "bytes",       "text",
                                               "llmc-gpt2", "llmc-llama3", "raw-u16"};

// How train_gpt cuts its data into blocks (data/token_blocks.h).
struct BlockShape {
  int64_t batch = 0, time = 0, vocab = 0;
  bool shuffle = false;
  uint64_t seed = 0;
};

// The blocks of `path` (`flag` names it in messages) read as `format`. auto: a glob or a file
// starting with an llm.c magic is a shard set (ids checked as blocks are read), anything else
// text when `tokenizer` is given, else bytes (both checked against the vocabulary here).
// Throws loom::Error naming the flag and the file for what cannot be read (text without a
// tokenizer, text that is not UTF-8, the shard errors of data/token_shards.h).
data::TokenBlocks open_blocks(const std::string& path, const std::string& format,
                              const text::Tokenizer* tokenizer, const char* flag,
                              const BlockShape& shape);
// `text` tokenized as one document (Tokenizer::document_start() first), in blocks.
data::TokenBlocks text_blocks(const std::string& text, const text::Tokenizer& tokenizer,
                              const BlockShape& shape);

// True when `path` is a glob(3) pattern (holds *, ? or [) rather than one file.
bool is_glob(const std::string& path);

}  // namespace loom::train_gpt
