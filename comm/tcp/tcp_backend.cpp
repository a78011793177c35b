#include "comm/tcp/tcp_backend.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <random>
#include <sstream>
#include <vector>

#include "comm/cpu_relax.h"
#include "comm/store/store.h"
#include "comm/store/tcp_socket.h"
#include "core/tags.h"

namespace loom::comm::tcp {

// Note [tcp connections]
// Each rank listens on an ephemeral port of INADDR_ANY and publishes "port token address..."
// under tcp/listen/<rank>: its IPv4 addresses, those of loopback last, and 16 random bytes.
// For every pair of ranks the higher one connects to the lower one's addresses in that order
// and sends a Hello (magic, its rank, the lower rank's token); the lower one answers one byte
// if the Hello is right and closes the connection otherwise. An address that leads elsewhere
// (another host's docker0, a loopback port reused by another job) therefore fails the
// handshake, and the next address is tried. Connecting waits only for lower ranks, which
// connect to theirs before they accept: no cycle, so no deadlock. Every step is bounded by
// the group's timeout; reaching an address gets at most kAttemptTime of it, while the answer
// to a Hello may take until the timeout (the lower rank answers once it connected to the
// ranks below it).
//
// Note [tcp messages]
// A message is an 8-byte length followed by the bytes. The receiver reads the length and
// the bytes with one readv straight into its buffer (no staging copy), and fails with a
// Mismatch naming the sender when the length is not the one it expects (the ranks run
// different collectives). Sends use sendmsg with the length and the bytes as two pieces.
// Both directions of an exchange advance in one loop of non-blocking calls, so two ranks
// that send to each other never wait on each other; a loop that moved nothing for
// kSpinBeforeYielding sleeps in poll() until a socket is ready (at most kLongestSleep, so the
// deadline is checked).

namespace {

constexpr uint32_t kHelloMagic = 0x4c4d5443;  // "LMTC"
constexpr size_t kTokenBytes = 16;
constexpr auto kAttemptTime = std::chrono::seconds(2);
constexpr auto kLongestSleep = std::chrono::milliseconds(10);

using Token = std::array<uint8_t, kTokenBytes>;

struct PeerHello {  // not the store's Hello (comm/store/tcp_request.h)
  uint32_t magic;
  int32_t rank;
  Token token;
};

std::string hex(const Token& token) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (uint8_t b : token) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

bool parse_hex(const std::string& text, Token& token) {
  if (text.size() != 2 * kTokenBytes) return false;
  for (size_t i = 0; i < kTokenBytes; ++i) {
    unsigned value = 0;
    if (std::sscanf(text.c_str() + 2 * i, "%2x", &value) != 1) return false;
    token[i] = static_cast<uint8_t>(value);
  }
  return true;
}

// This host's IPv4 addresses on interfaces that are up: loopback last.
std::vector<std::string> local_addresses() {
  std::vector<std::string> outside, loopback;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) == 0) {
    for (const ifaddrs* a = list; a != nullptr; a = a->ifa_next) {
      if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
      if ((a->ifa_flags & IFF_UP) == 0) continue;
      char text[INET_ADDRSTRLEN] = {};
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
      ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
      ((a->ifa_flags & IFF_LOOPBACK) != 0 ? loopback : outside).push_back(text);
    }
    ::freeifaddrs(list);
  }
  if (loopback.empty()) loopback.push_back("127.0.0.1");
  outside.insert(outside.end(), loopback.begin(), loopback.end());
  return outside;
}

int milliseconds_until(Deadline deadline, std::chrono::milliseconds longest) {
  const auto left = std::min(
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()), longest);
  return static_cast<int>(std::max<int64_t>(0, left.count()));
}

}  // namespace

struct TcpBackend::State {
  std::vector<Socket> peers;       // by rank; invalid for this rank
  std::vector<std::string> hosts;  // each rank's host, for messages (host_label())
};

