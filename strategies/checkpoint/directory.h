#pragma once
// A directory of training checkpoints, one subdirectory per saved step (docs/checkpoints.md):
//
//   ROOT/step-00000042/           a checkpoint: its files, then COMMITTED, written last
//   ROOT/.step-00000042.partial/  one being written: never read, removed by the next save
//
// A save writes every file into the partial directory (each one atomic and fsynced), fsyncs
// it, renames it to step-N, fsyncs ROOT, and only then writes and fsyncs COMMITTED. So a
// crash at any moment leaves either the previous checkpoints untouched and a partial (or
// uncommitted) directory, which readers skip, or the new checkpoint complete.
//
// Ranks: every rank writes its own files into staging(step) (the directory is shared: one
// host, or a shared file system); rank 0 alone calls prepare() before and commit() after
// (with barriers around, done by the caller).

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

#include "core/file_descriptor.h"

namespace loom::strategies::checkpoint {

class Directory {
 public:
  explicit Directory(std::filesystem::path root);

  const std::filesystem::path& root() const { return root_; }
  std::filesystem::path staging(int64_t step) const;
  std::filesystem::path committed_path(int64_t step) const;

  // Rank 0, before any rank writes: creates ROOT and an empty staging(step) (removing a
  // stale one). Throws loom::Error naming ROOT when it cannot be created or written.
  void prepare(int64_t step) const;
  // Rank 0, after every rank wrote: makes staging(step) the committed step-N checkpoint.
  std::filesystem::path commit(int64_t step) const;
  // Deletes the oldest committed checkpoints beyond `keep_last` (0 keeps all), and any
  // partial or uncommitted directory except a newer-than-latest partial being written.
  void prune(int keep_last) const;

  // The committed checkpoints, oldest first (step order).
  std::vector<std::filesystem::path> committed() const;
  std::optional<std::filesystem::path> latest() const;

  static bool is_committed(const std::filesystem::path& checkpoint);
  static constexpr const char* kMarker = "COMMITTED";

 private:
  std::filesystem::path root_;
};

// The run that saves under a checkpoint directory holds ROOT/.lock (flock(2), taken by rank 0
// for the run's life and released by the kernel when the process ends, even by SIGKILL): a
// second run started on the same ROOT is refused at once, naming the holder's host and pid,
// instead of failing later on the first run's half-written step. The file's content is
// "HOST PID"; it stays when the run ends (an unlocked .lock means nothing).
class DirectoryLock {
 public:
  // Creates ROOT if needed; throws loom::Error when another process holds the lock or ROOT
  // cannot be written.
  explicit DirectoryLock(const std::filesystem::path& root);
  static constexpr const char* kLockFile = ".lock";

 private:
  FileDescriptor file_;  // its lock lives as long as the descriptor
};

// Makes the written directory `staging` the committed checkpoint `target`: fsyncs its files
// and itself, renames it (over an uncommitted leftover), fsyncs the parent, then writes and
// fsyncs the COMMITTED marker. What Directory::commit does for a step.
void commit_directory(const std::filesystem::path& staging, const std::filesystem::path& target);

// Parses "step-00000042" (any directory name of that form); nullopt otherwise.
std::optional<int64_t> step_of(const std::filesystem::path& checkpoint);

}  // namespace loom::strategies::checkpoint
