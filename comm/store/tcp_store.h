#pragma once
// TCP store: one server (run by loomrun, or by rank 0) and one client per rank.
// Every connection starts with the shared secret; a client that does not present it is
// disconnected and the server logs nothing of its payload. The wire protocol is a small
// length-prefixed binary format (see tcp_protocol.h); values are opaque bytes.
// The server binds the given address only (loopback by default); binding all interfaces
// requires host "0.0.0.0" or "::" to be passed explicitly. The secret travels in clear text:
// it keeps strangers on a trusted network out, it is no defence against a network observer.
// Messages are capped at 64 MiB (a larger value is loom::Error on the client; a client that
// sends one is dropped by the server).

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "comm/store/store.h"

namespace loom::comm {

// The secret comes from LOOM_STORE_SECRET (set by loomrun) unless given explicitly.
std::string store_secret_from_env();
// 32 random bytes from the OS, hex-encoded.
std::string generate_store_secret();

class TCPStoreServer {
 public:
  // Binds host:port (port 0 picks a free one; see port()) and serves on a background thread
  // until destroyed. Throws loom::CommError when the address cannot be bound. The destructor
  // stops the thread promptly and closes every connection (a client parked in get/wait gets
  // loom::CommError at once).
  TCPStoreServer(const std::string& host, uint16_t port, std::string secret);
  ~TCPStoreServer();
  TCPStoreServer(const TCPStoreServer&) = delete;
  TCPStoreServer& operator=(const TCPStoreServer&) = delete;
  uint16_t port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

class TCPStore final : public Store {
 public:
  // Connects (retrying until `timeout`) and authenticates; throws loom::CommError naming the
  // address when the server cannot be reached or rejects the secret ("authentication failed").
  // `timeout` also bounds later reconnects and the replies of the non-waiting calls; get/wait
  // use their own timeout (the server answers when it expires). Threads may share one client:
  // each concurrent call uses its own pooled connection. A forked child may keep using the
  // parent's object; it opens connections of its own.
  TCPStore(const std::string& host, uint16_t port, std::string secret,
           Duration timeout = kDefaultTimeout);
  ~TCPStore() override;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Duration timeout = kDefaultTimeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout = kDefaultTimeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool remove(const std::string& key) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace loom::comm
