#include "bench/roofline.h"

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <fstream>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace loom::bench {

// Note [Roofline]
// A kernel's rate means little without the machine's limit beside it. loom_bench measures
// this core's limits once: the single-precision FMA throughput (independent accumulators,
// so the loop is bound by the FMA units, not by their latency; the best instruction set the
// core has) and the bandwidth of an in-place axpy within each cache level and in DRAM (two
// streams of a quarter of the level each, so they fill half of it; bytes counted as
// STREAM counts them, two read and one written per element). A working set just past a
// level's capacity partly stays in that level, so it can reach more than 100% of the next. A compute-bound kernel reports
// "GFLOP/s" and is compared with the FMA rate; a memory-bound one reports "GB/s" with its
// working set and is compared with the bandwidth of the innermost level that holds it. These
// are one core's limits: a run with more threads can exceed 100%.

namespace {

using Clock = std::chrono::steady_clock;

// Independent FMA chains per loop: more than FMA latency x FMA units on current cores (4-5 x
// 2), and few enough that they and the two constants stay in registers: AVX2 has 16 ymm
// registers (with 16 accumulators an AMD EPYC reported 58 GFLOP/s where its GEMMs reach 75;
// with 12, 103), AVX-512 32 zmm.
constexpr int kAccumulators = 16;      // scalar and AVX-512
constexpr int kAvx2Accumulators = 12;  // AVX2

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Each returns a value derived from every accumulator, so that no FMA is dead code.
float fma_scalar(int64_t n) {
  float a[kAccumulators];
  for (int i = 0; i < kAccumulators; ++i)
    a[i] = static_cast<float>(i);
  for (int64_t k = 0; k < n; ++k)
    for (int i = 0; i < kAccumulators; ++i)
      a[i] = a[i] * 0.999f + 0.001f;
  float sum = 0;
  for (float v : a)
    sum += v;
  return sum;
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) float fma_avx2(int64_t n) {
  __m256 a[kAvx2Accumulators];
  const __m256 x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(0.001f);
  for (int i = 0; i < kAvx2Accumulators; ++i)
    a[i] = _mm256_set1_ps(static_cast<float>(i));
  for (int64_t k = 0; k < n; ++k) {
#pragma GCC unroll 16
    for (int i = 0; i < kAvx2Accumulators; ++i)
      a[i] = _mm256_fmadd_ps(a[i], x, y);
  }
  __m256 sum = a[0];
  for (int i = 1; i < kAvx2Accumulators; ++i)
    sum = _mm256_add_ps(sum, a[i]);
  float lanes[8];
  _mm256_storeu_ps(lanes, sum);
  return lanes[0] + lanes[7];
}

__attribute__((target("avx512f"))) float fma_avx512(int64_t n) {
  __m512 a[kAccumulators];
  const __m512 x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(0.001f);
  for (int i = 0; i < kAccumulators; ++i)
    a[i] = _mm512_set1_ps(static_cast<float>(i));
  for (int64_t k = 0; k < n; ++k) {
#pragma GCC unroll 16
    for (int i = 0; i < kAccumulators; ++i)
      a[i] = _mm512_fmadd_ps(a[i], x, y);
  }
  __m512 sum = a[0];
  for (int i = 1; i < kAccumulators; ++i)
    sum = _mm512_add_ps(sum, a[i]);
  float lanes[16];  // not _mm512_reduce_add_ps, which GCC 12 warns about inside its own header
  _mm512_storeu_ps(lanes, sum);
  return lanes[0] + lanes[15];
}
#endif

// Best of three timed runs of about 0.05 s each: GFLOP/s of `kernel` with `accumulators`
// chains of `lanes` floats.
double fma_rate(float (*kernel)(int64_t), int lanes, int accumulators) {
  const int64_t n = 4'000'000 / lanes * 8;
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    auto start = Clock::now();
    volatile float sink = kernel(n);
    (void)sink;
    best = std::max(best, 2.0 * accumulators * lanes * static_cast<double>(n) /
                              seconds_since(start) * 1e-9);
  }
  return best;
}

// to[i] += 0.5 * from[i]: the access pattern of the in-place kernels (optimizer steps,
// reduce_into), which read two streams and write back lines they read, so that no
// write-allocate read is hidden from the count as it would be in a copy.
#if defined(__x86_64__)
__attribute__((target("avx2,fma")))
#endif
void axpy(float* __restrict to, const float* __restrict from, size_t n) {
  for (size_t i = 0; i < n; ++i)
    to[i] += 0.5f * from[i];
}

// Best of three: bytes read and written per second (1e9) by axpy over `bytes` per stream.
double axpy_rate(size_t bytes) {
  const size_t n = bytes / sizeof(float);
  std::vector<float> to(n, 1.0f), from(n, 0.0f);  // adding 0 keeps the values finite
  const int repeats = static_cast<int>(std::max<size_t>(1, (size_t{256} << 20) / bytes));
  double best = 0;
  for (int round = 0; round < 3; ++round) {
    auto start = Clock::now();
    for (int i = 0; i < repeats; ++i) {
      axpy(to.data(), from.data(), n);
      benchmark::ClobberMemory();
    }
    best = std::max(best, 3.0 * static_cast<double>(n * sizeof(float)) * repeats /
                              seconds_since(start) * 1e-9);
  }
  return best;
}

// The data (or unified) cache of `level` seen by CPU 0, from sysfs as Google Benchmark reads
// it (glibc's sysconf reports 320 MiB of L3 on some virtual machines); `fallback` if absent.
size_t cache_size(int level, size_t fallback) {
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index);
    std::ifstream level_file(dir + "/level"), type_file(dir + "/type"), size_file(dir + "/size");
    int found_level = 0;
    std::string type, size;
    if (!(level_file >> found_level) || !(type_file >> type) || !(size_file >> size)) break;
    if (found_level != level || type == "Instruction") continue;
    size_t value = 0;
    auto [end, ec] = std::from_chars(size.data(), size.data() + size.size(), value);
    if (ec != std::errc() || value == 0) break;
    if (end != size.data() + size.size() && *end == 'K') value <<= 10;
    if (end != size.data() + size.size() && *end == 'M') value <<= 20;
    return value;
  }
  return fallback;
}

