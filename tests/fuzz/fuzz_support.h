#pragma once
// What the harnesses share: a scratch directory for the parsers that read files.
//
// Each process makes one directory, loom-fuzz-<pid> under the temporary directory ($TMPDIR,
// or /tmp), writes every input into the same few files there, and removes the directory
// when it exits normally. A process that dies on a finding cannot clean up after itself:
// scripts/fuzz.sh points TMPDIR at a directory of its own and removes that.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace loom::fuzz {

class ScratchDirectory {
 public:
  ScratchDirectory()
      : path_(std::filesystem::temp_directory_path() /
              ("loom-fuzz-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~ScratchDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  ScratchDirectory(const ScratchDirectory&) = delete;
  ScratchDirectory& operator=(const ScratchDirectory&) = delete;

  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// This process's scratch directory, made on first use.
inline const std::filesystem::path& scratch_directory() {
  static const ScratchDirectory directory;
  return directory.path();
}

// Replaces the contents of `path` with `data`. A harness that cannot write its input has
// nothing to test: it stops the run rather than report every input as passing.
inline void write_file(const std::filesystem::path& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  out.close();
  if (!out) {
    std::fprintf(stderr, "fuzz harness: cannot write %s\n", path.c_str());
    std::abort();
  }
}

}  // namespace loom::fuzz
