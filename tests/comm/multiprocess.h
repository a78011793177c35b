#pragma once
// Runs the ranks of a test as real processes: fork() `size` children that share a FileStore
// in a fresh temporary directory. Each child runs body(rank, size, store) and exits 0 when it
// returned without a GoogleTest failure, 1 on a failure, 2 on an exception; its messages go
// to the shared stdout. The parent waits at most `timeout` and kills the children after it.
// The parent must be single-threaded when it forks (threads_in_this_process() == 1).

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "comm/store/file_store.h"

namespace loom::comm::testing {

using RankBody = std::function<void(int rank, int size, std::shared_ptr<Store> store)>;

struct RankResult {
  int exit_code = -1;  // -1 when killed by a signal
  int signal = 0;
};

inline int threads_in_this_process() {
  int threads = 0;
  for ([[maybe_unused]] const auto& task : std::filesystem::directory_iterator("/proc/self/task"))
    ++threads;
  return threads;
}

// ThreadSanitizer starts a thread of its own with the process's first thread; it survives a
// fork (the runtime handles it), and TSan itself kills a child forked while other threads
// ran (its die_after_fork), so that build allows that one more.
// (GCC defines __SANITIZE_THREAD__, clang answers __has_feature; clang's runtime may start
// its thread later, so the count is an upper bound.)
#if defined(__SANITIZE_THREAD__)
#define LOOM_TEST_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LOOM_TEST_TSAN 1
#endif
#endif
#ifdef LOOM_TEST_TSAN
inline constexpr int kThreadsBeforeFork = 2;
#else
inline constexpr int kThreadsBeforeFork = 1;
#endif

inline std::vector<RankResult> run_ranks(int size, const RankBody& body,
                                         std::chrono::seconds timeout = std::chrono::seconds(60)) {
  // fork() keeps only the calling thread: a lock another thread held at that moment (a
  // process group's queue, the flight recorder) stays locked forever in the child, and
  // ThreadSanitizer refuses to start threads after such a fork.
  if (const int threads = threads_in_this_process(); threads > kThreadsBeforeFork) {
    ADD_FAILURE() << "run_ranks: the test process runs " << threads
                  << " threads; destroy its process groups (and stop other threads) before "
                     "forking ranks";
    return std::vector<RankResult>(static_cast<size_t>(size));
  }
  char dir_template[] = "/tmp/loom_test_XXXXXX";
  std::string dir = mkdtemp(dir_template);
  std::string store_path = dir + "/store";
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int rank = 0; rank < size; ++rank) {
    pid_t pid = fork();
    if (pid == 0) {
      int code = 0;
      try {
        body(rank, size, std::make_shared<FileStore>(store_path));
        code = ::testing::Test::HasFailure() ? 1 : 0;
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] uncaught exception: %s\n", rank, e.what());
        code = 2;
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<RankResult> results(size);
  std::vector<bool> done(size, false);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  int remaining = size;
  while (remaining > 0) {
    for (int r = 0; r < size; ++r) {
      if (done[r]) continue;
      int status = 0;
      if (waitpid(pids[r], &status, WNOHANG) == pids[r]) {
        done[r] = true;
        --remaining;
        if (WIFEXITED(status)) results[r].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) results[r].signal = WTERMSIG(status);
      }
    }
    if (remaining > 0 && std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "ranks still running after " << timeout.count() << " s; killing them";
      for (int r = 0; r < size; ++r) {
        if (!done[r]) kill(pids[r], SIGKILL);
      }
      for (int r = 0; r < size; ++r) {
        if (!done[r]) waitpid(pids[r], nullptr, 0);
      }
      break;
    }
    if (remaining > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::filesystem::remove_all(dir);
  return results;
}

// Asserts that every rank exited with code 0.
inline void expect_all_ok(const std::vector<RankResult>& results) {
  for (size_t r = 0; r < results.size(); ++r) {
    EXPECT_EQ(results[r].exit_code, 0) << "rank " << r << " (signal " << results[r].signal << ")";
  }
}

// Names of /dev/shm entries created by Loom.
inline std::vector<std::string> loom_shm_entries() {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
    std::string name = entry.path().filename().string();
    if (name.rfind("loom-", 0) == 0) names.push_back(name);
  }
  return names;
}

}  // namespace loom::comm::testing
