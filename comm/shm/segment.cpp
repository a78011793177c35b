#include "comm/shm/segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "comm/error.h"
#include "core/tags.h"
#include "core/tunables.h"

namespace loom::comm::shm {

namespace {

std::string random_hex(size_t count) {
  unsigned char bytes[16];
  size_t got = 0;
  count = std::min(count, sizeof bytes);
  while (got < count) {
    ssize_t n = getrandom(bytes + got, count - got, 0);
    if (n < 0 && errno != EINTR)
      throw CommError(tag::kCommShm.prefix() + "getrandom failed: " + std::string(strerror(errno)));
    if (n > 0) got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string text;
  for (size_t i = 0; i < count; ++i) {
    text += hex[bytes[i] >> 4];
    text += hex[bytes[i] & 15];
  }
  return text;
}

// The job id from the environment ("" outside a launcher), checked once.
const std::string& job_id_from_env() {
  static const std::string id = [] {
    const char* text = tunable_value(tunables::kJobId);
    std::string value = text != nullptr ? text : "";
    const bool valid = value.size() <= 64 && std::all_of(value.begin(), value.end(), [](char c) {
                         return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
                       });
    if (!valid) {
      throw CommError((tag::kCommShm.prefix()) + tunables::kJobId.name + "='" + value +
                      "' is not a job id (at most 64 letters, digits or '_'; launchers set it)");
    }
    return value;
  }();
  return id;
}

std::string job_prefix(const std::string& job_id) {
  return job_id.empty() ? "loom-" : "loom-" + job_id + "-";
}

std::string random_name() {
  std::string name = "/";  // appended to: GCC 12 warns falsely on "/" + a temporary string
  name += job_prefix(job_id_from_env());
  name += random_hex(16);
  return name;
}

void* map(int fd, size_t bytes, const std::string& name) {
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    throw CommError(tag::kCommShm.prefix() + "mmap of " + name + " (" + std::to_string(bytes) +
                    " bytes) failed: " + strerror(errno));
  }
  return data;
}

}  // namespace

std::string new_job_id() {
  return random_hex(8);
}

int remove_job_segments(const std::string& job_id) {
  if (job_id.empty()) return 0;
  const std::string prefix = job_prefix(job_id);
  int removed = 0;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && shm_unlink(("/" + name).c_str()) == 0) ++removed;
  }
  return removed;
}

Segment Segment::create(size_t bytes) {
  Segment s;
  s.name_ = random_name();
  int fd = shm_open(s.name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0)
    throw CommError(tag::kCommShm.prefix() + "shm_open(" + s.name_ +
                    ") failed: " + strerror(errno));
  s.owner_ = true;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int error = errno;
    close(fd);
    shm_unlink(s.name_.c_str());
    throw CommError(tag::kCommShm.prefix() + "cannot size the segment to " + std::to_string(bytes) +
                    " bytes: " + strerror(error) + " (is /dev/shm large enough?)");
  }
  try {
    s.data_ = map(fd, bytes, s.name_);
  } catch (...) {
    close(fd);
    shm_unlink(s.name_.c_str());
    throw;
  }
  close(fd);
  s.size_ = bytes;
  return s;
}

Segment Segment::open(const std::string& name, size_t bytes) {
  Segment s;
  s.name_ = name;
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  if (fd < 0)
    throw CommError(tag::kCommShm.prefix() + "shm_open(" + name + ") failed: " + strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    throw CommError(tag::kCommShm.prefix() + "segment " + name + " has " +
                    std::to_string(st.st_size) + " bytes, expected " + std::to_string(bytes) +
                    " (ranks disagree on the group size)");
  }
  try {
    s.data_ = map(fd, bytes, name);
  } catch (...) {
    close(fd);
    throw;
  }
  close(fd);
  s.size_ = bytes;
  return s;
}

Segment::Segment(Segment&& other) noexcept {
  *this = std::move(other);
}

Segment& Segment::operator=(Segment&& other) noexcept {
  std::swap(name_, other.name_);
  std::swap(data_, other.data_);
  std::swap(size_, other.size_);
  std::swap(owner_, other.owner_);
  return *this;
}

Segment::~Segment() {
  if (data_ != nullptr) munmap(data_, size_);
  unlink();
}

void Segment::unlink() noexcept {
  if (owner_) {
    shm_unlink(name_.c_str());
    owner_ = false;
  }
}

}  // namespace loom::comm::shm
