#pragma once
// Reading and writing the safetensors format (https://github.com/huggingface/safetensors),
// the checkpoint format Loom shares with PyTorch and the Hugging Face tools.
//
// A file is: an 8-byte little-endian u64 N; N bytes of UTF-8 JSON mapping each tensor name
// to {"dtype", "shape", "data_offsets": [begin, end]} plus an optional "__metadata__"
// object of string values; then the data buffer, with offsets relative to its start.
// Loom reads and writes the dtypes F64, F32, F16, BF16, I64, I32 and U8.
//
// Every function here throws loom::Error with a message that starts with "[safetensors]"
// and the file (or origin) it concerns, says what was wrong and what was expected.

#include <cstddef>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::safetensors {

using TensorMap = std::map<std::string, Tensor>;      // sorted by name
using Metadata = std::map<std::string, std::string>;  // the "__metadata__" object

struct Contents {
  TensorMap tensors;
  Metadata metadata;
};

// Writes `tensors` and `metadata` to `path` atomically: the bytes go to a temporary file in
// the same directory, which is fsynced and renamed over `path`, and then the directory is
// fsynced. If anything fails, `path` keeps its old contents (or stays absent) and no
// temporary file is left behind.
// Tensors may have any layout and live on any device that to(Device::cpu()) supports; they
// are saved as their logical (row-major) values, without recording autograd history. The
// name "__metadata__" is reserved; names and metadata must be valid UTF-8.
// Blocks until the data is durable.
void save(const std::filesystem::path& path, const TensorMap& tensors,
          const Metadata& metadata = {});

// Reads and fully validates the file at `path` (see parse()); returns CPU tensors with their
// own storage. Nothing is returned unless the whole file is valid.
Contents load(const std::filesystem::path& path);

// Validates `bytes` as a safetensors file and copies every tensor out of it (the result does
// not refer to `bytes`). Rejected, each with its own message: a file shorter than 8 bytes, a
// header length past the end, a header that is not a JSON object (or has duplicate keys), an
// entry with a missing or mistyped dtype/shape/data_offsets, an unknown or unsupported dtype,
// offsets that are reversed or past the buffer, tensors that overlap or leave bytes of the
// buffer unused, a byte count that does not match shape and dtype, non-string metadata.
// `origin` names the source in messages (load() passes the path).
Contents parse(std::span<const std::byte> bytes, const std::string& origin);

// A file's header without its data, for readers that take only some bytes of a large file
// (distributed checkpoints read ranges of tensors). Validated as parse() validates it (the
// tensors tile the data buffer, which runs to the end of the file); offsets are absolute
// (from the start of the file), so a tensor's bytes are [begin, end) of the file.
struct HeaderEntry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};
struct Header {
  Metadata metadata;
  std::vector<HeaderEntry> tensors;  // in file order
  uint64_t data_start = 0;           // 8 + the header's length
  uint64_t file_size = 0;
};
Header read_header(const std::filesystem::path& path);

// The bytes save() would write: header padded with spaces to a multiple of 8 bytes, then the
// tensors' data in ascending name order, each right after the previous one.
std::vector<std::byte> serialize(const TensorMap& tensors, const Metadata& metadata = {});

}  // namespace loom::safetensors
