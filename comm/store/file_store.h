#pragma once
// A store in one file on a file system every rank can reach (a local temp dir for forked
// tests, a shared file system across hosts). Operations take an fcntl lock on the file, so
// processes and threads may share it. The file is created with mode 0600; the creator
// removes it in its destructor when `remove_on_exit` is set (a forked child's copy of the
// object never removes it).
// The file is an append-only log of set/remove records (see file_store.cpp); each object
// caches the replayed map and reads only what other writers appended since. Waits poll the
// file with a 1-10 ms backoff. Throws loom::CommError when the file cannot be opened or
// written, loom::Error when it is not a Loom file store.

#include <memory>
#include <string>

#include "comm/store/store.h"

namespace loom::comm {

class FileStore final : public Store {
 public:
  explicit FileStore(std::string path, bool remove_on_exit = false);
  ~FileStore() override;
  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key, Duration timeout = kDefaultTimeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout = kDefaultTimeout) override;
  bool check(const std::vector<std::string>& keys) override;
  bool remove(const std::string& key) override;
  const std::string& path() const { return path_; }

 private:
  struct State;  // the replayed map, its file offset, the creating pid (file_store.cpp)
  std::string path_;
  bool remove_on_exit_;
  std::unique_ptr<State> state_;
};

}  // namespace loom::comm