TcpBackend::TcpBackend(const BackendContext& context)
    : rank_(context.rank), size_(context.size), state_(std::make_unique<State>()) {
  State& s = *state_;
  const std::string me = tag::kCommTcp.prefix() + "rank " + std::to_string(rank_) + ": ";
  const Deadline deadline = Clock::now() + context.timeout;
  s.peers.resize(static_cast<size_t>(size_));
  s.hosts.assign(static_cast<size_t>(size_), host_label());
  context.store->set("tcp/host/" + std::to_string(rank_), to_bytes(host_label()));
  if (size_ == 1) return;

  Socket listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_in any{};
  any.sin_family = AF_INET;
  any.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t length = sizeof any;
  if (!listener.valid() || ::bind(listener.fd(), reinterpret_cast<sockaddr*>(&any), length) != 0 ||
      ::listen(listener.fd(), size_) != 0 ||
      ::getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&any), &length) != 0) {
    fail(me, "cannot listen on a TCP port: ", errno_str(errno));
  }
  Token mine{};
  std::random_device random;
  for (uint8_t& b : mine)
    b = static_cast<uint8_t>(random());
  std::string published = std::to_string(ntohs(any.sin_port)) + " " + hex(mine);
  for (const std::string& address : local_addresses())
    published += " " + address;
  context.store->set("tcp/listen/" + std::to_string(rank_), to_bytes(published));
  for (int r = 0; r < size_; ++r) {
    if (r != rank_) {
      s.hosts[static_cast<size_t>(r)] =
          to_string(context.store->get("tcp/host/" + std::to_string(r), context.timeout));
    }
  }

  // Connect to every lower rank (Note [tcp connections]).
  for (int r = 0; r < rank_; ++r) {
    std::istringstream fields(
        to_string(context.store->get("tcp/listen/" + std::to_string(r), context.timeout)));
    unsigned port = 0;
    std::string token_text;
    Token theirs{};
    if (!(fields >> port >> token_text) || port == 0 || port > 65535 ||
        !parse_hex(token_text, theirs)) {
      fail(me, "rank ", r,
           " published a malformed tcp/listen entry; every rank of a group must "
           "run the same Loom");
    }
    std::string tried;
    for (std::string address; fields >> address && !s.peers[static_cast<size_t>(r)].valid();) {
      const Deadline attempt = std::min(deadline, Clock::now() + kAttemptTime);
      std::string why;
      AddrInfoList resolved = resolve(address, static_cast<uint16_t>(port), why);
      IoStatus status;
      Socket c = resolved ? connect_nonblocking(*resolved, attempt, status) : Socket();
      if (resolved && !c.valid()) why = status.describe("rank " + std::to_string(r));
      if (c.valid()) {
        // The answer may wait until rank r has connected to the ranks below it: the whole
        // timeout, not the attempt's.
        const PeerHello hello{kHelloMagic, rank_, theirs};
        uint8_t answer = 0;
        if (send_all(c.fd(), &hello, sizeof hello, attempt).ok() &&
            recv_exact(c.fd(), &answer, 1, deadline).ok() && answer == 1) {
          s.peers[static_cast<size_t>(r)] = std::move(c);
          break;
        }
        why = "not rank " + std::to_string(r) + " of this group (handshake refused)";
      }
      tried += (tried.empty() ? "" : "; ") + address + ": " + why;
      if (Clock::now() >= deadline) break;
    }
    if (!s.peers[static_cast<size_t>(r)].valid()) {
      throw CommError(me + "cannot connect to rank " + std::to_string(r) + " (host " +
                          s.hosts[static_cast<size_t>(r)] + ", port " + std::to_string(port) +
                          ") at any of its addresses: " + tried,
                      rank_, r, CommFailure::Timeout);
    }
  }

  // Accept every higher rank.
  for (int expected = size_ - 1 - rank_; expected > 0;) {
    if (!wait_ready(listener.fd(), POLLIN, deadline).ok()) {
      std::string missing;
      for (int r = rank_ + 1; r < size_; ++r) {
        if (!s.peers[static_cast<size_t>(r)].valid()) missing.append(" ").append(std::to_string(r));
      }
      throw CommError(me + "ranks" + missing + " did not connect within the timeout", rank_,
                      std::nullopt, CommFailure::Timeout);
    }
    Socket c(::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!c.valid()) continue;
    PeerHello hello{};
    const Deadline attempt = std::min(deadline, Clock::now() + kAttemptTime);
    if (!recv_exact(c.fd(), &hello, sizeof hello, attempt).ok() || hello.magic != kHelloMagic ||
        hello.token != mine || hello.rank <= rank_ || hello.rank >= size_ ||
        s.peers[static_cast<size_t>(hello.rank)].valid()) {
      continue;  // not a member of this group: closed
    }
    const uint8_t yes = 1;
    if (!send_all(c.fd(), &yes, 1, attempt).ok()) continue;
    s.peers[static_cast<size_t>(hello.rank)] = std::move(c);
    --expected;
  }
  for (Socket& peer : s.peers) {
    if (peer.valid()) set_nodelay(peer.fd());
  }
}

TcpBackend::~TcpBackend() = default;

