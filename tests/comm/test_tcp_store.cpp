// TCPStore's own tests (the conformance suite over every store is test_store.cpp):
// authentication (Note [Store authentication]), hostile clients, binding, connect timeouts
// and clients in forked processes.

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/store/store.h"
#include "comm/store/tcp_auth.h"
#include "comm/store/tcp_store.h"
#include "core/error.h"
#include "store_test_support.h"

namespace loom::comm {
namespace {

using namespace store_testing;

// A raw TCP connection to the server, for speaking (broken) protocol by hand.
int raw_connect(uint16_t port, const char* address = "127.0.0.1") {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  ::inet_pton(AF_INET, address, &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

void put_u32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out += char(v >> (8 * i));
}

// A hello frame (see tcp_protocol.h): kHello, the version as an 8-byte field, then `proof`.
std::string hello_with(const std::string& proof, uint64_t version = 2) {
  std::string payload(1, char(1));
  put_u32(payload, 8);
  for (int i = 0; i < 8; ++i)
    payload += char(version >> (8 * i));
  put_u32(payload, uint32_t(proof.size()));
  payload += proof;
  std::string frame;
  put_u32(frame, uint32_t(payload.size()));
  return frame + payload;
}

// Reads the server's first frame on `fd`, its challenge, and returns the nonce ("" when the
// frame is not a challenge or does not come within two seconds).
std::string read_challenge(int fd) {
  std::string in;
  const auto deadline = Clock::now() + 2s;
  auto want = [&](size_t n) {
    while (in.size() < n && Clock::now() < deadline) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[256];
      const ssize_t got = ::recv(fd, buf, std::min(sizeof(buf), n - in.size()), 0);
      if (got <= 0) return false;
      in.append(buf, size_t(got));
    }
    return in.size() >= n;
  };
  if (!want(4)) return "";
  const uint32_t size = uint8_t(in[0]) | uint8_t(in[1]) << 8 | uint8_t(in[2]) << 16 | uint32_t(uint8_t(in[3])) << 24;
  if (size != 1 + 4 + 32 || !want(4 + size) || in[4] != char(9)) return "";
  return in.substr(9, 32);
}

// The hello that answers this connection's challenge with the proof of `secret`.
std::string hello_frame(int fd, const std::string& secret) {
  return hello_with(comm::tcp::hello_proof(secret, read_challenge(fd)));
}

// True when the server closes `fd` (EOF or reset) within two seconds.
bool closed_by_server(int fd) {
  pollfd p{fd, POLLIN, 0};
  const auto deadline = Clock::now() + 2s;
  while (Clock::now() < deadline) {
    if (::poll(&p, 1, 100) <= 0) continue;
    char buf[256];
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return true;
  }
  return false;
}

void expect_server_healthy(uint16_t port) {
  TCPStore good("127.0.0.1", port, kSecret, 2s);
  good.set("health", to_bytes("ok"));
  EXPECT_EQ(to_string(good.get("health", 1s)), "ok");
}

TEST(TCPStore, RejectsWrongSecret) {
  TCPStoreServer server("127.0.0.1", 0, kSecret);
  TCPStore good("127.0.0.1", server.port(), kSecret, 2s);
  good.set("k", to_bytes("v"));
  for (const std::string& bad :
       std::vector<std::string>{"wrong", "", std::string(kSecret) + "x", "correct horse"}) {
    try {
      TCPStore store("127.0.0.1", server.port(), bad, 2s);
      ADD_FAILURE() << "accepted the secret '" << bad << "'";
    } catch (const CommError& e) {
      EXPECT_NE(std::string(e.what()).find("authentication"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(server.port())),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_EQ(to_string(good.get("k", 1s)), "v");
  expect_server_healthy(server.port());
}

// Note [Store authentication]: the proof is HMAC-SHA256 (RFC 4231, test case 2).
TEST(TCPStore, ProofIsHmacSha256) {
  const std::string mac = comm::tcp::hello_proof("Jefe", "what do ya want for nothing?");
  const unsigned char expected[] = {0x5b, 0xdc, 0xc1, 0x46, 0xbf, 0x60, 0x75, 0x4e, 0x6a, 0x04, 0x24,
                                    0x26, 0x08, 0x95, 0x75, 0xc7, 0x5a, 0x00, 0x3f, 0x08, 0x9d, 0x27,
                                    0x39, 0x83, 0x9d, 0xec, 0x58, 0xb9, 0x64, 0xec, 0x38, 0x43};
  EXPECT_EQ(mac, std::string(reinterpret_cast<const char*>(expected), sizeof expected));
  EXPECT_NE(comm::tcp::new_nonce(), comm::tcp::new_nonce());
}

// A hello that authenticated one connection is refused on another: its nonce differs.
TEST(TCPStore, ReplayedHelloIsRejected) {
  TCPStoreServer server("127.0.0.1", 0, kSecret);
  const int first = raw_connect(server.port());
  ASSERT_GE(first, 0);
  const std::string captured = hello_frame(first, kSecret);
  ASSERT_EQ(::send(first, captured.data(), captured.size(), MSG_NOSIGNAL), ssize_t(captured.size()));
  EXPECT_FALSE(closed_by_server(first)) << "the genuine hello authenticates";
  const int second = raw_connect(server.port());
  ASSERT_GE(second, 0);
  ASSERT_EQ(read_challenge(second).size(), 32u);
  ASSERT_EQ(::send(second, captured.data(), captured.size(), MSG_NOSIGNAL), ssize_t(captured.size()));
  EXPECT_TRUE(closed_by_server(second)) << "the replayed hello must not";
  // A hello cut short, and one of the old protocol (the secret itself), are refused too.
  const int third = raw_connect(server.port());
  ASSERT_GE(third, 0);
  const std::string truncated = hello_frame(third, kSecret).substr(0, 20);
  ::send(third, truncated.data(), truncated.size(), MSG_NOSIGNAL);
  ::shutdown(third, SHUT_WR);
  EXPECT_TRUE(closed_by_server(third));
  const int fourth = raw_connect(server.port());
  ASSERT_GE(fourth, 0);
  read_challenge(fourth);
  const std::string old = hello_with(kSecret, 1);
  ::send(fourth, old.data(), old.size(), MSG_NOSIGNAL);
  EXPECT_TRUE(closed_by_server(fourth));
  for (int fd : {first, second, third, fourth})
    ::close(fd);
  expect_server_healthy(server.port());
}

// The client never sends the secret: a listener playing the server sees only the proof.
TEST(TCPStore, SecretNeverCrossesTheWire) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 1), 0);
  socklen_t length = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &length);
  const uint16_t port = ntohs(addr.sin_port);
  const std::string nonce(32, 'n');
  std::string heard;
  std::thread fake([&] {
    const int fd = ::accept(listener, nullptr, nullptr);
    std::string challenge;
    put_u32(challenge, 1 + 4 + 32);
    challenge += char(9);
    put_u32(challenge, 32);
    challenge += nonce;
    ::send(fd, challenge.data(), challenge.size(), MSG_NOSIGNAL);
    char buf[512];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) {
      heard.append(buf, size_t(n));
      if (heard.size() >= 4 + 1 + 12 + 4 + 32) break;  // the whole hello
    }
    ::close(fd);  // no reply: the client's authentication fails
  });
  EXPECT_THROW(TCPStore("127.0.0.1", port, kSecret, 2s), CommError);
  fake.join();
  ::close(listener);
  EXPECT_EQ(heard.find(kSecret), std::string::npos) << "the secret went over the wire";
  EXPECT_NE(heard.find(comm::tcp::hello_proof(kSecret, nonce)), std::string::npos);
}

