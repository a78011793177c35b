// TCPStoreServer: one thread multiplexing every connection with poll() over non-blocking
// sockets (wire format: tcp_protocol.h).
//
// Each connection is served one request at a time: the next frame is handled only after
// the previous reply has been sent and any parked Get/Wait has been answered, so a slow or
// malicious client costs the others nothing but its buffers (at most one frame each).
// Mutations (Set, Add, CompareSet) re-check every parked waiter; the poll timeout is the
// earliest waiter deadline, at which the waiter gets a Timeout reply. A self-pipe wakes the
// thread when the server is destroyed.

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <map>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include "comm/store/store_impl.h"
#include "comm/store/tcp_auth.h"
#include "comm/store/tcp_protocol.h"
#include "comm/store/tcp_request.h"
#include "comm/store/tcp_socket.h"
#include "comm/store/tcp_store.h"
#include "core/error.h"
#include "core/tags.h"

namespace loom::comm {

namespace {

using namespace tcp;

// An unauthenticated connection must present its secret within this time.
constexpr Duration kHelloTimeout = std::chrono::seconds(30);
// Bytes read per recv() call.
constexpr size_t kReadChunk = size_t(256) << 10;
// Longest wait a client may ask for (keeps deadline arithmetic far from overflow).
constexpr int64_t kMaxWaitMs = int64_t(365) * 24 * 3600 * 1000;

}  // namespace

struct TCPStoreServer::Impl {
  // One client: its socket, what it sent and is owed, and the request it waits on, if any.
  struct Connection {
    Socket socket;
    std::string nonce;  // this connection's challenge (Note [Store authentication])
    bool authenticated = false;
    bool dead = false;
    Deadline hello_deadline;
    Bytes in;             // received bytes not yet handled
    Bytes out;            // reply bytes not yet sent
    size_t out_sent = 0;  // prefix of `out` already sent
    // A parked Get (one key, replies with its value) or Wait.
    bool parked = false;
    bool parked_get = false;
    std::vector<std::string> parked_keys;
    Deadline parked_deadline;

    size_t limit() const { return authenticated ? kMaxMessage : kMaxHelloMessage; }
    bool busy() const { return parked || out_sent < out.size(); }
  };

  std::string where;
  std::string secret;
  uint16_t port = 0;
  Socket listener;
  Socket wake_read;
  Socket wake_write;
  std::thread thread;

  // Touched only by the server thread.
  std::map<std::string, Bytes> values;
  std::vector<std::unique_ptr<Connection>> connections;
  Deadline accept_paused_until{};

  void run() noexcept {
    try {
      loop();
    } catch (const std::exception& e) {
      // Fatal (poll failed, out of memory): close everything so clients fail fast.
      std::fprintf(stderr, "%s%s: server stopped: %s\n", tag::kCommStore.prefix().c_str(),
                   where.c_str(), e.what());
    }
    connections.clear();
    listener.reset();
  }

  void loop() {
    std::vector<pollfd> fds;
    while (true) {
      Deadline now = Clock::now();
      fds.clear();
      fds.push_back({wake_read.fd(), POLLIN, 0});
      const bool accepting = now >= accept_paused_until;
      fds.push_back({listener.fd(), short(accepting ? POLLIN : 0), 0});
      Deadline wake_at = Deadline::max();
      if (!accepting) wake_at = accept_paused_until;
      bool ready_now = false;
      for (const auto& c : connections) {
        short events = POLLRDHUP;
        if (c->in.size() < c->limit() + kFrameHeader) events |= POLLIN;
        if (c->out_sent < c->out.size()) events |= POLLOUT;
        fds.push_back({c->socket.fd(), events, 0});
        if (!c->authenticated) wake_at = std::min(wake_at, c->hello_deadline);
        if (c->parked) wake_at = std::min(wake_at, c->parked_deadline);
        if (!c->busy() && frame_state(*c) > 0) ready_now = true;
      }
      int timeout_ms = -1;
      if (ready_now) {
        timeout_ms = 0;
      } else if (wake_at != Deadline::max()) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(wake_at - now).count();
        timeout_ms = int(std::clamp<int64_t>(left, 0, INT_MAX));
      }
      const int rc = ::poll(fds.data(), fds.size(), timeout_ms);
      if (rc < 0) {
        if (errno == EINTR) continue;
        throw CommError("poll failed: " + errno_str(errno));
      }
      if (fds[0].revents != 0) return;  // destructor asked us to stop

      // fds[2 + i] belongs to connections[i]; accepted connections are appended after.
      const size_t polled = connections.size();
      for (size_t i = 0; i < polled; ++i) {
        Connection& c = *connections[i];
        const short revents = fds[2 + i].revents;
        if (revents & POLLIN) read_from(c);
        if (revents & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP)) c.dead = true;
        if (!c.dead && (revents & POLLOUT)) flush(c);
      }
      if (fds[1].revents & POLLIN) accept_all();

