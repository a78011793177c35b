// loom-sim-calibrate: measures this machine's device model for the simulator
// (docs/simulation.md, "Calibration") from real training steps. It trains four small GPTs on
// the CPU (shapes unlike the validation's: bench/sim/validate_this_machine.sh) with the ops
// profiled (Note [Profiling CPU ops] in tensor/meta.h): every op reports its FLOPs and bytes,
// as on the meta device, and its time in the step, from its start to the next op's, its
// inputs as cold or warm as the step leaves them, autograd and allocation between kernels
// included. From those:
// - GEMMs: achieved FLOP/s by the FLOPs of one op (the "gemm_tflops" curves: f32 from f32
//   steps, bf16 from the same steps under bf16 autocast, whose products run on bf16 tensors on
//   the CPU (kernels/cpu/gemm.h: oneDNN's bf16 kernels where the CPU has them, else widened to
//   f32), f16 the f32 curve, autocast emulating f16 in f32); attention
//   forward and backward apart and by head dimension ("ops_tflops": "causal_attention@d64";
//   the forwards' are also the "attention_tflops" curve);
// - every other op, by name: achieved bytes/s by its bytes (the "ops_gbps" curves; from the
//   f32 steps, or from the bf16 steps for an op only they run, such as autocast's casts);
// - ops no step ran (another model's): an f32 add by size, timed alone ("memory_gbps").
// The per-op overhead is in those times, so "op_overhead_us" is 0. Prints the "device"
// object of a cluster description (scripts/calibrate-this-machine.sh writes
// sim/clusters/this-machine.json with it) on stdout, what it measured on stderr.
//
// With --compare, it calibrates nothing: it profiles the given model's own f32 steps and
// prints, op by op (attention by head dimension), the measured seconds per step beside the
// device model's for the same ops on a cluster (the this-machine preset by default), so a
// validation's miss on one device can be traced to the ops whose curves extrapolate badly.
//
//   loom-sim-calibrate [--threads N]   (default 1: a rank's threads when each has one core)
//   loom-sim-calibrate --compare LAYERS,EMBD,HEADS,CTX,BATCH [--cluster PRESET|FILE]
//                      [--threads N]

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "kernels/cpu/thread_pool.h"
#include "nn/gpt.h"
#include "optim/adamw.h"
#include "optim/clip_grad.h"
#include "sim/cluster.h"
#include "sim/device_model.h"
#include "tensor/autocast.h"
#include "tensor/meta.h"
#include "tensor/ops.h"

