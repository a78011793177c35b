#pragma once
// Socket plumbing shared by the TCP store's server and client and the tcp backend.

#include <netdb.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "core/deadline.h"

namespace loom::comm::tcp {

// Owns a file descriptor; closes it on destruction (never throws).
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset();

 private:
  int fd_ = -1;
};

// "tcp 127.0.0.1:29500" or "tcp [::1]:29500", the prefix of every store message.
std::string endpoint_str(const std::string& host, uint16_t port);

struct AddrInfoDeleter {
  void operator()(addrinfo* info) const { freeaddrinfo(info); }
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// getaddrinfo for TCP on exactly `host` (a name, an IPv4 or an IPv6 literal). On failure
// returns null and sets `error` to getaddrinfo's message.
AddrInfoList resolve(const std::string& host, uint16_t port, std::string& error);

// Disables Nagle: store messages are small request/reply pairs.
void set_nodelay(int fd);

// strerror(err) as a string.
std::string errno_str(int err);

// How a bounded socket operation ended.
struct IoStatus {
  enum Kind { kDone, kTimedOut, kClosed, kFailed } kind = kDone;
  int err = 0;  // kFailed: the errno
  bool ok() const { return kind == kDone; }
  // "timed out", "<other_end> closed the connection", strerror.
  std::string describe(std::string_view other_end) const;
};

// Waits until `fd` is ready for `events` (poll's) or the deadline passes.
IoStatus wait_ready(int fd, short events, Deadline deadline);
// Writes all `size` bytes, waiting for room on a non-blocking socket (no SIGPIPE).
IoStatus send_all(int fd, const void* data, size_t size, Deadline deadline);
// Reads exactly `size` bytes; end of stream and a reset are kClosed.
IoStatus recv_exact(int fd, void* data, size_t size, Deadline deadline);

// A non-blocking, close-on-exec TCP connection to `address`, or an invalid Socket with
// `status` saying why (kFailed with the errno, or kTimedOut).
Socket connect_nonblocking(const addrinfo& address, Deadline deadline, IoStatus& status);

}  // namespace loom::comm::tcp
