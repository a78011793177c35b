#include "tools/loomrun/output_relay.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "tools/loomrun/log.h"

namespace loom::loomrun {

void OutputRelay::feed(const char* data, size_t size) {
  while (size > 0) {
    const void* found = std::memchr(data, '\n', size);
    if (found == nullptr) {
      pending_.append(data, size);
      while (pending_.size() >= kMaxLine) {
        emit(pending_.data(), kMaxLine, true);
        pending_.erase(0, kMaxLine);
      }
      return;
    }
    size_t length = static_cast<size_t>(static_cast<const char*>(found) - data) + 1;
    if (pending_.empty()) {
      emit(data, length, false);
    } else {
      pending_.append(data, length);
      emit(pending_.data(), pending_.size(), false);
      pending_.clear();
    }
    data += length;
    size -= length;
  }
}

void OutputRelay::flush() {
  if (pending_.empty()) return;
  emit(pending_.data(), pending_.size(), true);
  pending_.clear();
}

void OutputRelay::emit(const char* line, size_t size, bool add_newline) {
  std::string out;
  out.reserve(prefix_.size() + size + 1);
  out.append(prefix_).append(line, size);
  if (add_newline) out.push_back('\n');
  write_all(out_fd_, out);
}

}  // namespace loom::loomrun
