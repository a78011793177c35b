#include "tools/loomrun/launcher.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>

#include "comm/environment.h"
#include "comm/launch/rank_group.h"
#include "comm/launch/rank_process.h"
#include "comm/shm/segment.h"
#include "core/error.h"
#include "core/tags.h"
#include "tools/loomrun/log.h"
#include "tools/loomrun/output_relay.h"

extern char** environ;

namespace loom::loomrun {

namespace {

using comm::launch::RankExit;
using comm::launch::RankGroup;
using comm::launch::RankProcess;
using comm::launch::signal_name;
using Clock = std::chrono::steady_clock;

enum class Ending { Success, RankFailed, Signaled, TimedOut, StartFailed };

constexpr int kPollCapMs = 250;  // also reaps ranks whose SIGCHLD bytes were merged
constexpr size_t kReadChunk = 64 * 1024;
constexpr int kReadsPerWakeup = 16;  // so one chatty rank cannot starve the others

// At most 1e9 s (about 31 years): --timeout inf or 1e30 would overflow the clock's count (and
// end the job at once); that long is as good as no limit.
std::chrono::milliseconds seconds(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(std::min(s, 1e9) * 1000.0));
}

int ms_until(Clock::time_point when) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(when - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, kPollCapMs));
}

// A rank (owned by the attempt's RankGroup) with the relays of its two streams.
struct LiveRank {
  RankProcess* process;
  OutputRelay out;
  OutputRelay err;
};

enum class Stream { Out, Err };

