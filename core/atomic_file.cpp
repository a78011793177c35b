#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <string>

#include "core/fault_points.h"
#include "core/file_descriptor.h"

namespace loom {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISDIR(mode)) return "a directory";
  return "not a regular file";
}

// Removes the temporary file unless the rename succeeded; never throws.
class TemporaryFile {
 public:
  explicit TemporaryFile(std::filesystem::path path) : path_(std::move(path)) {}
  ~TemporaryFile() {
    if (!committed_) ::unlink(path_.c_str());
  }
  TemporaryFile(const TemporaryFile&) = delete;
  TemporaryFile& operator=(const TemporaryFile&) = delete;
  const std::filesystem::path& path() const { return path_; }
  void commit() { committed_ = true; }

 private:
  std::filesystem::path path_;
  bool committed_ = false;
};

// The errno a fault hook injects at `point` (tests only), else that of a system call that
// returned `result` (0 when it succeeded).
int failure(std::string_view point, int result) {
  const int error = result < 0 ? errno : 0;
  if (const int injected = fault::at(point)) return injected;
  return error;
}

}  // namespace

void check_replaceable_file(const std::filesystem::path& path, const Tag& component,
                            std::string_view flag) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) return;
  const std::string named = flag.empty() ? path.string() : std::string(flag) + " " + path.string();
  component.fail(named, " exists and is ", kind_of(st.st_mode),
                 "; outputs are written to a new file renamed over the old one, which would "
                 "replace it: give the name of a regular file or of a new one");
}

void write_file_atomically(const std::filesystem::path& path, std::span<const std::byte> bytes,
                           const Tag& component) {
  const std::string origin = path.string();
  auto refuse = [&](const auto&... parts) { component.fail(origin, ": ", parts...); };
  if (!path.has_filename())
    refuse("path has no file name; expected a path to a file, not a directory");
  check_replaceable_file(path, component);
  const std::filesystem::path directory =
      path.parent_path().empty() ? std::filesystem::path(".") : path.parent_path();

  // O_EXCL with a name unique to this process and call; the 0666 mode is narrowed by the
  // umask like any newly created file.
  static std::atomic<uint64_t> counter{0};
  int fd = -1;
  std::filesystem::path temporary_path;
  for (int attempt = 0; attempt < 100 && fd < 0; ++attempt) {
    std::string name = ".";
    name += path.filename().string();
    name += ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
    temporary_path = directory / name;
    fd = ::open(temporary_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) {
    refuse("cannot create temporary file ", temporary_path.string(), ": ", errno_text(errno),
           "; expected a writable directory ", directory.string());
  }
  FileDescriptor file(fd);
  TemporaryFile temporary(temporary_path);

  const std::byte* data = bytes.data();
  size_t remaining = bytes.size();
  while (remaining > 0) {
    const ssize_t written = ::write(file.get(), data, std::min<size_t>(remaining, 1u << 30));
    if (const int error = failure("file.write", written < 0 ? -1 : 0)) {
      if (error == EINTR) continue;
      refuse("writing ", bytes.size(), " bytes to ", temporary.path().string(), " failed after ",
             bytes.size() - remaining, " bytes: ", errno_text(error));
    }
    data += written;
    remaining -= static_cast<size_t>(written);
  }
  int error = fault::at("file.before_fsync");
  if (error == 0 && ::fsync(file.get()) != 0) error = errno;
  if (error != 0) refuse("fsync of ", temporary.path().string(), " failed: ", errno_text(error));
  if (file.close() != 0) refuse("close of ", temporary.path().string(), " failed: ", errno_text(errno));
  error = fault::at("file.before_rename");
  if (error == 0 && ::rename(temporary.path().c_str(), path.c_str()) != 0) error = errno;
  if (error != 0)
    refuse("renaming ", temporary.path().string(), " over it failed: ", errno_text(error));
  temporary.commit();

  // Some file systems cannot fsync a directory (EINVAL); the rename is then as durable as
  // that file system makes it.
  error = fault::at("file.after_rename");
  FileDescriptor dir(::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (error == 0 && dir.get() < 0) error = errno;
  if (error == 0 && ::fsync(dir.get()) != 0 && errno != EINVAL) error = errno;
  if (error != 0) {
    refuse("the file was written, but fsync of its directory ", directory.string(),
           " failed: ", errno_text(error), "; the rename may not survive a crash");
  }
}

void write_file_atomically(const std::filesystem::path& path, std::string_view text,
                           const Tag& component) {
  write_file_atomically(
      path, std::span<const std::byte>(reinterpret_cast<const std::byte*>(text.data()), text.size()),
      component);
}

}  // namespace loom
