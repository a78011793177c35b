#pragma once
// The timing loop of loom-perf, after nccl-tests: per size and placement, warm up, time
// `iters` operations (issued back to back and waited for at the end, or with -z 1 as
// synchronous calls, async_op = false), take the slowest rank's average, then run one more
// operation on fresh inputs and count the wrong output elements (-c 1).
// With --compute-us each rank computes between issuing a call and waiting for it (-z 2), and
// a call's time is the iteration's less the same computation timed alone, every rank
// computing at once (Note [A call's cost to a computing rank] in runner.cpp).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "tools/loom_perf/options.h"

namespace loom::perf {

struct Measurement {
  double time_us = 0;            // average per operation, slowest rank
  // With --compute-us: the average time from a call's issue to its completion as the computing
  // rank sees it (polled between slices of the computation), slowest rank; else nullopt.
  std::optional<double> completion_us;
  // With --compute-us: the computation's own time per call, alone (slowest rank).
  std::optional<double> compute_alone_us;
  double algbw = 0;              // GB/s (1e9 bytes)
  double busbw = 0;              // GB/s
  std::optional<int64_t> wrong;  // over all ranks; nullopt when not checked
};

struct Row {
  size_t bytes = 0;  // nccl-tests' size column (the total for split collectives)
  size_t count = 0;  // elements of that size
  std::optional<Measurement> out_of_place, in_place;  // nullopt: Loom has no such form
};

struct RankInfo {
  int rank = 0;
  int64_t pid = 0;
  std::string host;
  std::string cpus;  // CPUs the rank may run on, "0-1"
};

class Runner {
 public:
  // Collective over `pg`: every rank must construct it with the same options.
  Runner(std::shared_ptr<comm::ProcessGroup> pg, const PerfOptions& options);

  // Each rank's pid and host name, in rank order (collective).
  std::vector<RankInfo> gather_ranks();
  // Measures every size of the options, calling `on_row` on each finished row (collective;
  // every rank gets the same rows).
  std::vector<Row> run(const std::function<void(const Row&)>& on_row);

 private:
  Row measure_size(size_t requested_bytes, uint32_t seed);
  Measurement measure(size_t bytes, size_t count, size_t per_rank, bool in_place, uint32_t seed);
  // Rounds of busy_work that take options_.compute_us on this machine, the same on every rank
  // (the slowest rank's count; collective).
  int64_t compute_rounds();
  double max_over_ranks(double value);
  int64_t sum_over_ranks(int64_t value);

  std::shared_ptr<comm::ProcessGroup> pg_;
  PerfOptions options_;
  int rank_, nranks_;
  int64_t compute_rounds_ = 0;  // busy_work rounds per iteration (--compute-us)
};

}  // namespace loom::perf
