#include "strategies/local_launch.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/backend_registry.h"
#include "comm/error.h"
#include "core/tunables.h"

namespace loom::strategies {

using Clock = std::chrono::steady_clock;

// Reaps the ranks this process started, on a thread of its own (polling waitpid on each: it
// must not reap children that are not ranks). The first rank that fails, a non-zero exit
// status or a signal, is recorded; the watcher then stops the others (SIGTERM, SIGKILL
// kStopGrace later) and calls `on_failure` once, on its thread. Exits of ranks that it or
// stop_all() stopped are not failures.
// Every waitpid and kill happens under mutex_, so a signal never reaches a reaped (and
// possibly reused) process id.
class RankWatcher {
 public:
  // children[i] is rank i + 1.
  RankWatcher(std::vector<pid_t> children, std::function<void()> on_failure)
      : children_(std::move(children)), on_failure_(std::move(on_failure)) {
    thread_ = std::thread([this] { watch(); });
  }

  // Kills the ranks still running and reaps them.
  ~RankWatcher() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
      signal_running(SIGKILL);
    }
    thread_.join();
  }

  RankWatcher(const RankWatcher&) = delete;
  RankWatcher& operator=(const RankWatcher&) = delete;

  // SIGTERM to every rank still running, SIGKILL to those still running kStopGrace later;
  // returns once all are reaped.
  void stop_all() {
    std::unique_lock lock(mutex_);
    stopping_ = true;
    signal_running(SIGTERM);
    kill_at_ = Clock::now() + kStopGrace;
    changed_.wait(lock, [this] { return all_reaped(); });
  }

  // Waits until every rank has exited, or until `deadline`; then kills the rest (a failure
  // unless one was recorded already) and returns once all are reaped.
  void wait_all(Clock::time_point deadline, std::chrono::seconds grace) {
    std::unique_lock lock(mutex_);
    if (changed_.wait_until(lock, deadline, [this] { return all_reaped(); })) return;
    if (failure_.empty()) {
      failure_ = "a rank did not exit within " + std::to_string(grace.count()) +
                 " s of rank 0 finishing (killed)";
    }
    stopping_ = true;
    signal_running(SIGKILL);
    changed_.wait(lock, [this] { return all_reaped(); });
  }

  // What the first failed rank did ("rank 2 exited with code 1"), or "" when none failed.
  std::string failure() const {
    std::lock_guard lock(mutex_);
    return failure_;
  }

 private:
  bool all_reaped() const {
    for (pid_t pid : children_) {
      if (pid != 0) return false;
    }
    return true;
  }

  void signal_running(int signo) {
    for (pid_t pid : children_) {
      if (pid != 0) ::kill(pid, signo);
    }
  }

  static std::string describe_exit(int rank, int status) {
    std::string text = "rank ";
    text += std::to_string(rank);
    if (WIFSIGNALED(status)) {
      text += " was killed by signal ";
      text += std::to_string(WTERMSIG(status));
    } else {
      text += " exited with code ";
      text += std::to_string(WEXITSTATUS(status));
    }
    return text;
  }

  // Reaps whichever ranks exited; returns true when this recorded the first failure.
  bool reap_exited() {
    bool first_failure = false;
    for (size_t i = 0; i < children_.size(); ++i) {
      if (children_[i] == 0) continue;
      int status = 0;
      const pid_t done = ::waitpid(children_[i], &status, WNOHANG);
      if (done == 0 || (done < 0 && errno == EINTR)) continue;
      children_[i] = 0;  // exited, or not our child any more (ECHILD): nothing to wait for
      const bool failed = done > 0 && (WIFSIGNALED(status) || WEXITSTATUS(status) != 0);
      if (failed && !stopping_ && failure_.empty()) {
        failure_ = describe_exit(static_cast<int>(i) + 1, status);
        first_failure = true;
      }
    }
    return first_failure;
  }

  void watch() {
    while (true) {
      bool first_failure = false;
      {
        std::lock_guard lock(mutex_);
        first_failure = reap_exited();
        if (first_failure) {
          stopping_ = true;
          signal_running(SIGTERM);
          kill_at_ = Clock::now() + kStopGrace;
        }
        if (kill_at_ && Clock::now() >= *kill_at_) signal_running(SIGKILL);
        if (all_reaped()) {
          changed_.notify_all();
          if (!first_failure) return;
        }
      }
      if (first_failure) on_failure_();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable changed_;  // notified once every rank is reaped
  std::vector<pid_t> children_;      // 0 once reaped
  std::string failure_;
  bool stopping_ = false;  // exits from here on were asked for
  std::optional<Clock::time_point> kill_at_;
  std::function<void()> on_failure_;
  std::thread thread_;
};

namespace {

std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0'))
    args.push_back(arg);
  return args;
}

// The backend the ranks' group will use, checked before any rank starts: a registered name,
// or "auto" resolved for `device`, that can serve tensors on `device`.
std::string checked_backend(const std::string& requested, Device device) {
  const std::string backend =
      requested == "auto" ? comm::resolve_auto_backend({.device = device}) : requested;
  comm::require_backend(backend);
  if (backend == "nccl" && !device.is_cuda()) {
    fail("[launch] process group backend 'nccl' needs CUDA devices, but the ranks run on ", device,
         "; use 'shm' (or 'auto') for ranks on the CPU");
  }
  return backend;
}

// In a rank just forked: it gets SIGKILL when the forking thread exits, and exits at once if
// the parent is already gone (it died between fork() and here, so no signal will come).
void die_with_parent(pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) _exit(1);
}

