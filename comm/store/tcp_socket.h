#pragma once
// Socket plumbing shared by the TCP store's server and client and the tcp backend.

#include <netdb.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

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

}  // namespace loom::comm::tcp
