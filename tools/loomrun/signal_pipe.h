#pragma once
// The self-pipe trick: SIGINT, SIGTERM, SIGHUP and SIGCHLD become bytes on a non-blocking
// pipe that the launcher polls together with the ranks' output, so no work happens in a
// signal handler and a signal delivered to any thread (the store server has its own) still
// wakes the launcher. SIGPIPE is ignored. One instance per process, created before threads.

#include <signal.h>

#include <vector>

namespace loom::loomrun {

class SignalPipe {
 public:
  SignalPipe();   // installs the handlers; throws loom::Error if the pipe cannot be made
  ~SignalPipe();  // restores the default dispositions
  SignalPipe(const SignalPipe&) = delete;
  SignalPipe& operator=(const SignalPipe&) = delete;

  int fd() const { return read_fd_; }  // readable once a signal has arrived
  // The signals received since the last call, oldest first (SIGCHLDs may be merged).
  std::vector<int> drain();

  // For a forked child before exec (fork under a SignalBlock, so the child never runs
  // loomrun's handlers, whose bytes would land in loomrun's pipe): default dispositions and an
  // empty signal mask, so the program starts the way it would from a shell (ignored SIGPIPE would
  // survive exec). Async-signal-safe.
  static void reset_in_child() noexcept;

 private:
  int read_fd_ = -1;
};

// Blocks the forwarded signals in the calling thread while alive; signals that arrive
// meanwhile stay pending and are delivered when it ends.
class SignalBlock {
 public:
  SignalBlock();
  ~SignalBlock();
  SignalBlock(const SignalBlock&) = delete;
  SignalBlock& operator=(const SignalBlock&) = delete;

 private:
  sigset_t previous_;
};

}  // namespace loom::loomrun
