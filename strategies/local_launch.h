#pragma once
// Starting a job's ranks from inside the program, for ddp_spawn and ddp_fork (Lightning's
// subprocess and fork launchers), when no launcher (loomrun, torchrun, Slurm) started them.
//
//   spawn: the program re-executes itself (/proc/self/exe, same arguments) once per extra
//          rank with loomrun's variables; the ranks are fresh processes.
//   fork:  the process forks once per extra rank; each child continues from the call with
//          the parent's state (no threads may be running yet: fork keeps only the caller's).
//
// The calling process becomes rank 0 and serves the rendezvous store. Its LocalJob waits
// for the other ranks when destroyed (bounded: they are killed after `grace`), and reports
// a rank that failed.

#include <sys/types.h>
#include <chrono>
#include <memory>
#include <vector>

#include "comm/process_group.h"
#include "comm/store/tcp_store.h"

namespace loom::strategies {

enum class LaunchMethod { Spawn, Fork };

class LocalJob {
 public:
  // Starts `world` ranks (this process is one of them) and returns this rank's group.
  LocalJob(int world, LaunchMethod method, comm::Duration timeout);
  ~LocalJob();
  LocalJob(const LocalJob&) = delete;
  LocalJob& operator=(const LocalJob&) = delete;

  std::shared_ptr<comm::ProcessGroup> group() const { return group_; }
  // Waits for the other ranks (rank 0 only); throws loom::Error naming a rank that failed.
  void join(std::chrono::seconds grace = std::chrono::seconds(60));

 private:
  std::unique_ptr<comm::TCPStoreServer> server_;
  std::shared_ptr<comm::ProcessGroup> group_;
  std::vector<pid_t> children_;
  bool joined_ = false;
};

}  // namespace loom::strategies
