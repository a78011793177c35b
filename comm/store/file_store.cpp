// FileStore: an append-only log in one file.
//
// Layout: the 8-byte magic "LOOMFS1\n", then records
//   u8 kind ('S' set, 'R' remove) | u32 key length | u32 value length | key | value
// with little-endian lengths (a remove has an empty value). Replaying the log in order gives
// the map. Every operation opens the file afresh (so forked children and separate objects
// each get their own open file description) and holds an fcntl lock while it touches it:
// shared to read, exclusive to append. Linux open-file-description locks (F_OFD_SETLKW) are
// used where available, so two FileStore objects in one process exclude each other too;
// the object's mutex serialises its own threads around its cache.
// A writer that died mid-append leaves a partial record at the end: readers stop before it
// and the next writer truncates it before appending.

#include "comm/store/file_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>

#include "comm/store/store_impl.h"
#include "core/error.h"
#include "core/tags.h"

namespace loom::comm {

namespace {

constexpr char kMagic[] = "LOOMFS1\n";
constexpr size_t kMagicSize = sizeof(kMagic) - 1;
constexpr size_t kRecordHeader = 9;  // kind, key length, value length
constexpr uint8_t kSetRecord = 'S';
constexpr uint8_t kRemoveRecord = 'R';

[[noreturn]] void throw_io(const std::string& path, const std::string& what, int err) {
  throw CommError(tag::kCommStore.prefix() + "file " + path + ": " + what + ": " +
                  std::strerror(err));
}

uint32_t read_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

void append_u32(Bytes& out, uint32_t v) {
  for (int i = 0; i < 4; ++i)
    out.push_back(uint8_t(v >> (8 * i)));
}

// The file open for one operation, closed on scope exit (which also drops its lock).
class OpenFile {
 public:
  explicit OpenFile(const std::string& path) : path_(path) {
    do {
      fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    } while (fd_ < 0 && errno == EINTR);
    if (fd_ < 0) throw_io(path, "cannot open", errno);
  }
  ~OpenFile() { ::close(fd_); }
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;

  // Blocks until this process holds the lock (shared or exclusive) on the whole file.
  void lock(bool exclusive) {
    struct flock lk {};
    lk.l_type = exclusive ? F_WRLCK : F_RDLCK;
    lk.l_whence = SEEK_SET;
    lk.l_start = 0;
    lk.l_len = 0;
#ifdef F_OFD_SETLKW
    const int command = F_OFD_SETLKW;
#else
    const int command = F_SETLKW;
#endif
    while (::fcntl(fd_, command, &lk) != 0) {
      if (errno != EINTR) throw_io(path_, "cannot lock", errno);
    }
  }

  struct stat status() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) throw_io(path_, "cannot stat", errno);
    return st;
  }

