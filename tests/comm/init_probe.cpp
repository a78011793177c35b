// A rank program for the loomrun end-to-end tests: joins the default group with
// loom::comm::init(), allreduces its rank + 1 and prints the sum. With `--die RANK` that rank
// kills itself (SIGKILL) before the second allreduce, and the others report the CommError.

#include <signal.h>

#include <cstdio>
#include <cstring>
#include <string>

#include "comm/process_group.h"

int main(int argc, char** argv) {
  int die = -1;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--die") == 0) die = std::stoi(argv[i + 1]);
  }
  try {
    auto pg = loom::comm::init({.timeout = std::chrono::seconds(30)});
    loom::Tensor t = loom::Tensor::full({4}, pg->rank() + 1.0);
    pg->allreduce(t)->wait();
    std::printf("rank %d of %d: sum=%g\n", pg->rank(), pg->size(), t.to_vector<float>()[0]);
    std::fflush(stdout);
    if (pg->rank() == die) raise(SIGKILL);
    pg->allreduce(t)->wait();
    return 0;
  } catch (const loom::CommError& e) {
    std::fprintf(stderr, "CommError: %s\n", e.what());
    return 3;
  }
}
