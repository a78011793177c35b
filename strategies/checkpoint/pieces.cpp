#include "strategies/checkpoint/pieces.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/tags.h"
#include "tensor/safetensors.h"

namespace loom::strategies::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string checksum_text(uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

std::string shape_text(const Shape& shape) {
  return json(shape).dump();
}

std::pair<int64_t, int64_t> box_extent(const Shape& offsets, const Shape& sizes, const Shape& shape,
                                       const std::string& what) {
  if (offsets.size() != shape.size() || sizes.size() != shape.size())
    tag::kCheckpoint.fail(what, ": a box of ", offsets.size(), " dimensions in a tensor of ",
                          shape.size());
  int64_t first = 0, count = 1;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (offsets[d] < 0 || sizes[d] < 0 || offsets[d] > shape[d] || sizes[d] > shape[d] - offsets[d])
      tag::kCheckpoint.fail(what, ": box ", shape_text(offsets), " + ", shape_text(sizes),
                            " leaves the tensor's shape ", shape_text(shape));
    first = first * shape[d] + offsets[d];
    count *= sizes[d];
  }
  return {first, count};
}

std::vector<ShardRun> runs_of(const Shard& shard, const Shape& shape) {
  if (shard.sizes.empty()) return {{shard.begin, 0, shard.end - shard.begin}};
  const size_t dims = shape.size();
  if (dims == 0) return {{0, 0, 1}};
  std::vector<int64_t> stride(dims, 1);
  for (size_t d = dims - 1; d-- > 0;)
    stride[d] = stride[d + 1] * shape[d + 1];
  const int64_t row = shard.sizes[dims - 1];
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < dims; ++d)
    rows *= shard.sizes[d];
  std::vector<ShardRun> runs;
  if (row == 0) return runs;
  std::vector<int64_t> index(dims, 0);  // within the box, the last dimension left at 0
  for (int64_t r = 0; r < rows; ++r) {
    int64_t global = 0;
    for (size_t d = 0; d < dims; ++d)
      global += (shard.offsets[d] + index[d]) * stride[d];
    const int64_t local = r * row;
    if (!runs.empty() && runs.back().global + runs.back().length == global &&
        runs.back().local + runs.back().length == local) {
      runs.back().length += row;
    } else {
      runs.push_back({global, local, row});
    }
    for (size_t d = dims - 1; d-- > 0;) {  // the next row: an odometer over the leading dims
      if (++index[d] < shard.sizes[d]) break;
      index[d] = 0;
    }
  }
  return runs;
}

void write_pieces(const fs::path& path, const std::vector<TensorPiece>& pieces,
                  uint64_t block_bytes) {
  if (block_bytes == 0) tag::kCheckpoint.fail("write_pieces: block_bytes must be positive");
  safetensors::TensorMap stored;
  json described = json::object();
  for (const TensorPiece& piece : pieces) {
    const Tensor host = piece.values.to(Device::cpu()).contiguous();
    if (host.dim() != 1)
      tag::kCheckpoint.fail("write_pieces: piece of ", piece.name, " is not 1-D");
    const bool box = !piece.sizes.empty();
    std::string key = piece.name + "@";
    if (box) {
      const int64_t count = box_extent(piece.offsets, piece.sizes, piece.shape, piece.name).second;
      if (count != host.numel())
        tag::kCheckpoint.fail("write_pieces: box of ", piece.name, " holds ", count,
                              " elements, values ", host.numel());
      for (size_t d = 0; d < piece.offsets.size(); ++d) {
        if (d > 0) key += ',';
        key += std::to_string(piece.offsets[d]);
      }
    } else {
      key += std::to_string(piece.begin);
    }
    if (!stored.emplace(key, host).second)
      tag::kCheckpoint.fail("write_pieces: ", key, " given twice for ", path.string());
    json checksums = json::array();
    const auto* bytes = static_cast<const char*>(host.raw_data());
    for (uint64_t at = 0; at < host.nbytes(); at += block_bytes) {
      const uint64_t length = std::min<uint64_t>(block_bytes, host.nbytes() - at);
      checksums.push_back(checksum_text(XXH3_64bits(bytes + at, length)));
    }
    described[key] = {{"tensor", piece.name}, {"shape", piece.shape}, {"xxh3", std::move(checksums)}};
    if (box) {
      described[key]["offsets"] = piece.offsets;
      described[key]["sizes"] = piece.sizes;
    } else {
      described[key]["begin"] = piece.begin;
    }
  }
  safetensors::save(path, stored,
                    {{kPiecesMetadataKey, described.dump()}, {kBlockBytesMetadataKey, std::to_string(block_bytes)}});
}

}  // namespace loom::strategies::checkpoint
