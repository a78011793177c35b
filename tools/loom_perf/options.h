#pragma once
// loom-perf's settings (nccl-tests' flags, same letters and meanings) and the helpers that
// interpret them: byte sizes with K/M/G suffixes, the list of sizes, nccl-tests type names.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "comm/reduce_op.h"
#include "core/dtype.h"
#include "tools/loom_perf/collective.h"

namespace loom::perf {

struct PerfOptions {
  Collective collective = Collective::AllReduce;
  size_t min_bytes = 8;                     // -b
  size_t max_bytes = size_t{64} << 20;      // -e
  double step_factor = 2.0;                 // -f
  size_t step_bytes = 0;                    // -i: when non-zero, sizes grow by this much instead
  int iters = 20;                           // -n
  int warmup_iters = 5;                     // -w
  bool check = true;                        // -c
  DType dtype = DType::F32;                 // -d
  comm::ReduceOp op = comm::ReduceOp::Sum;  // -o
  bool blocking = false;  // -z 1: synchronous calls (async_op = false), each done before the next
  bool wait_each = false;  // -z 2: asynchronous calls, each waited for before the next
  // --compute-us (with -z 2): each rank computes this long (arithmetic on its own thread)
  // between issuing a call and waiting for it, and the reported time is what a call adds to
  // that computation: the core time it takes from a rank that computes meanwhile, where the
  // ranks fill the cores (loom-sim's node.comm_core_us, docs/simulation.md).
  double compute_us = 0;
  int root = 0;           // -r
  std::string backend = "auto";
  double timeout_s = 300;
  std::string csv_path, json_path;
  int np = 0;               // --np: launch this many ranks of this program (0: already launched)
  bool bind_cores = false;  // --bind core: pin --np's rank r to the r-th allowed CPU
  std::string command;      // the command line as the user typed it, for reports
};

// "8", "64K", "1M", "2G" (powers of 1024; an optional trailing "B" or "iB" is accepted).
// Throws loom::Error on anything else.
size_t parse_bytes(std::string_view text);
// nccl-tests' type names (float, double, bfloat16, half, int32, int64, uint8, and their
// usual spellings) and Loom's (f32, bf16, ...). Throws loom::Error listing both.
DType parse_type_name(std::string_view name);
std::string_view nccl_type_name(DType dtype);  // "float", "bfloat16", ...
comm::ReduceOp parse_reduce_op(std::string_view name);

// The longest --timeout: a year, in seconds (a value past it is a typo, and seconds * 1000
// must fit the int64 milliseconds of a loom::Duration).
inline constexpr int64_t kMaxTimeoutSeconds = int64_t{365} * 24 * 3600;

// Checks the parsed options against each other and their ranges, before any work starts:
// -e not below -b, a finite -f above 1 (unless -i is set), -o avg on a floating type, and a
// --timeout above 0 and at most kMaxTimeoutSeconds, --compute-us finite, not negative and
// only with -z 2. Throws loom::Error naming the flag,
// the value and what is accepted.
void check_options(const PerfOptions& options);

// The requested sizes in bytes, from min to max inclusive: multiplied by the step factor,
// or increased by step_bytes when that is set. Never empty (min alone when min > max).
std::vector<size_t> size_list(const PerfOptions& options);

// Space-joined argv, quoting arguments that need it.
std::string join_command(int argc, char** argv);

}  // namespace loom::perf
