// loom-sim-calibrate: measures this machine's device model for the simulator
// (docs/simulation.md, "Calibration"). Loom's own CPU ops are timed for real, forward and
// backward, and each op's work (FLOPs, bytes) is taken from the same ops run on the meta
// device, so the achieved rates mean exactly what the device model divides by:
// - GEMMs: linear layers of a transformer (1,024 tokens, width d to 4d, bias included),
//   forward and backward together, by the FLOPs of one GEMM;
// - attention: causal attention of 4 heads of 64 over 1,024 tokens in sequences of 64 to
//   1,024, its inputs views of one projection as nn/gpt.cpp makes them, forward and backward
//   together;
// - each bandwidth-bound op a transformer step runs (GELU, layer norm, cross-entropy, the
//   embedding, adds, AdamW, the gradient norm), forward and backward apart, by name: the
//   device's "ops" curves (bytes/s by bytes);
// - the rest: an f32 add by size (the "memory_gbps" curve), and the per-op overhead.
// Prints the "device" object of a cluster description (sim/clusters/this-machine.json; made by
// scripts/calibrate-this-machine.sh) on stdout, what it measured on stderr.
//
//   loom-sim-calibrate [--threads N]   (default 1: a rank's threads when each has one core)

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "kernels/cpu/thread_pool.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "tensor/meta.h"
#include "tensor/ops.h"

