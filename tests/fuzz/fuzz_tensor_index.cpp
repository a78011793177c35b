// Fuzzes the building of a checkpoint's index from its files' headers (Index::of_files,
// tensor_index.h: the "loom.pieces" metadata that write_pieces writes, or the per-tensor
// checksums of a full model file), with the input as rank 0's file of a save. The index is
// built as the saving rank 0 builds it (write_index): over the input alone (a save of one
// rank), and when that is refused, over the input and rank 1's file of a real save
// (checkpoint_fixture.h; rank 0's file of that save is a seed). An accepted index is written
// (Index::write) and loaded back through CheckpointReader, and every tensor is read through
// it (read_every_tensor), as a resumed run would.
//
// Contract (tensor_index.h, checkpoint_reader.h, safetensors.h): of_files, write, the reader
// and its reads throw loom::Error for a file that is not a valid checkpoint file, an index
// that does not hold together, or data that fails its checksums. That is all this harness
// catches: any other exception (from nlohmann::json, std::stoull, ...), an allocation sized
// by metadata rather than by the file, a read that does not end (libFuzzer's -timeout), or a
// sanitizer report is a finding.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "core/error.h"
#include "strategies/checkpoint/checkpoint_reader.h"
#include "strategies/checkpoint/distributed_state.h"
#include "strategies/checkpoint/tensor_index.h"
#include "tests/fuzz/checkpoint_fixture.h"
#include "tests/fuzz/fuzz_support.h"

namespace {

namespace ckpt = loom::strategies::checkpoint;

std::optional<ckpt::Index> index_of(const std::vector<std::string>& files) {
  try {
    return ckpt::Index::of_files(loom::fuzz::fixture_directory(), files);
  } catch (const loom::Error&) {
    return std::nullopt;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::filesystem::path& directory = loom::fuzz::fixture_directory();
  const std::string input = ckpt::rank_file(0);
  loom::fuzz::write_file(directory / input, data, size);
  std::optional<ckpt::Index> index = index_of({input});
  if (!index) index = index_of({input, ckpt::rank_file(1)});
  if (!index) return 0;
  try {
    index->write(directory);
    ckpt::CheckpointReader reader(directory);
    loom::fuzz::read_every_tensor(reader);
  } catch (const loom::Error&) {
  }
  return 0;
}
