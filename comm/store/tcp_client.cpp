// TCPStore: the client side of the TCP store (wire format: tcp_protocol.h).
//
// The client keeps a small pool of authenticated connections. Each call takes one (opening
// and authenticating a new one when none is idle), does one request/reply on it and puts it
// back, so threads sharing a TCPStore never wait behind one another's blocking get/wait.
// A connection that failed or timed out mid-request is closed, never reused: its byte stream
// may be out of step. Get/Wait carry their timeout to the server, which answers Timeout when
// it expires; the client gives the reply kReplyGrace more before it abandons the connection.
// A forked child drops the pool it inherited (those sockets belong to the parent) and opens
// its own.

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>
#include <thread>
#include <vector>

#include "comm/store/store_impl.h"
#include "comm/store/tcp_auth.h"
#include "comm/store/tcp_protocol.h"
#include "comm/store/tcp_socket.h"
#include "comm/store/tcp_store.h"
#include "core/error.h"
#include "core/tags.h"
#include "core/tunables.h"

namespace loom::comm {

namespace {

using namespace tcp;

constexpr Duration kReplyGrace = std::chrono::seconds(1);
constexpr std::string_view kServer = "the server";  // who closes a connection, in messages
constexpr size_t kMaxIdleConnections = 16;
// Authentication gets at least this long even when connecting used up the timeout.
constexpr Duration kMinHelloTime = std::chrono::seconds(1);

// Reads one frame's payload; a payload over kMaxMessage fails with EMSGSIZE.
IoStatus recv_frame(int fd, Bytes& payload, Deadline deadline) {
  uint8_t header[kFrameHeader];
  IoStatus status = recv_exact(fd, header, kFrameHeader, deadline);
  if (!status.ok()) return status;
  const size_t size = load_u32(header);
  if (size == 0 || size > kMaxMessage) return {IoStatus::kFailed, EMSGSIZE};
  payload.resize(size);
  return recv_exact(fd, payload.data(), size, deadline);
}

}  // namespace

struct TCPStore::Impl {
  std::string host;
  uint16_t port = 0;
  std::string secret;
  Duration timeout{};  // for connecting and for the replies of non-waiting calls
  std::string where;   // "tcp host:port"

  std::mutex mutex;  // guards `idle` and `owner`
  std::vector<Socket> idle;
  pid_t owner = 0;

  [[noreturn]] void fail(const std::string& what) const {
    throw CommError(tag::kCommStore.prefix() + where + ": " + what);
  }

  // Connects (retrying with backoff until the deadline; the server may start later) and
  // authenticates. Throws loom::CommError.
  Socket connect(Deadline deadline) const {
    std::string last_error;
    auto backoff = std::chrono::milliseconds(10);
    while (true) {
      AddrInfoList addresses = resolve(host, port, last_error);
      for (addrinfo* ai = addresses.get(); ai != nullptr; ai = ai->ai_next) {
        IoStatus status;
        Socket s = connect_nonblocking(*ai, deadline, status);
        if (!s.valid()) {
          // Keep an earlier, more telling error ("Connection refused") over running out of
          // time on the last attempt.
          if (status.kind != IoStatus::kTimedOut || last_error.empty()) {
            last_error = "connect: " + status.describe(kServer);
          }
          continue;
        }
        set_nodelay(s.fd());
        authenticate(s, std::max(deadline, Clock::now() + kMinHelloTime));
        return s;
      }
      const auto now = Clock::now();
      if (now >= deadline) break;
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
      backoff = std::min(backoff * 2, Duration(std::chrono::seconds(1)));
    }
    fail("could not connect within " + duration_str(timeout) +
         " (last error: " + (last_error.empty() ? "connect: timed out" : last_error) + ")");
  }

  // Note [Store authentication]: the server's challenge, then the proof of the secret.
  void authenticate(Socket& s, Deadline deadline) const {
    Bytes challenge;
    IoStatus status = recv_frame(s.fd(), challenge, deadline);
    if (!status.ok())
      fail("authentication failed: no challenge from the server: " + status.describe(kServer));
    MessageReader offer(challenge.data(), challenge.size());
    const auto code = offer.code();
    const auto nonce = offer.field();
    if (code != kChallenge || !nonce || !offer.at_end() || nonce->size() != kNonceBytes) {
      fail("authentication failed: the server's first message is not a challenge (is it a Loom "
           "store of this version?)");
    }
    MessageWriter hello(kHello);
    hello.integer(kProtocolVersion).field(std::string_view(hello_proof(secret, *nonce)));
    const Bytes frame = std::move(hello).frame();
    status = send_all(s.fd(), frame.data(), frame.size(), deadline);
    Bytes reply;
    if (status.ok()) status = recv_frame(s.fd(), reply, deadline);
    if (status.kind == IoStatus::kClosed) {
      fail(
          "authentication failed: the server closed the connection at the proof of the secret "
          "(the secrets differ; check " +
          std::string(tunables::kStoreSecret.name) + ")");
    }
    if (!status.ok()) fail("authentication failed: " + status.describe(kServer));
    if (MessageReader(reply.data(), reply.size()).code() != kOk) {
      fail("authentication failed: unexpected reply from the server");
    }
  }

  Socket acquire() {
    {
      std::lock_guard lock(mutex);
      if (owner != ::getpid()) {
        // A forked child: the inherited sockets are the parent's streams. Closing our
        // descriptors leaves the parent's connections open.
        idle.clear();
        owner = ::getpid();
      }
      if (!idle.empty()) {
        Socket s = std::move(idle.back());
        idle.pop_back();
        return s;
      }
    }
    return connect(detail::deadline_in(timeout));
  }

  void release(Socket s) {
    std::lock_guard lock(mutex);
    if (owner == ::getpid() && idle.size() < kMaxIdleConnections) idle.push_back(std::move(s));
  }

