#pragma once
// Relays one rank's stream (its stdout or stderr pipe) to loomrun's own stdout or stderr,
// prefixing every line with "[<global rank>] ". Each complete line is written with a single
// write(2), so lines of different ranks never interleave within a line. A line longer than
// kMaxLine is cut and relayed in pieces; a partial last line is relayed with a newline
// added when the stream ends (flush()). Not thread-safe: loomrun relays from one thread.

#include <cstddef>
#include <string>

namespace loom::loomrun {

class OutputRelay {
 public:
  static constexpr size_t kMaxLine = 64 * 1024;

  OutputRelay(int out_fd, std::string prefix) : out_fd_(out_fd), prefix_(std::move(prefix)) {}

  // Relays every complete line of `data`; keeps the unterminated rest for later.
  void feed(const char* data, size_t size);
  // Relays the unterminated rest, if any, as a line of its own.
  void flush();

 private:
  void emit(const char* line, size_t size, bool add_newline);

  int out_fd_;
  std::string prefix_;
  std::string pending_;  // bytes after the last newline
};

}  // namespace loom::loomrun
