#pragma once
// Files written so that a crash at any moment leaves either the old file or the whole new
// one, never a mix: Loom's one way to write an output (safetensors files, checkpoint
// metadata, traces, flight-recorder dumps).

#include <cstddef>
#include <filesystem>
#include <span>
#include <string_view>

#include "core/error.h"

namespace loom {

// Writes `bytes` to `path`: a temporary file in the same directory (created with O_EXCL),
// written, fsynced, renamed over `path`, then the directory fsynced. A `path` that exists and
// is not a regular file (a FIFO, a device, a socket, a directory) is refused before anything
// is written: the rename would replace it. Errors are loom::Error "[component] PATH: what
// failed: why" (the temporary file is removed). Fault points file.* (core/fault_points.h).
void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes,
                           const Tag& component);
void write_file_atomically(const std::filesystem::path& path, std::string_view text,
                           const Tag& component);

// The refusal alone, for a tool checking its outputs before any work: throws loom::Error
// "[component] FLAG PATH exists and is a FIFO/..." when `path` exists and is not a regular file.
void check_replaceable_file(const std::filesystem::path& path, const Tag& component,
                            std::string_view flag = "");

}  // namespace loom