TEST(TCPStore, UnauthenticatedRequestsAreNotProcessed) {
  TCPStoreServer server("127.0.0.1", 0, kSecret);
  // A Set frame (command 2) sent before any hello: the server must drop the connection.
  std::string payload(1, char(2));
  put_u32(payload, 3);
  payload += "key";
  put_u32(payload, 3);
  payload += "bad";
  std::string frame;
  put_u32(frame, uint32_t(payload.size()));
  frame += payload;
  const int fd = raw_connect(server.port());
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL), ssize_t(frame.size()));
  EXPECT_TRUE(closed_by_server(fd));
  ::close(fd);
  TCPStore good("127.0.0.1", server.port(), kSecret, 2s);
  EXPECT_FALSE(good.check({"key"}));
}

TEST(TCPStore, DropsGarbageAndOversizedMessages) {
  TCPStoreServer server("127.0.0.1", 0, kSecret);
  // Plain garbage (an HTTP request): its first four bytes read as a huge length.
  {
    const int fd = raw_connect(server.port());
    ASSERT_GE(fd, 0);
    const std::string junk = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    ::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    EXPECT_TRUE(closed_by_server(fd));
    ::close(fd);
  }
  // An empty frame, then an unknown command after authenticating.
  {
    const int fd = raw_connect(server.port());
    ASSERT_GE(fd, 0);
    const std::string empty(4, '\0');
    ::send(fd, empty.data(), empty.size(), MSG_NOSIGNAL);
    EXPECT_TRUE(closed_by_server(fd));
    ::close(fd);
  }
  {
    const int fd = raw_connect(server.port());
    ASSERT_GE(fd, 0);
    std::string frames = hello_frame(fd, kSecret);
    frames += std::string("\x01\0\0\0\x7f", 5);  // a 1-byte payload with command 0x7f
    ::send(fd, frames.data(), frames.size(), MSG_NOSIGNAL);
    EXPECT_TRUE(closed_by_server(fd));
    ::close(fd);
  }
  // An authenticated client announcing a frame over the 64 MiB cap is dropped at once,
  // without the server waiting for (or buffering) the body.
  {
    const int fd = raw_connect(server.port());
    ASSERT_GE(fd, 0);
    std::string frames = hello_frame(fd, kSecret);
    put_u32(frames, (64u << 20) + 1);
    frames += "partial body";
    ::send(fd, frames.data(), frames.size(), MSG_NOSIGNAL);
    EXPECT_TRUE(closed_by_server(fd));
    ::close(fd);
  }
  // A hello over the pre-authentication cap.
  {
    const int fd = raw_connect(server.port());
    ASSERT_GE(fd, 0);
    std::string frames = hello_with(std::string(10000, 's'));
    ::send(fd, frames.data(), frames.size(), MSG_NOSIGNAL);
    EXPECT_TRUE(closed_by_server(fd));
    ::close(fd);
  }
  expect_server_healthy(server.port());
}