namespace {

using loom::Device;
using loom::DType;
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

struct Point {
  double size, rate;
};
using Curves = std::map<std::string, std::vector<Point>>;

// A calibration GPT (byte vocabulary, 2 layers) and its batch by width.
const std::map<int64_t, int64_t> kBatch = {{96, 8}, {160, 4}, {192, 4}, {384, 4}};
loom::nn::GPTConfig model(int64_t embd, int64_t heads, int64_t context) {
  loom::nn::GPTConfig c;
  c.layers = 2;
  c.embd = embd;
  c.heads = heads;
  c.context = context;
  return c;
}

constexpr int kProfiledSteps = 3;

// Trains `config` for two steps, then three more with its ops profiled into `profile`: the
// forward and loss (under `autocast`: F32 for none), backward, gradient clipping and AdamW of
// train_gpt's loop.
void profile_steps(const loom::nn::GPTConfig& config, int64_t batch, DType autocast,
                   loom::OpProfile& profile) {
  loom::nn::GPT gpt(config, 1);
  loom::optim::AdamW optimizer(gpt.parameters());
  std::vector<int64_t> ids(static_cast<size_t>(batch * config.context));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>((i * 7 + 3) % 256);
  const Tensor tokens = Tensor::from_vector<int64_t>(ids, {batch, config.context});
  const auto step = [&] {
    Tensor loss;
    {
      loom::AutocastGuard guard(autocast);
      loss = gpt.loss(tokens, tokens);
    }
    loss.backward();
    (void)loom::optim::clip_grad_norm(gpt.parameters(), 1.0);
    optimizer.step();
    optimizer.zero_grad();
  };
  step();
  step();
  loom::OpProfileScope scope(profile);
  for (int i = 0; i < kProfiledSteps; ++i) step();
}

// Note [The spread of a rank's computation]
// The same ops take different times in consecutive steps (scheduling, interrupts, the caches
// and memory bandwidth a node's ranks share), and ranks that compute the same work drift apart
// by it: the simulator's stragglers (Note [Stragglers at a meeting] in sim/device_model.h).
// For windows of consecutive ops whose mean time over the profiled steps reaches each target,
// the variance of the window's time over those steps (kProfiledSteps - 1 degrees of freedom),
// pooled over every window of the target in every model: the spread by the windows' mean
// length ("compute_spread_us", by target, beside the device object's rates; the calibration
// script puts the shared round's, where every core computes as ranks do at a meeting, in
// node.compute_spread_us).
constexpr double kSpreadTargets[] = {250e-6, 1e-3, 4e-3};  // seconds
struct SpreadSum {
  double length = 0, variance = 0;  // sums over the windows
  int windows = 0;
};
using SpreadSums = std::array<SpreadSum, std::size(kSpreadTargets)>;

// Adds the windows of one model's profiled steps, entries [begin, end) of `entries`.
void add_spreads(const std::vector<loom::OpProfile::Entry>& entries, size_t begin, size_t end,
                 SpreadSums& sums) {
  const size_t per_step = (end - begin) / kProfiledSteps;
  if (per_step == 0 || (end - begin) % kProfiledSteps != 0) return;
  const auto entry = [&](int step, size_t i) -> const loom::OpProfile::Entry& {
    return entries[begin + static_cast<size_t>(step) * per_step + i];
  };
  for (int step = 1; step < kProfiledSteps; ++step)
    for (size_t i = 0; i < per_step; ++i)
      if (std::string_view(entry(step, i).cost.op) != entry(0, i).cost.op) return;  // (not alike)
  for (size_t t = 0; t < std::size(kSpreadTargets); ++t) {
    for (size_t from = 0; from < per_step;) {
      std::array<double, kProfiledSteps> window{};
      double mean = 0;
      size_t to = from;
      for (; to < per_step && mean < kSpreadTargets[t]; ++to) {
        for (int step = 0; step < kProfiledSteps; ++step) window[step] += entry(step, to).seconds;
        mean = std::accumulate(window.begin(), window.end(), 0.0) / kProfiledSteps;
      }
      if (mean < kSpreadTargets[t]) break;  // (the step's tail, shorter than the target)
      double squares = 0;
      for (const double w : window) squares += (w - mean) * (w - mean);
      sums[t].length += mean;
      sums[t].variance += squares / (kProfiledSteps - 1);
      ++sums[t].windows;
      from = to;
    }
  }
}

// {"TARGET_US": [mean window length (us), pooled standard deviation (us)], ...}: the targets
// some window reached (a window holds whole ops, so its length can pass its target by one op).
nlohmann::json spread_by_target(const SpreadSums& sums) {
  nlohmann::json out = nlohmann::json::object();
  for (size_t t = 0; t < sums.size(); ++t) {
    const SpreadSum& sum = sums[t];
    if (sum.windows == 0) continue;
    const double length_us = sum.length / sum.windows * 1e6;
    const double sigma_us = std::sqrt(sum.variance / sum.windows) * 1e6;
    std::fprintf(stderr, "  windows of %8.1f us (target %g us): %8.2f us standard deviation "
                 "(%d windows)\n", length_us, kSpreadTargets[t] * 1e6, sigma_us, sum.windows);
    out[std::to_string(std::lround(kSpreadTargets[t] * 1e6))] = {length_us, sigma_us};
  }
  return out;
}

// The profile's entries by op name and size (FLOPs for GEMMs and attention, else bytes): the
// summed work and seconds of the entries of one size.
struct Sum {
  double work = 0, seconds = 0;
};
using Groups = std::map<std::string, std::map<double, Sum>>;

// Attention's rate depends on its head dimension as much as on its FLOPs: its entries group
// under "NAME@dD" (the device model looks that name up first).
std::string group_name(const loom::OpCost& c) {
  if (c.op_class != loom::OpClass::Attention) return c.op;
  return std::string(c.op) + "@d" + std::to_string(c.dims[3]);
}

double bytes_of(const loom::OpCost& c) { return c.bytes_read + c.bytes_written; }

// The entries of `profile`, or only its GEMMs of `gemm_dtype` when one is given.
Groups group(const std::vector<loom::OpProfile::Entry>& entries,
             std::optional<DType> gemm_dtype = std::nullopt) {
  Groups groups;
  for (const loom::OpProfile::Entry& e : entries) {
    if (gemm_dtype && (e.cost.op_class != loom::OpClass::Gemm || e.cost.dtype != *gemm_dtype))
      continue;
    const bool by_flops =
        e.cost.op_class == loom::OpClass::Gemm || e.cost.op_class == loom::OpClass::Attention;
    const double work = by_flops ? e.cost.flops : bytes_of(e.cost);
    if (work <= 0) continue;  // (nothing to rate: an empty op)
    Sum& sum = groups[group_name(e.cost)][work];
    sum.work += work;
    sum.seconds += e.seconds;
  }
  return groups;
}

// Op `name`'s achieved rates by size; `by_flops` only labels the report.
std::vector<Point> rates(const Groups& groups, const std::string& name, bool by_flops) {
  std::vector<Point> points;
  const auto it = groups.find(name);
  if (it == groups.end()) return points;
  for (const auto& [size, sum] : it->second) {
    points.push_back({size, sum.work / sum.seconds});
    std::fprintf(stderr, "  %-22s %10.4g %s: %.4g %s\n", name.c_str(), size,
                 by_flops ? "FLOP" : "bytes", sum.work / sum.seconds,
                 by_flops ? "FLOP/s" : "bytes/s");
  }
  return points;
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

// Profiles `config`'s f32 steps and prints each op group's measured and predicted seconds
// per step on `cluster` (one rank alone on the node), the largest first, and their totals.
void compare(const loom::nn::GPTConfig& config, int64_t batch, const std::string& cluster_name) {
  const loom::sim::Cluster cluster = loom::sim::load_cluster(cluster_name);
  const loom::sim::DeviceModel device(cluster, /*ranks_per_node=*/1);
  loom::OpProfile profile;
  profile_steps(config, batch, DType::F32, profile);
  constexpr double kSteps = kProfiledSteps;
  struct PerStep {
    double ops = 0, measured_ms = 0, predicted_ms = 0;
  };
  std::map<std::string, PerStep> groups;
  PerStep total;
  for (const loom::OpProfile::Entry& e : profile.entries()) {
    for (PerStep* sum : {&groups[group_name(e.cost)], &total}) {
      sum->ops += 1 / kSteps;
      sum->measured_ms += e.seconds * 1e3 / kSteps;
      sum->predicted_ms += device.seconds(e.cost) * 1e3 / kSteps;
    }
  }
  std::vector<std::pair<std::string, PerStep>> order(groups.begin(), groups.end());
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return a.second.measured_ms > b.second.measured_ms;
  });
  order.emplace_back("total", total);
  std::printf("%-26s %8s %12s %12s %8s\n", "op", "per step", "measured ms", "predicted ms",
              "error");
  for (const auto& [name, sum] : order) {
    std::printf("%-26s %8.0f %12.3f %12.3f %+7.1f%%\n", name.c_str(), sum.ops, sum.measured_ms,
                sum.predicted_ms, 100 * (sum.predicted_ms - sum.measured_ms) / sum.measured_ms);
  }
}

