#include "strategies/local_launch.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "comm/backend_registry.h"
#include "comm/environment.h"
#include "comm/error.h"
#include "comm/launch/rank_group.h"
#include "core/tags.h"

extern char** environ;

namespace loom::strategies {

// Watches the ranks this process started, on a thread of its own, with the launchers'
// supervision rule (comm/launch/rank_group.h): the first rank that fails is recorded, the
// others are stopped (SIGTERM, SIGKILL kStopGrace later), and `on_failure` runs once, on the
// watcher's thread. Exits of ranks that it or stop_all() stopped are not failures.
// The group is driven under mutex_ only, so a signal never reaches a reaped (and possibly
// reused) process id.
class RankWatcher {
 public:
  RankWatcher(comm::launch::RankGroup group, std::function<void()> on_failure)
      : group_(std::move(group)), on_failure_(std::move(on_failure)) {
    thread_ = std::thread([this] { watch(); });
  }

  // Kills the ranks still running and reaps them.
  ~RankWatcher() {
    {
      std::lock_guard lock(mutex_);
      group_.stop(SIGKILL);
    }
    thread_.join();
  }

  RankWatcher(const RankWatcher&) = delete;
  RankWatcher& operator=(const RankWatcher&) = delete;

  // SIGTERM to every rank still running, SIGKILL to those still running kStopGrace later;
  // returns once all are reaped.
  void stop_all() {
    std::unique_lock lock(mutex_);
    if (!group_.stopping()) group_.stop(SIGTERM);
    changed_.wait(lock, [this] { return group_.running() == 0; });
  }

  // Waits until every rank has exited, or until `deadline`; then kills the rest (a failure
  // unless one was recorded already) and returns once all are reaped.
  void wait_all(Clock::time_point deadline, std::chrono::seconds grace) {
    std::unique_lock lock(mutex_);
    if (changed_.wait_until(lock, deadline, [this] { return group_.running() == 0; })) return;
    if (failure_.empty()) {
      failure_ = "a rank did not exit within " + std::to_string(grace.count()) +
                 " s of rank 0 finishing (killed)";
    }
    group_.stop(SIGKILL);
    changed_.wait(lock, [this] { return group_.running() == 0; });
  }

  // What the first failed rank did ("rank 2 exited with code 1"), or "" when none failed.
  std::string failure() const {
    std::lock_guard lock(mutex_);
    return failure_;
  }