TEST(TCPStore, ClientRefusesValuesOverTheMessageCap) {
  TCPStoreServer server("127.0.0.1", 0, kSecret);
  TCPStore store("127.0.0.1", server.port(), kSecret, 2s);
  EXPECT_THROW(store.set("huge", Bytes((64u << 20) + 1)), Error);
  store.set("after", to_bytes("fine"));
  EXPECT_EQ(to_string(store.get("after", 1s)), "fine");
}

TEST(TCPStore, ClientsInForkedProcesses) {
  TCPStoreServer server("127.0.0.1", 0, kSecret);
  TCPStore parent("127.0.0.1", server.port(), kSecret, 2s);
  parent.set("hello", to_bytes("from parent"));
  constexpr int kChildren = 4;
  constexpr int kAdds = 25;
  std::vector<pid_t> children;
  for (int c = 0; c < kChildren; ++c) {
    children.push_back(spawn([&, c] {
      TCPStore store("127.0.0.1", server.port(), kSecret, 5s);
      if (to_string(store.get("hello", 1s)) != "from parent") return 4;
      for (int i = 0; i < kAdds; ++i)
        store.add("counter", 1);
      // The inherited client also works in the child (it opens its own connections).
      parent.add("via_inherited", 1);
      store.set("child/" + std::to_string(c), {});
      return to_string(store.get("go", 10s)) == "go" ? 0 : 5;
    }));
  }
  std::vector<std::string> keys;
  for (int c = 0; c < kChildren; ++c)
    keys.push_back("child/" + std::to_string(c));
  parent.wait(keys, 10s);
  EXPECT_EQ(parent.add("counter", 0), kChildren * kAdds);
  EXPECT_EQ(parent.add("via_inherited", 0), kChildren);
  parent.set("go", to_bytes("go"));
  for (pid_t pid : children)
    EXPECT_EQ(join(pid), 0);
  parent.set("still", to_bytes("works"));
  EXPECT_EQ(to_string(parent.get("still", 1s)), "works");
}