  // Sends one request and returns the reply payload. `keys`/`wait_timeout` name what a
  // Get/Wait waited for, for the message when the server never answers.
  Bytes call(MessageWriter&& request, Deadline deadline, const char* op,
             const std::vector<std::string>* keys = nullptr, Duration wait_timeout = {}) {
    if (request.payload_size() > kMaxMessage) {
      tag::kCommStore.fail(where, ": ", op, " request of ", request.payload_size(),
                           " bytes exceeds the TCP store's 64 MiB message limit");
    }
    Socket s = acquire();
    const Bytes frame = std::move(request).frame();
    IoStatus status = send_all(s.fd(), frame.data(), frame.size(), deadline);
    Bytes reply;
    if (status.ok()) status = recv_frame(s.fd(), reply, deadline);
    if (!status.ok()) {
      // `s` is closed on return: its stream may hold a late reply.
      if (status.kind == IoStatus::kTimedOut && keys != nullptr) {
        detail::throw_wait_timeout(where + " (no reply from the server)", *keys, wait_timeout);
      }
      fail(std::string(op) + " failed: " + status.describe(kServer));
    }
    release(std::move(s));
    return reply;
  }

  [[noreturn]] void malformed(const char* op) const {
    fail(std::string("malformed reply to ") + op + " from the server");
  }

  Deadline reply_deadline() const { return detail::deadline_in(timeout); }
  Deadline wait_deadline(Duration wait) const {
    return detail::deadline_in(wait >= Duration::max() - kReplyGrace ? Duration::max()
                                                                     : wait + kReplyGrace);
  }
};

TCPStore::TCPStore(const std::string& host, uint16_t port, std::string secret, Duration timeout)
    : impl_(std::make_unique<Impl>()) {
  impl_->host = host;
  impl_->port = port;
  impl_->secret = std::move(secret);
  impl_->timeout = timeout;
  impl_->where = endpoint_str(host, port);
  impl_->owner = ::getpid();
  impl_->idle.push_back(impl_->connect(detail::deadline_in(timeout)));
}

TCPStore::~TCPStore() = default;

void TCPStore::set(const std::string& key, const Bytes& value) {
  MessageWriter request(kSet);
  request.field(key).field(value);
  Bytes reply = impl_->call(std::move(request), impl_->reply_deadline(), "set");
  if (MessageReader(reply.data(), reply.size()).code() != kOk) impl_->malformed("set");
}

Bytes TCPStore::get(const std::string& key, Duration timeout) {
  MessageWriter request(kGet);
  request.field(key).integer(timeout.count());
  const std::vector<std::string> keys{key};
  Bytes reply =
      impl_->call(std::move(request), impl_->wait_deadline(timeout), "get", &keys, timeout);
  MessageReader in(reply.data(), reply.size());
  const auto code = in.code();
  if (code == kTimeout) detail::throw_wait_timeout(impl_->where, keys, timeout);
  auto value = in.bytes();
  if (code != kOk || !value || !in.at_end()) impl_->malformed("get");
  return std::move(*value);
}

int64_t TCPStore::add(const std::string& key, int64_t delta) {
  MessageWriter request(kAdd);
  request.field(key).integer(delta);
  Bytes reply = impl_->call(std::move(request), impl_->reply_deadline(), "add");
  MessageReader in(reply.data(), reply.size());
  const auto code = in.code();
  if (code == kError) {
    auto message = in.string();
    if (!message) impl_->malformed("add");
    throw Error(*message);  // the server's loom::Error (a non-integer value), passed on
  }
  auto result = in.integer();
  if (code != kOk || !result || !in.at_end()) impl_->malformed("add");
  return *result;
}

Bytes TCPStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  MessageWriter request(kCompareSet);
  request.field(key).field(expected).field(desired);
  Bytes reply = impl_->call(std::move(request), impl_->reply_deadline(), "compare_set");
  MessageReader in(reply.data(), reply.size());
  const auto code = in.code();
  auto value = in.bytes();
  if (code != kOk || !value || !in.at_end()) impl_->malformed("compare_set");
  return std::move(*value);
}

void TCPStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  MessageWriter request(kWait);
  request.integer(timeout.count());
  for (const auto& key : keys)
    request.field(key);
  Bytes reply =
      impl_->call(std::move(request), impl_->wait_deadline(timeout), "wait", &keys, timeout);
  MessageReader in(reply.data(), reply.size());
  const auto code = in.code();
  if (code == kOk && in.at_end()) return;
  if (code != kTimeout) impl_->malformed("wait");
  std::vector<std::string> missing;
  while (!in.at_end()) {
    auto key = in.string();
    if (!key) impl_->malformed("wait");
    missing.push_back(std::move(*key));
  }
  detail::throw_wait_timeout(impl_->where, missing.empty() ? keys : missing, timeout);
}

bool TCPStore::check(const std::vector<std::string>& keys) {
  MessageWriter request(kCheck);
  for (const auto& key : keys)
    request.field(key);
  Bytes reply = impl_->call(std::move(request), impl_->reply_deadline(), "check");
  MessageReader in(reply.data(), reply.size());
  const auto code = in.code();
  auto all = in.integer();
  if (code != kOk || !all || !in.at_end()) impl_->malformed("check");
  return *all != 0;
}

bool TCPStore::remove(const std::string& key) {
  MessageWriter request(kRemove);
  request.field(key);
  Bytes reply = impl_->call(std::move(request), impl_->reply_deadline(), "remove");
  MessageReader in(reply.data(), reply.size());
  const auto code = in.code();
  auto existed = in.integer();
  if (code != kOk || !existed || !in.at_end()) impl_->malformed("remove");
  return *existed != 0;
}

}  // namespace loom::comm
