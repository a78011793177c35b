#include "strategies/local_launch.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>

namespace loom::strategies {

namespace {

std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> args;
  std::string arg;
  while (std::getline(in, arg, '\0'))
    args.push_back(arg);
  return args;
}

}  // namespace

LocalJob::LocalJob(int world, LaunchMethod method, comm::Duration timeout) {
  if (world < 1) fail("[launch] the number of ranks must be at least 1, got ", world);
  const std::string secret = comm::generate_store_secret();
  int rank = 0;
  uint16_t port = 0;
  if (method == LaunchMethod::Fork) {
    // Fork first (fork keeps only the calling thread, and the store server runs on one),
    // then serve, and tell the children the port through a pipe.
    int pipe_fds[2];
    if (pipe(pipe_fds) != 0) fail("[launch] pipe failed: ", std::strerror(errno));
    std::fflush(stdout);
    std::fflush(stderr);
    for (int r = 1; r < world; ++r) {
      pid_t pid = fork();
      if (pid < 0) fail("[launch] fork failed: ", std::strerror(errno));
      if (pid == 0) {
        rank = r;
        children_.clear();
        break;
      }
      children_.push_back(pid);
    }
    if (rank == 0) {
      close(pipe_fds[0]);
      server_ = std::make_unique<comm::TCPStoreServer>("127.0.0.1", 0, secret);
      port = server_->port();
      for (int r = 1; r < world; ++r) {
        if (write(pipe_fds[1], &port, sizeof port) != sizeof port) {
          fail("[launch] cannot hand the store port to the forked ranks: ", std::strerror(errno));
        }
      }
      close(pipe_fds[1]);
    } else {
      close(pipe_fds[1]);
      if (read(pipe_fds[0], &port, sizeof port) != sizeof port) {
        std::fprintf(stderr, "[launch] rank %d: rank 0 did not send the store port\n", rank);
        _exit(1);
      }
      close(pipe_fds[0]);
    }
  } else {
    server_ = std::make_unique<comm::TCPStoreServer>("127.0.0.1", 0, secret);
    port = server_->port();
    std::vector<std::string> args = own_arguments();
    std::fflush(stdout);
    std::fflush(stderr);
    for (int r = 1; r < world; ++r) {
      pid_t pid = fork();
      if (pid < 0) fail("[launch] fork failed: ", std::strerror(errno));
      if (pid == 0) {
        setenv("RANK", std::to_string(r).c_str(), 1);
        setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
        setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
        setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
        setenv("GROUP_RANK", "0", 1);
        setenv("MASTER_ADDR", "127.0.0.1", 1);
        setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
        setenv("LOOM_STORE_SECRET", secret.c_str(), 1);
        setenv("LOOM_STORE_SERVED_BY_LAUNCHER", "1", 1);
        setenv("LOOM_CLUSTER_ENV", "torchrun", 1);
        std::vector<char*> argv;
        for (std::string& a : args)
          argv.push_back(a.data());
        argv.push_back(nullptr);
        execv("/proc/self/exe", argv.data());
        std::fprintf(stderr, "[launch] rank %d: cannot re-execute the program: %s\n", r,
                     std::strerror(errno));
        _exit(127);
      }
      children_.push_back(pid);
    }
  }
  auto store = std::make_shared<comm::TCPStore>("127.0.0.1", port, secret, timeout);
  group_ = std::make_shared<comm::ProcessGroup>(
      rank, world, store, comm::GroupOptions{.timeout = timeout}, comm::default_group_name());
}

void LocalJob::join(std::chrono::seconds grace) {
  if (joined_) return;
  joined_ = true;
  group_.reset();
  auto deadline = std::chrono::steady_clock::now() + grace;
  std::string failure;
  for (size_t i = 0; i < children_.size(); ++i) {
    int status = 0;
    while (true) {
      pid_t done = waitpid(children_[i], &status, WNOHANG);
      if (done == children_[i]) break;
      if (std::chrono::steady_clock::now() > deadline) {
        kill(children_[i], SIGKILL);
        waitpid(children_[i], &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    int rank = static_cast<int>(i) + 1;
    if (WIFSIGNALED(status) && failure.empty()) {
      failure = "rank " + std::to_string(rank) + " was killed by signal " +
                std::to_string(WTERMSIG(status));
    } else if (WIFEXITED(status) && WEXITSTATUS(status) != 0 && failure.empty()) {
      failure = "rank " + std::to_string(rank) + " exited with code " +
                std::to_string(WEXITSTATUS(status));
    }
  }
  children_.clear();
  server_.reset();
  if (!failure.empty()) fail("[launch] ", failure);
}

LocalJob::~LocalJob() {
  try {
    join();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
  }
}

}  // namespace loom::strategies
