// Fuzzes the reader of a distributed checkpoint's index.json (Index::read, tensor_index.h),
// as every loader reaches it: CheckpointReader on a directory whose index.json is the input,
// beside the files of a real two-rank save (checkpoint_fixture.h; the seeds are indexes of
// those files). When the index is accepted, every tensor it lists is read through it, whole
// and as a box (read_every_tensor), so that the shards, byte ranges and checksum blocks the
// index claims drive real reads of those files.
//
// Contract (checkpoint_reader.h, tensor_index.h): CheckpointReader's constructor and its
// reads throw loom::Error for an index that is unreadable, inconsistent or does not match
// the files, and for data that fails its checksums. Index::read turns the exceptions of
// nlohmann::json into loom::Error itself. So loom::Error is all this harness catches: any
// other exception escaping, an allocation sized by the index rather than by the files
// (std::bad_alloc, libFuzzer's malloc limit), a read that does not end (libFuzzer's
// -timeout), or a sanitizer report is a finding.

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "core/error.h"
#include "strategies/checkpoint/checkpoint_reader.h"
#include "strategies/checkpoint/tensor_index.h"
#include "tests/fuzz/checkpoint_fixture.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace ckpt = loom::strategies::checkpoint;
  const std::filesystem::path& directory = loom::fuzz::fixture_directory();
  loom::fuzz::write_file(directory / ckpt::kIndexFile, data, size);
  try {
    ckpt::CheckpointReader reader(directory);
    loom::fuzz::read_every_tensor(reader);
  } catch (const loom::Error&) {
  }
  return 0;
}
