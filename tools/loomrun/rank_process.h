#pragma once
// One rank as a child process: fork + execvp with its stdout and stderr on pipes, stdin on
// /dev/null, in a process group of its own (so stopping a rank also stops what it forked),
// and killed by the kernel if loomrun dies (PR_SET_PDEATHSIG). An exec failure is reported
// on the rank's stderr and the child exits 127 (the shell's "command not found" code).

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "tools/loomrun/binding.h"

namespace loom::loomrun {

// How a rank ended, from waitpid's status.
struct RankExit {
  bool signaled = false;
  int value = 0;  // exit code, or the signal number when signaled

  bool ok() const { return !signaled && value == 0; }
  // The exit code loomrun passes on: the code, or 128 + signal.
  int exit_code() const { return signaled ? 128 + value : value; }
  // "exited with code 3" / "was killed by signal 9 (SIGKILL)"
  std::string describe() const;
};

struct RankSpec {
  int global_rank = 0;
  int local_rank = 0;
  std::string program;
  std::vector<std::string> args;  // without argv[0]
  std::vector<std::string> env;   // "NAME=value"
  const BindingPlan* binding = nullptr;
};

class RankProcess {
 public:
  // Starts the rank. Throws loom::Error when a pipe or fork fails (exec failures happen in
  // the child and show up as exit code 127).
  explicit RankProcess(const RankSpec& spec);
  ~RankProcess();  // closes the pipes still open; does not wait (see reap())
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  int global_rank() const { return global_rank_; }
  pid_t pid() const { return pid_; }
  bool running() const { return !exit_; }
  const std::optional<RankExit>& exit() const { return exit_; }

  // The read ends of the rank's stdout and stderr; -1 once closed.
  int stdout_fd() const { return out_fd_; }
  int stderr_fd() const { return err_fd_; }
  void close_stdout();
  void close_stderr();

  // Sends `signo` to the rank's process group (to the rank alone if that fails). No-op
  // once the rank has been reaped.
  void signal(int signo) const;
  // Non-blocking waitpid; returns true when the rank has just been reaped.
  bool reap();

 private:
  int global_rank_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::optional<RankExit> exit_;
};

// "SIGKILL" for 9; "signal 42" when unknown.
std::string signal_name(int signo);

}  // namespace loom::loomrun
