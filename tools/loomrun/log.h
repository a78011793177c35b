#pragma once
// loomrun's own messages: "loomrun: ..." lines on stderr. Each line is written with one
// write(2) so it never interleaves with relayed rank output (see output_relay.h).

#include <sstream>
#include <string>

namespace loom::loomrun {

// Writes all of `data` to `fd`, retrying on EINTR. Returns false on any other error
// (EPIPE included: loomrun ignores SIGPIPE and drops output nobody reads).
bool write_all(int fd, const std::string& data);

// Prints "loomrun: <parts...>\n" to stderr.
template <typename... Parts>
void say(const Parts&... parts) {
  std::ostringstream out;
  out << "loomrun: ";
  (out << ... << parts);
  out << '\n';
  write_all(2, out.str());
}

}  // namespace loom::loomrun
