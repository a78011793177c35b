// loom-perf: Loom's collective benchmark, in the style of nccl-tests.
//
//   loom-perf allreduce --np 2 -b 8 -e 256M          # launches 2 ranks itself
//   loomrun --nproc-per-node 4 loom-perf all_gather -b 1K -e 64M -d bf16
//   loom-perf strategy --strategy fsdp --layers 8 --embd 512 --np 2   # strategy_bench.h
//
// Same flags and table as nccl-tests' *_perf programs; one binary, the collective first.
// Exit codes: 0 success, 1 wrong results or a failure, 2 bad usage.

#include <cstdlib>
#include <iostream>

#include <CLI/CLI.hpp>

#include "comm/error.h"
#include "comm/process_group.h"
#include "core/error.h"
#include "core/tunables.h"
#include "tools/loom_perf/launch.h"
#include "tools/loom_perf/options.h"
#include "tools/loom_perf/report.h"
#include "tools/loom_perf/runner.h"
#include "tools/loom_perf/strategy_bench.h"

namespace {

using loom::perf::PerfOptions;

std::string names_list() {
  std::string list;
  for (const std::string& name : loom::perf::collective_names()) {
    list += (list.empty() ? "" : ", ") + name;
  }
  return list;
}

// Parses argv into `options`; returns an exit code when the program should stop (help or
// bad usage), else nullopt.
std::optional<int> parse(int argc, char** argv, PerfOptions& options) {
  CLI::App app{"loom-perf: Loom's collective benchmark (nccl-tests flags and table)"};
  app.footer("Usage: loom-perf COLLECTIVE [flags]   (COLLECTIVE: " + names_list() + ")");
  std::string collective, min_bytes = "8", max_bytes = "64M", step_bytes = "0";
  std::string dtype = "float", op = "sum";
  int check = 1, blocking = 0;
  app.add_option("collective", collective, "Collective to measure: " + names_list())->required();
  app.add_option("-b,--minbytes", min_bytes, "Smallest size in bytes (K/M/G suffixes)")
      ->capture_default_str();
  app.add_option("-e,--maxbytes", max_bytes, "Largest size in bytes (K/M/G suffixes)")
      ->capture_default_str();
  app.add_option("-f,--stepfactor", options.step_factor, "Multiply the size by this each step")
      ->capture_default_str();
  app.add_option("-i,--stepbytes", step_bytes, "Add this many bytes each step instead (0: off)")
      ->capture_default_str();
  app.add_option("-n,--iters", options.iters, "Timed iterations per size")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("-w,--warmup_iters", options.warmup_iters, "Untimed iterations per size")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("-c,--check", check, "Check results (0/1)")
      ->capture_default_str()
      ->check(CLI::Range(0, 1));
  app.add_option("-d,--datatype", dtype,
                 "float, double, bfloat16, half, int32, int64, uint8 (or f32, bf16, ...)")
      ->capture_default_str();
  app.add_option("-o,--op", op, "Reduction: sum, prod, min, max, avg")->capture_default_str();
  app.add_option("-z,--blocking", blocking,
                 "0: issue all iterations, then wait; 1: synchronous calls (async_op = false); "
                 "2: asynchronous calls, each waited for before the next")
      ->capture_default_str()
      ->check(CLI::Range(0, 2));
  app.add_option("--compute-us", options.compute_us,
                 "With -z 2: each rank computes this many microseconds between issuing a call "
                 "and waiting for it; the time reported is what the call adds (0: off)")
      ->capture_default_str();
  app.add_option("-r,--root", options.root, "Root of broadcast and reduce")->capture_default_str();
  app.add_option("--backend", options.backend, "Loom backend (auto, shm, ...)")
      ->capture_default_str();
  app.add_option("--timeout", options.timeout_s,
                 "Seconds any one operation may take (above 0, at most 31536000: a year)")
      ->capture_default_str();
  app.add_option("--csv", options.csv_path, "Also write the rows as CSV to this file");
  app.add_option("--json", options.json_path, "Also write the rows and metadata as JSON");
  app.add_option("--np", options.np,
                 "Launch this many ranks of this program on this host (serving the store "
                 "itself); without it, run under loomrun/torchrun/mpirun/Slurm")
      ->check(CLI::PositiveNumber);
  std::string bind = "none";
  app.add_option("--bind", bind,
                 "With --np: none, or core to pin rank r to the r-th allowed CPU (as Open MPI "
                 "does by default for up to 2 ranks)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "core"}));
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int printed = app.exit(e);  // CLI11's own codes (105, ...) mean bad usage here
    return printed == 0 ? 0 : 2;
  }
  try {
    auto kind = loom::perf::parse_collective(collective);
    if (!kind) loom::fail("unknown collective '", collective, "'; expected one of ", names_list());
    options.collective = *kind;
    options.min_bytes = loom::perf::parse_bytes(min_bytes);
    options.max_bytes = loom::perf::parse_bytes(max_bytes);
    options.step_bytes = loom::perf::parse_bytes(step_bytes);
    options.dtype = loom::perf::parse_type_name(dtype);
    options.op = loom::perf::parse_reduce_op(op);
    options.check = check == 1;
    options.blocking = blocking == 1;
    options.wait_each = blocking == 2;
    options.bind_cores = bind == "core";
    loom::perf::check_options(options);
  } catch (const loom::Error& e) {
    std::cerr << "loom-perf: " << e.what() << "\n";
    return 2;
  }
  const char* launched_as = loom::tunable_value(loom::tunables::kPerfCommand);
  options.command = launched_as != nullptr ? launched_as : loom::perf::join_command(argc, argv);
  return std::nullopt;
}

int run(const PerfOptions& options) {
  loom::comm::InitOptions init;
  init.backend = options.backend;
  init.timeout = loom::Duration(static_cast<int64_t>(options.timeout_s * 1000));
  auto pg = loom::comm::init(init);
  loom::perf::Runner runner(pg, options);
  loom::perf::RunInfo info{.options = options,
                           .nranks = pg->size(),
                           .backend = pg->backend_name(),
                           .device = "cpu (" + loom::perf::cpu_model() + ")",
                           .date = loom::perf::iso_date_now(),
                           .ranks = runner.gather_ranks()};
  const bool printer = pg->rank() == 0;
  if (printer) loom::perf::print_header(std::cout, info);
  auto rows = runner.run([&](const loom::perf::Row& row) {
    if (printer) loom::perf::print_row(std::cout, info, row);
  });
  if (printer) {
    loom::perf::print_footer(std::cout, rows);
    if (!options.csv_path.empty()) loom::perf::write_csv(options.csv_path, info, rows);
    if (!options.json_path.empty()) loom::perf::write_json(options.json_path, info, rows);
  }
  return loom::perf::total_wrong(rows) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "strategy") return loom::perf::strategy_main(argc, argv);
  PerfOptions options;
  if (auto exit_code = parse(argc, argv, options)) return *exit_code;
  try {
    if (options.np > 0) {
      return loom::perf::launch_ranks(options.np, options.bind_cores, argc, argv, options.command);
    }
    return run(options);
  } catch (const std::exception& e) {
    loom::perf::report_rank_error("loom-perf", e);
  }
  return 1;
}
