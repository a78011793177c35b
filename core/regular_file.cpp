#include "core/regular_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

namespace loom {

FileDescriptor open_regular_file(const std::filesystem::path& path, const Tag& component,
                                 std::string_view expected, uint64_t& size) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer (for a regular
  // file the flag changes nothing).
  FileDescriptor file(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (file.get() < 0) {
    component.fail(path.string(), ": cannot open for reading: ", errno_text(errno),
                   "; expected an existing, readable ", expected);
  }
  struct stat status {};
  if (::fstat(file.get(), &status) != 0)
    component.fail(path.string(), ": fstat failed: ", errno_text(errno));
  if (!S_ISREG(status.st_mode))
    component.fail(path.string(), ": is not a regular file (a FIFO, device, socket or directory); expected ", expected);
  size = static_cast<uint64_t>(status.st_size);
  return file;
}

std::string read_regular_file(const std::filesystem::path& path, const Tag& component,
                              std::string_view expected) {
  uint64_t size = 0;
  const FileDescriptor file = open_regular_file(path, component, expected, size);
  std::string bytes(size, '\0');
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t got = ::read(file.get(), bytes.data() + done, bytes.size() - done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) component.fail(path.string(), ": reading failed: ", errno_text(errno));
    if (got == 0)
      component.fail(path.string(), ": ended after ", done, " of its ", size, " bytes (it shrank while being read)");
    done += static_cast<size_t>(got);
  }
  return bytes;
}

}  // namespace loom
