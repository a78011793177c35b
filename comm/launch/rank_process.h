#pragma once
// One rank as a child process, the one way Loom starts ranks (loomrun, loom-perf --np,
// ddp_spawn): fork, then in the child die with the launcher (PR_SET_PDEATHSIG; exit at once
// if it is already gone), run the spec's `in_child` step, and exec the program with the
// spec's environment. Optionally the child gets a process group of its own (so stopping a
// rank also stops what it forked) and its stdout and stderr on pipes, stdin on /dev/null.
// An exec failure is reported on the rank's stderr and the child exits 127 (the shell's
// "command not found" code).
//
// ddp_fork's ranks are forks that never exec: fork_rank() gives them the same death rule.

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace loom::comm::launch {

// How a rank ended, from waitpid's status.
struct RankExit {
  bool signaled = false;
  int value = 0;  // exit code, or the signal number when signaled

  bool ok() const { return !signaled && value == 0; }
  // The exit code a launcher passes on: the code, or 128 + signal.
  int exit_code() const { return signaled ? 128 + value : value; }
  // "exited with code 3" / "was killed by signal 9 (SIGKILL)"
  std::string describe() const;
};

struct RankSpec {
  int rank = 0;                        // for messages
  std::string program = {};            // found on PATH unless it holds a '/'
  std::vector<std::string> args = {};  // without argv[0]
  std::vector<std::string> env = {};   // the whole environment, "NAME=value"
  std::string tool = "loom";           // names the launcher in the child's messages
  bool own_process_group = false;
  bool capture_output = false;  // stdout/stderr on pipes (the launcher relays them)
  // Runs in the child after fork, before exec, with signals as the launcher left them: only
  // what is safe after fork (async-signal-safe calls, CPU binding). Returns an errno-style
  // code; non-zero is reported on the rank's stderr as `in_child_failure` and the rank runs
  // anyway.
  std::function<int()> in_child = {};
  std::string in_child_failure = {};
};

class RankProcess {
 public:
  // Starts the rank. Throws loom::Error when a pipe or fork fails (exec failures happen in
  // the child and show up as exit code 127).
  explicit RankProcess(const RankSpec& spec);
  // A rank this process forked without exec (ddp_fork), watched like the others.
  static std::unique_ptr<RankProcess> adopt(int rank, pid_t pid);
  ~RankProcess();  // closes the pipes still open; does not wait (see reap())
  RankProcess(const RankProcess&) = delete;
  RankProcess& operator=(const RankProcess&) = delete;

  int rank() const { return rank_; }
  pid_t pid() const { return pid_; }
  bool running() const { return !exit_; }
  const std::optional<RankExit>& exit() const { return exit_; }

  // The read ends of the rank's stdout and stderr when captured; -1 otherwise or once closed.
  int stdout_fd() const { return out_fd_; }
  int stderr_fd() const { return err_fd_; }
  void close_stdout();
  void close_stderr();

  // Sends `signo` to the rank (to its process group when it has one). No-op once the rank
  // has been reaped, so a signal never reaches a reused process id.
  void signal(int signo) const;
  // Non-blocking waitpid; returns true when the rank has just been reaped.
  bool reap();

 private:
  RankProcess(int rank, pid_t pid) : rank_(rank), own_group_(false), pid_(pid) {}

  int rank_;
  bool own_group_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::optional<RankExit> exit_;
};

// For a rank forked without exec (ddp_fork), called first thing in the child: dies with
// `parent` (PR_SET_PDEATHSIG), and exits at once if it is already gone.
void die_with_parent(pid_t parent);

// "SIGKILL" for 9; "signal 42" when unknown.
std::string signal_name(int signo);

}  // namespace loom::comm::launch