  Bytes read_range(uint64_t begin, uint64_t end) const {
    Bytes out(end - begin);
    size_t done = 0;
    while (done < out.size()) {
      const ssize_t n = ::pread(fd_, out.data() + done, out.size() - done, off_t(begin + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_io(path_, "cannot read", errno);
      if (n == 0) break;  // shrank under us (only a dead writer's tail is ever truncated)
      done += size_t(n);
    }
    out.resize(done);
    return out;
  }

  void write_at(uint64_t offset, const Bytes& data) const {
    size_t done = 0;
    while (done < data.size()) {
      const ssize_t n = ::pwrite(fd_, data.data() + done, data.size() - done, off_t(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_io(path_, "cannot write", errno);
      done += size_t(n);
    }
  }

  void truncate(uint64_t size) const {
    while (::ftruncate(fd_, off_t(size)) != 0) {
      if (errno != EINTR) throw_io(path_, "cannot truncate", errno);
    }
  }

 private:
  std::string path_;
  int fd_ = -1;
};

}  // namespace

struct FileStore::State {
  std::mutex mutex;
  std::map<std::string, Bytes> values;  // the log replayed up to `offset`
  uint64_t offset = 0;                  // bytes of the file applied to `values`
  dev_t device = 0;                     // identity of the file `values` came from
  ino_t inode = 0;
  pid_t creator = 0;

  // Brings `values` up to date with the file; the caller holds `file`'s lock (exclusive when
  // `repair` is set, which truncates a dead writer's partial record). Returns the end of the
  // last complete record.
  uint64_t sync(const std::string& path, OpenFile& file, bool repair) {
    const struct stat st = file.status();
    const uint64_t size = uint64_t(st.st_size);
    if (st.st_dev != device || st.st_ino != inode || size < offset) {
      // A different (recreated) file, or the first read: replay from the start.
      values.clear();
      offset = 0;
      device = st.st_dev;
      inode = st.st_ino;
    }
    if (size == offset) return offset;
    const Bytes data = file.read_range(offset, size);
    size_t pos = 0;
    if (offset == 0) {
      const size_t have = std::min(data.size(), kMagicSize);
      if (std::memcmp(data.data(), kMagic, have) != 0) {
        tag::kCommStore.fail(
            "file ", path,
            ": expected a Loom file store (starting with \"LOOMFS1\"), found other content");
      }
      if (have < kMagicSize) {  // the first writer died mid-header
        if (repair) file.truncate(0);
        return 0;
      }
      pos = kMagicSize;
    }
    while (data.size() - pos >= kRecordHeader) {
      const uint8_t kind = data[pos];
      const uint64_t key_size = read_u32(&data[pos + 1]);
      const uint64_t value_size = read_u32(&data[pos + 5]);
      if (kind != kSetRecord && kind != kRemoveRecord) {
        tag::kCommStore.fail("file ", path, ": corrupt record at offset ", offset + pos,
                             " (kind byte ", int(kind), ", expected 'S' or 'R')");
      }
      if (data.size() - pos - kRecordHeader < key_size + value_size) break;  // partial tail
      // Pointers, not data[...]: an empty value at the end of the file starts at data.size().
      const auto* key_begin = reinterpret_cast<const char*>(data.data() + pos + kRecordHeader);
      std::string key(key_begin, key_size);
      if (kind == kSetRecord) {
        const auto* value_begin = data.data() + pos + kRecordHeader + key_size;
        values[std::move(key)] = Bytes(value_begin, value_begin + value_size);
      } else {
        values.erase(key);
      }
      pos += kRecordHeader + key_size + value_size;
    }
    offset += pos;
    if (repair && offset < size) file.truncate(offset);
    return offset;
  }

  // Appends one record; the caller holds the exclusive lock and has just synced.
  void append(OpenFile& file, uint8_t kind, const std::string& key, const Bytes& value) {
    Bytes record;
    if (offset == 0) record.assign(kMagic, kMagic + kMagicSize);
    if (key.size() > UINT32_MAX || value.size() > UINT32_MAX) {
      tag::kCommStore.fail("key '", key, "': value of ", value.size(),
                           " bytes exceeds the 4 GiB record limit");
    }
    record.push_back(kind);
    append_u32(record, uint32_t(key.size()));
    append_u32(record, uint32_t(value.size()));
    record.insert(record.end(), key.begin(), key.end());
    record.insert(record.end(), value.begin(), value.end());
    file.write_at(offset, record);
    offset += record.size();
    if (kind == kSetRecord) {
      values[key] = value;
    } else {
      values.erase(key);
    }
  }

  bool has_all(const std::vector<std::string>& keys) const {
    return std::all_of(keys.begin(), keys.end(),
                       [&](const std::string& key) { return values.contains(key); });
  }
};

FileStore::FileStore(std::string path, bool remove_on_exit)
    : path_(std::move(path)), remove_on_exit_(remove_on_exit), state_(std::make_unique<State>()) {
  state_->creator = ::getpid();
  OpenFile file(path_);  // create it now, so a bad path fails here and not in the first wait
  file.lock(false);
  state_->sync(path_, file, false);
}

FileStore::~FileStore() {
  if (remove_on_exit_ && ::getpid() == state_->creator) ::unlink(path_.c_str());
}

void FileStore::set(const std::string& key, const Bytes& value) {
  std::lock_guard guard(state_->mutex);
  OpenFile file(path_);
  file.lock(true);
  state_->sync(path_, file, true);
  state_->append(file, kSetRecord, key, value);
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::lock_guard guard(state_->mutex);
  OpenFile file(path_);
  file.lock(true);
  state_->sync(path_, file, true);
  auto found = state_->values.find(key);
  const int64_t result =
      detail::add_to_counter(key, found == state_->values.end() ? nullptr : &found->second, delta);
  state_->append(file, kSetRecord, key, to_bytes(std::to_string(result)));
  return result;
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::lock_guard guard(state_->mutex);
  OpenFile file(path_);
  file.lock(true);
  state_->sync(path_, file, true);
  auto found = state_->values.find(key);
  if (found == state_->values.end()) {
    if (!expected.empty()) return {};
  } else if (found->second != expected) {
    return found->second;
  }
  state_->append(file, kSetRecord, key, desired);
  return desired;
}

bool FileStore::remove(const std::string& key) {
  std::lock_guard guard(state_->mutex);
  OpenFile file(path_);
  file.lock(true);
  state_->sync(path_, file, true);
  if (!state_->values.contains(key)) return false;
  state_->append(file, kRemoveRecord, key, {});
  return true;
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard guard(state_->mutex);
  OpenFile file(path_);
  file.lock(false);
  state_->sync(path_, file, false);
  return state_->has_all(keys);
}

namespace {

// Polls `ready` (which reads the file) with a 1-10 ms backoff until it returns true or the
// deadline passes. Returns whether it became ready.
template <typename Ready>
bool poll_until(Deadline deadline, Ready ready) {
  auto backoff = std::chrono::microseconds(1000);
  constexpr auto kMaxBackoff = std::chrono::microseconds(10000);
  while (true) {
    if (ready()) return true;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

}  // namespace

void FileStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  if (poll_until(detail::deadline_in(timeout), [&] { return check(keys); })) return;
  std::vector<std::string> missing;
  {
    std::lock_guard guard(state_->mutex);
    for (const auto& key : keys) {
      if (!state_->values.contains(key)) missing.push_back(key);
    }
  }
  detail::throw_wait_timeout("file " + path_, missing, timeout);
}

Bytes FileStore::get(const std::string& key, Duration timeout) {
  Bytes value;
  const bool found = poll_until(detail::deadline_in(timeout), [&] {
    std::lock_guard guard(state_->mutex);
    OpenFile file(path_);
    file.lock(false);
    state_->sync(path_, file, false);
    auto it = state_->values.find(key);
    if (it == state_->values.end()) return false;
    value = it->second;
    return true;
  });
  if (!found) detail::throw_wait_timeout("file " + path_, {key}, timeout);
  return value;
}

}  // namespace loom::comm