 private:
  void watch() {
    while (true) {
      bool first_failure = false;
      {
        std::lock_guard lock(mutex_);
        for (const comm::launch::RankGroup::Report& report : group_.reap()) {
          if (!report.first_failure) continue;
          failure_ = "rank " + std::to_string(report.rank->rank()) + " " +
                     report.rank->exit()->describe();
          first_failure = true;
        }
        group_.tick();
        if (group_.running() == 0) {
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
  comm::launch::RankGroup group_;
  std::string failure_;
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

// The backend the group of `world` ranks on this host will use, checked before any rank
// starts: a registered name, or "auto" resolved for them, that can serve tensors on `device`.
std::string checked_backend(const std::string& requested, Device device, int world) {
  const std::string backend =
      requested == "auto"
          ? comm::resolve_auto_backend(comm::backend_needs(comm::single_host_job(world), device))
          : requested;
  comm::BackendRegistry::require(backend);
  if (backend == "nccl" && !device.is_cuda()) {
    tag::kLaunch.fail("process group backend 'nccl' needs CUDA devices, but the ranks run on ",
                      device, "; use 'shm' (or 'auto') for ranks on the CPU");
  }
  return backend;
}

// Kills and reaps the ranks started so far: starting the job failed.
void kill_started(comm::launch::RankGroup& started) {
  started.stop(SIGKILL);
  while (started.running() > 0) {
    started.reap();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

template <typename... Parts>
[[noreturn]] void abandon(comm::launch::RankGroup& started, const Parts&... parts) {
  kill_started(started);
  tag::kLaunch.fail(parts...);
}

// The rank `rank` of `world` as a re-execution of this program, with the launchers' rank
// variables (comm/environment.h).
std::unique_ptr<comm::launch::RankProcess> spawn_rank(int rank, int world, uint16_t port,
                                                      const std::string& secret,
                                                      const std::vector<std::string>& args) {
  const comm::RankAssignment assignment{.rank = rank,
                                        .local_rank = rank,
                                        .world_size = world,
                                        .local_world_size = world,
                                        .store_port = port,
                                        .store_secret = secret};
  return std::make_unique<comm::launch::RankProcess>(comm::launch::RankSpec{
      .rank = rank,
      .program = "/proc/self/exe",
      .args = args,
      .env = comm::environment_with(comm::rank_variables(assignment), environ),
      .tool = "launch"});
}

// Rank 0's group creation failed with `error` and its ranks were stopped: rethrows it,
// unless it only says that the store closed (loom::CommError) because a rank failed first,
// in which case that rank's failure is the news.
[[noreturn]] void rethrow_setup_failure(std::exception_ptr error, const std::string& failed) {
  try {
    std::rethrow_exception(error);
  } catch (const CommError& e) {
    if (failed.empty()) throw;
    tag::kLaunch.fail(
        failed,
        " while the ranks were setting up their process group (its own message is above); "
        "rank 0 stopped the others (rank 0 saw: ",
        e.what(), ")");
  }
}

}  // namespace

LocalJob::LocalJob(int world, LaunchMethod method, const LocalJobOptions& options) {
  if (world < 1) tag::kLaunch.fail("the number of ranks must be at least 1, got ", world);
  const comm::GroupOptions group_options{
      .backend = checked_backend(options.backend, options.device, world),
      .timeout = options.timeout,
      .device = options.device.is_cuda() ? std::optional<Device>(options.device) : std::nullopt};
  const std::string secret = comm::generate_store_secret();
  const pid_t parent = ::getpid();
  comm::launch::RankGroup children(kStopGrace);  // rank 0's: ranks 1 to world - 1
  int rank = 0;
  uint16_t port = 0;
  if (method == LaunchMethod::Fork) {
    // Fork first (fork keeps only the calling thread, and the store server runs on one),
    // then serve, and tell the children the port through a pipe.
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) tag::kLaunch.fail("pipe failed: ", std::strerror(errno));
    std::fflush(stdout);
    std::fflush(stderr);
    for (int r = 1; r < world; ++r) {
      pid_t pid = fork();
      if (pid < 0) abandon(children, "fork failed: ", std::strerror(errno));
      if (pid == 0) {
        comm::launch::die_with_parent(parent);
        rank = r;
        break;
      }
      children.add(comm::launch::RankProcess::adopt(r, pid));  // (a forked rank ignores these)
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
        std::fprintf(stderr, "%srank %d: rank 0 did not send the store port\n",
                     tag::kLaunch.prefix().c_str(), rank);
        _exit(1);
      }
      close(pipe_fds[0]);
    }
  } else {
    server_ = std::make_unique<comm::TCPStoreServer>("127.0.0.1", 0, secret);
    port = server_->port();
    std::vector<std::string> args = own_arguments();
    args.erase(args.begin());  // argv[0]: the program is /proc/self/exe
    for (int r = 1; r < world; ++r) {
      try {
        children.add(spawn_rank(r, world, port, secret, args));
      } catch (const Error&) {
        kill_started(children);
        throw;
      }
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
  if (!failure.empty()) tag::kLaunch.fail(failure);
}

LocalJob::~LocalJob() {
  try {
    // Destroyed while an error unwinds (a collective that timed out on a rank that stopped
    // answering, say): the others get kStopGrace, not the minute a finishing job gets, so the
    // job ends within its timeout plus that grace, as under loomrun.
    join(std::uncaught_exceptions() > 0 ? kStopGrace : std::chrono::seconds(60));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
}

}  // namespace loom::strategies
