#pragma once
// loomrun's command line: torchrun-style flags (both dash and underscore spellings), then the
// program and its arguments. Parsing does not start anything; it only validates.

#include <optional>
#include <string>
#include <vector>

#include "tools/loomrun/binding.h"

namespace loom::loomrun {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;  // 0: the store picks a free port (single node only)
  int max_restarts = 0;     // whole-group restarts after a failure
  BindMode bind = BindMode::None;
  std::optional<double> timeout_s;  // kill the group after this long (all attempts together)
  double grace_period_s = 5.0;      // SIGTERM -> SIGKILL delay when stopping ranks
  std::string program;              // as given (execvp searches PATH)
  std::vector<std::string> args;    // argv[1..] of every rank

  int world_size() const { return nnodes * nproc_per_node; }
};

// Bad usage: main prints the message and exits 2.
struct UsageError {
  std::string message;
};

// Result of parsing: options to run, or an exit code (help printed: 0).
struct ParseResult {
  std::optional<LaunchOptions> options;
  int exit_code = 0;
};

// Parses and validates argv. Throws UsageError for bad usage (no program, N < 1,
// node rank >= nnodes, program not found, ...). `secret_in_env` is whether LOOM_STORE_SECRET
// is set in loomrun's environment (required for --nnodes > 1).
ParseResult parse_options(int argc, char** argv, bool secret_in_env);

// The path execvp would run for `program` (PATH search when it has no '/'), or nullopt.
std::optional<std::string> find_program(const std::string& program);

}  // namespace loom::loomrun
