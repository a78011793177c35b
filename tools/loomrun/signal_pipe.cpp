#include "tools/loomrun/signal_pipe.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include "core/error.h"
#include "core/tags.h"

namespace loom::loomrun {

namespace {

int g_write_fd = -1;  // the handler's end of the pipe
constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGCHLD};

void on_signal(int signo) {
  int saved = errno;
  unsigned char byte = static_cast<unsigned char>(signo);
  // A full pipe drops the byte; the launcher is then busy draining anyway.
  [[maybe_unused]] ssize_t n = ::write(g_write_fd, &byte, 1);
  errno = saved;
}

}  // namespace

SignalPipe::SignalPipe() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
    tag::kLoomrun.fail("cannot create the signal pipe");
  read_fd_ = fds[0];
  g_write_fd = fds[1];
  struct sigaction action {};
  action.sa_handler = on_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  for (int signo : kForwarded)
    ::sigaction(signo, &action, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
}

SignalPipe::~SignalPipe() {
  for (int signo : kForwarded)
    ::signal(signo, SIG_DFL);
  ::close(read_fd_);
  ::close(g_write_fd);
  g_write_fd = -1;
}

std::vector<int> SignalPipe::drain() {
  std::vector<int> signals;
  unsigned char buffer[64];
  for (;;) {
    ssize_t n = ::read(read_fd_, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    signals.insert(signals.end(), buffer, buffer + n);
  }
  return signals;
}

void SignalPipe::reset_in_child() noexcept {
  for (int signo : kForwarded)
    ::signal(signo, SIG_DFL);
  ::signal(SIGPIPE, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
}

SignalBlock::SignalBlock() {
  sigset_t block;
  sigemptyset(&block);
  for (int signo : kForwarded)
    sigaddset(&block, signo);
  ::pthread_sigmask(SIG_BLOCK, &block, &previous_);
}

SignalBlock::~SignalBlock() {
  ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

}  // namespace loom::loomrun
