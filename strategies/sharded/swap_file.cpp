#include "strategies/sharded/swap_file.h"

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "core/error.h"
#include "core/fault_points.h"
#include "core/tags.h"

namespace loom::strategies::sharded {

namespace {

constexpr size_t kMaxPiece = size_t{64} << 20;  // one read or write: at most 64 MiB
constexpr unsigned kRingEntries = 64;
constexpr int kShortTransfer = -100000;  // a Pending::error that is not an errno

uint64_t round_up(uint64_t n, uint64_t to) {
  return (n + to - 1) / to * to;
}

std::string mib(uint64_t bytes) {
  return std::to_string(bytes >> 20) + " MiB";
}

// Creates an anonymous file in `directory`: O_TMPFILE, or a named file unlinked at once where
// the file system has no O_TMPFILE. Returns the descriptor, or -errno of the failure.
int open_anonymous(const std::string& directory) {
  int fd = ::open(directory.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd >= 0) return fd;
  if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL) return -errno;
  std::string name = directory + "/loom-swap-XXXXXX";
  fd = ::mkostemp(name.data(), O_CLOEXEC);
  if (fd < 0) return -errno;
  ::unlink(name.c_str());
  return fd;
}

}  // namespace

struct SwapFile::Ring {
  io_uring ring{};
};

// A queued piece of a transfer, carried through the ring as the completion's user data.
struct Piece {
  SwapFile::Ticket ticket;
  size_t nbytes;
};

SwapFile::SwapFile(const std::string& directory, size_t reserve_bytes,
                   std::chrono::milliseconds timeout)
    : directory_(directory), timeout_(timeout) {
  const std::string where = tag::kNvme.prefix() + "nvme_path '" + directory + "'";
  if (directory.empty())
    tag::kNvme.fail(
        "no nvme_path given: NVMe offload needs a directory on a local disk (--nvme-path DIR)");
  struct stat st{};
  if (::stat(directory.c_str(), &st) != 0) {
    fail(where, " cannot be used: ", std::strerror(errno),
         "; create the directory (on a fast local disk) or pass another --nvme-path");
  }
  if (!S_ISDIR(st.st_mode)) fail(where, " is not a directory; pass a directory for the swap file");
  struct statvfs fs{};
  if (::statvfs(directory.c_str(), &fs) == 0 && (fs.f_flag & ST_RDONLY) != 0)
    fail(where, " is on a read-only file system; pass a writable directory");
  fd_ = open_anonymous(directory);
  if (fd_ < 0) {
    fail(where, " is not writable (", std::strerror(-fd_),
         "); pass a directory this process may create files in");
  }
  const std::string self = "/proc/self/fd/" + std::to_string(fd_);
  direct_fd_ = ::open(self.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);  // -1 on tmpfs (EINVAL)

  if (reserve_bytes > 0) {
    const uint64_t available = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    const uint64_t needed = round_up(reserve_bytes, kDirectAlignment);
    if (needed > available) {
      ::close(fd_);
      if (direct_fd_ >= 0) ::close(direct_fd_);
      fail(where, " has ", mib(available), " free but NVMe offload needs ", mib(needed),
           " (", needed, " bytes) there; free some space, pass another --nvme-path, or offload to "
           "the CPU instead");
    }
    const int error = ::posix_fallocate(fd_, 0, static_cast<off_t>(needed));
    if (error != 0) {
      ::close(fd_);
      if (direct_fd_ >= 0) ::close(direct_fd_);
      fail(where, ": reserving ", mib(needed), " (", needed, " bytes) failed: ",
           std::strerror(error), "; free some space or pass another --nvme-path");
    }
    reserved_ = needed;
  }

  // Without io_uring (a seccomp profile that refuses it, kernel.io_uring_disabled) the file
  // is read and written synchronously: slower, never wrong, and said once here.
  auto ring = std::make_unique<Ring>();
  int rc = -fault::at("nvme.ring");
  if (rc == 0) rc = io_uring_queue_init(kRingEntries, &ring->ring, 0);
  if (rc == 0) {
    ring_ = std::move(ring);
  } else {
    no_ring_reason_ = std::strerror(-rc);
    std::fprintf(stderr, "%sio_uring is unavailable here (%s): the swap file under '%s' is "
                 "read and written with pread/pwrite\n",
                 tag::kNvme.prefix().c_str(), no_ring_reason_.c_str(), directory_.c_str());
  }
}

SwapFile::~SwapFile() {
  // The kernel may still be reading or writing the callers' buffers: wait before they go.
  while (ring_ && std::any_of(pending_.begin(), pending_.end(),
                              [](const Pending& p) { return p.pieces_left > 0; })) {
    try {
      reap_one();
    } catch (...) {
      break;  // timed out: nothing more can be done
    }
  }
  if (ring_) io_uring_queue_exit(&ring_->ring);
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (fd_ >= 0) ::close(fd_);
}

std::string SwapFile::mode() const {
  std::string m = ring_ ? "io_uring" : "pread/pwrite (io_uring unavailable: " + no_ring_reason_ + ")";
  m += direct_fd_ >= 0 ? ", O_DIRECT for aligned transfers" : ", page cache (no O_DIRECT here)";
  return m;
}

