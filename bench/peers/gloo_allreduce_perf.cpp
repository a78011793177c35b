// Gloo peer of `loom-perf allreduce`: gloo::allreduce over the TCP transport (loopback),
// timed the same way (per size: warm up, barrier, time `iters` calls, slowest rank's
// average; then one checked call), with the same columns (in place: no input buffer set),
// busbw factor 2(n-1)/n and JSON shape (see tools/loom_perf/report.h).
//
//   ./gloo_allreduce_perf --np 2 -b 8 -e 256M          # forks 2 ranks
//   ./gloo_allreduce_perf --rank R --size N --store-dir DIR ...   # one rank of N
//   mpirun ... ./gloo_allreduce_perf --store-dir DIR --iface eth0 ... # rank and size from
//                                       Open MPI; listening on eth0 (hosts: docs/multihost.md)
//
// Ranks rendezvous through gloo::rendezvous::FileStore in a temporary directory. With
// --bind core, forked rank r is pinned to the r-th allowed CPU (Open MPI's default for up
// to 2 ranks, and loom-perf --bind core).
// Flags (a subset of nccl-tests'): -b -e (K/M/G suffixes) -f -n -w -c, -d float,
// --json FILE.

#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

namespace {

struct Options {
  size_t min_bytes = 8, max_bytes = size_t{64} << 20;
  double step_factor = 2.0;
  int iters = 20, warmup_iters = 5;
  bool check = true;
  std::string json_path;
  int np = 0, rank = -1, size = 0;
  bool bind_cores = false;
  std::string store_dir;
  std::string iface;  // listen on this interface (else 127.0.0.1)
  std::string command;
};

struct Cell {
  double time_us = 0, algbw = 0, busbw = 0;
  long long wrong = -1;  // -1: not checked
};

struct Row {
  size_t bytes = 0, count = 0;
  Cell oop, ip;
};

bool parse_bytes(const std::string& text, size_t& out) {
  char* end = nullptr;
  unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str()) return false;
  int shift = 0;
  if (*end == 'K' || *end == 'k')
    shift = 10, ++end;
  else if (*end == 'M' || *end == 'm')
    shift = 20, ++end;
  else if (*end == 'G' || *end == 'g')
    shift = 30, ++end;
  if (*end == 'i') ++end;
  if (*end == 'B') ++end;
  if (*end != '\0') return false;
  out = static_cast<size_t>(value) << shift;
  return true;
}

[[noreturn]] void usage_exit(const std::string& message) {
  std::fprintf(
      stderr,
      "gloo_allreduce_perf: %s\nusage: gloo_allreduce_perf (--np N | --rank R --size N "
      "--store-dir DIR) [--bind none|core] [-b 8] [-e 64M] [-f 2] [-n 20] [-w 5] [-c 1] [-d float] "
      "[--json FILE]\n",
      message.c_str());
  std::exit(2);
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (i + 1 >= argc) usage_exit("every flag takes a value");
    std::string value = argv[++i];
    if (flag == "-b" || flag == "--minbytes") {
      if (!parse_bytes(value, o.min_bytes)) usage_exit("bad -b size");
    } else if (flag == "-e" || flag == "--maxbytes") {
      if (!parse_bytes(value, o.max_bytes)) usage_exit("bad -e size");
    } else if (flag == "-f" || flag == "--stepfactor") {
      o.step_factor = std::atof(value.c_str());
      if (o.step_factor <= 1.0) usage_exit("-f must be above 1");
    } else if (flag == "-n" || flag == "--iters") {
      o.iters = std::max(1, std::atoi(value.c_str()));
    } else if (flag == "-w" || flag == "--warmup_iters") {
      o.warmup_iters = std::atoi(value.c_str());
    } else if (flag == "-c" || flag == "--check") {
      o.check = std::atoi(value.c_str()) != 0;
    } else if (flag == "-d" || flag == "--datatype") {
      if (value != "float" && value != "f32") usage_exit("-d takes float only");
    } else if (flag == "--json") {
      o.json_path = value;
    } else if (flag == "--np") {
      o.np = std::atoi(value.c_str());
    } else if (flag == "--rank") {
      o.rank = std::atoi(value.c_str());
    } else if (flag == "--size") {
      o.size = std::atoi(value.c_str());
    } else if (flag == "--bind") {
      if (value != "none" && value != "core") usage_exit("--bind takes none or core");
      o.bind_cores = value == "core";
    } else if (flag == "--store-dir") {
      o.store_dir = value;
    } else if (flag == "--iface") {
      o.iface = value;
    } else {
      usage_exit("unknown flag " + flag);
    }
  }
  // Started by mpirun: the rank and size are Open MPI's when not given.
  if (o.np < 1 && o.rank < 0 && std::getenv("OMPI_COMM_WORLD_RANK") != nullptr) {
    o.rank = std::atoi(std::getenv("OMPI_COMM_WORLD_RANK"));
    o.size = std::atoi(std::getenv("OMPI_COMM_WORLD_SIZE"));
  }
  if (o.np < 1 && (o.rank < 0 || o.size < 1 || o.rank >= o.size || o.store_dir.empty())) {
    usage_exit("give --np N, or --rank R --size N --store-dir DIR");
  }
  for (int i = 0; i < argc; ++i)
    o.command += (i ? " " : "") + std::string(argv[i]);
  return o;
}

