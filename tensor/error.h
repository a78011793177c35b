#pragma once
// Loom's error tiers (see README "Errors"):
//  - loom::Error: misuse and broken invariants (bad shape, unknown name, corrupt file).
//    The message says what was expected and what was given.
//  - loom::CommError (comm/): failures of peers and transports.
// LOOM_CHECK* throw loom::Error with "<file>:<line>: <condition> (<lhs> vs <rhs>): <context>".

#include <source_location>
#include <sstream>
#include <stdexcept>
#include <string>

namespace loom {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

[[noreturn]] void throw_check_failure(const std::string& what, const std::string& context,
                                      const std::source_location& where);

template <typename A, typename B>
[[noreturn]] void throw_comparison_failure(const char* op, const A& a, const B& b,
                                           const std::string& context,
                                           const std::source_location& where) {
  std::ostringstream what;
  what << "expected lhs " << op << " rhs (" << a << " vs " << b << ")";
  throw_check_failure(what.str(), context, where);
}

}  // namespace detail

// Throws loom::Error with `context` when `condition` is false.
inline void check(bool condition, const std::string& context,
                  const std::source_location& where = std::source_location::current()) {
  if (!condition) detail::throw_check_failure("check failed", context, where);
}

template <typename A, typename B>
void check_eq(const A& a, const B& b, const std::string& context,
              const std::source_location& where = std::source_location::current()) {
  if (!(a == b)) detail::throw_comparison_failure("==", a, b, context, where);
}

// Builds a message from streamable parts: fail("tensor ", name, " has shape ", shape).
template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  throw Error(out.str());
}

}  // namespace loom
