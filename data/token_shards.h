#pragma once
// Token files on disk, read as their owners define them:
//  - llm.c's .bin shards (karpathy/llm.c, dev/data/data_common.py): a header of 256 int32,
//    little-endian: [0] magic, [1] version, [2] token count, the rest zero; then the tokens.
//      llmc-gpt2:   magic 20240520, version 1, uint16 tokens
//      llmc-llama3: magic 20240801, version 7, uint32 tokens
//  - nanoGPT's raw files (data/*/prepare.py, np.memmap(..., dtype=np.uint16)): uint16 tokens,
//    no header; nothing in the file says what it is, so it is read only when asked for.
// Every error is loom::Error "[data] PATH: ...", saying what was expected and what was found.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string_view>

namespace loom::data {

enum class ShardFormat { kLlmcGpt2, kLlmcLlama3, kRawU16 };

// "llmc-gpt2", "llmc-llama3" or "raw-u16" (what --data-format takes); anything else throws
// loom::Error listing the accepted names.
ShardFormat parse_shard_format(std::string_view text);
std::string_view name(ShardFormat format);
// Bytes per token: 2 for llmc-gpt2 and raw-u16, 4 for llmc-llama3.
int64_t token_width(ShardFormat format);

// Writes `tokens` to `path` in `format`, atomically (core/atomic_file.h: the old file or the
// whole new one, never a mix). Throws loom::Error, writing nothing, for no tokens, a token too
// large for a uint16 format (naming the token, its index and the format to use instead), or
// more than INT32_MAX tokens in an llm.c format (its header counts them in an int32).
void write_token_shard(const std::filesystem::path& path, std::span<const uint32_t> tokens,
                       ShardFormat format);

// One token file, memory-mapped read-only: the tokens stay in the page cache, never copied
// whole into the process. open() validates the file completely (below); afterwards reads are
// plain loads, safe from any number of threads at once. The file must not be truncated while
// it is open (the mapping would fault); write_token_shard and llm.c replace files whole.
class TokenShard {
 public:
  // Maps `path`, which must be a regular file (FIFOs, devices, directories are refused).
  // With a format, the file must be in it; without one an llm.c header is recognised by its
  // magic, and a file without a known magic is refused (a raw-u16 file must be named so).
  // Refused: a version not matching the magic, a header token count different from
  // (size - 1024) / token width (a truncated or overlong file), an odd-sized raw-u16 file, a
  // file with no tokens.
  static TokenShard open(const std::filesystem::path& path, std::optional<ShardFormat> format);

  TokenShard(TokenShard&& other) noexcept;
  TokenShard& operator=(TokenShard&& other) noexcept;
  TokenShard(const TokenShard&) = delete;
  TokenShard& operator=(const TokenShard&) = delete;
  ~TokenShard();  // unmaps

  int64_t size() const { return size_; }  // tokens (> 0)
  ShardFormat format() const { return format_; }
  const std::filesystem::path& path() const { return path_; }
  // Tokens [start, start + count) widened to int64 into out[0, count). Throws loom::Error
  // unless 0 <= start, 0 <= count and start + count <= size().
  void copy(int64_t start, int64_t count, int64_t* out) const;

 private:
  TokenShard(std::filesystem::path path, ShardFormat format, void* mapping, size_t mapped_bytes,
             int64_t header_bytes, int64_t size);

  std::filesystem::path path_;
  ShardFormat format_ = ShardFormat::kRawU16;
  void* mapping_ = nullptr;  // the whole file; nullptr once moved from
  size_t mapped_bytes_ = 0;
  const std::byte* tokens_ = nullptr;  // mapping_ + the header's bytes
  int64_t size_ = 0;
};

}  // namespace loom::data