// "LAYERS,EMBD,HEADS,CTX,BATCH" as five positive integers.
std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> values;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t end = std::min(text.find(',', begin), text.size());
    const std::string field = text.substr(begin, end - begin);
    char* rest = nullptr;
    const long long value = std::strtoll(field.c_str(), &rest, 10);
    if (field.empty() || *rest != '\0' || value <= 0) break;
    values.push_back(value);
    begin = end + 1;
  }
  if (values.size() != 5) {
    std::fprintf(stderr,
                 "loom-sim-calibrate: --compare wants LAYERS,EMBD,HEADS,CTX,BATCH as five "
                 "positive integers (e.g. 4,128,4,128,8), got '%s'\n",
                 text.c_str());
    std::exit(2);
  }
  return values;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Measures this machine's device model for loom-sim (docs/simulation.md)");
  int threads = 1;
  app.add_option("--threads", threads, "intra-op threads (a rank's, when each has one core)")
      ->check(CLI::PositiveNumber);
  std::string shape, cluster = "this-machine";
  app.add_option("--compare", shape,
                 "LAYERS,EMBD,HEADS,CTX,BATCH: compare this model's measured op times with the "
                 "cluster's device model instead of calibrating");
  app.add_option("--cluster", cluster, "with --compare: a preset or a cluster JSON file");
  CLI11_PARSE(app, argc, argv);
  loom::kernels::cpu::set_num_threads(threads);
  if (!shape.empty()) {
    const std::vector<int64_t> v = parse_shape(shape);
    loom::nn::GPTConfig config = model(v[1], v[2], v[3]);
    config.layers = v[0];
    try {
      compare(config, v[4], cluster);
    } catch (const std::exception& e) {  // a cluster that does not load
      std::fprintf(stderr, "loom-sim-calibrate: %s\n", e.what());
      return 1;
    }
    return 0;
  }

  // Four models (head dimensions 32 and 64), each two steps to warm up and three profiled.
  const std::vector<loom::nn::GPTConfig> models = {model(96, 3, 96), model(160, 5, 160),
                                                   model(192, 3, 192), model(384, 6, 128)};
  loom::OpProfile profile, bf16_profile;
  SpreadSums spreads{};
  for (const loom::nn::GPTConfig& config : models) {
    std::fprintf(stderr, "training steps of embd %lld, heads %lld, ctx %lld, batch %lld\n",
                 static_cast<long long>(config.embd), static_cast<long long>(config.heads),
                 static_cast<long long>(config.context), static_cast<long long>(kBatch.at(config.embd)));
    const size_t begin = profile.entries().size();
    profile_steps(config, kBatch.at(config.embd), DType::F32, profile);
    add_spreads(profile.entries(), begin, profile.entries().size(), spreads);
    profile_steps(config, kBatch.at(config.embd), DType::BF16, bf16_profile);
  }
  std::fprintf(stderr, "the spread of the f32 steps' computation (Note [The spread of a "
                       "rank's computation])\n");
  const nlohmann::json spread = spread_by_target(spreads);
  Groups groups = group(profile.entries());
  std::vector<Point> gemm = rates(groups, "gemm", true);
  std::fprintf(stderr, "bf16 GEMMs (the same steps under bf16 autocast)\n");
  std::vector<Point> bf16_gemm = rates(group(bf16_profile.entries(), DType::BF16), "gemm", true);
  // Attention forward and backward by name and head dimension (their rates differ); the
  // class curve is the forward's of every head dimension, for other attention ops.
  Curves flops_ops, ops;
  std::vector<Point> attention;
  for (const auto& [name, sizes] : groups) {
    if (name.find("@d") != std::string::npos) {
      flops_ops[name] = rates(groups, name, true);
      if (name.starts_with("causal_attention@"))
        attention.insert(attention.end(), flops_ops[name].begin(), flops_ops[name].end());
    } else if (name != "gemm") {
      ops[name] = rates(groups, name, false);
    }
  }
  // Ops only the bf16 steps run (the casts autocast adds): their curves from those steps.
  const Groups bf16_groups = group(bf16_profile.entries());
  for (const auto& [name, sizes] : bf16_groups) {
    const bool bytes_op = name != "gemm" && name.find("@d") == std::string::npos;
    if (bytes_op && !groups.contains(name)) ops[name] = rates(bf16_groups, name, false);
  }
  std::fprintf(stderr, "memory (an f32 add by size, alone)\n");
  std::vector<Point> memory;
  for (const int64_t n : {1 << 10, 1 << 13, 1 << 16, 1 << 19, 1 << 22}) {
    const Tensor a = Tensor::full({n}, 1.0, DType::F32, Device::cpu());
    const double seconds = seconds_per_call([&] { (void)loom::add(a, a); });
    memory.push_back({12.0 * static_cast<double>(n), 12.0 * static_cast<double>(n) / seconds});
  }
  // bf16 GEMMs have their own curve; f16 GEMMs and every attention compute in f32 on the CPU
  // (autocast emulates them: tensor/autocast.h), so theirs are the f32 ones.
  nlohmann::json gemm_json, attention_json, ops_json = nlohmann::json::object();
  for (const char* dtype : {"f32", "bf16", "f16"}) {
    gemm_json[dtype] = curve(std::string(dtype) == "bf16" ? bf16_gemm : gemm, 1e12);
    attention_json[dtype] = curve(attention, 1e12);
  }
  nlohmann::json flops_json = nlohmann::json::object();
  for (const auto& [name, points] : ops) ops_json[name] = curve(points, 1e9);
  for (const auto& [name, points] : flops_ops) flops_json[name] = curve(points, 1e12);
  const nlohmann::json device = {{"op_overhead_us", 0},
                                 {"gemm_tflops", gemm_json},
                                 {"attention_tflops", attention_json},
                                 {"memory_gbps", curve(memory, 1e9)},
                                 {"ops_gbps", ops_json},
                                 {"ops_tflops", flops_json},
                                 {"compute_spread_us", spread}};
  std::printf("%s\n", device.dump().c_str());
  return 0;
}