// Kills and reaps the ranks started so far, then throws: starting the job failed.
template <typename... Parts>
[[noreturn]] void abandon(const std::vector<pid_t>& started, const Parts&... parts) {
  for (pid_t pid : started)
    ::kill(pid, SIGKILL);
  for (pid_t pid : started)
    ::waitpid(pid, nullptr, 0);
  fail("[launch] ", parts...);
}

// Sets loomrun's variables for rank `rank` and re-executes this program; never returns.
[[noreturn]] void exec_rank(int rank, int world, uint16_t port, const std::string& secret,
                            std::vector<std::string>& args) {
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
  setenv("GROUP_RANK", "0", 1);
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  setenv(tunables::kStorePort.name, std::to_string(port).c_str(), 1);
  setenv(tunables::kStoreSecret.name, secret.c_str(), 1);
  setenv(tunables::kStoreServedByLauncher.name, "1", 1);
  setenv(tunables::kClusterEnv.name, "torchrun", 1);
  std::vector<char*> argv;
  for (std::string& a : args)
    argv.push_back(a.data());
  argv.push_back(nullptr);
  execv("/proc/self/exe", argv.data());
  std::fprintf(stderr, "[launch] rank %d: cannot re-execute the program: %s\n", rank,
               std::strerror(errno));
  _exit(127);
}

// Rank 0's group creation failed with `error` and its ranks were stopped: rethrows it,
// unless it only says that the store closed (loom::CommError) because a rank failed first,
// in which case that rank's failure is the news.
[[noreturn]] void rethrow_setup_failure(std::exception_ptr error, const std::string& failed) {
  try {
    std::rethrow_exception(error);
  } catch (const CommError& e) {
    if (failed.empty()) throw;
    fail("[launch] ", failed,
         " while the ranks were setting up their process group (its own message is above); "
         "rank 0 stopped the others (rank 0 saw: ",
         e.what(), ")");
  }
}

}  // namespace

LocalJob::LocalJob(int world, LaunchMethod method, const LocalJobOptions& options) {
  if (world < 1) fail("[launch] the number of ranks must be at least 1, got ", world);
  const comm::GroupOptions group_options{
      .backend = checked_backend(options.backend, options.device),
      .timeout = options.timeout,
      .device = options.device.is_cuda() ? std::optional<Device>(options.device) : std::nullopt};
  const std::string secret = comm::generate_store_secret();
  const pid_t parent = ::getpid();
  std::vector<pid_t> children;
  int rank = 0;
  uint16_t port = 0;
  if (method == LaunchMethod::Fork) {
    // Fork first (fork keeps only the calling thread, and the store server runs on one),
    // then serve, and tell the children the port through a pipe.
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) fail("[launch] pipe failed: ", std::strerror(errno));
    std::fflush(stdout);
    std::fflush(stderr);
    for (int r = 1; r < world; ++r) {
      pid_t pid = fork();
      if (pid < 0) abandon(children, "fork failed: ", std::strerror(errno));
      if (pid == 0) {
        die_with_parent(parent);
        rank = r;
        children.clear();
        break;
      }
      children.push_back(pid);
    }
    if (rank == 0) {
      close(pipe_fds[0]);
      try {
        server_ = std::make_unique<comm::TCPStoreServer>("127.0.0.1", 0, secret);
      } catch (const std::exception& e) {
        abandon(children, "cannot serve the store: ", e.what());
      }
      port = server_->port();
      for (int r = 1; r < world; ++r) {
        if (write(pipe_fds[1], &port, sizeof port) != sizeof port) {
          abandon(children,
                  "cannot hand the store port to the forked ranks: ", std::strerror(errno));
        }
      }
      close(pipe_fds[1]);
    } else {
      close(pipe_fds[1]);
      if (read(pipe_fds[0], &port, sizeof port) != sizeof port) {
        std::fprintf(stderr, "[launch] rank %d: rank 0 did not send the store port\n", rank);
        _exit(1);
      }
      close(pipe_fds[0]);
    }
  } else {
    server_ = std::make_unique<comm::TCPStoreServer>("127.0.0.1", 0, secret);
    port = server_->port();
    std::vector<std::string> args = own_arguments();
    std::fflush(stdout);
    std::fflush(stderr);
    for (int r = 1; r < world; ++r) {
      pid_t pid = fork();
      if (pid < 0) abandon(children, "fork failed: ", std::strerror(errno));
      if (pid == 0) {
        die_with_parent(parent);
        exec_rank(r, world, port, secret, args);
      }
      children.push_back(pid);
    }
  }
  if (rank == 0) {
    watcher_ = std::make_unique<RankWatcher>(std::move(children), [this] { close_store(); });
  }
  try {
    start_group(rank, world, port, secret, group_options);
  } catch (...) {
    if (rank != 0) throw;
    watcher_->stop_all();
    const std::string failed = watcher_->failure();
    watcher_.reset();
    close_store();
    rethrow_setup_failure(std::current_exception(), failed);
  }
}

void LocalJob::start_group(int rank, int world, uint16_t port, const std::string& secret,
                           const comm::GroupOptions& options) {
  auto store = std::make_shared<comm::TCPStore>("127.0.0.1", port, secret, options.timeout);
  group_ =
      std::make_shared<comm::ProcessGroup>(rank, world, store, options, comm::default_group_name());
}

void LocalJob::close_store() {
  std::lock_guard lock(server_mutex_);
  server_.reset();
}

void LocalJob::join(std::chrono::seconds grace) {
  if (joined_) return;
  joined_ = true;
  group_.reset();
  std::string failure;
  if (watcher_) {
    watcher_->wait_all(Clock::now() + grace, grace);
    failure = watcher_->failure();
    watcher_.reset();
  }
  close_store();
  if (!failure.empty()) fail("[launch] ", failure);
}

LocalJob::~LocalJob() {
  try {
    join();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
}

}  // namespace loom::strategies