// Reads what is available on one stream of `rank` (the fds are non-blocking) and relays
// it; closes the stream at end of file. At most `max_reads` reads.
void pump(LiveRank& rank, Stream stream, int max_reads) {
  char buffer[kReadChunk];
  for (int i = 0; i < max_reads; ++i) {
    int fd = stream == Stream::Out ? rank.process->stdout_fd() : rank.process->stderr_fd();
    if (fd < 0) return;
    ssize_t n = ::read(fd, buffer, sizeof(buffer));
    if (n > 0) {
      (stream == Stream::Out ? rank.out : rank.err).feed(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    // End of file (or a broken pipe): relay the partial last line and close.
    if (stream == Stream::Out) {
      rank.out.flush();
      rank.process->close_stdout();
    } else {
      rank.err.flush();
      rank.process->close_stderr();
    }
    return;
  }
}

// After the rank exited: relays what its pipes still hold (bounded, in case something it
// forked keeps writing).
void drain(LiveRank& rank) {
  pump(rank, Stream::Out, 64);
  pump(rank, Stream::Err, 64);
}

void set_nonblocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

}  // namespace

struct Launcher::Outcome {
  Ending ending = Ending::Success;
  int exit_code = 0;
};

Launcher::Launcher(const LaunchOptions& options, int master_port, std::string secret,
                   const BindingPlan* binding, SignalPipe& signals)
    : options_(options),
      master_port_(master_port),
      secret_(std::move(secret)),
      job_id_(comm::shm::new_job_id()),
      binding_(binding),
      signals_(signals) {}

int Launcher::run() {
  const int attempts = options_.max_restarts + 1;
  std::optional<Clock::time_point> job_deadline;  // --timeout spans every attempt
  if (options_.timeout_s) job_deadline = Clock::now() + seconds(*options_.timeout_s);
  for (int restart = 0;; ++restart) {
    for (int signo : signals_.drain()) {
      if (signo == SIGCHLD) continue;
      say("received ", signal_name(signo), " between attempts; not restarting");
      return 128 + signo;
    }
    Outcome outcome = run_attempt(restart, job_deadline);
    // Ranks killed while they set up their group may leave its segment behind.
    if (int removed = comm::shm::remove_job_segments(job_id_); removed > 0) {
      say("removed ", removed, " shared-memory segment(s) that exited ranks left in /dev/shm");
    }
    switch (outcome.ending) {
      case Ending::Success: return 0;
      case Ending::RankFailed:
        if (restart + 1 < attempts) {
          say("restarting (attempt ", restart + 2, " of ", attempts, ")");
          continue;
        }
        if (attempts > 1) say("giving up after ", attempts, " attempts");
        return outcome.exit_code != 0 ? outcome.exit_code : 1;
      case Ending::Signaled:
      case Ending::TimedOut:
      case Ending::StartFailed: return outcome.exit_code != 0 ? outcome.exit_code : 1;
    }
  }
}

Launcher::Outcome Launcher::run_attempt(int restart_count,
                                        std::optional<Clock::time_point> job_deadline) {
  Outcome outcome;  // the reason the group is being stopped, once it is
  RankGroup group(seconds(options_.grace_period_s));
  std::vector<LiveRank> ranks;
  ranks.reserve(static_cast<size_t>(options_.nproc_per_node));
  auto begin_stop = [&](Outcome why, int signo) {
    outcome = why;
    group.stop(signo);
  };

  for (int local = 0; local < options_.nproc_per_node; ++local) {
    const int global = options_.node_rank * options_.nproc_per_node + local;
    const comm::RankAssignment assignment{.rank = global,
                                          .local_rank = local,
                                          .world_size = options_.world_size(),
                                          .local_world_size = options_.nproc_per_node,
                                          .node_rank = options_.node_rank,
                                          .nnodes = options_.nnodes,
                                          .master_addr = options_.master_addr,
                                          .store_port = master_port_,
                                          .store_secret = secret_,
                                          .restart_count = restart_count,
                                          .max_restarts = options_.max_restarts,
                                          .job_id = job_id_};
    comm::launch::RankSpec spec{
        .rank = global,
        .program = options_.program,
        .args = options_.args,
        .env = comm::environment_with(comm::rank_variables(assignment), environ),
        .tool = "loomrun",
        .own_process_group = true,
        .capture_output = true,
        // The child resets loomrun's handlers (blocked around fork below: run in the child,
        // they would write into loomrun's signal pipe), then binds to its CPUs.
        .in_child = [this, local]() -> int {
          SignalPipe::reset_in_child();
          return binding_ != nullptr ? binding_->apply(local) : 0;
        },
        .in_child_failure = "cannot bind to its CPUs (running unbound)"};
    try {
      std::unique_ptr<RankProcess> process;
      {
        SignalBlock block;
        process = std::make_unique<RankProcess>(spec);
      }
      set_nonblocking(process->stdout_fd());
      set_nonblocking(process->stderr_fd());
      std::string prefix = "[";  // built piecewise: GCC 12 -Wrestrict false positive
      prefix += std::to_string(global);
      prefix += "] ";
      ranks.push_back({process.get(), OutputRelay(1, prefix), OutputRelay(2, prefix)});
      group.add(std::move(process));
    } catch (const Error& e) {
      say("cannot start rank ", global, ": ", e.what());
      begin_stop({Ending::StartFailed, 1}, SIGTERM);
      break;
    }
  }

  std::vector<pollfd> fds;
  std::vector<std::pair<size_t, Stream>> owners;  // fds[i + 1] belongs to owners[i]
  while (group.running() > 0) {
    fds.assign(1, pollfd{.fd = signals_.fd(), .events = POLLIN, .revents = 0});
    owners.clear();
    for (size_t i = 0; i < ranks.size(); ++i) {
      const RankProcess& p = *ranks[i].process;
      if (p.stdout_fd() >= 0) {
        fds.push_back({.fd = p.stdout_fd(), .events = POLLIN, .revents = 0});
        owners.emplace_back(i, Stream::Out);
      }
      if (p.stderr_fd() >= 0) {
        fds.push_back({.fd = p.stderr_fd(), .events = POLLIN, .revents = 0});
        owners.emplace_back(i, Stream::Err);
      }
    }
    int wait_ms = kPollCapMs;
    if (!group.stopping() && job_deadline) wait_ms = std::min(wait_ms, ms_until(*job_deadline));
    if (group.stopping() && !group.killed())
      wait_ms = std::min(wait_ms, ms_until(*group.kill_at()));
    int ready = ::poll(fds.data(), fds.size(), wait_ms);
    if (ready < 0 && errno != EINTR) tag::kLoomrun.fail("poll: ", std::strerror(errno));
    for (size_t i = 1; ready > 0 && i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto [rank, stream] = owners[i - 1];
      pump(ranks[rank], stream, kReadsPerWakeup);
    }

    for (int signo : signals_.drain()) {
      if (signo == SIGCHLD) continue;
      if (!group.stopping()) {
        say("received ", signal_name(signo), "; forwarding it to the ranks");
        begin_stop({Ending::Signaled, 128 + signo}, signo);
      } else if (!group.killed()) {
        say("received ", signal_name(signo), " while stopping; sending SIGKILL to the ranks");
        outcome = Outcome{Ending::Signaled, 128 + signo};
        group.kill_all();
      }
    }

    std::vector<bool> was_running;
    for (const LiveRank& rank : ranks) was_running.push_back(rank.process->running());
    const std::vector<RankGroup::Report> reports = group.reap();
    for (size_t i = 0; i < ranks.size(); ++i) {
      // A rank reaped just now: its last words come before loomrun's verdict.
      if (was_running[i] && !ranks[i].process->running()) drain(ranks[i]);
    }
    for (const RankGroup::Report& report : reports) {
      // A signal death after the first failure is named while that failure is the reason
      // for the stop (not once a signal to loomrun took over).
      if (!report.first_failure && outcome.ending != Ending::RankFailed) continue;
      say("rank ", report.rank->rank(), " (pid ", report.rank->pid(), ") ",
          report.rank->exit()->describe());
      outcome = Outcome{Ending::RankFailed, group.exit_code()};
    }

    if (!group.stopping() && job_deadline && Clock::now() >= *job_deadline && group.running() > 0) {
      say("the job ran longer than --timeout ", *options_.timeout_s, " s; stopping all ranks");
      begin_stop({Ending::TimedOut, kTimeoutExitCode}, SIGTERM);
    }
    const int still_running = group.running();
    if (group.tick()) {
      say(still_running, " rank(s) still running ", options_.grace_period_s, " s after ",
          signal_name(group.stop_signal()), "; sending SIGKILL");
    }
  }

  for (LiveRank& rank : ranks) {
    drain(rank);
    rank.out.flush();
    rank.err.flush();
  }
  return outcome;
}

}  // namespace loom::loomrun