// Element j of rank r holds ((3 j + 5 r + seed) mod 7) + 1, as loom-perf.
void fill(float* data, size_t count, int rank, unsigned seed) {
  size_t k = (5 * static_cast<size_t>(rank) + seed) % 7;
  for (size_t i = 0; i < count; ++i) {
    data[i] = static_cast<float>(k + 1);
    k = (k + 3) % 7;
  }
}

long long count_wrong(const float* data, size_t count, int nranks, unsigned seed) {
  double expected[7];
  for (int k = 0; k < 7; ++k) {
    expected[k] = 0;
    for (int r = 0; r < nranks; ++r)
      expected[k] += (k + 5 * r) % 7 + 1;
  }
  long long wrong = 0;
  size_t k = seed % 7;
  for (size_t i = 0; i < count; ++i) {
    if (data[i] != expected[k]) ++wrong;
    k = (k + 3) % 7;
  }
  return wrong;
}

class Bench {
 public:
  Bench(std::shared_ptr<gloo::Context> context) : context_(std::move(context)) {}

  void allreduce(float* in, float* out, size_t count) {
    gloo::AllreduceOptions opts(context_);
    if (in != out) opts.setInput(in, count);
    opts.setOutput(out, count);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(1);
    gloo::allreduce(opts);
  }

  template <typename T>
  T reduce_scalar(T value, bool max) {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(&value, 1);
    opts.setReduceFunction(
        max ? static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::max<T>)
            : static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<T>));
    opts.setTag(2);
    gloo::allreduce(opts);
    return value;
  }

  void barrier() {
    gloo::BarrierOptions opts(context_);
    opts.setTag(3);
    gloo::barrier(opts);
  }

  Cell measure(const Options& o, float* send, float* recv, size_t count, bool in_place,
               unsigned seed) {
    const int rank = context_->rank, n = context_->size;
    float* target = in_place ? send : recv;
    Cell cell;
    fill(send, count, rank, seed);
    for (int i = 0; i < o.warmup_iters; ++i)
      allreduce(send, target, count);
    barrier();
    auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < o.iters; ++i)
      allreduce(send, target, count);
    double local_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
            .count() /
        o.iters;
    cell.time_us = reduce_scalar(local_us, true);
    const double bytes = static_cast<double>(count * sizeof(float));
    cell.algbw = cell.time_us > 0 ? bytes / cell.time_us / 1e3 : 0.0;
    cell.busbw = cell.algbw * 2.0 * (n - 1) / n;
    if (o.check) {
      fill(send, count, rank, seed + 1000);
      if (!in_place) std::memset(recv, 0xAB, count * sizeof(float));
      allreduce(send, target, count);
      cell.wrong = reduce_scalar(count_wrong(target, count, n, seed + 1000), false);
    }
    return cell;
  }

 private:
  std::shared_ptr<gloo::Context> context_;
};

std::string time_text(double us) {
  char text[32];
  if (us >= 10000.0)
    std::snprintf(text, sizeof text, "%7.0f", us);
  else if (us >= 100.0)
    std::snprintf(text, sizeof text, "%7.1f", us);
  else
    std::snprintf(text, sizeof text, "%7.2f", us);
  return text;
}

void print_cell(const Cell& c) {
  char wrong[32];
  if (c.wrong >= 0)
    std::snprintf(wrong, sizeof wrong, "%5lld", c.wrong);
  else
    std::snprintf(wrong, sizeof wrong, "  N/A");
  std::printf("  %7s  %6.2f  %6.2f  %5s", time_text(c.time_us).c_str(), c.algbw, c.busbw, wrong);
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) >= 0x20) out += c;
  }
  return out;
}

std::string json_cell(const Cell& c) {
  char text[256];
  std::snprintf(text, sizeof text,
                "{\"time_us\": %.6f, \"algbw_gbps\": %.6f, \"busbw_gbps\": %.6f, \"wrong\": ",
                c.time_us, c.algbw, c.busbw);
  return text + (c.wrong >= 0 ? std::to_string(c.wrong) : std::string("null")) + "}";
}

