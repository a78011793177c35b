#pragma once
// loom-perf's output: the nccl-tests table on stdout (rank 0), and the same rows as CSV
// and JSON files. The JSON is {"metadata": {...}, "results": [{...}, ...]}; the peer
// benchmarks in bench/peers/ write the same shape, and scripts/plot_busbw.py reads it.

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "tools/loom_perf/options.h"
#include "tools/loom_perf/runner.h"

namespace loom::perf {

struct RunInfo {
  PerfOptions options;
  int nranks = 1;
  std::string backend;  // the group's backend ("shm"), not "auto"
  std::string device;   // "cpu (AMD EPYC 7B13)"
  std::string date;     // ISO 8601, local time
  std::vector<RankInfo> ranks;
};

// "AMD EPYC 7B13" from /proc/cpuinfo, or "unknown CPU".
std::string cpu_model();
// Local time as "2026-11-21T09:30:00".
std::string iso_date_now();

void print_header(std::ostream& out, const RunInfo& info);
void print_row(std::ostream& out, const RunInfo& info, const Row& row);
void print_footer(std::ostream& out, const std::vector<Row>& rows);

// Mean busbw over every measured cell (both placements), as nccl-tests' footer.
double average_busbw(const std::vector<Row>& rows);
int64_t total_wrong(const std::vector<Row>& rows);

// Throw loom::Error when the file cannot be written.
void write_csv(const std::string& path, const RunInfo& info, const std::vector<Row>& rows);
void write_json(const std::string& path, const RunInfo& info, const std::vector<Row>& rows);

}  // namespace loom::perf