TEST(TCPStore, ManyClientsRendezvous) {
  TCPStoreServer server("127.0.0.1", 0, kSecret);
  constexpr int kClients = 64;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      try {
        TCPStore store("127.0.0.1", server.port(), kSecret, 5s);
        store.set("rank/" + std::to_string(c), to_bytes(std::to_string(c)));
        if (store.add("arrived", 1) == kClients) store.set("all", {});
        store.get("all", 5s);
        const int peer = (c + 1) % kClients;
        if (to_string(store.get("rank/" + std::to_string(peer), 1s)) != std::to_string(peer)) {
          ++failures;
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "client %d: %s\n", c, e.what());
        ++failures;
      }
    });
  }
  for (auto& t : threads)
    t.join();
  EXPECT_EQ(failures.load(), 0);
}

TEST(TCPStore, ThreadsSharingOneClientDoNotBlockEachOther) {
  TCPStoreServer server("127.0.0.1", 0, kSecret);
  TCPStore store("127.0.0.1", server.port(), kSecret, 2s);
  // One thread blocks in get() on the shared client while another sets the key through it.
  std::thread waiter([&] { EXPECT_EQ(to_string(store.get("later", 5s)), "x"); });
  std::this_thread::sleep_for(50ms);
  const Duration took = time_of([&] { store.set("later", to_bytes("x")); });
  waiter.join();
  EXPECT_LT(took, 1000ms);
}

TEST(TCPStore, AbandonedWaiterLeavesTheServerHealthy) {
  TCPStoreServer server("127.0.0.1", 0, kSecret);
  // A child parks a 60 s Get (command 3: key, timeout ms) on the server and dies.
  const pid_t child = spawn([&] {
    const int fd = raw_connect(server.port());
    std::string payload(1, char(3));
    put_u32(payload, 5);
    payload += "never";
    put_u32(payload, 8);
    const int64_t timeout_ms = 60000;
    for (int i = 0; i < 8; ++i)
      payload += char(uint64_t(timeout_ms) >> (8 * i));
    std::string frames = hello_frame(fd, kSecret);
    put_u32(frames, uint32_t(payload.size()));
    frames += payload;
    if (fd < 0 || ::send(fd, frames.data(), frames.size(), MSG_NOSIGNAL) < 0) return 4;
    std::this_thread::sleep_for(50ms);
    return 0;  // _exit closes the socket with the Get still parked
  });
  EXPECT_EQ(join(child), 0);
  expect_server_healthy(server.port());
  TCPStore store("127.0.0.1", server.port(), kSecret, 2s);
  store.set("never", to_bytes("now"));  // wakes nobody: the waiter's connection is gone
  EXPECT_EQ(to_string(store.get("never", 1s)), "now");
}

TEST(TCPStore, ServerDestructorIsPromptWithParkedWaiters) {
  auto server = std::make_unique<TCPStoreServer>("127.0.0.1", 0, kSecret);
  TCPStore store("127.0.0.1", server->port(), kSecret, 200ms);
  std::atomic<bool> failed{false};
  std::thread waiter([&] {
    try {
      store.get("never", 30s);
    } catch (const CommError&) {
      failed = true;
    }
  });
  std::this_thread::sleep_for(50ms);
  EXPECT_LT(time_of([&] { server.reset(); }), 1000ms);
  waiter.join();  // the client sees the connection close, not a 30 s wait
  EXPECT_TRUE(failed.load());
  // Later calls try to reconnect for the client's 200 ms, then fail.
  EXPECT_THROW(store.set("k", {}), CommError);
}

