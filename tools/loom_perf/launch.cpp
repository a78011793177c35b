#include "tools/loom_perf/launch.h"

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "comm/shm/segment.h"
#include "comm/store/tcp_store.h"
#include "core/error.h"
#include "core/tunables.h"

extern char** environ;

namespace loom::perf {

namespace {

// Variables this launcher sets, plus those that would point a rank elsewhere.
bool replaced(const std::string& entry) {
  static const char* const kNames[] = {"RANK",
                                       "WORLD_SIZE",
                                       "LOCAL_RANK",
                                       "LOCAL_WORLD_SIZE",
                                       "GROUP_RANK",
                                       "MASTER_ADDR",
                                       "MASTER_PORT",
                                       tunables::kStoreSecret.name,
                                       tunables::kStorePort.name,
                                       tunables::kStoreServedByLauncher.name,
                                       tunables::kClusterEnv.name,
                                       tunables::kJobId.name,
                                       tunables::kPerfCommand.name};
  for (const char* name : kNames) {
    size_t n = std::strlen(name);
    if (entry.compare(0, n, name) == 0 && entry.size() > n && entry[n] == '=') return true;
  }
  return false;
}

std::vector<std::string> rank_environment(int rank, int np, uint16_t port,
                                          const std::string& secret, const std::string& job_id,
                                          const std::string& command) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (!replaced(*e)) env.emplace_back(*e);
  }
  env.push_back("RANK=" + std::to_string(rank));
  env.push_back("WORLD_SIZE=" + std::to_string(np));
  env.push_back("LOCAL_RANK=" + std::to_string(rank));
  env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(np));
  env.push_back("GROUP_RANK=0");
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back("MASTER_PORT=" + std::to_string(port));
  env.push_back(std::string(tunables::kStoreSecret.name) + "=" + secret);
  env.push_back(std::string(tunables::kStoreServedByLauncher.name) + "=1");
  env.push_back(std::string(tunables::kJobId.name) + "=" + job_id);
  env.push_back(std::string(tunables::kPerfCommand.name) + "=" + command);
  return env;
}

// argv without "--np N" / "--np=N".
std::vector<std::string> rank_arguments(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--np") {
      ++i;
      continue;
    }
    if (arg.starts_with("--np=")) continue;
    args.push_back(arg);
  }
  return args;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> pointers;
  for (std::string& s : strings)
    pointers.push_back(s.data());
  pointers.push_back(nullptr);
  return pointers;
}

// The CPUs this process may run on, in order.
std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> cpus;
  if (::sched_getaffinity(0, sizeof set, &set) != 0) return cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.push_back(cpu);
  }
  return cpus;
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

}  // namespace

void report_rank_error(const char* tool, const char* rank, const std::exception& error) {
  std::string line = tool;
  line.append(": rank ").append(rank != nullptr ? rank : "0").append(": ");
  line.append(error.what()).append("\n");
  (void)!::write(2, line.data(), line.size());
}

int launch_ranks(int np, bool bind_cores, int argc, char** argv, const std::string& command) {
  const std::string secret = comm::generate_store_secret();
  const std::string job_id = comm::shm::new_job_id();
  comm::TCPStoreServer server("127.0.0.1", 0, secret);
  std::vector<std::string> args = rank_arguments(argc, argv);
  std::vector<char*> c_args = c_strings(args);
  const pid_t launcher = ::getpid();
  const std::vector<int> cpus = bind_cores ? allowed_cpus() : std::vector<int>{};

  std::vector<pid_t> pids(static_cast<size_t>(np), -1);
  for (int rank = 0; rank < np; ++rank) {
    // Everything the child needs is built before fork: after it, only exec-safe calls.
    std::vector<std::string> env =
        rank_environment(rank, np, server.port(), secret, job_id, command);
    std::vector<char*> c_env = c_strings(env);
    cpu_set_t core;
    CPU_ZERO(&core);
    if (!cpus.empty()) CPU_SET(cpus[static_cast<size_t>(rank) % cpus.size()], &core);
    pid_t pid = ::fork();
    if (pid < 0) fail("loom-perf --np: fork failed: ", std::strerror(errno));
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
      if (::getppid() != launcher) ::_exit(1);
      if (!cpus.empty()) ::sched_setaffinity(0, sizeof core, &core);
      ::execve("/proc/self/exe", c_args.data(), c_env.data());
      const char message[] = "loom-perf --np: cannot re-execute /proc/self/exe\n";
      (void)!::write(2, message, sizeof message - 1);
      ::_exit(127);
    }
    pids[static_cast<size_t>(rank)] = pid;
  }

  int result = 0;
  int running = np;
  std::chrono::steady_clock::time_point kill_at{};
  bool stopping = false;
  bool killed = false;            // SIGKILL sent to the ranks still running
  bool cause_was_signal = false;  // the failure that began the stop was a signal death
  while (running > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, stopping ? WNOHANG : 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (pid == 0) {  // stopping, none exited yet
      if (!killed && std::chrono::steady_clock::now() >= kill_at) {
        killed = true;
        for (pid_t p : pids) {
          if (p > 0) ::kill(p, SIGKILL);
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    for (size_t r = 0; r < pids.size(); ++r) {
      if (pids[r] != pid) continue;
      pids[r] = -1;
      --running;
      int code = exit_code_of(status);
      const bool signaled = WIFSIGNALED(status);
      if (code != 0 && result == 0) {
        result = code;
        cause_was_signal = signaled;
        std::fprintf(stderr, "loom-perf --np: rank %zu exited with code %d; stopping the others\n",
                     r, code);
        for (pid_t p : pids) {
          if (p > 0) ::kill(p, SIGTERM);
        }
        stopping = true;
        kill_at = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      } else if (stopping && signaled && WTERMSIG(status) != SIGTERM &&
                 !(killed && WTERMSIG(status) == SIGKILL)) {
        // Killed by a signal we did not send, after a peer failed: most likely the cause (a
        // survivor can notice the death before we reap the dead rank), so named too.
        std::fprintf(stderr, "loom-perf --np: rank %zu was killed by signal %d\n", r,
                     WTERMSIG(status));
        if (!cause_was_signal) result = code;
        cause_was_signal = true;
      }
    }
  }
  // Ranks killed while they set up their group may leave its segment behind.
  if (int removed = comm::shm::remove_job_segments(job_id); removed > 0) {
    std::fprintf(stderr, "loom-perf --np: removed %d shared-memory segment(s) left in /dev/shm\n",
                 removed);
  }
  return result;
}

}  // namespace loom::perf
