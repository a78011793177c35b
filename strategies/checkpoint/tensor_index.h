#pragma once
// The index of a distributed checkpoint (docs/checkpoints.md, "index.json"): for every
// global tensor its dtype and shape, and the shards that hold it. A shard is a run of the
// tensor's elements in row-major order, [begin, end), stored in a safetensors file of the
// checkpoint at bytes [byte_begin, byte_end) of that file, with XXH3-64 checksums of its
// consecutive blocks of `block_bytes` bytes (the last one shorter), so that a reader that
// needs part of a shard reads and checks only the blocks it overlaps. PyTorch DCP's metadata
// and Hugging Face's model.safetensors.index.json hold the same idea.
//
// This file reads, validates and writes index.json; the geometry of pieces and shards, and the
// files that carry pieces, are pieces.h's. A file without pieces metadata (a full
// model.safetensors written with checked_file.h's per-tensor checksums) holds whole tensors
// under their own names, one block each.

#include <cstdint>
#include <filesystem>
#include <istream>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "strategies/checkpoint/pieces.h"
#include "tensor/tensor.h"

namespace loom::strategies::checkpoint {


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
