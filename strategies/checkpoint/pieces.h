#pragma once
// Pieces of a distributed checkpoint's tensors and where their elements sit (docs/
// checkpoints.md): a piece is a run of a global tensor's elements in row-major order or a box
// of it; a shard is a piece as a file holds it, with the checksums of its blocks. Files carry
// their pieces as ordinary safetensors tensors, so Python's safetensors reads them; which
// global tensor a stored tensor belongs to is in the file's metadata (kPiecesMetadataKey,
// written by write_pieces). tensor_index.h indexes the shards of a checkpoint's files.

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
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

// A box's place in a tensor of `shape` (whose element count fits in int64): its first
// element and element count; throws loom::Error naming `what` when it does not fit.
std::pair<int64_t, int64_t> box_extent(const Shape& offsets, const Shape& sizes, const Shape& shape,
                                       const std::string& what);

// The file metadata write_pieces writes: where each stored tensor belongs ("loom.pieces"), and
// the checksum block size ("loom.block_bytes").
inline constexpr const char* kPiecesMetadataKey = "loom.pieces";
inline constexpr const char* kBlockBytesMetadataKey = "loom.block_bytes";
// A checksum as index.json and the metadata spell it: 16 lowercase hex digits.
std::string checksum_text(uint64_t checksum);
// A shape as messages and the metadata spell it: [2,3].
std::string shape_text(const Shape& shape);

}  // namespace loom::strategies::checkpoint
