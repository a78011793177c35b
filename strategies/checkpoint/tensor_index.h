#pragma once
// The index of a distributed checkpoint (docs/checkpoints.md, "index.json"): for every
// global tensor its dtype and shape, and the shards that hold it. A shard is a run of the
// tensor's elements in row-major order, [begin, end), stored in a safetensors file of the
// checkpoint at bytes [byte_begin, byte_end) of that file, with XXH3-64 checksums of its
// consecutive blocks of `block_bytes` bytes (the last one shorter), so that a reader that
// needs part of a shard reads and checks only the blocks it overlaps. PyTorch DCP's metadata
// and Hugging Face's model.safetensors.index.json hold the same idea.
//
// Files carry their pieces as ordinary safetensors tensors, so Python's safetensors reads
// them; which global tensor a stored tensor belongs to is in the file's metadata
// ("loom.pieces", written by write_pieces). A file without it (a full model.safetensors
// written with checked_file.h's per-tensor checksums) holds whole tensors under their own
// names, one block each.

#include <cstdint>
#include <filesystem>
#include <istream>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::strategies::checkpoint {

// A part of the global tensor `name` of shape `shape`: elements [begin, begin +
// values.numel()) of its row-major flattening (a run: what data parallel and ZeRO ranks
// hold), or, when `sizes` is given, the box of elements offsets[d] .. offsets[d] + sizes[d]
// along every dimension d (a slice: what a tensor-parallel rank holds, e.g. a block of
// columns), its elements in row-major order. `values` is 1-D, in the tensor's dtype, on any
// device.
struct TensorPiece {
  std::string name;
  Shape shape;
  int64_t begin = 0;
  Tensor values;
  Shape offsets = {}, sizes = {};  // a box instead of a run
};

// Writes `pieces` into the safetensors file `path` (atomic, durable), each stored as
// "<name>@<begin>", with their place and the checksums of their blocks of `block_bytes` in
// the metadata.
inline constexpr uint64_t kChecksumBlockBytes = 1 << 20;
void write_pieces(const std::filesystem::path& path, const std::vector<TensorPiece>& pieces,
                  uint64_t block_bytes = kChecksumBlockBytes);

struct Shard {
  std::string file;  // a plain file name in the checkpoint directory (no '/')
  // A run: elements [begin, end) of the global tensor. A box (sizes not empty): the slice
  // offsets[d] .. offsets[d] + sizes[d], row-major; begin is its first element's index and
  // end - begin its element count.
  int64_t begin = 0, end = 0;
  Shape offsets = {}, sizes = {};
  uint64_t byte_begin = 0, byte_end = 0;
  uint64_t block_bytes = 0;
  std::vector<uint64_t> checksums;  // XXH3-64 per block
};

// Where a shard's elements sit: elements [global, global + length) of the tensor are the
// shard's elements [local, local + length). A run is one; a box one per row of its last
// dimension (merged where consecutive).
struct ShardRun {
  int64_t global, local, length;
};
std::vector<ShardRun> runs_of(const Shard& shard, const Shape& shape);

struct TensorEntry {
  DType dtype = DType::F32;
  Shape shape;
  std::vector<Shard> shards;  // sorted by begin; their runs tile [0, numel) exactly
};

struct Index {
  std::map<std::string, TensorEntry> tensors;
  std::map<std::string, uint64_t> file_bytes;  // every file's size when it was indexed

  // Builds the index of `files` (names relative to `checkpoint`) from their headers alone;
  // throws loom::Error when two files disagree on a tensor's dtype or shape, or its shards
  // leave elements out or hold some twice.
  static Index of_files(const std::filesystem::path& checkpoint,
                        const std::vector<std::string>& files);
  // Reads `checkpoint`/index.json, validated as of_files() validates, and takes it only when
  // it is exactly what of_files() gives for the files it lists: every file's header is read
  // and checked (safetensors.h: names, dtypes, shapes, offsets inside the data buffer, no
  // overlaps) and must give the same tensors, dtypes, shapes and shards, so that an edited
  // index, a damaged header or a file replaced since the save is an error here, not wrong
  // bytes later. Files must be plain names inside `checkpoint`. Every message names the file
  // and what was wrong.
  static Index read(const std::filesystem::path& checkpoint);
  // Writes it as `checkpoint`/index.json (synced by the checkpoint's commit).
  void write(const std::filesystem::path& checkpoint) const;

  const TensorEntry& at(const std::string& name, const std::filesystem::path& checkpoint) const;
};

inline constexpr const char* kIndexFile = "index.json";

// Parses `in` as the JSON file `origin` (index.json, meta.json): it must hold one JSON object,
// and no object in it may give a key twice (a parser keeps one of the values silently, so a
// damaged file could pass for a valid one). Throws loom::Error naming `origin`, what was wrong
// and what is expected.
nlohmann::json parse_json_object(std::istream& in, const std::string& origin);

}  // namespace loom::strategies::checkpoint