void write_json(const Options& o, const std::vector<Row>& rows, int nranks, const std::string& date,
                const std::string& host, double avg, long long wrong) {
  std::ofstream f(o.json_path);
  if (!f) {
    std::fprintf(stderr, "gloo_allreduce_perf: cannot write %s\n", o.json_path.c_str());
    return;
  }
  f << "{\n  \"metadata\": {\"implementation\": \"gloo\", \"collective\": \"allreduce\", "
    << "\"nranks\": " << nranks << ", \"backend\": \"gloo tcp\", \"dtype\": \"float\", "
    << "\"op\": \"sum\", \"root\": -1, \"iters\": " << o.iters
    << ", \"warmup_iters\": " << o.warmup_iters
    << ", \"blocking\": true, \"check\": " << (o.check ? "true" : "false") << ", \"date\": \""
    << date << "\", \"command\": \"" << json_escape(o.command) << "\", \"host\": \""
    << json_escape(host) << "\", \"avg_busbw_gbps\": " << avg << ", \"wrong\": " << wrong
    << "},\n  \"results\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    f << "    {\"size\": " << rows[i].bytes << ", \"count\": " << rows[i].count
      << ", \"type\": \"float\", \"redop\": \"sum\", \"root\": -1, \"out_of_place\": "
      << json_cell(rows[i].oop) << ", \"in_place\": " << json_cell(rows[i].ip) << "}"
      << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
}

int run_rank(const Options& o) {
  gloo::transport::tcp::attr attr;
  if (o.iface.empty()) {
    attr.hostname = "127.0.0.1";
  } else {
    attr.iface = o.iface;
  }
  auto device = gloo::transport::tcp::CreateDevice(attr);
  auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
  gloo::rendezvous::FileStore store(o.store_dir);
  context->connectFullMesh(store, device);
  Bench bench(context);

  char date[32], host[256] = "";
  std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%S", std::localtime(&now));
  gethostname(host, sizeof host - 1);

  const size_t max_count = std::max(o.max_bytes, o.min_bytes) / sizeof(float);
  std::vector<float> send(max_count + 1), recv(max_count + 1);
  const bool printer = o.rank == 0;
  if (printer) {
    std::printf(
        "# gloo_allreduce_perf: nranks %d transport tcp minBytes %zu maxBytes %zu step: "
        "%g(factor) warmup iters: %d iters: %d validation: %d\n",
        o.size, o.min_bytes, o.max_bytes, o.step_factor, o.warmup_iters, o.iters, o.check);
    std::printf("# Command: %s\n# Date: %s\n#\n", o.command.c_str(), date);
    std::printf(
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       "
        "in-place          \n",
        "", "", "", "", "");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s\n", "size",
                "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
                "algbw", "busbw", "#wrong");
    std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s\n", "(B)",
                "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
                "(GB/s)", "");
    std::fflush(stdout);
  }
  std::vector<Row> rows;
  double busbw_sum = 0;
  long long wrong = 0;
  unsigned seed = 0;
  for (size_t size = o.min_bytes;;) {
    Row row;
    row.count = size / sizeof(float);
    row.bytes = row.count * sizeof(float);
    row.oop = bench.measure(o, send.data(), recv.data(), row.count, false, seed);
    row.ip = bench.measure(o, send.data(), recv.data(), row.count, true, seed + 1);
    seed += 2;
    busbw_sum += row.oop.busbw + row.ip.busbw;
    wrong += std::max(0LL, row.oop.wrong) + std::max(0LL, row.ip.wrong);
    if (printer) {
      std::printf("%12zu  %12zu  %8s  %6s  %6d", row.bytes, row.count, "float", "sum", -1);
      print_cell(row.oop);
      print_cell(row.ip);
      std::printf("\n");
      std::fflush(stdout);
    }
    rows.push_back(row);
    size_t next = static_cast<size_t>(static_cast<double>(size) * o.step_factor);
    if (next <= size || next > o.max_bytes) break;
    size = next;
  }
  const double avg = busbw_sum / (2.0 * static_cast<double>(rows.size()));
  if (printer) {
    std::printf("# Out of bounds values : %lld %s\n", wrong, wrong ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g \n#\n", avg);
    if (!o.json_path.empty()) write_json(o, rows, o.size, date, host, avg, wrong);
  }
  bench.barrier();  // nobody closes its connections while a peer still reads
  return wrong == 0 ? 0 : 1;
}

// Forks `np` ranks sharing a fresh FileStore directory; returns the first failure's code.
int launch(Options o) {
  char dir_template[] = "/tmp/gloo_perf.XXXXXX";
  const char* dir = ::mkdtemp(dir_template);
  if (dir == nullptr) usage_exit("cannot create a temporary directory");
  o.store_dir = dir;
  o.size = o.np;
  std::vector<int> cpus;
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (o.bind_cores && ::sched_getaffinity(0, sizeof allowed, &allowed) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
    }
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < o.np; ++r) {
    pid_t pid = ::fork();
    if (pid < 0) usage_exit("fork failed");
    if (pid == 0) {
      o.rank = r;
      if (!cpus.empty()) {
        cpu_set_t core;
        CPU_ZERO(&core);
        CPU_SET(cpus[static_cast<size_t>(r) % cpus.size()], &core);
        ::sched_setaffinity(0, sizeof core, &core);
      }
      int code = 1;
      try {
        code = run_rank(o);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "gloo_allreduce_perf: rank %d: %s\n", r, e.what());
      }
      std::fflush(stdout);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  int result = 0;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (code != 0 && result == 0) result = code;
  }
  std::filesystem::remove_all(dir);
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse_options(argc, argv);
  if (o.np > 0) return launch(o);
  try {
    return run_rank(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_allreduce_perf: rank %d: %s\n", o.rank, e.what());
    return 1;
  }
}
