#include "strategies/checkpoint/directory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>

#include "core/error.h"
#include "core/fault_points.h"
#include "core/tags.h"

namespace loom::strategies::checkpoint {

namespace fs = std::filesystem;

namespace {

std::string step_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

// fsync of a file or a directory (its entries); throws naming the path.
void sync_path(const fs::path& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0)
    tag::kCheckpoint.fail("cannot open ", path.string(), " to sync it: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0) tag::kCheckpoint.fail("fsync of ", path.string(), " failed: ", std::strerror(error));
}

// A fault injected at `point` (tests only: Note [Fault points]) fails the save as an I/O
// error of `what` would.
void fault_point(std::string_view point, const fs::path& what) {
  if (const int error = fault::at(point))
    tag::kCheckpoint.fail(what.string(), ": ", std::strerror(error), " (at ", point, ")");
}

}  // namespace

std::optional<int64_t> step_of(const fs::path& checkpoint) {
  const std::string name = checkpoint.filename().string();
  if (name.size() <= 5 || name.rfind("step-", 0) != 0) return std::nullopt;
  const std::string digits = name.substr(5);
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return std::stoll(digits);
}

Directory::Directory(fs::path root) : root_(std::move(root)) {}

fs::path Directory::staging(int64_t step) const {
  std::string name = ".";  // appended to: GCC 12 warns falsely on "." + a temporary string
  name += step_name(step);
  name += ".partial";
  return root_ / name;
}

fs::path Directory::committed_path(int64_t step) const {
  return root_ / step_name(step);
}

bool Directory::is_committed(const fs::path& checkpoint) {
  std::error_code ec;
  return fs::is_regular_file(checkpoint / kMarker, ec);
}

void Directory::prepare(int64_t step) const {
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) {
    tag::kCheckpoint.fail("cannot create the checkpoint directory ", root_.string(), ": ",
                          ec.message(), "; pass a writable --checkpoint-dir");
  }
  fs::remove_all(staging(step), ec);
  fs::create_directory(staging(step), ec);
  if (ec) {
    tag::kCheckpoint.fail("cannot create ", staging(step).string(), ": ", ec.message(),
                          "; is --checkpoint-dir writable?");
  }
  fault_point("checkpoint.staged", staging(step));
}

fs::path Directory::commit(int64_t step) const {
  commit_directory(staging(step), committed_path(step));
  return committed_path(step);
}

void commit_directory(const fs::path& from, const fs::path& to) {
  for (const auto& entry : fs::directory_iterator(from))
    sync_path(entry.path(), false);
  sync_path(from, true);
  fault_point("checkpoint.before_rename", from);
  std::error_code ec;
  fs::remove_all(to, ec);  // an uncommitted leftover of an earlier try
  fs::rename(from, to, ec);
  if (ec)
    tag::kCheckpoint.fail("renaming ", from.string(), " to ", to.string(), ": ", ec.message());
  sync_path(to.parent_path().empty() ? fs::path(".") : to.parent_path(), true);
  const fs::path marker = to / Directory::kMarker;
  fault_point("checkpoint.before_committed", marker);
  const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) tag::kCheckpoint.fail("cannot write ", marker.string(), ": ", std::strerror(errno));
  const int rc = ::fsync(fd);
  ::close(fd);
  if (rc != 0) tag::kCheckpoint.fail("fsync of ", marker.string(), " failed");
  sync_path(to, true);
  fault_point("checkpoint.committed", to);
}

DirectoryLock::DirectoryLock(const fs::path& root) {
  std::error_code ec;
  fs::create_directories(root, ec);
  const fs::path path = root / kLockFile;
  file_ = FileDescriptor(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (file_.get() < 0) {
    tag::kCheckpoint.fail("cannot create ", path.string(), ": ", std::strerror(errno),
                          "; pass a writable --checkpoint-dir");
  }
  if (::flock(file_.get(), LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char holder[256] = {};
    const ssize_t n = ::pread(file_.get(), holder, sizeof holder - 1, 0);
    std::string who = n > 0 ? std::string(holder, static_cast<size_t>(n)) : std::string();
    while (!who.empty() && (who.back() == '\n' || who.back() == ' ')) who.pop_back();
    if (error != EWOULDBLOCK) {
      tag::kCheckpoint.fail("cannot lock ", path.string(), ": ", std::strerror(error));
    }
    const size_t space = who.find(' ');
    tag::kCheckpoint.fail(root.string(), " is in use by another run (",
                          space == std::string::npos
                              ? "holder unknown"
                              : "host " + who.substr(0, space) + ", pid " + who.substr(space + 1),
                          "), which holds ", path.string(),
                          "; wait for it to end, or pass another --checkpoint-dir");
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string me = std::string(host) + " " + std::to_string(::getpid()) + "\n";
  // The note only names the holder in a refused run's message; the lock holds without it.
  const bool noted = ::ftruncate(file_.get(), 0) == 0 &&
                     ::pwrite(file_.get(), me.data(), me.size(), 0) == static_cast<ssize_t>(me.size());
  (void)noted;
}

std::vector<fs::path> Directory::committed() const {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(root_, ec)) return {};
  for (const auto& entry : fs::directory_iterator(root_)) {
    auto step = step_of(entry.path());
    if (step && entry.is_directory() && is_committed(entry.path()))
      found.emplace_back(*step, entry.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [step, path] : found)
    out.push_back(path);
  return out;
}

std::optional<fs::path> Directory::latest() const {
  std::vector<fs::path> all = committed();
  if (all.empty()) return std::nullopt;
  return all.back();
}

void Directory::prune(int keep_last) const {
  std::vector<fs::path> all = committed();
  std::error_code ec;
  if (keep_last > 0 && all.size() > static_cast<size_t>(keep_last)) {
    for (size_t i = 0; i + static_cast<size_t>(keep_last) < all.size(); ++i)
      fs::remove_all(all[i], ec);
  }
  // Leftovers of interrupted saves: partial directories and renamed but unmarked ones.
  for (const auto& entry : fs::directory_iterator(root_)) {
    const std::string name = entry.path().filename().string();
    const bool partial = name.starts_with(".step-") && name.ends_with(".partial");
    const bool unmarked = step_of(entry.path()) && !is_committed(entry.path());
    if (entry.is_directory() && (partial || unmarked)) fs::remove_all(entry.path(), ec);
  }
}

}  // namespace loom::strategies::checkpoint
