// LocalJob (strategies/local_launch.h) with forked ranks: a bad backend is refused before any
// rank starts; a rank that fails while rank 0 sets up its group, or rank 0's own failure,
// stops and reaps every rank at once (not after the group's timeout); the ranks die with rank
// 0. The ranks are real processes; test backends decide what each rank does in its group's
// creation. A forked rank never returns into the test: it leaves with _exit.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "comm/backend_registry.h"
#include "strategies/local_launch.h"

namespace loom::strategies {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// Long enough that a test which waited for it would be caught by the time checks below.
constexpr loom::Duration kLongTimeout = std::chrono::minutes(2);
constexpr auto kPromptly = 15s;

// True when this process has no child left (running or unreaped).
bool no_children() {
  return ::waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD;
}

// A backend registered for one test, removed after it.
class TestBackend {
 public:
  TestBackend(std::string name, comm::BackendFactory factory) : name_(std::move(name)) {
    comm::BackendRegistry::add(name_, {std::move(factory), "test"});
  }
  ~TestBackend() { comm::BackendRegistry::remove(name_); }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

// Runs `body`, expecting loom::Error; returns its message.
template <typename Body>
std::string error_of(Body body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no loom::Error";
  return "";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(LocalJob, RefusesAnUnknownBackendBeforeStartingAnyRank) {
  for (std::string name : {"mpi", "gloo", ""}) {
    const std::string what = error_of(
        [&] { LocalJob job(2, LaunchMethod::Fork, {.backend = name, .timeout = kLongTimeout}); });
    EXPECT_TRUE(contains(what, "unknown backend '" + name + "'")) << what;
    EXPECT_TRUE(contains(what, "Available: ")) << what;
    EXPECT_TRUE(no_children());
  }
}

TEST(LocalJob, RefusesNcclForRanksOnTheCpu) {
  const std::string what = error_of(
      [] { LocalJob job(2, LaunchMethod::Fork, {.backend = "nccl", .timeout = kLongTimeout}); });
  // A build without NCCL does not know the name at all.
  EXPECT_TRUE(contains(what, "'nccl' needs CUDA devices, but the ranks run on cpu") ||
              contains(what, "backend 'nccl' is not in this build"))
      << what;
  EXPECT_TRUE(no_children());
}

TEST(LocalJob, StopsTheRanksWhenRankZerosGroupCreationFails) {
  TestBackend backend(
      "test-rank0-fails", [](const comm::BackendContext& c) -> std::unique_ptr<comm::Backend> {
        if (c.rank == 0) fail("rank 0 cannot create its backend");
        std::this_thread::sleep_for(std::chrono::minutes(2));  // stopped long before
        _exit(0);
      });
  const auto start = Clock::now();
  const std::string what = error_of([&] {
    LocalJob job(3, LaunchMethod::Fork, {.backend = backend.name(), .timeout = kLongTimeout});
  });
  EXPECT_TRUE(contains(what, "rank 0 cannot create its backend")) << what;
  EXPECT_LT(Clock::now() - start, kStopGrace + kPromptly);
  EXPECT_TRUE(no_children());
}

TEST(LocalJob, NamesTheRankThatFailedWhileRankZeroWaitedInTheRendezvous) {
  TestBackend backend(
      "test-rank1-exits", [](const comm::BackendContext& c) -> std::unique_ptr<comm::Backend> {
        if (c.rank == 1) _exit(3);
        if (c.rank == 2) {
          std::this_thread::sleep_for(std::chrono::minutes(2));  // stopped long before
          _exit(0);
        }
        c.store->get("never/set", c.timeout);  // ends when the launcher closes the store
        fail("rank 0 was never meant to get past its rendezvous");
      });
  const auto start = Clock::now();
  const std::string what = error_of([&] {
    LocalJob job(3, LaunchMethod::Fork, {.backend = backend.name(), .timeout = kLongTimeout});
  });
  EXPECT_TRUE(contains(what,
                       "[launch] rank 1 exited with code 3 while the ranks were setting "
                       "up their process group"))
      << what;
  EXPECT_LT(Clock::now() - start, kStopGrace + kPromptly);
  EXPECT_TRUE(no_children());
}

TEST(LocalJob, JoinNamesARankThatFailedAfterTheGroupWasCreated) {
  {
    LocalJob job(2, LaunchMethod::Fork, {.timeout = kLongTimeout});
    // Both ranks past their setup first: rank 1 leaving while rank 0 still sets up its group is
    // the other test's case (a race on a loaded machine before the barrier was here).
    job.group()->barrier()->wait();
    if (job.group()->rank() == 1) _exit(5);
    const std::string what = error_of([&] { job.join(); });
    EXPECT_TRUE(contains(what, "[launch] rank 1 exited with code 5")) << what;
  }
  EXPECT_TRUE(no_children());
}

// Whether process `pid` is gone or a zombie (it is not this process's child).
bool dead(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'Z';
}

TEST(LocalJob, RanksDieWithRankZero) {
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const int report = fds[1];
  TestBackend backend("test-stall",
                      [report](const comm::BackendContext& c) -> std::unique_ptr<comm::Backend> {
                        if (c.rank == 1) {
                          const pid_t me = ::getpid();
                          if (::write(report, &me, sizeof me) != sizeof me) _exit(2);
                        }
                        std::this_thread::sleep_for(std::chrono::minutes(2));
                        _exit(0);
                      });
  const pid_t rank0 = fork();
  ASSERT_GE(rank0, 0);
  if (rank0 == 0) {
    try {
      LocalJob job(2, LaunchMethod::Fork, {.backend = backend.name(), .timeout = kLongTimeout});
    } catch (...) {
    }
    _exit(0);
  }
  close(fds[1]);
  pid_t rank1 = 0;
  ASSERT_EQ(::read(fds[0], &rank1, sizeof rank1), static_cast<ssize_t>(sizeof rank1));
  close(fds[0]);
  ::kill(rank0, SIGKILL);
  ::waitpid(rank0, nullptr, 0);
  const auto deadline = Clock::now() + kPromptly;
  while (!dead(rank1) && Clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(dead(rank1)) << "rank 1 (pid " << rank1 << ") outlived rank 0";
  if (!dead(rank1)) ::kill(rank1, SIGKILL);
}

}  // namespace
}  // namespace loom::strategies
