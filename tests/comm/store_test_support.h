#pragma once
// Shared by the store tests (test_store.cpp, test_tcp_store.cpp): timeouts, a secret, forked
// children and timing checks.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "comm/error.h"

namespace loom::comm::store_testing {

using namespace std::chrono_literals;

inline constexpr Duration kShortTimeout = 100ms;
// Slack for a timeout to fire on a loaded two-core machine.
inline constexpr auto kTimeoutSlack = 1500ms;
inline constexpr const char* kSecret = "correct horse battery staple";

inline std::string unique_path(const std::string& stem) {
  static std::atomic<int> counter{0};
  return (std::filesystem::temp_directory_path() /
          (stem + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
      .string();
}

// Runs `body` in a forked child; the child exits with body's return value (3 on an
// exception, after printing it).
inline pid_t spawn(const std::function<int()>& body) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  if (pid == 0) {
    int code = 3;
    try {
      code = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child %d: %s\n", int(::getpid()), e.what());
    }
    std::fflush(stderr);
    _exit(code);
  }
  return pid;
}

// Exit code of the child, or -signal when it was killed.
inline int join(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return -WTERMSIG(status);
}

template <typename F>
Duration time_of(F&& f) {
  const auto start = Clock::now();
  f();
  return std::chrono::duration_cast<Duration>(Clock::now() - start);
}

// Expects `f` to throw CommError within about `timeout`, with a message containing each of
// `parts`.
template <typename F>
void expect_timeout(F&& f, Duration timeout, const std::vector<std::string>& parts) {
  const auto start = Clock::now();
  try {
    f();
    ADD_FAILURE() << "expected a CommError";
  } catch (const CommError& e) {
    const auto elapsed = Clock::now() - start;
    EXPECT_GE(elapsed, timeout - 5ms) << e.what();
    EXPECT_LE(elapsed, timeout + kTimeoutSlack) << e.what();
    for (const auto& part : parts)
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos)
          << "'" << part << "' not in: " << e.what();
  }
}

}  // namespace loom::comm::store_testing