      now = Clock::now();
      for (auto& c : connections) {
        if (c->dead) continue;
        if (!c->authenticated && now >= c->hello_deadline) c->dead = true;
        if (c->parked && now >= c->parked_deadline) answer_timeout(*c);
      }
      for (size_t i = 0; i < connections.size(); ++i)
        process(*connections[i]);
      std::erase_if(connections, [](const auto& c) { return c->dead; });
    }
  }

  void accept_all() {
    while (true) {
      const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        // EAGAIN: drained. EMFILE and friends: back off instead of spinning on poll.
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
          accept_paused_until = Clock::now() + std::chrono::milliseconds(100);
        }
        return;
      }
      set_nodelay(fd);
      auto c = std::make_unique<Connection>();
      c->socket = Socket(fd);
      c->hello_deadline = Clock::now() + kHelloTimeout;
      c->nonce = new_nonce();
      reply(*c, std::move(MessageWriter(kChallenge).field(std::string_view(c->nonce))));
      connections.push_back(std::move(c));
    }
  }

  void read_from(Connection& c) {
    while (!c.dead) {
      const size_t cap = c.limit() + kFrameHeader;
      if (c.in.size() >= cap) return;  // one whole frame buffered: wait until it is handled
      const size_t old = c.in.size();
      const size_t chunk = std::min(kReadChunk, cap - old);
      c.in.resize(old + chunk);
      const ssize_t n = ::recv(c.socket.fd(), c.in.data() + old, chunk, 0);
      const int err = errno;
      c.in.resize(old + size_t(std::max<ssize_t>(n, 0)));
      if (n > 0) {
        if (frame_state(c) < 0) c.dead = true;  // oversized or empty frame: drop at once
      } else if (n < 0 && err == EINTR) {
        continue;
      } else if (n < 0 && (err == EAGAIN || err == EWOULDBLOCK)) {
        return;
      } else {
        c.dead = true;  // closed by the client (a parked wait of its own dies with it) or reset
      }
    }
  }

  void flush(Connection& c) {
    while (c.out_sent < c.out.size()) {
      const ssize_t n =
          ::send(c.socket.fd(), c.out.data() + c.out_sent, c.out.size() - c.out_sent, MSG_NOSIGNAL);
      if (n > 0) {
        c.out_sent += size_t(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // POLLOUT resumes it
      c.dead = true;
      return;
    }
    c.out.clear();
    c.out_sent = 0;
  }

  // 1: a complete frame is buffered; 0: not yet; -1: the frame header is invalid
  // (empty or over the limit), so the connection must be dropped.
  static int frame_state(const Connection& c) {
    return tcp::frame_state(c.in.data(), c.in.size(), c.limit());
  }

  // Handles buffered frames while the connection is idle.
  void process(Connection& c) {
    while (!c.dead && !c.busy()) {
      const int state = frame_state(c);
      if (state < 0) c.dead = true;
      if (state <= 0) return;
      const size_t size = load_u32(c.in.data());
      try {
        handle(c, c.in.data() + kFrameHeader, size);
      } catch (const std::exception&) {
        c.dead = true;  // e.g. bad_alloc on a huge value: drop this client, serve the rest
      }
      c.in.erase(c.in.begin(), c.in.begin() + std::ptrdiff_t(kFrameHeader + size));
    }
  }

  void reply(Connection& c, MessageWriter&& message) {
    Bytes frame = std::move(message).frame();
    c.out.insert(c.out.end(), frame.begin(), frame.end());
    flush(c);
  }

  void handle(Connection& c, const uint8_t* payload, size_t size) {
    if (!c.authenticated) {
      const auto hello = decode_hello(payload, size);
      if (!hello || hello->version != kProtocolVersion ||
          !proofs_equal(hello_proof(secret, c.nonce), hello->proof)) {
        c.dead = true;  // no reply: a wrong proof learns nothing
        return;
      }
      c.authenticated = true;
      reply(c, MessageWriter(kOk));
      return;
    }
    auto request = decode_request(payload, size);
    if (!request) {
      c.dead = true;  // unknown command or malformed fields
      return;
    }
    std::visit([&](auto& r) { serve(c, r); }, *request);
  }

  void serve(Connection& c, SetRequest& r) {
    values[r.key] = std::move(r.value);
    reply(c, MessageWriter(kOk));
    release_waiters();
  }

  void serve(Connection& c, GetRequest& r) {
    park(c, true, {std::move(r.key)}, r.timeout_ms);
  }

  void serve(Connection& c, AddRequest& r) {
    auto found = values.find(r.key);
    int64_t result = 0;
    try {
      result = detail::add_to_counter(r.key, found == values.end() ? nullptr : &found->second,
                                      r.delta);
    } catch (const Error& e) {
      reply(c, std::move(MessageWriter(kError).field(std::string_view(e.what()))));
      return;
    }
    values[r.key] = to_bytes(std::to_string(result));
    reply(c, std::move(MessageWriter(kOk).integer(result)));
    release_waiters();
  }

  void serve(Connection& c, CompareSetRequest& r) {
    auto found = values.find(r.key);
    const bool matches = found == values.end() ? r.expected.empty() : found->second == r.expected;
    if (!matches) {
      reply(c, std::move(MessageWriter(kOk).field(found == values.end() ? Bytes{} : found->second)));
      return;
    }
    values[r.key] = r.desired;
    reply(c, std::move(MessageWriter(kOk).field(r.desired)));
    release_waiters();
  }

  void serve(Connection& c, WaitRequest& r) {
    park(c, false, std::move(r.keys), r.timeout_ms);
  }

  void serve(Connection& c, CheckRequest& r) {
    bool all = true;
    while (!r.keys.at_end()) {
      const std::string_view key = *r.keys.field();  // decode_request checked every field
      all = all && values.contains(std::string(key));
    }
    reply(c, std::move(MessageWriter(kOk).integer(all ? 1 : 0)));
  }

  void serve(Connection& c, RemoveRequest& r) {
    const bool existed = values.erase(r.key) > 0;
    reply(c, std::move(MessageWriter(kOk).integer(existed ? 1 : 0)));
  }

  void park(Connection& c, bool get, std::vector<std::string> keys, int64_t timeout_ms) {
    c.parked = true;
    c.parked_get = get;
    c.parked_keys = std::move(keys);
    c.parked_deadline =
        Clock::now() + std::chrono::milliseconds(std::clamp<int64_t>(timeout_ms, 0, kMaxWaitMs));
    try_release(c);
  }

  // Answers a parked waiter whose keys all exist.
  void try_release(Connection& c) {
    for (const auto& key : c.parked_keys) {
      if (!values.contains(key)) return;
    }
    c.parked = false;
    MessageWriter message(kOk);
    if (c.parked_get) message.field(values.at(c.parked_keys.front()));
    c.parked_keys.clear();
    reply(c, std::move(message));
  }

  void release_waiters() {
    for (auto& c : connections) {
      if (c->parked && !c->dead) try_release(*c);
    }
  }

  void answer_timeout(Connection& c) {
    MessageWriter message(kTimeout);
    for (const auto& key : c.parked_keys) {
      if (!values.contains(key)) message.field(key);
    }
    c.parked = false;
    c.parked_keys.clear();
    reply(c, std::move(message));
  }
};

TCPStoreServer::TCPStoreServer(const std::string& host, uint16_t port, std::string secret)
    : impl_(std::make_unique<Impl>()) {
  impl_->secret = std::move(secret);
  impl_->where = endpoint_str(host, port);
  std::string error;
  AddrInfoList addresses = resolve(host, port, error);
  for (addrinfo* ai = addresses.get(); ai != nullptr && !impl_->listener.valid();
       ai = ai->ai_next) {
    Socket s(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!s.valid()) {
      error = "socket: " + errno_str(errno);
      continue;
    }
    const int one = 1;
    ::setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(s.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
      error = "bind: " + errno_str(errno);
      continue;
    }
    if (::listen(s.fd(), SOMAXCONN) != 0) {
      error = "listen: " + errno_str(errno);
      continue;
    }
    impl_->listener = std::move(s);
  }
  if (!impl_->listener.valid()) {
    throw CommError(tag::kCommStore.prefix() + impl_->where + ": server cannot listen (" + error +
                    ")");
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  ::getsockname(impl_->listener.fd(), reinterpret_cast<sockaddr*>(&bound), &length);
  impl_->port =
      ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                        : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  impl_->where = endpoint_str(host, impl_->port);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    throw CommError(tag::kCommStore.prefix() + impl_->where +
                    ": server cannot create its wake pipe: " + errno_str(errno));
  }
  impl_->wake_read = Socket(pipe_fds[0]);
  impl_->wake_write = Socket(pipe_fds[1]);
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

TCPStoreServer::~TCPStoreServer() {
  const char byte = 1;
  while (::write(impl_->wake_write.fd(), &byte, 1) < 0 && errno == EINTR) {
  }
  impl_->thread.join();
}

uint16_t TCPStoreServer::port() const {
  return impl_->port;
}

}  // namespace loom::comm
