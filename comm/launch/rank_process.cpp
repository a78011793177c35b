#include "comm/launch/rank_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace loom::comm::launch {

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

// The ends of the pipes a captured rank writes into (-1 when not captured).
struct ChildStdio {
  int out_write = -1;
  int err_write = -1;
  int devnull = -1;
};

// Runs in the forked child: only async-signal-safe work (plus the spec's in_child step and
// strerror, both fine after glibc's fork), then exec.
[[noreturn]] void exec_rank(const RankSpec& spec, char* const* argv, char* const* envp,
                            pid_t parent, const ChildStdio& stdio, const char* exec_message,
                            const char* in_child_message) {
  if (spec.own_process_group) ::setpgid(0, 0);
  die_with_parent(parent);
  if (spec.capture_output) {
    if (::dup2(stdio.devnull, 0) < 0 || ::dup2(stdio.out_write, 1) < 0 ||
        ::dup2(stdio.err_write, 2) < 0) {
      ::_exit(127);
    }
    close_fds_from(3);
  }
  if (spec.in_child) {
    if (int error = spec.in_child(); error != 0) {
      write_str(2, in_child_message);
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

void die_with_parent(pid_t parent) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // the launcher died before the prctl
}

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

RankProcess::RankProcess(const RankSpec& spec)
    : rank_(spec.rank), own_group_(spec.own_process_group) {
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
  std::string rank_tag = spec.tool + ": rank " + std::to_string(spec.rank) + ": ";
  std::string exec_message = rank_tag + "cannot execute '" + spec.program + "': ";
  std::string in_child_message = rank_tag + spec.in_child_failure + ": ";

  int out[2] = {-1, -1}, err[2] = {-1, -1};
  ChildStdio stdio;
  if (spec.capture_output) {
    if (::pipe2(out, O_CLOEXEC) != 0) Tag(spec.tool).fail("pipe: ", std::strerror(errno));
    if (::pipe2(err, O_CLOEXEC) != 0) {
      ::close(out[0]);
      ::close(out[1]);
      Tag(spec.tool).fail("pipe: ", std::strerror(errno));
    }
    stdio = {out[1], err[1], ::open("/dev/null", O_RDONLY | O_CLOEXEC)};
  }
  const pid_t parent = ::getpid();
  // What the child writes through stdio goes out before it forks, not twice.
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = ::fork();
  const int fork_error = errno;
  if (pid == 0) {
    exec_rank(spec, argv.data(), envp.data(), parent, stdio, exec_message.c_str(),
              in_child_message.c_str());
  }
  for (int fd : {stdio.out_write, stdio.err_write, stdio.devnull}) {
    if (fd >= 0) ::close(fd);
  }
  if (pid < 0) {
    if (out[0] >= 0) ::close(out[0]);
    if (err[0] >= 0) ::close(err[0]);
    Tag(spec.tool).fail("fork for rank ", spec.rank, ": ", std::strerror(fork_error));
  }
  if (own_group_) ::setpgid(pid, pid);  // also done by the child; whichever runs first wins
  pid_ = pid;
  out_fd_ = out[0];
  err_fd_ = err[0];
}

std::unique_ptr<RankProcess> RankProcess::adopt(int rank, pid_t pid) {
  return std::unique_ptr<RankProcess>(new RankProcess(rank, pid));
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
  if (own_group_ && ::kill(-pid_, signo) == 0) return;
  ::kill(pid_, signo);
}

bool RankProcess::reap() {
  if (exit_ || pid_ <= 0) return false;
  int status = 0;
  pid_t done = ::waitpid(pid_, &status, WNOHANG);
  if (done == 0 || (done < 0 && errno == EINTR)) return false;
  if (done < 0) {
    exit_ = RankExit{.signaled = false, .value = 0};  // not our child any more: nothing to wait for
  } else if (WIFSIGNALED(status)) {
    exit_ = RankExit{.signaled = true, .value = WTERMSIG(status)};
  } else {
    exit_ = RankExit{.signaled = false, .value = WEXITSTATUS(status)};
  }
  return true;
}

}  // namespace loom::comm::launch
