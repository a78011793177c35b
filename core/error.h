#pragma once
// Loom's error tiers (see README "Errors"):
//  - loom::Error: misuse and broken invariants (bad shape, unknown name, corrupt file).
//    The message says what was expected and what was given.
//  - loom::CommError (comm/): failures of peers and transports.
// LOOM_CHECK* throw loom::Error with "<file>:<line>: <condition> (<lhs> vs <rhs>): <context>".

#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace loom {

// Where a check is written: what std::source_location::current() gives, captured the same
// way (default arguments, evaluated where the call is written). Loom's own because
// libstdc++'s std::source_location needs __builtin_source_location, which clang has only
// from version 15 (the fuzzing build, tests/fuzz, uses clang 14); __builtin_FILE and
// __builtin_LINE are in GCC, clang and MSVC alike.
class SourceLocation {
 public:
  static constexpr SourceLocation current(const char* file = __builtin_FILE(),
                                          uint_least32_t line = __builtin_LINE()) noexcept {
    return SourceLocation(file, line);
  }
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr uint_least32_t line() const noexcept { return line_; }

 private:
  constexpr SourceLocation(const char* file, uint_least32_t line) : file_(file), line_(line) {}
  const char* file_;
  uint_least32_t line_;
};

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

[[noreturn]] void throw_check_failure(const std::string& what, const std::string& context,
                                      const SourceLocation& where);

template <typename A, typename B>
[[noreturn]] void throw_comparison_failure(const char* op, const A& a, const B& b,
                                           const std::string& context,
                                           const SourceLocation& where) {
  std::ostringstream what;
  what << "expected lhs " << op << " rhs (" << a << " vs " << b << ")";
  throw_check_failure(what.str(), context, where);
}

}  // namespace detail

// Throws loom::Error with `context` when `condition` is false.
inline void check(bool condition, const std::string& context,
                  const SourceLocation& where = SourceLocation::current()) {
  if (!condition) detail::throw_check_failure("check failed", context, where);
}

template <typename A, typename B>
void check_eq(const A& a, const B& b, const std::string& context,
              const SourceLocation& where = SourceLocation::current()) {
  if (!(a == b)) detail::throw_comparison_failure("==", a, b, context, where);
}

// The text of an errno value ("No such file or directory"), for messages.
std::string errno_text(int error);

// Builds a message from streamable parts: fail("tensor ", name, " has shape ", shape).
template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  throw Error(out.str());
}

// The tag that starts every message of one component, "[checkpoint] ...": the one way
// messages are prefixed. Each component's Tag is declared once, in core/tags.h.
//   tag::kCheckpoint.fail("no index in ", dir);  // loom::Error "[checkpoint] no index in ..."
//   throw CommError(tag::kCommShm.message("peer ", peer, " died"), rank, peer);
// A component named at run time (a strategy's registry name) is tagged the same way:
//   Tag(name()).fail("setup_module before setup_environment()");
class Tag {
 public:
  explicit constexpr Tag(std::string_view name) : name_(name) {}
  constexpr std::string_view name() const { return name_; }
  // "[name] "
  std::string prefix() const {
    std::string text = "[";  // built piecewise: GCC 12's -Wrestrict false positive
    text += name_;
    text += "] ";
    return text;
  }
  // The prefix followed by the streamable parts.
  template <typename... Parts>
  std::string message(const Parts&... parts) const {
    std::ostringstream out;
    out << prefix();
    (out << ... << parts);
    return out.str();
  }
  template <typename... Parts>
  [[noreturn]] void fail(const Parts&... parts) const {
    throw Error(message(parts...));
  }

 private:
  std::string_view name_;
};

}  // namespace loom
