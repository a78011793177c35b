#pragma once
// Starting a job's ranks from inside the program, for ddp_spawn and ddp_fork (Lightning's
// subprocess and fork launchers), when no launcher (loomrun, torchrun, Slurm) started them.
//
//   spawn: the program re-executes itself (/proc/self/exe, same arguments) once per extra
//          rank with loomrun's variables; the ranks are fresh processes.
//   fork:  the process forks once per extra rank; each child continues from the call with
//          the parent's state (no threads may be running yet: fork keeps only the caller's).
//
// The calling process becomes rank 0 and serves the rendezvous store. Its LocalJob:
//   - checks the backend before starting any rank (a registered name, or "auto", that can
//     run on the ranks' device), so a bad one is refused once, with nothing left to stop;
//   - watches the ranks it started: at the first one that fails (a non-zero exit status, or
//     a signal) it stops the others (SIGTERM, then SIGKILL after kStopGrace) and closes the
//     store, which ends a rendezvous rank 0 may be waiting in. When rank 0's own group
//     creation fails, the ranks are stopped and reaped before the error reaches the caller;
//   - waits for the ranks when destroyed (bounded: they are stopped after a minute, or after
//     kStopGrace when destroyed by an error unwinding), and reports a rank that failed.
// The ranks it starts die with it (PR_SET_PDEATHSIG, SIGKILL), so none outlives a killed
// rank 0. Linux sends that signal when the *thread* that forked exits: construct the job on
// a thread that outlives it (the main thread).

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "comm/process_group.h"
#include "comm/store/tcp_store.h"

namespace loom::strategies {

enum class LaunchMethod { Spawn, Fork };

struct LocalJobOptions {
  std::string backend = "auto";   // the group's backend ("auto": chosen for `device`)
  Device device = Device::cpu();  // where rank 0's tensors live (the backend must serve it)
  loom::Duration timeout = loom::kDefaultTimeout;
};

// How long a rank asked to stop (SIGTERM) has before it is killed.
inline constexpr std::chrono::seconds kStopGrace{5};

class RankWatcher;  // local_launch.cpp

class LocalJob {
 public:
  // Starts `world` ranks (this process is one of them) and returns this rank's group.
  // Throws loom::Error before starting any rank for a bad backend, and, once the ranks were
  // started, when the group cannot be created: rank 0's own error, or (when rank 0 only saw
  // the store close) the rank that failed first. No rank it started is running by then.
  LocalJob(int world, LaunchMethod method, const LocalJobOptions& options);
  ~LocalJob();
  LocalJob(const LocalJob&) = delete;
  LocalJob& operator=(const LocalJob&) = delete;

  std::shared_ptr<comm::ProcessGroup> group() const { return group_; }
  // Waits for the other ranks (rank 0 only); throws loom::Error naming a rank that failed.
  void join(std::chrono::seconds grace = std::chrono::seconds(60));

 private:
  void start_group(int rank, int world, uint16_t port, const std::string& secret,
                   const comm::GroupOptions& options);
  // Stops the store server (any thread): clients waiting on it get loom::CommError at once.
  void close_store();

  std::mutex server_mutex_;  // guards server_: the watcher closes it on a rank's failure
  std::unique_ptr<comm::TCPStoreServer> server_;
  std::unique_ptr<RankWatcher> watcher_;  // rank 0: the ranks it started
  std::shared_ptr<comm::ProcessGroup> group_;
  bool joined_ = false;
};

}  // namespace loom::strategies
