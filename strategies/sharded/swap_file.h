#pragma once
// A file that holds tensors' bytes while they are not in memory (NVMe offload,
// strategies/sharded/nvme_swap.h), with asynchronous reads and writes.
//
// Nothing is left behind: the file is created without a name (O_TMPFILE) or unlinked right
// after it is opened, so it disappears with the process, even after SIGKILL. Its space is
// reserved up front (fallocate), so a disk too small is an error naming the directory and the
// bytes before training starts, not a failed write halfway through a step.
//
// I/O goes through io_uring (liburing) when the kernel allows it, and through pread/pwrite
// otherwise (containers whose seccomp profile refuses io_uring); O_DIRECT is used for a
// transfer whose buffer address, length and offset are multiples of kDirectAlignment, when
// the file system supports it (not tmpfs), and the page cache otherwise. mode() says which.
//
// Threading: one thread uses a SwapFile (the training thread); the kernel does the I/O.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::strategies::sharded {

class SwapFile {
 public:
  static constexpr size_t kDirectAlignment = 4096;

  // Creates the file under `directory` and reserves `reserve_bytes` of space in it. Throws
  // loom::Error naming `directory` when it is missing, not a directory, not writable, or
  // short of space (with the bytes needed and available). Every wait() gives up with
  // loom::Error after `timeout`.
  SwapFile(const std::string& directory, size_t reserve_bytes,
           std::chrono::milliseconds timeout = std::chrono::seconds(120));
  ~SwapFile();
  SwapFile(const SwapFile&) = delete;
  SwapFile& operator=(const SwapFile&) = delete;

  // A region of `nbytes` (its offset a multiple of kDirectAlignment), inside the reserved
  // space or growing the file (throws loom::Error when the disk is full).
  uint64_t allocate(size_t nbytes);

  // Starts a transfer between `buffer` and the file at `offset`; the buffer must stay valid
  // and untouched until wait() returns for the ticket.
  using Ticket = uint64_t;
  Ticket write(uint64_t offset, const void* buffer, size_t nbytes);
  Ticket read(uint64_t offset, void* buffer, size_t nbytes);
  // Blocks until the transfer is complete; throws loom::Error naming the file's directory on
  // an I/O error (ENOSPC, EIO, ...), a short transfer, or the timeout.
  void wait(Ticket ticket);

  const std::string& directory() const { return directory_; }
  uint64_t size() const { return size_; }  // bytes allocated so far
  // "io_uring, O_DIRECT", "pread/pwrite, page cache", ...
  std::string mode() const;
  // Bytes moved each way since creation, and how many of them bypassed the page cache.
  uint64_t bytes_written() const { return bytes_written_; }
  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t bytes_direct() const { return bytes_direct_; }

 private:
  struct Ring;
  Ticket submit(bool write, uint64_t offset, void* buffer, size_t nbytes);
  void reap_one();  // waits for one completion (bounded by timeout_)
  void fail_io(const char* what, int error) const;

  std::string directory_;
  std::chrono::milliseconds timeout_;
  int fd_ = -1;         // buffered
  int direct_fd_ = -1;  // the same file opened with O_DIRECT, or -1
  uint64_t size_ = 0;
  uint64_t reserved_ = 0;
  std::unique_ptr<Ring> ring_;  // null: synchronous pread/pwrite
  std::string no_ring_reason_;  // why there is no ring
  Ticket next_ticket_ = 1;
  struct Pending {
    Ticket ticket;
    bool write;
    uint64_t offset;
    size_t nbytes;
    size_t pieces_left;
    int error;  // first failure (-errno), or 0
  };
  std::vector<Pending> pending_;
  uint64_t bytes_written_ = 0, bytes_read_ = 0, bytes_direct_ = 0;
};

}  // namespace loom::strategies::sharded
