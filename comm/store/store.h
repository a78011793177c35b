#pragma once
// Store: the small key-value rendezvous every process group is built on.
// Implementations: InProcessStore (threads of one process), FileStore (processes sharing a
// file system), TCPStore (a server on the master, clients authenticated by a shared secret).
// Values are bytes; nothing read from a store is ever executed or deserialised into objects.
// All methods are thread-safe. Every blocking call takes a timeout and throws
// loom::CommError (naming the keys it waited for) when it expires.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/error.h"

namespace loom::comm {

using Bytes = std::vector<uint8_t>;

Bytes to_bytes(const std::string& text);
std::string to_string(const Bytes& bytes);

class Store {
 public:
  virtual ~Store() = default;

  virtual void set(const std::string& key, const Bytes& value) = 0;
  // Waits until `key` exists, then returns its value.
  virtual Bytes get(const std::string& key, Duration timeout = kDefaultTimeout) = 0;
  // Adds `delta` to the integer stored at `key` (absent counts as 0) and returns the result.
  // The value is stored as decimal text, so get() of a counter returns e.g. "3".
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Atomically: if the current value equals `expected` (an absent key matches an empty
  // `expected`), store `desired`. Returns the value stored afterwards.
  virtual Bytes compare_set(const std::string& key, const Bytes& expected,
                            const Bytes& desired) = 0;
  // Waits until every key exists.
  virtual void wait(const std::vector<std::string>& keys, Duration timeout = kDefaultTimeout) = 0;
  // True when every key exists (does not wait).
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Deletes `key`; returns whether it existed.
  virtual bool remove(const std::string& key) = 0;
};

// Every key of `base` prefixed with "<prefix>/": the namespace of one process group.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base);
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Duration timeout = kDefaultTimeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout = kDefaultTimeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool remove(const std::string& key) override;

 private:
  std::string key_of(const std::string& key) const { return prefix_ + "/" + key; }
  std::vector<std::string> keys_of(const std::vector<std::string>& keys) const;
  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace loom::comm