CoreLimits measure() {
  CoreLimits limits;
  limits.fma_gflops = fma_rate(fma_scalar, 1, kAccumulators);
  limits.fma_isa = "scalar";
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    if (double rate = fma_rate(fma_avx2, 8, kAvx2Accumulators); rate > limits.fma_gflops) {
      limits.fma_gflops = rate;
      limits.fma_isa = "avx2";
    }
  }
  if (__builtin_cpu_supports("avx512f")) {
    if (double rate = fma_rate(fma_avx512, 16, kAccumulators); rate > limits.fma_gflops) {
      limits.fma_gflops = rate;
      limits.fma_isa = "avx512";
    }
  }
#endif
  const size_t caches[] = {cache_size(1, size_t{32} << 10), cache_size(2, size_t{1} << 20),
                           cache_size(3, size_t{32} << 20)};
  const char* names[] = {"L1", "L2", "L3"};
  for (int i = 0; i < 3; ++i)
    limits.levels.push_back({names[i], caches[i], axpy_rate(caches[i] / 4)});
  limits.levels.push_back({"DRAM", SIZE_MAX, axpy_rate(std::max<size_t>(caches[2] * 8, 256 << 20))});
  return limits;
}

// The reporter's addition to every run: "limit%" and the limit's name in the label.
void add_limits(benchmark::BenchmarkReporter::Run& run) {
  const CoreLimits& limits = core_limits();
  auto label = [&run](const std::string& limit) {
    if (!run.report_label.empty()) run.report_label += ' ';
    run.report_label += "vs " + limit;
  };
  if (auto flops = run.counters.find("GFLOP/s"); flops != run.counters.end()) {
    run.counters["limit%"] = 100.0 * flops->second.value / limits.fma_gflops;
    label("FMA");
  } else if (auto bytes = run.counters.find("GB/s"); bytes != run.counters.end()) {
    auto set = run.counters.find("working_set");
    const MemoryLevel& level =
        level_for(set == run.counters.end() ? SIZE_MAX : static_cast<size_t>(set->second.value));
    run.counters["limit%"] = 100.0 * bytes->second.value / level.gbps;
    label(level.name);
  }
}

template <typename Base>
class WithLimits : public Base {
 public:
  bool ReportContext(const benchmark::BenchmarkReporter::Context& context) override {
    const CoreLimits& limits = core_limits();
    std::ostream& out = Base::GetErrorStream();
    // A --benchmark_out file reporter writes both streams to the file, which must stay JSON:
    // the limits go to the display's error stream only (each run's counters carry them).
    if (&out != &Base::GetOutputStream()) {
      out << "Core limits (Note [Roofline]): FMA " << limits.fma_gflops << " GFLOP/s ("
          << limits.fma_isa << ")";
      for (const MemoryLevel& level : limits.levels)
        out << ", " << level.name << " " << level.gbps << " GB/s";
      out << "\n";
    }
    return Base::ReportContext(context);
  }

  void ReportRuns(const std::vector<benchmark::BenchmarkReporter::Run>& runs) override {
    std::vector<benchmark::BenchmarkReporter::Run> with_limits = runs;
    for (auto& run : with_limits)
      add_limits(run);
    Base::ReportRuns(with_limits);
  }
};

}  // namespace

const CoreLimits& core_limits() {
  static const CoreLimits limits = measure();
  return limits;
}

const MemoryLevel& level_for(size_t bytes) {
  const auto& levels = core_limits().levels;
  for (const MemoryLevel& level : levels)
    if (bytes <= level.capacity) return level;
  return levels.back();
}

void set_working_set(benchmark::State& state, double bytes) {
  state.counters["working_set"] = benchmark::Counter(bytes, benchmark::Counter::kDefaults,
                                                     benchmark::Counter::kIs1024);
}

std::unique_ptr<benchmark::BenchmarkReporter> make_console_reporter() {
  return std::make_unique<WithLimits<benchmark::ConsoleReporter>>();
}

std::unique_ptr<benchmark::BenchmarkReporter> make_json_reporter() {
  return std::make_unique<WithLimits<benchmark::JSONReporter>>();
}

}  // namespace loom::bench