namespace {

using loom::Device;
using loom::DType;
using loom::MetaCostTotals;
using loom::Tensor;

constexpr int64_t kTokens = 1024;  // rows of every op: a micro-batch of 8 x 128 tokens

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

struct Point {
  double size, rate;
};
using Curves = std::map<std::string, std::vector<Point>>;

// Makes an op's inputs on a device (those that take gradients marked so) and returns its
// forward.
using Forward = std::function<Tensor()>;
using MakeForward = std::function<Forward(Device)>;

// An op's work on meta, forward and backward apart.
struct Work {
  MetaCostTotals forward, backward;
};

// `backward`: also the backward of the output, from a gradient of ones.
Work work_of(const MakeForward& make, bool backward) {
  const Forward forward = make(Device::meta());
  Work work;
  Tensor y;
  {
    loom::MetaCostScope scope(work.forward);
    y = forward();
  }
  if (!backward) return work;
  const Tensor seed = Tensor::ones(y.shape(), y.dtype(), Device::meta());
  loom::MetaCostScope scope(work.backward);
  y.backward(seed);
  return work;
}

struct Timing {
  double forward = 0, backward = 0;  // seconds
};

// Forward alone, and (`backward`) forward + backward less it, the gradient seed made once.
Timing time_of(const MakeForward& make, bool backward) {
  const Forward forward = make(Device::cpu());
  Timing t;
  t.forward = seconds_per_call([&] { (void)forward(); });
  if (!backward) return t;
  const Tensor probe = forward();
  const Tensor seed = Tensor::ones(probe.shape(), probe.dtype(), Device::cpu());
  t.backward = seconds_per_call([&] { forward().backward(seed); }) - t.forward;
  return t;
}

double bytes(const MetaCostTotals::Sum& s) { return s.bytes_read + s.bytes_written; }

// GEMMs or attention (`op_class`), forward and backward together: a point of FLOP/s by the
// FLOPs of one op.
Point measure_flops(const MakeForward& make, loom::OpClass op_class) {
  const Work work = work_of(make, true);
  const Timing t = time_of(make, true);
  const MetaCostTotals::Sum& f = work.forward.of(op_class);
  const MetaCostTotals::Sum& b = work.backward.of(op_class);
  const double flops = f.flops + b.flops;
  const double seconds = t.forward + t.backward;
  std::fprintf(stderr, "  %s: %lld ops, %.3g FLOP in %.3g s: %.3g FLOP/s\n",
               loom::op_class_name(op_class), static_cast<long long>(f.ops + b.ops), flops,
               seconds, flops / seconds);
  return {flops / static_cast<double>(f.ops + b.ops), flops / seconds};
}

// A bandwidth-bound op: a point of bytes/s by bytes for op `forward_op` of its forward pass
// and, unless empty, `backward_op` of its backward, each given its whole pass's time (the
// other ops of a pass, if any, are small).
void measure_bytes(const MakeForward& make, const std::string& forward_op,
                   const std::string& backward_op, Curves& curves) {
  const bool backward = !backward_op.empty();
  const Work work = work_of(make, backward);
  const Timing t = time_of(make, backward);
  const auto add = [&](const MetaCostTotals& totals, const std::string& name, double seconds) {
    const double moved = bytes(totals.by_op().at(name));
    std::fprintf(stderr, "  %s: %.3g bytes in %.3g s: %.3g bytes/s\n", name.c_str(), moved,
                 seconds, moved / seconds);
    curves[name].push_back({moved, moved / seconds});
  };
  add(work.forward, forward_op, t.forward);
  if (backward) add(work.backward, backward_op, t.backward);
}

// A pass over `n` parameters with gradients (an optimizer's step, clipping): op `op` of it.
void measure_pass(int64_t n, const std::string& op,
                  const std::function<void(std::vector<Tensor>&)>& pass, Curves& curves) {
  const auto params_on = [&](Device device) {
    std::vector<Tensor> params;
    for (int i = 0; i < 4; ++i) {
      Tensor p = Tensor::full({n / 4}, 0.5, DType::F32, device);
      p.set_requires_grad(true);
      loom::sum(p).backward();
      params.push_back(p);
    }
    return params;
  };
  std::vector<Tensor> on_meta = params_on(Device::meta());
  MetaCostTotals totals;
  {
    loom::MetaCostScope scope(totals);
    pass(on_meta);
  }
  std::vector<Tensor> on_cpu = params_on(Device::cpu());
  const double seconds = seconds_per_call([&] { pass(on_cpu); });
  const double moved = bytes(totals.by_op().at(op));
  std::fprintf(stderr, "  %s: %.3g bytes in %.3g s: %.3g bytes/s\n", op.c_str(), moved, seconds,
               moved / seconds);
  curves[op].push_back({moved, moved / seconds});
}

Tensor input(const loom::Shape& shape, double value, Device device, bool grad) {
  Tensor t = Tensor::full(shape, value, DType::F32, device);
  if (grad) t.set_requires_grad(true);
  return t;
}

nlohmann::json curve(std::vector<Point> points, double unit) {
  std::sort(points.begin(), points.end(),
            [](const Point& a, const Point& b) { return a.size < b.size; });
  nlohmann::json out = nlohmann::json::array();
  for (const Point& p : points) {
    if (!out.empty() && out.back()[0].get<double>() >= p.size) continue;  // one rate per size
    out.push_back({p.size, p.rate / unit});
  }
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

  std::fprintf(stderr, "GEMMs (linear, forward and backward)\n");
  std::vector<Point> gemm;
  for (const int64_t d : {64, 128, 256, 512, 1024}) {
    gemm.push_back(measure_flops(
        [&](Device device) -> Forward {
          const Tensor x = input({kTokens, d}, 0.5, device, true);
          const Tensor w = input({d, 4 * d}, 0.25, device, true);
          const Tensor b = input({4 * d}, 0.25, device, true);
          return [x, w, b] { return loom::linear(x, w, b); };
        },
        loom::OpClass::Gemm));
  }
  std::fprintf(stderr, "attention (forward and backward)\n");
  std::vector<Point> attention;
  for (const int64_t t : {64, 128, 256, 512, 1024}) {
    attention.push_back(measure_flops(
        [&](Device device) -> Forward {
          // As nn/gpt.cpp lays them out: views of one [B, T, 3C] projection.
          const Tensor qkv = input({kTokens / t, t, 3 * 256}, 0.01, device, true);
          return [qkv, t] {
            const std::vector<Tensor> parts = loom::split(qkv, {256, 256, 256}, -1);
            const auto heads = [&](const Tensor& x) {
              return x.reshape({kTokens / t, t, 4, 64}).permute({0, 2, 1, 3});
            };
            return loom::causal_attention(heads(parts[0]), heads(parts[1]), heads(parts[2]))
                .permute({0, 2, 1, 3})
                .reshape({kTokens / t, t, 256});
          };
        },
        loom::OpClass::Attention));
  }
  std::fprintf(stderr, "bandwidth-bound ops by name\n");
  Curves ops;
  for (const int64_t d : {128, 512}) {
    measure_bytes([&](Device device) -> Forward {
      const Tensor x = input({kTokens, 4 * d}, 0.5, device, true);
      return [x] { return loom::gelu(x); };
    }, "gelu", "Gelu", ops);
    measure_bytes([&](Device device) -> Forward {
      const Tensor x = input({kTokens, d}, 0.5, device, true);
      const Tensor w = input({d}, 1.0, device, true);
      const Tensor b = input({d}, 0.0, device, true);
      return [x, w, b] { return loom::layer_norm(x, w, b); };
    }, "layer_norm", "LayerNorm", ops);
    measure_bytes([&](Device device) -> Forward {
      const Tensor a = input({kTokens, d}, 0.5, device, true);
      const Tensor b = input({kTokens, d}, 0.25, device, true);
      return [a, b] { return loom::add(a, b); };
    }, "add", "", ops);
    measure_bytes([&](Device device) -> Forward {
      const Tensor logits = input({kTokens, 8 * d}, 0.01, device, true);
      const Tensor targets = Tensor::zeros({kTokens}, DType::I64, device);
      return [logits, targets] { return loom::cross_entropy(logits, targets); };
    }, "cross_entropy", "CrossEntropy", ops);
    measure_bytes([&](Device device) -> Forward {
      const Tensor indices = Tensor::zeros({kTokens}, DType::I64, device);
      const Tensor table = input({8 * d, d}, 0.5, device, true);
      return [indices, table] { return loom::embedding(indices, table); };
    }, "embedding", "Embedding", ops);
    const int64_t params = 12 * d * d * 4;  // four layers' weights
    measure_pass(params, "adamw", [](std::vector<Tensor>& p) { loom::optim::AdamW(p).step(); }, ops);
    measure_pass(params, "grad_norm",
                 [](std::vector<Tensor>& p) { (void)loom::optim::clip_grad_norm(p, 1e9); }, ops);
  }
  std::fprintf(stderr, "memory (f32 add by size)\n");
  std::vector<Point> memory;
  for (const int64_t n : {1 << 10, 1 << 13, 1 << 16, 1 << 19, 1 << 22}) {
    Curves one;
    measure_bytes([&](Device device) -> Forward {
      const Tensor a = input({n}, 1.0, device, false);
      return [a] { return loom::add(a, a); };
    }, "add", "", one);
    memory.push_back(one["add"].front());
  }
  const Tensor one = Tensor::full({1}, 1.0, DType::F32, Device::cpu());
  const double overhead = seconds_per_call([&] { (void)loom::add(one, one); });

  // On the CPU, autocast rounds the operands of matmul, linear and attention through bf16 or
  // f16 and computes in f32 (tensor/autocast.h): the 16-bit curves are the f32 ones.
  nlohmann::json gemm_json, attention_json, ops_json = nlohmann::json::object();
  for (const char* dtype : {"f32", "bf16", "f16"}) {
    gemm_json[dtype] = curve(gemm, 1e12);
    attention_json[dtype] = curve(attention, 1e12);
  }
  for (const auto& [name, points] : ops) ops_json[name] = curve(points, 1e9);
  const nlohmann::json device = {{"op_overhead_us", overhead * 1e6},
                                 {"gemm_tflops", gemm_json},
                                 {"attention_tflops", attention_json},
                                 {"memory_gbps", curve(memory, 1e9)},
                                 {"ops_gbps", ops_json}};
  std::printf("%s\n", device.dump().c_str());
  return 0;
}
