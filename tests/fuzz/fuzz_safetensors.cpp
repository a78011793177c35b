// Fuzzes the safetensors reader (tensor/safetensors.h) with the input as a whole file:
//  - parse() on the bytes in memory: what load() runs on its read-only mapping of a file;
//  - read_header() on the same bytes written to a file: what the distributed checkpoints use
//    to read ranges of large files (its own reads, header-only validation).
//
// Contract: every function of safetensors.h throws loom::Error, and only that, for a file
// that is not valid. That is all this harness catches. Anything else is a finding: a
// nlohmann::json exception or std::out_of_range escaping the reader, std::bad_alloc (or
// libFuzzer's malloc limit) from an allocation sized by the header instead of by the file,
// or a sanitizer report.

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/error.h"
#include "tensor/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace st = loom::safetensors;
  try {
    st::parse(std::span(reinterpret_cast<const std::byte*>(data), size), "fuzz input");
  } catch (const loom::Error&) {
  }

  static const std::filesystem::path file = loom::fuzz::scratch_directory() / "input.safetensors";
  loom::fuzz::write_file(file, data, size);
  try {
    st::read_header(file);
  } catch (const loom::Error&) {
  }
  return 0;
}
