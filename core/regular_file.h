#pragma once
// Input files opened only when they are regular files: a FIFO with no writer would block
// the reader forever, and a device such as /dev/zero would be read without end.

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/file_descriptor.h"

namespace loom {

// Opens `path` for reading (without blocking, whatever it is), then refuses anything but a
// regular file. Its size goes to `size`. Errors are loom::Error "[component] PATH: what: why;
// expected EXPECTED" (e.g. "a safetensors file").
FileDescriptor open_regular_file(const std::filesystem::path& path, const Tag& component,
                                 std::string_view expected, uint64_t& size);

// The whole of a regular file (open_regular_file's checks, then every byte; a short read
// is an error).
std::string read_regular_file(const std::filesystem::path& path, const Tag& component,
                              std::string_view expected);

}  // namespace loom
