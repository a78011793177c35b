// loomrun_probe: a rank for test_loomrun. Reads its identity from loomrun's environment
// and does one thing, chosen by argv[1]:
//   env                    print the launcher variables as NAME=value lines
//   output                 two stdout lines, one stderr line, then an unterminated stdout line
//   fail RANK CODE         RANK exits CODE after 100 ms; the others sleep 30 s
//   kill-self RANK         RANK kills itself with SIGKILL; the others sleep 30 s
//   fail-until N           exit 1 while LOOM_RESTART_COUNT < N, else 0
//   stubborn RANK CODE     RANK exits CODE; the others ignore SIGTERM and sleep 30 s
//   sleep SECONDS          sleep, then exit 0
//   wait-signal            print "ready", wait for SIGTERM/SIGINT, print "got signal N", exit 0
//   affinity               print "CPUS=<list of CPUs this process may run on>"
//   store                  rank 0 and 1 exchange a value through the store loomrun serves
//   store-bad-secret       connect with a wrong secret; exit 0 only if rejected
//   leak-segment           create a shared-memory segment and print "SEGMENT=<name>"; rank 1
//                          then dies by SIGKILL 200 ms later, the others sleep 30 s; none
//                          unlinks it (ranks killed during group setup)

#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "comm/shm/segment.h"
#include "comm/store/tcp_store.h"

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

int rank() {
  return std::atoi(env("RANK").c_str());
}

void sleep_s(double s) {
  std::this_thread::sleep_for(std::chrono::milliseconds(static_cast<int64_t>(s * 1000)));
}

volatile sig_atomic_t g_signal = 0;
void on_signal(int signo) {
  g_signal = signo;
}

std::string cpu_list() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return "?";
  std::string out;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    int last = cpu;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set))
      ++last;
    if (!out.empty()) out += ",";
    out += std::to_string(cpu);
    if (last > cpu) out += "-" + std::to_string(last);
    cpu = last;
  }
  return out;
}

loom::comm::TCPStore connect_store(const std::string& secret) {
  return loom::comm::TCPStore(env("MASTER_ADDR"),
                              static_cast<uint16_t>(std::atoi(env("MASTER_PORT").c_str())), secret,
                              std::chrono::seconds(5));
}

int store_exchange() {
  loom::comm::TCPStore store = connect_store(env("LOOM_STORE_SECRET"));
  std::string attempt = "attempt" + env("LOOM_RESTART_COUNT") + "/";
  using loom::comm::to_bytes;
  using loom::comm::to_string;
  if (rank() == 0) {
    store.set(attempt + "ping", to_bytes("hello from rank 0"));
    std::printf("rank 0 got '%s'\n",
                to_string(store.get(attempt + "pong", std::chrono::seconds(5))).c_str());
  } else {
    std::printf("rank 1 got '%s'\n",
                to_string(store.get(attempt + "ping", std::chrono::seconds(5))).c_str());
    store.set(attempt + "pong", to_bytes("hello from rank 1"));
  }
  return 0;
}

int store_bad_secret() {
  try {
    loom::comm::TCPStore store = connect_store("not-the-secret");
    store.set("intruder", loom::comm::to_bytes("x"));
    std::printf("accepted a wrong secret\n");
    return 1;
  } catch (const std::exception& e) {
    std::printf("rejected: %s\n", e.what());
    return 0;
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "env";
  auto arg = [&](int i) { return i < argc ? std::atoi(argv[i]) : 0; };
  if (mode == "env") {
    for (const char* name :
         {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
          "MASTER_PORT", "LOOM_STORE_SECRET", "LOOM_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT",
          "LOOM_CLUSTER_ENV", "LOOM_JOB_ID", "LOOM_STORE_PORT"}) {
      std::printf("%s=%s\n", name, env(name).c_str());
    }
    return 0;
  }
  if (mode == "output") {
    std::printf("out line 1\nout line 2\n");
    std::fflush(stdout);
    std::fprintf(stderr, "err line\n");
    std::printf("partial");
    return 0;
  }
  if (mode == "fail" || mode == "kill-self" || mode == "stubborn") {
    if (rank() == arg(2)) {
      sleep_s(0.1);
      if (mode == "kill-self") raise(SIGKILL);
      return arg(3);
    }
    if (mode == "stubborn") signal(SIGTERM, SIG_IGN);
    sleep_s(30);
    return 0;
  }
  if (mode == "leak-segment") {
    loom::comm::shm::Segment segment = loom::comm::shm::Segment::create(4096);
    std::printf("SEGMENT=%s\n", segment.name().c_str());
    std::fflush(stdout);
    if (rank() != 1) sleep_s(30);
    sleep_s(0.2);
    raise(SIGKILL);
  }
  if (mode == "fail-until") {
    int attempt = std::atoi(env("LOOM_RESTART_COUNT").c_str());
    std::printf("attempt %d\n", attempt);
    return attempt < arg(2) ? 1 : 0;
  }
  if (mode == "sleep") {
    sleep_s(argc > 2 ? std::atof(argv[2]) : 30);
    return 0;
  }
  if (mode == "wait-signal") {
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    std::printf("ready\n");
    std::fflush(stdout);
    for (int i = 0; i < 3000 && g_signal == 0; ++i)
      sleep_s(0.01);
    std::printf("got signal %d\n", static_cast<int>(g_signal));
    return g_signal != 0 ? 0 : 1;
  }
  if (mode == "affinity") {
    std::printf("CPUS=%s\n", cpu_list().c_str());
    return 0;
  }
  if (mode == "store") return store_exchange();
  if (mode == "store-bad-secret") return store_bad_secret();
  std::fprintf(stderr, "loomrun_probe: unknown mode '%s'\n", mode.c_str());
  return 2;
}
