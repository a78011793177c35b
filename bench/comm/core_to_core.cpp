// core_to_core: how long one cache line takes to go from one core to another, the cost that
// the shm backend's small collectives pay per message (Note [Fast boxes]):
//
//     build/release/bench/comm/core_to_core [--cores A,B] [--round-trips N] [--trials T]
//
// Two threads pinned to cores A and B (default: the first two this process may use) pass a
// counter back and forth through one line; one-way latency = time / (2 x round trips). Prints
// each trial's figure and their median. This machine's host has a fast and a slow mode
// (docs/performance_comm.md, "Caveat: two host modes"); this figure tells them apart, so
// bench/comm/small_allreduce_vs_mpi.py prints it beside its table.

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace {

struct alignas(64) Line {
  std::atomic<long> value{0};
};

// The caller checked that `core` is one this process may use.
void pin_to(int core) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(core, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

cpu_set_t allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0)
    throw std::runtime_error("sched_getaffinity failed");
  return set;
}

// The first two cores this process may run on.
std::pair<int, int> default_cores() {
  const cpu_set_t set = allowed_cores();
  std::vector<int> cores;
  for (int c = 0; c < CPU_SETSIZE && cores.size() < 2; ++c) {
    if (CPU_ISSET(c, &set)) cores.push_back(c);
  }
  if (cores.size() < 2) throw std::runtime_error("this process may use only one core; need two");
  return {cores[0], cores[1]};
}

// One trial: `round_trips` times, A writes an odd number and waits for B's even answer.
double one_way_ns(int core_a, int core_b, long round_trips) {
  Line line;
  std::thread b([&] {
    pin_to(core_b);
    for (long i = 1; i < 2 * round_trips; i += 2) {
      while (line.value.load(std::memory_order_acquire) != i) {
      }
      line.value.store(i + 1, std::memory_order_release);
    }
  });
  pin_to(core_a);
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < 2 * round_trips; i += 2) {
    line.value.store(i + 1, std::memory_order_release);
    while (line.value.load(std::memory_order_acquire) != i + 2) {
    }
  }
  const auto elapsed = std::chrono::steady_clock::now() - start;
  b.join();
  return std::chrono::duration<double, std::nano>(elapsed).count() / (2.0 * round_trips);
}

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "core_to_core: %s\nusage: core_to_core [--cores A,B] [--round-trips N (>0)] "
               "[--trials T (>0)]\n",
               problem.c_str());
  std::exit(2);
}

long positive(const char* text, const char* flag) {
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || value <= 0) {
    usage(std::string(flag) + " '" + text + "' is not a positive integer");
  }
  return value;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    std::pair<int, int> cores{-1, -1};
    long round_trips = 1'000'000, trials = 5;
    for (int i = 1; i < argc; ++i) {
      const std::string flag = argv[i];
      if (i + 1 >= argc) usage(flag + " needs a value");
      const char* value = argv[++i];
      if (flag == "--cores") {
        if (std::sscanf(value, "%d,%d", &cores.first, &cores.second) != 2 || cores.first < 0 ||
            cores.second < 0 || cores.first == cores.second) {
          usage(std::string("--cores '") + value + "' is not two different cores A,B");
        }
      } else if (flag == "--round-trips") {
        round_trips = positive(value, "--round-trips");
      } else if (flag == "--trials") {
        trials = positive(value, "--trials");
      } else {
        usage("unknown flag " + flag);
      }
    }
    if (cores.first < 0) cores = default_cores();
    const cpu_set_t allowed = allowed_cores();
    for (int core : {cores.first, cores.second}) {
      if (core >= CPU_SETSIZE || !CPU_ISSET(core, &allowed)) {
        usage("core " + std::to_string(core) + " is not one this process may use (see taskset -p)");
      }
    }
    std::vector<double> figures;
    for (long t = 0; t < trials; ++t)
      figures.push_back(one_way_ns(cores.first, cores.second, round_trips));
    std::printf("one-way core-to-core latency, cores %d and %d, ns per trial:", cores.first,
                cores.second);
    for (double f : figures)
      std::printf(" %.1f", f);
    std::sort(figures.begin(), figures.end());
    std::printf("\nmedian_ns %.1f\n", figures[figures.size() / 2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "core_to_core: %s\n", e.what());
    return 1;
  }
}
