#include "tools/loomrun/rank_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "tools/loomrun/signal_pipe.h"

namespace loom::loomrun {

namespace {

void write_str(int fd, const char* text) {
  size_t size = std::strlen(text);
  while (size > 0) {
    ssize_t n = ::write(fd, text, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text += n;
    size -= static_cast<size_t>(n);
  }
}

void close_fds_from(int first) {
  if (::close_range(static_cast<unsigned>(first), ~0U, 0) == 0) return;
  long max = ::sysconf(_SC_OPEN_MAX);
  if (max < 0 || max > 65536) max = 65536;
  for (int fd = first; fd < max; ++fd)
    ::close(fd);
}

// Runs in the forked child, signals still blocked: only async-signal-safe work (plus
// hwloc's binding call and strerror, both fine after glibc's fork), then exec.
[[noreturn]] void exec_rank(const RankSpec& spec, char* const* argv, char* const* envp,
                            pid_t parent, int out_write, int err_write, int devnull,
                            const char* exec_message, const char* bind_message) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // loomrun died before the prctl
  SignalPipe::reset_in_child();             // default handlers, then unblocks
  if (::dup2(devnull, 0) < 0 || ::dup2(out_write, 1) < 0 || ::dup2(err_write, 2) < 0) {
    ::_exit(127);
  }
  close_fds_from(3);
  if (spec.binding != nullptr) {
    if (int error = spec.binding->apply(spec.local_rank); error != 0) {
      write_str(2, bind_message);
      write_str(2, std::strerror(error));
      write_str(2, "\n");
    }
  }
  ::execvpe(argv[0], argv, envp);
  int error = errno;
  write_str(2, exec_message);
  write_str(2, std::strerror(error));
  write_str(2, "\n");
  ::_exit(127);
}

}  // namespace

std::string signal_name(int signo) {
  const char* abbrev = ::sigabbrev_np(signo);
  if (abbrev == nullptr) return "signal " + std::to_string(signo);
  return std::string("SIG") + abbrev;
}

std::string RankExit::describe() const {
  if (signaled) {
    return "was killed by signal " + std::to_string(value) + " (" + signal_name(value) + ")";
  }
  return "exited with code " + std::to_string(value);
}

RankProcess::RankProcess(const RankSpec& spec) : global_rank_(spec.global_rank) {
  // Everything the child needs is built here: after fork it only reads.
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(spec.program.c_str()));
  for (const std::string& arg : spec.args)
    argv.push_back(const_cast<char*>(arg.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& entry : spec.env)
    envp.push_back(const_cast<char*>(entry.c_str()));
  envp.push_back(nullptr);
  std::string rank_tag = "loomrun: rank " + std::to_string(spec.global_rank) + ": ";
  std::string exec_message = rank_tag + "cannot execute '" + spec.program + "': ";
  std::string bind_message = rank_tag + "cannot bind to its CPUs (running unbound): ";

  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0) fail("[loomrun] pipe: ", std::strerror(errno));
  if (::pipe2(err, O_CLOEXEC) != 0) {
    ::close(out[0]);
    ::close(out[1]);
    fail("[loomrun] pipe: ", std::strerror(errno));
  }
  int devnull = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  pid_t parent = ::getpid();
  pid_t pid = -1;
  int fork_error = 0;
  {
    // The child resets loomrun's handlers before it unblocks: run in the child, they would
    // write into loomrun's signal pipe.
    SignalBlock block;
    pid = ::fork();
    fork_error = errno;
    if (pid == 0) {
      exec_rank(spec, argv.data(), envp.data(), parent, out[1], err[1], devnull,
                exec_message.c_str(), bind_message.c_str());
    }
  }
  ::close(out[1]);
  ::close(err[1]);
  if (devnull >= 0) ::close(devnull);
  if (pid < 0) {
    ::close(out[0]);
    ::close(err[0]);
    fail("[loomrun] fork for rank ", spec.global_rank, ": ", std::strerror(fork_error));
  }
  ::setpgid(pid, pid);  // also done by the child; whichever runs first wins the race
  pid_ = pid;
  out_fd_ = out[0];
  err_fd_ = err[0];
}

RankProcess::~RankProcess() {
  close_stdout();
  close_stderr();
}

void RankProcess::close_stdout() {
  if (out_fd_ >= 0) ::close(out_fd_);
  out_fd_ = -1;
}

void RankProcess::close_stderr() {
  if (err_fd_ >= 0) ::close(err_fd_);
  err_fd_ = -1;
}

void RankProcess::signal(int signo) const {
  if (exit_ || pid_ <= 0) return;
  if (::kill(-pid_, signo) != 0) ::kill(pid_, signo);
}

bool RankProcess::reap() {
  if (exit_ || pid_ <= 0) return false;
  int status = 0;
  pid_t done = ::waitpid(pid_, &status, WNOHANG);
  if (done != pid_) return false;
  if (WIFSIGNALED(status)) {
    exit_ = RankExit{.signaled = true, .value = WTERMSIG(status)};
  } else {
    exit_ = RankExit{.signaled = false, .value = WEXITSTATUS(status)};
  }
  return true;
}

}  // namespace loom::loomrun