void TcpBackend::send_recv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                           size_t recv_bytes, int src, Deadline deadline) {
  State& s = *state_;
  auto named = [&](int peer) {
    return "peer " + std::to_string(peer) + " (host " + s.hosts[static_cast<size_t>(peer)] + ")";
  };
  auto me = [&] { return tag::kCommTcp.prefix() + "rank " + std::to_string(rank_) + ": "; };
  auto peer_failed = [&](int peer, const std::string& what) {
    throw CommError(me() + named(peer) + " " + what, rank_, peer, CommFailure::PeerDied);
  };
  const int out = send_bytes > 0 ? s.peers[static_cast<size_t>(dst)].fd() : -1;
  const int in = recv_bytes > 0 ? s.peers[static_cast<size_t>(src)].fd() : -1;
  if ((send_bytes > 0 && out < 0) || (recv_bytes > 0 && in < 0)) {
    throw CommError(me() + "no connection to rank " +
                        std::to_string(send_bytes > 0 && out < 0 ? dst : src) +
                        " (a group's rank does not exchange messages with itself)",
                    rank_);
  }
  // Note [tcp messages]: what is left of each direction, as iovecs over (length, bytes).
  uint64_t send_length = send_bytes;
  uint64_t recv_length = 0;
  iovec sending[2] = {{&send_length, sizeof send_length},
                      {const_cast<void*>(send_data), send_bytes}};
  iovec receiving[2] = {{&recv_length, sizeof recv_length}, {recv_data, recv_bytes}};
  int send_first = send_bytes > 0 ? 0 : 2;  // the first iovec with bytes left; 2: done
  int recv_first = recv_bytes > 0 ? 0 : 2;
  auto advance = [](iovec* iov, int& first, size_t moved) {
    while (first < 2 && moved >= iov[first].iov_len) {
      moved -= iov[first].iov_len;
      iov[first].iov_len = 0;
      ++first;
    }
    if (first < 2) {
      iov[first].iov_base = static_cast<uint8_t*>(iov[first].iov_base) + moved;
      iov[first].iov_len -= moved;
    }
  };
  Clock::time_point idle_since = Clock::now();
  while (send_first < 2 || recv_first < 2) {
    bool moved = false;
    if (send_first < 2) {
      msghdr message{};
      message.msg_iov = sending + send_first;
      message.msg_iovlen = static_cast<size_t>(2 - send_first);
      const ssize_t n = ::sendmsg(out, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        advance(sending, send_first, static_cast<size_t>(n));
        moved = true;
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        peer_failed(dst, "closed its connection (" + errno_str(errno) +
                             ") while this rank sent it a message");
      }
    }
    if (recv_first < 2) {
      const bool had_length = recv_first > 0;
      const ssize_t n = ::readv(in, receiving + recv_first, 2 - recv_first);
      if (n > 0) {
        advance(receiving, recv_first, static_cast<size_t>(n));
        moved = true;
        if (!had_length && recv_first > 0 && recv_length != recv_bytes) {
          throw CommError(me() + named(src) + " sent a message of " + std::to_string(recv_length) +
                              " bytes where " + std::to_string(recv_bytes) +
                              " were expected: the ranks run different collectives or sizes",
                          rank_, src, CommFailure::Mismatch);
        }
      } else if (n == 0) {
        peer_failed(src, "closed its connection while this rank waited for its message");
      } else if (errno != EAGAIN && errno != EINTR) {
        peer_failed(src, "closed its connection (" + errno_str(errno) +
                             ") while this rank waited for its message");
      }
    }
    const Clock::time_point now = Clock::now();
    if (moved) {
      idle_since = now;
      continue;
    }
    if (now >= deadline) {
      const bool waiting_for_src = recv_first < 2;
      const int late = waiting_for_src ? src : dst;
      throw CommError(me() + named(late) + " did not " +
                          (waiting_for_src ? "send its message" : "take this rank's message") +
                          " before the deadline",
                      rank_, late, CommFailure::Timeout);
    }
    if (now - idle_since < kSpinBeforeYielding) continue;
    // Idle for a while: sleep until a socket is ready (Note [tcp messages]).
    pollfd ready[2];
    nfds_t count = 0;
    if (send_first < 2) ready[count++] = {out, POLLOUT, 0};
    if (recv_first < 2) {
      if (count == 1 && ready[0].fd == in) {
        ready[0].events |= POLLIN;
      } else {
        ready[count++] = {in, POLLIN, 0};
      }
    }
    ::poll(ready, count, milliseconds_until(deadline, kLongestSleep));
  }
}

}  // namespace loom::comm::tcp
