// loom-sim-calibrate: measures this machine's device model for the simulator
// (docs/simulation.md, "Calibration"): Loom's own CPU kernels, timed as the real ops of
// tensor/ops.h, each op's work (FLOPs, bytes) taken from the same op run on the meta device,
// so the achieved rates mean exactly what the device model divides by. The shapes are a
// transformer's (linear layers of 1,024 tokens, causal attention of 64-dimensional heads);
// forward ops only. Prints the "device"
// object of a cluster description (sim/clusters/this-machine.json) on stdout.
//
//   loom-sim-calibrate [--threads N]     (default 1: the thread count of a rank when each
//                                         rank of a job has one core)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "kernels/cpu/thread_pool.h"
#include "tensor/meta.h"
#include "tensor/ops.h"

namespace {

using loom::Device;
using loom::DType;
using loom::Shape;
using loom::Tensor;

// The median of 5 timings of `op`, each repeated to at least 20 ms; seconds per call.
double seconds_per_call(const std::function<void()>& op) {
  using Clock = std::chrono::steady_clock;
  op();  // warm up: first-touch pages, kernel selection
  int repeats = 1;
  for (;;) {
    const auto start = Clock::now();
    for (int i = 0; i < repeats; ++i) op();
    if (Clock::now() - start > std::chrono::milliseconds(20)) break;
    repeats *= 2;
  }
  std::vector<double> runs;
  for (int run = 0; run < 5; ++run) {
    const auto start = Clock::now();
    for (int i = 0; i < repeats; ++i) op();
    runs.push_back(std::chrono::duration<double>(Clock::now() - start).count() / repeats);
  }
  std::sort(runs.begin(), runs.end());
  return runs[2];
}

// Rows of the GEMMs and attention calibrated: a micro-batch of 8 sequences of 128 tokens.
constexpr int64_t kTokens = 1024;

struct Point {
  double size, rate;
};

// `make(device)` makes an op's inputs on `device` and returns the op. It is sized on meta
// (its FLOPs, or its bytes read and written) and timed on the CPU: a rate of FLOP/s by FLOPs
// (`by_flops`), else of bytes/s by bytes.
using Op = std::function<void()>;
Point measure(const std::function<Op(Device)>& make, bool by_flops) {
  const Op on_meta = make(Device::meta());
  loom::MetaCostTotals totals;
  {
    loom::MetaCostScope scope(totals);
    on_meta();
  }
  const loom::MetaCostTotals::Sum work = totals.total();
  const double seconds = seconds_per_call(make(Device::cpu()));
  const double amount = by_flops ? work.flops : work.bytes_read + work.bytes_written;
  std::fprintf(stderr, "  %s %.3g: %.3g s, %.3g per s\n", by_flops ? "FLOP" : "bytes", amount,
               seconds, amount / seconds);
  return {amount, amount / seconds};
}

nlohmann::json curve(std::vector<Point> points, double unit) {
  std::sort(points.begin(), points.end(), [](const Point& a, const Point& b) { return a.size < b.size; });
  nlohmann::json out = nlohmann::json::array();
  for (const Point& p : points) out.push_back({p.size, p.rate / unit});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Measures this machine's device model for loom-sim (docs/simulation.md)");
  int threads = 1;
  app.add_option("--threads", threads, "intra-op threads (a rank's, when each has one core)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  loom::kernels::cpu::set_num_threads(threads);

  // f32 only: on the CPU, autocast rounds the operands of matmul, linear and attention
  // through bf16 or f16 and computes in f32 (tensor/autocast.h), so the 16-bit curves are the
  // f32 ones.
  nlohmann::json gemm = nlohmann::json::object(), attention = nlohmann::json::object();
  for (const DType dtype : {DType::F32}) {
    std::fprintf(stderr, "GEMM %s\n", loom::dtype_name(dtype));
    std::vector<Point> points;
    // A transformer's products: `tokens` rows through a linear layer of width d to 4d (bias
    // included), for the widths of small to medium models.
    for (const int64_t d : {64, 128, 256, 512, 1024}) {
      points.push_back(measure(
          [&](Device device) -> Op {
            const Tensor x = Tensor::full({kTokens, d}, 0.5, dtype, device);
            const Tensor w = Tensor::full({d, 4 * d}, 0.25, dtype, device);
            const Tensor b = Tensor::full({4 * d}, 0.25, dtype, device);
            return [x, w, b] { (void)loom::linear(x, w, b); };
          },
          true));
    }
    gemm[loom::dtype_name(dtype)] = curve(points, 1e12);
    std::fprintf(stderr, "attention %s\n", loom::dtype_name(dtype));
    points.clear();
    // Causal attention over `kTokens` tokens per head group: batches of sequences of 64 to
    // 1024 tokens, 4 heads of 64.
    for (const int64_t t : {64, 128, 256, 512, 1024}) {
      points.push_back(measure(
          [&](Device device) -> Op {
            const Tensor q = Tensor::full({kTokens / t, 4, t, 64}, 0.01, dtype, device);
            return [q] { (void)loom::causal_attention(q, q, q); };
          },
          true));
    }
    attention[loom::dtype_name(dtype)] = curve(points, 1e12);
  }
  for (const char* low : {"bf16", "f16"}) {
    gemm[low] = gemm["f32"];
    attention[low] = attention["f32"];
  }
  std::fprintf(stderr, "memory (f32 add)\n");
  std::vector<Point> memory;
  for (const int64_t n : {1 << 10, 1 << 13, 1 << 16, 1 << 19, 1 << 22}) {
    memory.push_back(measure(
        [&](Device device) -> Op {
          const Tensor a = Tensor::full({n}, 1.0, DType::F32, device);
          return [a] { (void)loom::add(a, a); };
        },
        false));
  }
  // The per-op overhead: an add of one element, all dispatch and allocation.
  const Tensor one = Tensor::full({1}, 1.0, DType::F32, Device::cpu());
  const double overhead = seconds_per_call([&] { (void)loom::add(one, one); });
  const nlohmann::json device = {{"op_overhead_us", overhead * 1e6},
                                 {"gemm_tflops", gemm},
                                 {"attention_tflops", attention},
                                 {"memory_gbps", curve(memory, 1e9)}};
  std::printf("%s\n", device.dump(2).c_str());
  return 0;
}
