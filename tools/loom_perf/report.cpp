#include "tools/loom_perf/report.h"

#include <cstdio>
#include <ctime>
#include <fstream>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace loom::perf {

namespace {

std::string format(const char* pattern, auto... args) {
  char text[256];
  std::snprintf(text, sizeof text, pattern, args...);
  return text;
}

std::string redop_column(const RunInfo& info) {
  if (!collective_info(info.options.collective).reduces) return "none";
  return std::string(comm::reduce_op_name(info.options.op));
}

int root_column(const RunInfo& info) {
  return collective_info(info.options.collective).rooted ? info.options.root : -1;
}

// nccl-tests' time column: two decimals below 100 us, one below 10 ms, none above.
std::string time_text(double us) {
  if (us >= 10000.0) return format("%7.0f", us);
  if (us >= 100.0) return format("%7.1f", us);
  return format("%7.2f", us);
}

std::string cell(const std::optional<Measurement>& m) {
  if (!m) return format("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
  std::string wrong = m->wrong ? format("%5lld", static_cast<long long>(*m->wrong)) : "  N/A";
  return format("  %7s  %6.2f  %6.2f  %5s", time_text(m->time_us).c_str(), m->algbw, m->busbw,
                wrong.c_str());
}

nlohmann::json measurement_json(const std::optional<Measurement>& m) {
  if (!m) return nullptr;
  nlohmann::json out = {{"time_us", m->time_us},
                        {"algbw_gbps", m->algbw},
                        {"busbw_gbps", m->busbw},
                        {"wrong", m->wrong ? nlohmann::json(*m->wrong) : nlohmann::json(nullptr)}};
  if (m->completion_us) out["completion_us"] = *m->completion_us;
  if (m->compute_alone_us) out["compute_alone_us"] = *m->compute_alone_us;
  return out;
}

std::string csv_cells(const std::optional<Measurement>& m) {
  if (!m) return ",,,";
  return format("%.3f,%.6f,%.6f,", m->time_us, m->algbw, m->busbw) +
         (m->wrong ? std::to_string(*m->wrong) : "");
}

std::ofstream open_output(const std::string& path) {
  std::ofstream out(path);
  if (!out) fail("cannot write '", path, "': check that its directory exists and is writable");
  return out;
}

}  // namespace

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.starts_with("model name")) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown CPU";
}

std::string iso_date_now() {
  std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", &local);
  return text;
}

void print_header(std::ostream& out, const RunInfo& info) {
  const PerfOptions& o = info.options;
  out << format("# loom-perf %s: nranks %d backend %s minBytes %zu maxBytes %zu ",
                std::string(collective_info(o.collective).name).c_str(), info.nranks,
                info.backend.c_str(), o.min_bytes, o.max_bytes);
  if (o.step_bytes > 0) {
    out << format("step: %zu(bytes)", o.step_bytes);
  } else {
    out << format("step: %g(factor)", o.step_factor);
  }
  out << format(" warmup iters: %d iters: %d validation: %d blocking: %d\n", o.warmup_iters,
                o.iters, o.check ? 1 : 0, o.blocking ? 1 : (o.wait_each ? 2 : 0));
  if (o.compute_us > 0) {
    out << format("# Each call overlaps %g us of computation per rank; time: what it adds "
                  "(--json: also completion_us, from its issue to its completion as the "
                  "computing rank sees it, and compute_alone_us)\n",
                  o.compute_us);
  }
  out << "# Command: " << o.command << "\n";
  out << "# Date: " << info.date << "\n#\n# Using devices\n";
  for (const RankInfo& r : info.ranks) {
    out << format("#  Rank %2d Pid %7lld on %10s device %s cpus %s\n", r.rank,
                  static_cast<long long>(r.pid), r.host.c_str(), info.device.c_str(),
                  r.cpus.c_str());
  }
  out << "#\n";
  out << format(
      "# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
      "in-place          \n",
      "", "", "", "", "");
  out << format("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size",
                "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
                "algbw", "busbw", "#wrong");
  out << format("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)",
                "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
                "(GB/s)", "");
  out.flush();
}

