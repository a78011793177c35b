// Drives the library's fault points (core/fault_points.h, Note [Fault points]) from the
// environment of a test program. Linked only into test executables (train_gpt_faults); the
// library and the shipped tools never read these variables.
//
//   LOOM_TEST_FAULT=list                 print every fault point's name, one per line, and exit 0
//   LOOM_TEST_FAULT=POINT:HIT:ACTION     at the HIT-th time (from 1) this process reaches POINT:
//                                        ACTION crash  SIGKILL itself (as a kill -9 would)
//                                               eio    the code at the point sees EIO
//                                               enospc the code at the point sees ENOSPC
//   LOOM_TEST_FAULT_COUNTS=FILE          at exit, append "POINT COUNT" for every point this
//                                        process reached (how a test aims at a given save)

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "core/fault_points.h"

namespace {

struct Plan {
  std::string point;
  long hit = 0;
  int error = 0;  // 0: crash
};

Plan plan;
std::mutex counts_mutex;
std::map<std::string, long>& counts() {
  static auto* map = new std::map<std::string, long>;  // outlives every static destructor
  return *map;
}

int hook(std::string_view point) {
  long reached = 0;
  {
    std::lock_guard lock(counts_mutex);
    reached = ++counts()[std::string(point)];
  }
  if (point != plan.point || reached != plan.hit) return 0;
  std::fprintf(stderr, "fault injection: %s at %.*s (time %ld)\n",
               plan.error == 0 ? "crash" : "error", static_cast<int>(point.size()), point.data(),
               reached);
  if (plan.error == 0) {
    std::fflush(stderr);
    ::kill(::getpid(), SIGKILL);
  }
  return plan.error;
}

void write_counts() {
  const char* file = std::getenv("LOOM_TEST_FAULT_COUNTS");
  if (file == nullptr) return;
  std::lock_guard lock(counts_mutex);
  if (FILE* out = std::fopen(file, "a")) {
    for (const auto& [point, count] : counts())
      std::fprintf(out, "%d %s %ld\n", static_cast<int>(::getpid()), point.c_str(), count);
    std::fclose(out);
  }
}

[[noreturn]] void usage(const char* given) {
  std::fprintf(stderr,
               "LOOM_TEST_FAULT='%s': expected list, or POINT:HIT:ACTION with HIT >= 1 and "
               "ACTION crash, eio or enospc\n",
               given);
  std::_Exit(2);
}

[[maybe_unused]] const bool installed = [] {
  const char* spec = std::getenv("LOOM_TEST_FAULT");
  if (spec != nullptr && std::string_view(spec) == "list") {
    for (std::string_view point : loom::fault::kFaultPoints)
      std::printf("%.*s\n", static_cast<int>(point.size()), point.data());
    std::fflush(stdout);
    std::_Exit(0);
  }
  if (spec != nullptr && *spec != '\0') {
    const std::string text = spec;
    const size_t a = text.find(':'), b = text.find(':', a == std::string::npos ? a : a + 1);
    if (a == std::string::npos || b == std::string::npos) usage(spec);
    plan.point = text.substr(0, a);
    plan.hit = std::strtol(text.substr(a + 1, b - a - 1).c_str(), nullptr, 10);
    const std::string action = text.substr(b + 1);
    if (action == "eio") plan.error = EIO;
    else if (action == "enospc") plan.error = ENOSPC;
    else if (action != "crash") usage(spec);
    bool known = false;
    for (std::string_view point : loom::fault::kFaultPoints) known = known || point == plan.point;
    if (!known || plan.hit < 1) usage(spec);
  }
  if (spec != nullptr || std::getenv("LOOM_TEST_FAULT_COUNTS") != nullptr) {
    loom::fault::set_hook(hook);
    std::atexit(write_counts);
  }
  return true;
}();

}  // namespace