TEST(TCPStore, ConnectToNoServerTimesOut) {
  // A port that was free a moment ago (bound, then released).
  uint16_t port = 0;
  { port = TCPStoreServer("127.0.0.1", 0, kSecret).port(); }
  expect_timeout([&] { TCPStore("127.0.0.1", port, kSecret, 200ms); }, 200ms,
                 {"[comm/store]", "127.0.0.1:" + std::to_string(port), "connect"});
}

TEST(TCPStore, ClientWaitsForALateServer) {
  uint16_t port = 0;
  { port = TCPStoreServer("127.0.0.1", 0, kSecret).port(); }
  std::unique_ptr<TCPStoreServer> server;
  std::thread starter([&] {
    std::this_thread::sleep_for(150ms);
    server = std::make_unique<TCPStoreServer>("127.0.0.1", port, kSecret);
  });
  TCPStore store("127.0.0.1", port, kSecret, 5s);
  starter.join();
  store.set("k", to_bytes("v"));
  EXPECT_EQ(to_string(store.get("k", 1s)), "v");
}

TEST(TCPStore, BindsOnlyTheGivenAddress) {
  TCPStoreServer server("127.0.0.1", 0, kSecret);
  // 127.0.0.2 is loopback too, but not the address bound.
  EXPECT_LT(raw_connect(server.port(), "127.0.0.2"), 0);
  // A non-loopback address of this machine, if it has one.
  ifaddrs* list = nullptr;
  std::string other;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i != nullptr && other.empty(); i = i->ifa_next) {
      if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
      char text[INET_ADDRSTRLEN];
      const auto* in = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
      ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
      if (std::string(text).rfind("127.", 0) != 0) other = text;
    }
    ::freeifaddrs(list);
  }
  if (!other.empty()) {
    const int fd = raw_connect(server.port(), other.c_str());
    EXPECT_LT(fd, 0) << "reachable via " << other;
    if (fd >= 0) ::close(fd);
  }
  expect_timeout([&] { TCPStore("127.0.0.2", server.port(), kSecret, 100ms); }, 100ms,
                 {"127.0.0.2"});
  if (other.empty()) GTEST_SKIP() << "no non-loopback IPv4 address to try";
}

TEST(TCPStore, LocalhostAndIPv6) {
  {
    TCPStoreServer server("localhost", 0, kSecret);
    TCPStore store("localhost", server.port(), kSecret, 2s);
    store.set("k", to_bytes("v"));
    EXPECT_EQ(to_string(store.get("k", 1s)), "v");
  }
  std::unique_ptr<TCPStoreServer> server;
  try {
    server = std::make_unique<TCPStoreServer>("::1", 0, kSecret);
  } catch (const CommError& e) {
    GTEST_SKIP() << "no IPv6 loopback: " << e.what();
  }
  TCPStore store("::1", server->port(), kSecret, 2s);
  store.set("k6", to_bytes("v6"));
  EXPECT_EQ(to_string(store.get("k6", 1s)), "v6");
  EXPECT_LT(raw_connect(server->port(), "127.0.0.1"), 0);  // bound ::1 only
}

TEST(TCPStore, BindFailureIsACommErrorNamingTheAddress) {
  TCPStoreServer first("127.0.0.1", 0, kSecret);
  try {
    TCPStoreServer second("127.0.0.1", first.port(), kSecret);
    FAIL() << "bound a port already in use";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(first.port())),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(TCPStoreServer("no-such-host.invalid", 0, kSecret), CommError);
}

TEST(TCPStore, Secrets) {
  const std::string a = generate_store_secret();
  const std::string b = generate_store_secret();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos) << a;
  EXPECT_NE(a, b);

  const char* saved = std::getenv("LOOM_STORE_SECRET");
  const std::string restore = saved ? saved : "";
  ::setenv("LOOM_STORE_SECRET", "from-env", 1);
  EXPECT_EQ(store_secret_from_env(), "from-env");
  ::unsetenv("LOOM_STORE_SECRET");
  EXPECT_EQ(store_secret_from_env(), "");
  if (saved) ::setenv("LOOM_STORE_SECRET", restore.c_str(), 1);
}

}  // namespace
}  // namespace loom::comm
