#include "tools/train_gpt/data_sources.h"

#include <array>
#include <cstring>

#include "core/regular_file.h"
#include "core/tags.h"
#include "data/token_shards.h"

namespace loom::train_gpt {

namespace {

constexpr uint32_t kLlmcMagics[] = {20240520, 20240801};  // llmc-gpt2, llmc-llama3

// Whether the regular file `path` starts with an llm.c header's magic.
bool starts_with_llmc_magic(const std::string& path, const char* flag) {
  uint64_t size = 0;
  FileDescriptor fd =
      open_regular_file(path, tag::kTrainGpt, std::string(flag) + " file", size);
  if (size < 4) return false;
  std::array<unsigned char, 4> head{};
  if (::pread(fd.get(), head.data(), head.size(), 0) != 4) return false;
  const uint32_t magic = static_cast<uint32_t>(head[0]) | static_cast<uint32_t>(head[1]) << 8 |
                         static_cast<uint32_t>(head[2]) << 16 |
                         static_cast<uint32_t>(head[3]) << 24;
  for (uint32_t m : kLlmcMagics)
    if (magic == m) return true;
  return false;
}

data::TokenBlocks shards(const std::string& path, std::optional<data::ShardFormat> format,
                         const BlockShape& s) {
  return data::TokenBlocks(
      std::make_shared<data::ShardedTokens>(data::ShardedTokens::open(path, format)), s.batch,
      s.time, s.vocab, s.shuffle, s.seed);
}

data::TokenBlocks memory_blocks(std::vector<int32_t> tokens, const BlockShape& s) {
  return data::TokenBlocks(std::move(tokens), s.batch, s.time, s.vocab, s.shuffle, s.seed);
}

}  // namespace

bool is_glob(const std::string& path) {
  return path.find_first_of("*?[") != std::string::npos;
}

data::TokenBlocks text_blocks(const std::string& text, const text::Tokenizer& tokenizer,
                              const BlockShape& shape) {
  // llm.c's convention (as loom-tokenize writes shards): the document-start token first.
  std::vector<uint32_t> ids{tokenizer.document_start()};
  tokenizer.encode(text, ids, {.match_special_tokens = false});
  return memory_blocks(std::vector<int32_t>(ids.begin(), ids.end()), shape);
}

data::TokenBlocks open_blocks(const std::string& path, const std::string& format,
                              const text::Tokenizer* tokenizer, const char* flag,
                              const BlockShape& shape) {
  if (format != "auto" && format != "bytes" && format != "text")
    return shards(path, data::parse_shard_format(format), shape);
  if (format == "auto" && (is_glob(path) || starts_with_llmc_magic(path, flag)))
    return shards(path, std::nullopt, shape);
  if (is_glob(path)) {
    tag::kTrainGpt.fail(flag, " ", path, " is a glob, which names token files; --data-format ",
                        format, " reads one file");
  }
  const std::string contents =
      read_regular_file(path, tag::kTrainGpt, std::string(flag) + " file");
  if (format == "text" && tokenizer == nullptr) {
    tag::kTrainGpt.fail("--data-format text needs --tokenizer (a Hugging Face tokenizer.json)");
  }
  if (tokenizer != nullptr && format != "bytes") return text_blocks(contents, *tokenizer, shape);
  return memory_blocks(data::byte_tokens({contents.begin(), contents.end()}), shape);
}

}  // namespace loom::train_gpt
