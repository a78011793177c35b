#include "strategies/checkpoint/checkpoint_reader.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdint>
#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/tags.h"

namespace loom::strategies::checkpoint {

namespace fs = std::filesystem;

CheckpointReader::CheckpointReader(fs::path checkpoint)
    : path_(std::move(checkpoint)), index_(Index::read(path_)) {}

CheckpointReader::~CheckpointReader() {
  for (const auto& [file, fd] : open_)
    ::close(fd);
}

int CheckpointReader::descriptor(const std::string& file) {
  auto found = open_.find(file);
  if (found != open_.end()) return found->second;
  const fs::path path = path_ / file;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) tag::kCheckpoint.fail("cannot open ", path.string(), ": ", std::strerror(errno));
  open_.emplace(file, fd);
  return fd;
}

void CheckpointReader::read_into(const std::string& name, int64_t begin, Tensor& out) {
  read_runs(name, {{begin, 0, out.numel()}}, out);
}

void CheckpointReader::read_box(const std::string& name, const Shape& offsets, const Shape& sizes,
                                Tensor& out) {
  const TensorEntry& e = entry(name);
  Shard box;  // the box as a shard of the tensor: its runs are what to read
  box.offsets = offsets;
  box.sizes = sizes;
  int64_t count = 1;
  for (size_t d = 0; d < sizes.size(); ++d) {
    if (d >= e.shape.size() || offsets[d] < 0 || offsets[d] + sizes[d] > e.shape[d]) {
      tag::kCheckpoint.fail(path_.string(), ": box ", shape_str(offsets), " + ", shape_str(sizes),
                            " of tensor '", name, "', whose shape is ", shape_str(e.shape));
    }
    count *= sizes[d];
  }
  if (sizes.size() != e.shape.size() || count != out.numel()) {
    tag::kCheckpoint.fail(path_.string(), ": a box of ", count, " elements of tensor '", name,
                          "' read into ", out.str());
  }
  read_runs(name, runs_of(box, e.shape), out);
}

void CheckpointReader::read_runs(const std::string& name, const std::vector<ShardRun>& wanted,
                                 Tensor& out) {
  const TensorEntry& e = entry(name);
  int64_t numel = 1;
  for (int64_t d : e.shape)
    numel *= d;
  if (out.dtype() != e.dtype || !out.is_contiguous() || out.device() != Device::cpu()) {
    tag::kCheckpoint.fail(path_.string(), ": tensor '", name, "' is ", dtype_name(e.dtype),
                          "; it cannot be read into ", out.str());
  }
  for (const ShardRun& w : wanted) {
    if (w.global < 0 || w.global + w.length > numel || w.local + w.length > out.numel()) {
      tag::kCheckpoint.fail(path_.string(), ": elements [", w.global, ", ", w.global + w.length,
                            ") of tensor '", name, "', which has ", numel);
    }
  }
  const uint64_t element = dtype_size(e.dtype);
  auto* into = static_cast<char*>(out.raw_data());
  std::vector<char> buffer;
  struct Copy {
    int64_t local, length, to;  // shard elements [local, local + length) -> out[to, ...)
  };
  for (const Shard& shard : e.shards) {
    auto cached = runs_.find(&shard);
    if (cached == runs_.end()) cached = runs_.emplace(&shard, runs_of(shard, e.shape)).first;
    std::vector<Copy> copies;
    for (const ShardRun& run : cached->second) {
      for (const ShardRun& w : wanted) {
        const int64_t lo = std::max(w.global, run.global);
        const int64_t hi = std::min(w.global + w.length, run.global + run.length);
        if (lo < hi) copies.push_back({run.local + (lo - run.global), hi - lo, w.local + (lo - w.global)});
      }
    }
    if (copies.empty()) continue;
    // The checksum blocks [first, last] that hold the shard bytes [from, to) the copies need.
    uint64_t from = UINT64_MAX, to = 0;
    for (const Copy& c : copies) {
      from = std::min<uint64_t>(from, static_cast<uint64_t>(c.local) * element);
      to = std::max<uint64_t>(to, static_cast<uint64_t>(c.local + c.length) * element);
    }
    const uint64_t first = from / shard.block_bytes, last = (to - 1) / shard.block_bytes;
    const uint64_t read_from = first * shard.block_bytes;
    const uint64_t read_to =
        std::min((last + 1) * shard.block_bytes, shard.byte_end - shard.byte_begin);
    buffer.resize(read_to - read_from);
    const int fd = descriptor(shard.file);
    for (uint64_t done = 0; done < buffer.size();) {
      const ssize_t n = ::pread(fd, buffer.data() + done, buffer.size() - done,
                                static_cast<off_t>(shard.byte_begin + read_from + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        tag::kCheckpoint.fail(
            "reading tensor '", name, "' from ", (path_ / shard.file).string(),
            " failed: ", n < 0 ? std::strerror(errno) : "the file ends early (truncated)");
      }
      done += static_cast<uint64_t>(n);
    }
    bytes_read_ += buffer.size();
    for (uint64_t block = first; block <= last; ++block) {
      const uint64_t at = block * shard.block_bytes - read_from;
      const uint64_t length = std::min<uint64_t>(shard.block_bytes, buffer.size() - at);
      const uint64_t sum = XXH3_64bits(buffer.data() + at, length);
      if (sum != shard.checksums[block]) {
        tag::kCheckpoint.fail(
            (path_ / shard.file).string(), ": tensor '", name, "' is corrupt (bytes ",
            shard.byte_begin + block * shard.block_bytes, " to ",
            shard.byte_begin + block * shard.block_bytes + length,
            " of the file fail their checksum); the file was damaged after it was written: "
            "restore it or resume from an earlier checkpoint");
      }
    }
    for (const Copy& c : copies) {
      std::memcpy(into + static_cast<uint64_t>(c.to) * element,
                  buffer.data() + (static_cast<uint64_t>(c.local) * element - read_from),
                  static_cast<uint64_t>(c.length) * element);
    }
  }
}

Tensor CheckpointReader::read(const std::string& name) {
  const TensorEntry& e = entry(name);
  int64_t numel = 1;
  for (int64_t d : e.shape)
    numel *= d;
  Tensor flat = Tensor::empty({numel}, e.dtype, Device::cpu());
  read_into(name, 0, flat);
  return flat.reshape(e.shape);
}

}  // namespace loom::strategies::checkpoint
