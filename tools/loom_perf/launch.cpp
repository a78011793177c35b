#include "tools/loom_perf/launch.h"

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <map>
#include <thread>
#include <vector>

#include "comm/environment.h"
#include "comm/launch/rank_group.h"
#include "comm/shm/segment.h"
#include "comm/store/tcp_store.h"
#include "core/error.h"
#include "core/tunables.h"

extern char** environ;

namespace loom::perf {

namespace {

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

}  // namespace

void report_rank_error(const char* tool, const std::exception& error) {
  std::string line = tool;
  line.append(": rank ").append(std::to_string(comm::launcher_rank().value_or(0))).append(": ");
  line.append(error.what()).append("\n");
  (void)!::write(2, line.data(), line.size());
}

int launch_ranks(int np, bool bind_cores, int argc, char** argv, const std::string& command) {
  const std::string secret = comm::generate_store_secret();
  const std::string job_id = comm::shm::new_job_id();
  comm::TCPStoreServer server("127.0.0.1", 0, secret);
  std::vector<std::string> args = rank_arguments(argc, argv);
  args.erase(args.begin());  // argv[0]: the program is /proc/self/exe
  const std::vector<int> cpus = bind_cores ? allowed_cpus() : std::vector<int>{};

  comm::launch::RankGroup group(std::chrono::seconds(5));
  for (int rank = 0; rank < np; ++rank) {
    std::map<std::string, std::string> variables =
        comm::rank_variables({.rank = rank,
                              .local_rank = rank,
                              .world_size = np,
                              .local_world_size = np,
                              .store_port = server.port(),
                              .store_secret = secret,
                              .job_id = job_id});
    variables[tunables::kPerfCommand.name] = command;
    cpu_set_t core;
    CPU_ZERO(&core);
    if (!cpus.empty()) CPU_SET(cpus[static_cast<size_t>(rank) % cpus.size()], &core);
    comm::launch::RankSpec spec{.rank = rank,
                                .program = "/proc/self/exe",
                                .args = args,
                                .env = comm::environment_with(variables, environ),
                                .tool = "loom-perf --np",
                                .in_child = [&cpus, core]() -> int {
                                  if (cpus.empty()) return 0;
                                  return ::sched_setaffinity(0, sizeof core, &core) == 0 ? 0
                                                                                         : errno;
                                },
                                .in_child_failure = "cannot bind to its core (running unbound)"};
    try {
      group.add(std::make_unique<comm::launch::RankProcess>(spec));
    } catch (const Error& e) {
      std::fprintf(stderr, "loom-perf --np: cannot start rank %d: %s\n", rank, e.what());
      group.stop(SIGTERM);
      break;
    }
  }

  while (group.running() > 0) {
    for (const comm::launch::RankGroup::Report& report : group.reap()) {
      const comm::launch::RankExit& exit = *report.rank->exit();
      if (report.first_failure) {
        std::fprintf(stderr, "loom-perf --np: rank %d exited with code %d; stopping the others\n",
                     report.rank->rank(), exit.exit_code());
      } else {
        std::fprintf(stderr, "loom-perf --np: rank %d was killed by signal %d\n",
                     report.rank->rank(), exit.value);
      }
    }
    group.tick();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // Ranks killed while they set up their group may leave its segment behind.
  if (int removed = comm::shm::remove_job_segments(job_id); removed > 0) {
    std::fprintf(stderr, "loom-perf --np: removed %d shared-memory segment(s) left in /dev/shm\n",
                 removed);
  }
  return group.failed() ? group.exit_code() : (group.stopping() ? 1 : 0);
}

}  // namespace loom::perf
