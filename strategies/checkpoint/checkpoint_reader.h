#pragma once
// Reads the tensors of a checkpoint through its index (tensor_index.h): any run of any
// tensor's elements, taking from each shard file only the checksum blocks the run overlaps
// and checking each one, so that a rank loading its part of a resharded model reads about
// its part of the bytes, and a flipped byte is an error naming the file and the tensor.

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>

#include "strategies/checkpoint/tensor_index.h"

namespace loom::strategies::checkpoint {

class CheckpointReader {
 public:
  // Reads and validates index.json (missing or truncated files are errors here).
  explicit CheckpointReader(std::filesystem::path checkpoint);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const std::filesystem::path& path() const { return path_; }
  const Index& index() const { return index_; }
  bool contains(const std::string& name) const { return index_.tensors.count(name) != 0; }
  // The entry of `name`; throws loom::Error naming the checkpoint when it has none.
  const TensorEntry& entry(const std::string& name) const { return index_.at(name, path_); }

  // Elements [begin, begin + out.numel()) of `name` into `out` (1-D, contiguous, on the CPU,
  // of the tensor's dtype). Throws loom::Error for a range past the tensor, another dtype, a
  // read error or a block whose checksum differs (naming the file, tensor and bytes).
  void read_into(const std::string& name, int64_t begin, Tensor& out);
  // The box offsets[d] .. offsets[d] + sizes[d] of `name` into `out` (contiguous, on the CPU,
  // of the tensor's dtype, row-major, the product of sizes elements).
  void read_box(const std::string& name, const Shape& offsets, const Shape& sizes, Tensor& out);
  // The whole tensor, in its shape.
  Tensor read(const std::string& name);
  // Bytes read from the files so far (for tests and reports).
  uint64_t bytes_read() const { return bytes_read_; }

 private:
  int descriptor(const std::string& file);
  // Reads the runs `wanted` (elements [global, global + length) of the tensor into `out` at
  // element `local`), each shard's blocks once.
  void read_runs(const std::string& name, const std::vector<ShardRun>& wanted, Tensor& out);

  std::filesystem::path path_;
  Index index_;
  std::map<std::string, int> open_;  // file -> descriptor
  std::map<const Shard*, std::vector<ShardRun>> runs_;  // computed once per shard
  uint64_t bytes_read_ = 0;
};

}  // namespace loom::strategies::checkpoint