void print_row(std::ostream& out, const RunInfo& info, const Row& row) {
  out << format("%12zu  %12zu  %8s  %6s  %6d", row.bytes, row.count,
                std::string(nccl_type_name(info.options.dtype)).c_str(), redop_column(info).c_str(),
                root_column(info))
      << cell(row.out_of_place) << cell(row.in_place) << "\n";
  out.flush();
}

double average_busbw(const std::vector<Row>& rows) {
  double sum = 0;
  int cells = 0;
  for (const Row& row : rows) {
    for (const auto& m : {row.out_of_place, row.in_place}) {
      if (m) {
        sum += m->busbw;
        ++cells;
      }
    }
  }
  return cells > 0 ? sum / cells : 0.0;
}

int64_t total_wrong(const std::vector<Row>& rows) {
  int64_t wrong = 0;
  for (const Row& row : rows) {
    for (const auto& m : {row.out_of_place, row.in_place}) {
      if (m && m->wrong) wrong += *m->wrong;
    }
  }
  return wrong;
}

void print_footer(std::ostream& out, const std::vector<Row>& rows) {
  const int64_t wrong = total_wrong(rows);
  out << format("# Out of bounds values : %lld %s\n", static_cast<long long>(wrong),
                wrong == 0 ? "OK" : "FAILED");
  out << format("# Avg bus bandwidth    : %g \n#\n", average_busbw(rows));
  out.flush();
}

void write_csv(const std::string& path, const RunInfo& info, const std::vector<Row>& rows) {
  std::ofstream out = open_output(path);
  out << "size_bytes,count,type,redop,root,"
         "oop_time_us,oop_algbw_gbps,oop_busbw_gbps,oop_wrong,"
         "ip_time_us,ip_algbw_gbps,ip_busbw_gbps,ip_wrong\n";
  for (const Row& row : rows) {
    out << row.bytes << ',' << row.count << ',' << nccl_type_name(info.options.dtype) << ','
        << redop_column(info) << ',' << root_column(info) << ',' << csv_cells(row.out_of_place)
        << ',' << csv_cells(row.in_place) << '\n';
  }
}

void write_json(const std::string& path, const RunInfo& info, const std::vector<Row>& rows) {
  const PerfOptions& o = info.options;
  nlohmann::json results = nlohmann::json::array();
  for (const Row& row : rows) {
    results.push_back({{"size", row.bytes},
                       {"count", row.count},
                       {"type", nccl_type_name(o.dtype)},
                       {"redop", redop_column(info)},
                       {"root", root_column(info)},
                       {"out_of_place", measurement_json(row.out_of_place)},
                       {"in_place", measurement_json(row.in_place)}});
  }
  nlohmann::json rank_cpus = nlohmann::json::array();
  for (const RankInfo& r : info.ranks)
    rank_cpus.push_back(r.cpus);
  nlohmann::json metadata = {{"implementation", "loom"},
                             {"collective", collective_info(o.collective).name},
                             {"nranks", info.nranks},
                             {"backend", info.backend},
                             {"dtype", nccl_type_name(o.dtype)},
                             {"op", redop_column(info)},
                             {"root", root_column(info)},
                             {"iters", o.iters},
                             {"warmup_iters", o.warmup_iters},
                             {"blocking", o.blocking ? 1 : (o.wait_each ? 2 : 0)},
                             {"compute_us", o.compute_us},
                             {"check", o.check},
                             {"date", info.date},
                             {"command", o.command},
                             {"host", info.ranks.empty() ? "" : info.ranks.front().host},
                             {"device", info.device},
                             {"rank_cpus", rank_cpus},
                             {"avg_busbw_gbps", average_busbw(rows)},
                             {"wrong", total_wrong(rows)}};
  std::ofstream out = open_output(path);
  out << nlohmann::json{{"metadata", metadata}, {"results", results}}.dump(2) << "\n";
}

}  // namespace loom::perf
