#pragma once
// The life cycle of this node's ranks: start them, relay their output, watch them, stop
// them together and restart the whole group.
//
// An attempt ends when every rank has been reaped. It fails when a rank exits non-zero or
// is killed by a signal: loomrun names the rank, sends SIGTERM to the others (to their
// process groups), and SIGKILL to those still running after the grace period. SIGINT,
// SIGTERM or SIGHUP sent to loomrun are forwarded to every rank, then the same grace
// period applies; a second such signal sends SIGKILL at once. After a failed attempt the
// group restarts (LOOM_RESTART_COUNT + 1) until --max-restarts is used up; a signal or
// --timeout never restarts. The store (served by main on node 0) outlives every attempt;
// see Note [Restart attempts share one store] in comm/environment.h.
//
// Exit codes of run(): 0 when every rank of an attempt exits 0; the failing rank's code
// (128 + signal when it was killed) when the last attempt fails; 128 + signal when loomrun
// was interrupted; 124 on --timeout; 1 when a rank cannot be started.

#include <chrono>
#include <optional>
#include <string>

#include "tools/loomrun/binding.h"
#include "tools/loomrun/options.h"
#include "tools/loomrun/signal_pipe.h"

namespace loom::loomrun {

inline constexpr int kTimeoutExitCode = 124;

class Launcher {
 public:
  // `binding` and `signals` must outlive the launcher; `master_port` is the store's real port.
  Launcher(const LaunchOptions& options, int master_port, std::string secret,
           const BindingPlan* binding, SignalPipe& signals);

  // Runs attempts until one succeeds or loomrun gives up; blocks. Returns the exit code.
  int run();

 private:
  struct Outcome;
  Outcome run_attempt(int restart_count,
                      std::optional<std::chrono::steady_clock::time_point> job_deadline);

  const LaunchOptions& options_;
  int master_port_;
  std::string secret_;
  std::string job_id_;  // LOOM_JOB_ID of the ranks (comm/shm/segment.h)
  const BindingPlan* binding_;
  SignalPipe& signals_;
};

}  // namespace loom::loomrun
