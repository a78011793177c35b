// Socket plumbing shared by the TCP store's server and client.

#include "comm/store/tcp_socket.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace loom::comm::tcp {

void Socket::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string endpoint_str(const std::string& host, uint16_t port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return "tcp " + (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

AddrInfoList resolve(const std::string& host, uint16_t port, std::string& error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  hints.ai_flags = AI_NUMERICSERV;
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) {
    error = "cannot resolve host '" + host + "': " + ::gai_strerror(rc);
    return nullptr;
  }
  return AddrInfoList(list);
}

void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string errno_str(int err) {
  return std::strerror(err);
}

std::string IoStatus::describe(std::string_view other_end) const {
  switch (kind) {
    case kDone: return "ok";
    case kTimedOut: return "timed out";
    case kClosed: return std::string(other_end) + " closed the connection";
    case kFailed: return errno_str(err);
  }
  return "?";
}

IoStatus wait_ready(int fd, short events, Deadline deadline) {
  while (true) {
    const auto now = Clock::now();
    if (now >= deadline) return {IoStatus::kTimedOut};
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, int(std::min<int64_t>(left, 1 << 30)));
    if (rc > 0) return {};
    if (rc < 0 && errno != EINTR) return {IoStatus::kFailed, errno};
  }
}

IoStatus send_all(int fd, const void* data, size_t size, Deadline deadline) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  size_t sent = 0;
  while (sent < size) {
    const ssize_t n = ::send(fd, bytes + sent, size - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += size_t(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const IoStatus ready = wait_ready(fd, POLLOUT, deadline);
      if (!ready.ok()) return ready;
      continue;
    }
    return {IoStatus::kFailed, errno};
  }
  return {};
}

IoStatus recv_exact(int fd, void* data, size_t size, Deadline deadline) {
  auto* bytes = static_cast<uint8_t*>(data);
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::recv(fd, bytes + got, size - got, 0);
    if (n > 0) {
      got += size_t(n);
      continue;
    }
    if (n == 0) return {IoStatus::kClosed};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      const IoStatus ready = wait_ready(fd, POLLIN, deadline);
      if (!ready.ok()) return ready;
      continue;
    }
    if (errno == ECONNRESET) return {IoStatus::kClosed};
    return {IoStatus::kFailed, errno};
  }
  return {};
}

Socket connect_nonblocking(const addrinfo& address, Deadline deadline, IoStatus& status) {
  Socket s(::socket(address.ai_family, address.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    address.ai_protocol));
  if (!s.valid()) {
    status = {IoStatus::kFailed, errno};
    return {};
  }
  const int rc = ::connect(s.fd(), address.ai_addr, address.ai_addrlen);
  if (rc != 0 && errno != EINPROGRESS && errno != EINTR) {
    status = {IoStatus::kFailed, errno};
    return {};
  }
  if (rc != 0) {
    status = wait_ready(s.fd(), POLLOUT, deadline);
    if (!status.ok()) return {};
    int err = 0;
    socklen_t length = sizeof(err);
    ::getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &err, &length);
    if (err != 0) {
      status = {IoStatus::kFailed, err};
      return {};
    }
  }
  status = {};
  return s;
}

}  // namespace loom::comm::tcp
