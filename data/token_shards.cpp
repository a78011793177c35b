#include "data/token_shards.h"

#include <sys/mman.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/atomic_file.h"
#include "core/regular_file.h"
#include "core/tags.h"

namespace loom::data {

// The header is read and written as the host's int32s and the tokens as its uint16/uint32:
// llm.c's files are little-endian, as every host Loom builds for is.
static_assert(std::endian::native == std::endian::little, "token shards are little-endian");

namespace {

constexpr int64_t kLlmcHeaderInts = 256;
constexpr int64_t kLlmcHeaderBytes = kLlmcHeaderInts * 4;

struct LlmcHeader {
  ShardFormat format;
  int32_t magic;
  int32_t version;
};
constexpr LlmcHeader kLlmcHeaders[] = {{ShardFormat::kLlmcGpt2, 20240520, 1},
                                       {ShardFormat::kLlmcLlama3, 20240801, 7}};

const LlmcHeader* llmc_header_with_magic(int32_t magic) {
  for (const LlmcHeader& header : kLlmcHeaders)
    if (header.magic == magic) return &header;
  return nullptr;
}

const LlmcHeader& llmc_header_of(ShardFormat format) {
  for (const LlmcHeader& header : kLlmcHeaders)
    if (header.format == format) return header;
  tag::kData.fail(name(format), " has no llm.c header");
}

int32_t header_int(const std::byte* file, int64_t index) {
  int32_t value = 0;
  std::memcpy(&value, file + index * 4, sizeof value);
  return value;
}

// The refusal of a file whose first int32 is no llm.c magic (or not the one asked for).
[[noreturn]] void fail_unknown_magic(const std::filesystem::path& path,
                                     std::optional<ShardFormat> format, int32_t first) {
  std::string expected = "an llm.c magic (20240520 for llmc-gpt2, 20240801 for llmc-llama3)";
  if (format) {
    expected =
        std::string(name(*format)) + "'s magic " + std::to_string(llmc_header_of(*format).magic);
  }
  tag::kData.fail(path.string(), ": the first int32 is ", first, ", not ", expected,
                  "; nanoGPT's raw uint16 files have no header: read them with "
                  "--data-format raw-u16");
}

}  // namespace

ShardFormat parse_shard_format(std::string_view text) {
  for (ShardFormat format :
       {ShardFormat::kLlmcGpt2, ShardFormat::kLlmcLlama3, ShardFormat::kRawU16}) {
    if (text == name(format)) return format;
  }
  tag::kData.fail("unknown token file format '", text,
                  "'; expected llmc-gpt2, llmc-llama3 or raw-u16");
}

std::string_view name(ShardFormat format) {
  switch (format) {
    case ShardFormat::kLlmcGpt2: return "llmc-gpt2";
    case ShardFormat::kLlmcLlama3: return "llmc-llama3";
    case ShardFormat::kRawU16: return "raw-u16";
  }
  return "unknown";
}

int64_t token_width(ShardFormat format) {
  return format == ShardFormat::kLlmcLlama3 ? 4 : 2;
}

void write_token_shard(const std::filesystem::path& path, std::span<const uint32_t> tokens,
                       ShardFormat format) {
  const int64_t count = static_cast<int64_t>(tokens.size());
  const int64_t width = token_width(format);
  const bool llmc = format != ShardFormat::kRawU16;
  if (count == 0) {
    tag::kData.fail(path.string(), ": no tokens to write; a token file holds at least one");
  }
  if (llmc && count > std::numeric_limits<int32_t>::max()) {
    tag::kData.fail(path.string(), ": ", count, " tokens do not fit the int32 count of an ",
                    name(format), " header (at most ", std::numeric_limits<int32_t>::max(),
                    "); split them into several shards");
  }
  if (width == 2) {
    for (int64_t i = 0; i < count; ++i) {
      if (tokens[i] > std::numeric_limits<uint16_t>::max()) {
        tag::kData.fail(path.string(), ": token ", tokens[i], " at index ", i, " does not fit ",
                        name(format),
                        "'s uint16 tokens (at most 65535); write llmc-llama3 "
                        "(uint32 tokens) instead");
      }
    }
  }
  const int64_t header_bytes = llmc ? kLlmcHeaderBytes : 0;
  std::vector<std::byte> bytes(static_cast<size_t>(header_bytes + count * width));
  if (llmc) {
    const LlmcHeader& header = llmc_header_of(format);
    const int32_t fields[3] = {header.magic, header.version, static_cast<int32_t>(count)};
    std::memcpy(bytes.data(), fields, sizeof fields);  // the other 253 ints stay zero
  }
  std::byte* out = bytes.data() + header_bytes;
  if (width == 2) {
    for (int64_t i = 0; i < count; ++i) {
      const auto token = static_cast<uint16_t>(tokens[i]);
      std::memcpy(out + i * 2, &token, 2);
    }
  } else {
    std::memcpy(out, tokens.data(), static_cast<size_t>(count) * 4);
  }
  write_file_atomically(path, bytes, tag::kData);
}

TokenShard TokenShard::open(const std::filesystem::path& path, std::optional<ShardFormat> format) {
  uint64_t file_bytes = 0;
  const FileDescriptor file = open_regular_file(
      path, tag::kData, "token file (an llm.c .bin shard or raw uint16 tokens)", file_bytes);
  if (file_bytes == 0) {
    tag::kData.fail(path.string(), ": the file is empty; expected at least one token");
  }
  // A private read-only mapping of the whole file: pages are read when a block touches them.
  void* mapping = ::mmap(nullptr, file_bytes, PROT_READ, MAP_PRIVATE, file.get(), 0);
  if (mapping == MAP_FAILED) {
    tag::kData.fail(path.string(), ": mmap of ", file_bytes, " bytes failed: ", errno_text(errno));
  }
  // Owned from here, so that a refusal below unmaps it.
  TokenShard shard(path, format.value_or(ShardFormat::kRawU16), mapping, file_bytes, 0, 0);
  const auto* bytes = static_cast<const std::byte*>(mapping);
  const auto size = static_cast<int64_t>(file_bytes);

  if (format == ShardFormat::kRawU16) {
    if (size % 2 != 0) {
      tag::kData.fail(path.string(), ": ", size,
                      " bytes, an odd size; a raw-u16 file holds 2-byte tokens");
    }
    shard.size_ = size / 2;
    return shard;
  }

  // An llm.c shard, named or recognised by its magic.
  if (size < 4) {
    tag::kData.fail(path.string(), ": ", size, " bytes, too short for llm.c's ", kLlmcHeaderBytes,
                    "-byte header; nanoGPT's raw uint16 files have no header: read them with "
                    "--data-format raw-u16");
  }
  const int32_t magic = header_int(bytes, 0);
  const LlmcHeader* header = llmc_header_with_magic(magic);
  if (header == nullptr) fail_unknown_magic(path, format, magic);
  if (format && header->format != *format) {
    tag::kData.fail(path.string(), ": header magic ", magic, " is ", name(header->format),
                    "'s; expected ", name(*format), "'s ", llmc_header_of(*format).magic);
  }
  if (size < kLlmcHeaderBytes) {
    tag::kData.fail(path.string(), ": ", size, " bytes, shorter than the ", kLlmcHeaderBytes,
                    "-byte header of ", name(header->format));
  }
  const int32_t version = header_int(bytes, 1);
  if (version != header->version) {
    tag::kData.fail(path.string(), ": header version ", version, " with magic ", magic,
                    "; expected version ", header->version, " (", name(header->format), ")");
  }
  const int32_t count = header_int(bytes, 2);
  const int64_t width = token_width(header->format);
  const int64_t data_bytes = size - kLlmcHeaderBytes;
  if (count != data_bytes / width || data_bytes % width != 0) {
    std::string stray;
    if (data_bytes % width != 0)
      stray = " and " + std::to_string(data_bytes % width) + " stray byte(s)";
    tag::kData.fail(path.string(), ": the header counts ", count, " tokens but the file holds ",
                    data_bytes / width, " tokens", stray, " (", data_bytes, " bytes after the ",
                    kLlmcHeaderBytes, "-byte header, ", width, " per ", name(header->format),
                    " token); the file is truncated or overlong");
  }
  if (count == 0) {
    tag::kData.fail(path.string(), ": the header counts 0 tokens; expected at least one");
  }
  shard.format_ = header->format;
  shard.tokens_ = bytes + kLlmcHeaderBytes;
  shard.size_ = count;
  return shard;
}

TokenShard::TokenShard(std::filesystem::path path, ShardFormat format, void* mapping,
                       size_t mapped_bytes, int64_t header_bytes, int64_t size)
    : path_(std::move(path)),
      format_(format),
      mapping_(mapping),
      mapped_bytes_(mapped_bytes),
      tokens_(static_cast<const std::byte*>(mapping) + header_bytes),
      size_(size) {}

TokenShard::TokenShard(TokenShard&& other) noexcept
    : path_(std::move(other.path_)),
      format_(other.format_),
      mapping_(std::exchange(other.mapping_, nullptr)),
      mapped_bytes_(std::exchange(other.mapped_bytes_, 0)),
      tokens_(std::exchange(other.tokens_, nullptr)),
      size_(std::exchange(other.size_, 0)) {}

TokenShard& TokenShard::operator=(TokenShard&& other) noexcept {
  if (this != &other) {
    if (mapping_ != nullptr) ::munmap(mapping_, mapped_bytes_);
    path_ = std::move(other.path_);
    format_ = other.format_;
    mapping_ = std::exchange(other.mapping_, nullptr);
    mapped_bytes_ = std::exchange(other.mapped_bytes_, 0);
    tokens_ = std::exchange(other.tokens_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

TokenShard::~TokenShard() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapped_bytes_);
}

void TokenShard::copy(int64_t start, int64_t count, int64_t* out) const {
  if (start < 0 || count < 0 || start > size_ - count) {
    tag::kData.fail(path_.string(), ": tokens [", start, ", ", start, " + ", count,
                    ") asked for; the shard holds ", size_);
  }
  // Plain widening loops, which the compiler vectorises; the mapping is page-aligned and the
  // header 1024 bytes, so the tokens are aligned for their type.
  if (token_width(format_) == 2) {
    const auto* tokens = reinterpret_cast<const uint16_t*>(tokens_) + start;
    for (int64_t i = 0; i < count; ++i)
      out[i] = tokens[i];
  } else {
    const auto* tokens = reinterpret_cast<const uint32_t*>(tokens_) + start;
    for (int64_t i = 0; i < count; ++i)
      out[i] = tokens[i];
  }
}

}  // namespace loom::data
