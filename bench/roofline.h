#pragma once
// This core's measured limits, and the share of them each kernel benchmark reaches
// (Note [Roofline] in roofline.cpp).
//
// A benchmark reports its rate as the counter "GFLOP/s" (compute-bound kernels) or "GB/s"
// (memory-bound ones, which also call set_working_set so that their bytes are compared with
// the memory level they fit in). The reporter that loom_bench's main installs adds the
// counter "limit%" and names the limit in the label.

#include <benchmark/benchmark.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

namespace loom::bench {

struct MemoryLevel {
  std::string name;       // "L1", "L2", "L3" or "DRAM"
  size_t capacity = 0;    // bytes this level holds (SIZE_MAX for DRAM)
  double gbps = 0;        // in-place axpy within it: bytes read + written per second, 1e9
};

struct CoreLimits {
  double fma_gflops = 0;            // single-precision FMA throughput of one core
  std::string fma_isa;              // the instruction set that reached it
  std::vector<MemoryLevel> levels;  // innermost first
};

// Measured once, on first use (about half a second), on the calling thread.
const CoreLimits& core_limits();

// The innermost level that holds `bytes`.
const MemoryLevel& level_for(size_t bytes);

// The bytes a memory-bound kernel touches per iteration (inputs and outputs together).
void set_working_set(benchmark::State& state, double bytes);

// Google Benchmark's console and JSON reporters with "limit%" added to each run.
std::unique_ptr<benchmark::BenchmarkReporter> make_console_reporter();
std::unique_ptr<benchmark::BenchmarkReporter> make_json_reporter();

}  // namespace loom::bench