uint64_t SwapFile::allocate(size_t nbytes) {
  const uint64_t offset = round_up(size_, kDirectAlignment);
  const uint64_t end = offset + round_up(nbytes, kDirectAlignment);
  if (end > reserved_) {
    const int error = ::posix_fallocate(fd_, static_cast<off_t>(reserved_),
                                        static_cast<off_t>(end - reserved_));
    if (error != 0) {
      tag::kNvme.fail("growing the swap file under '", directory_, "' to ", mib(end),
                      " failed: ", std::strerror(error),
                      "; free some space or pass another --nvme-path");
    }
    reserved_ = end;
  }
  size_ = end;
  return offset;
}

void SwapFile::fail_io(const char* what, int error) const {
  tag::kNvme.fail(
      what, " the swap file under '", directory_,
      "' failed: ", error == kShortTransfer ? "short transfer" : std::strerror(-error),
      error == -ENOSPC ? " (the disk is full; free space or pass another --nvme-path)" : "");
}

SwapFile::Ticket SwapFile::write(uint64_t offset, const void* buffer, size_t nbytes) {
  return submit(true, offset, const_cast<void*>(buffer), nbytes);
}

SwapFile::Ticket SwapFile::read(uint64_t offset, void* buffer, size_t nbytes) {
  return submit(false, offset, buffer, nbytes);
}

SwapFile::Ticket SwapFile::submit(bool write, uint64_t offset, void* buffer, size_t nbytes) {
  if (offset + nbytes > size_) {
    tag::kNvme.fail("transfer of ", nbytes, " bytes at offset ", offset,
                    " is outside the allocated ", size_, " bytes of the swap file");
  }
  const bool direct = direct_fd_ >= 0 && reinterpret_cast<uintptr_t>(buffer) % kDirectAlignment == 0 &&
                      nbytes % kDirectAlignment == 0 && offset % kDirectAlignment == 0;
  const int fd = direct ? direct_fd_ : fd_;
  const Ticket ticket = next_ticket_++;
  Pending pending{ticket, write, offset, nbytes, 0, 0};
  auto* bytes = static_cast<char*>(buffer);
  if (const int injected = fault::at(write ? "nvme.write" : "nvme.read")) {
    pending.error = -injected;  // reported by wait(), as the kernel's error would be
  } else if (!ring_) {
    for (size_t done = 0; done < nbytes && pending.error == 0;) {
      const size_t piece = std::min(kMaxPiece, nbytes - done);
      const ssize_t n = write ? ::pwrite(fd, bytes + done, piece, static_cast<off_t>(offset + done))
                              : ::pread(fd, bytes + done, piece, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) pending.error = n < 0 ? -errno : kShortTransfer;
      done += n > 0 ? static_cast<size_t>(n) : 0;
    }
  } else {
    for (size_t done = 0; done < nbytes; done += kMaxPiece) {
      const size_t piece = std::min(kMaxPiece, nbytes - done);
      io_uring_sqe* sqe = io_uring_get_sqe(&ring_->ring);
      while (sqe == nullptr) {  // the submission queue is full: make room
        io_uring_submit(&ring_->ring);
        reap_one();
        sqe = io_uring_get_sqe(&ring_->ring);
      }
      if (write)
        io_uring_prep_write(sqe, fd, bytes + done, static_cast<unsigned>(piece), offset + done);
      else
        io_uring_prep_read(sqe, fd, bytes + done, static_cast<unsigned>(piece), offset + done);
      io_uring_sqe_set_data(sqe, new Piece{ticket, piece});
      ++pending.pieces_left;
    }
    io_uring_submit(&ring_->ring);
  }
  (write ? bytes_written_ : bytes_read_) += nbytes;
  if (direct) bytes_direct_ += nbytes;
  pending_.push_back(pending);
  return ticket;
}

void SwapFile::reap_one() {
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(timeout_);
  __kernel_timespec ts{};
  ts.tv_sec = seconds.count();
  ts.tv_nsec = std::chrono::duration_cast<std::chrono::nanoseconds>(timeout_ - seconds).count();
  io_uring_cqe* cqe = nullptr;
  int rc = io_uring_wait_cqe_timeout(&ring_->ring, &cqe, &ts);
  while (rc == -EINTR)
    rc = io_uring_wait_cqe_timeout(&ring_->ring, &cqe, &ts);
  if (rc == -ETIME) {
    tag::kNvme.fail("a read or write of the swap file under '", directory_,
                    "' did not complete within ", timeout_.count(), " ms; is the disk healthy?");
  }
  if (rc < 0) fail_io("waiting for", rc);
  std::unique_ptr<Piece> piece(static_cast<Piece*>(io_uring_cqe_get_data(cqe)));
  const int result = cqe->res;
  io_uring_cqe_seen(&ring_->ring, cqe);
  for (Pending& p : pending_) {
    if (p.ticket != piece->ticket) continue;
    --p.pieces_left;
    if (p.error == 0 && result < 0) p.error = result;
    if (p.error == 0 && static_cast<size_t>(result) != piece->nbytes) p.error = kShortTransfer;
    return;
  }
}

void SwapFile::wait(Ticket ticket) {
  auto find = [&] {
    return std::find_if(pending_.begin(), pending_.end(),
                        [&](const Pending& p) { return p.ticket == ticket; });
  };
  if (find() == pending_.end())
    tag::kNvme.fail("wait: unknown or already finished transfer ", ticket);
  while (find()->pieces_left > 0)
    reap_one();
  const Pending done = *find();
  pending_.erase(find());
  if (done.error != 0) fail_io(done.write ? "writing" : "reading", done.error);
}

}  // namespace loom::strategies::sharded
