// loom-trace analyze DIR: see analyze.h. Exit status 1 when something was found, 0 when the
// ranks agree, 2 on bad input.

#include <cstdio>
#include <cstring>
#include <exception>

#include "tools/loom_trace/analyze.h"

int main(int argc, char** argv) {
  if (argc != 3 || std::strcmp(argv[1], "analyze") != 0) {
    std::fprintf(stderr, "usage: loom-trace analyze DIR   (DIR holds flight.rank-R.json dumps)\n");
    return 2;
  }
  try {
    const loom::trace::Analysis a = loom::trace::analyze_flight_dumps(argv[2]);
    std::fputs(a.report.c_str(), stdout);
    return a.found ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
