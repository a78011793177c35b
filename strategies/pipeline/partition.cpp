#include "strategies/pipeline/partition.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>
#include <optional>
#include <string>

#include "core/error.h"
#include "core/tags.h"
#include "tensor/meta.h"

namespace loom::strategies::pipeline {

std::vector<int64_t> partition_layers(const nn::LayeredModel& model, const nn::Module& module,
                                      int stages, const std::vector<int64_t>& balance) {
  const int64_t layers = model.layer_count();
  if (stages < 1 || stages > layers)
    tag::kPipeline.fail(stages, " stages for a model of ", layers, " layers; use 1 to ", layers);
  std::vector<int64_t> bounds{0};
  if (!balance.empty()) {
    if (static_cast<int>(balance.size()) != stages)
      tag::kPipeline.fail("balance lists ", balance.size(), " stages; --pp is ", stages);
    for (int64_t n : balance) {
      if (n < 1)
        tag::kPipeline.fail("balance gives a stage ", n, " layers; every stage needs >= 1");
      bounds.push_back(bounds.back() + n);
    }
    if (bounds.back() != layers) {
      tag::kPipeline.fail("balance adds up to ", bounds.back(), " layers; the model has ", layers,
                          " (GPT: the embedding, each block, the head)");
    }
    return bounds;
  }
  std::map<std::string, int64_t> sizes;
  for (const auto& [name, p] : module.named_parameters())
    sizes[name] = p.numel();
  std::vector<int64_t> costs;
  for (int64_t l = 0; l < layers; ++l) {
    int64_t n = 0;
    for (const std::string& name : model.layer_parameters(l))
      n += sizes.at(name);
    costs.push_back(n);
  }
  return partition_by_cost(costs, stages);
}

std::vector<int64_t> partition_by_cost(const std::vector<int64_t>& costs, int stages) {
  const auto layers = static_cast<int64_t>(costs.size());
  if (stages < 1 || stages > layers)
    tag::kPipeline.fail(stages, " stages for a model of ", layers, " layers; use 1 to ", layers);
  std::vector<int64_t> prefix{0};  // cost of layers [0, i)
  for (int64_t c : costs)
    prefix.push_back(prefix.back() + c);
  // best[s][i]: the smallest largest chunk splitting layers [0, i) into s chunks.
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::vector<std::vector<int64_t>> best(stages + 1, std::vector<int64_t>(layers + 1, kNone));
  std::vector<std::vector<int64_t>> cut(stages + 1, std::vector<int64_t>(layers + 1, 0));
  best[0][0] = 0;
  for (int s = 1; s <= stages; ++s) {
    for (int64_t i = s; i <= layers; ++i) {
      for (int64_t j = s - 1; j < i; ++j) {
        if (best[s - 1][j] == kNone) continue;
        const int64_t worst = std::max(best[s - 1][j], prefix[i] - prefix[j]);
        if (worst < best[s][i]) {
          best[s][i] = worst;
          cut[s][i] = j;
        }
      }
    }
  }
  std::vector<int64_t> reversed{layers};
  for (int s = stages; s > 0; --s)
    reversed.push_back(cut[s][reversed.back()]);
  return {reversed.rbegin(), reversed.rend()};
}

std::vector<int64_t> layer_forward_times(const nn::LayeredModel& model, const Tensor& sample,
                                         int repeats) {
  NoGradGuard no_grad;
  std::vector<std::vector<int64_t>> runs(static_cast<size_t>(model.layer_count()));
  // Microseconds from now; on the meta device under a simulation's clock, simulated ones (the
  // cost model's: docs/simulation.md).
  const auto now_us = [] {
    if (const std::optional<double> simulated = simulated_now()) return *simulated * 1e6;
    return std::chrono::duration<double, std::micro>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  for (int r = 0; r < repeats; ++r) {
    Tensor x = sample;
    for (int64_t l = 0; l < model.layer_count(); ++l) {
      const double start = now_us();
      x = model.forward_layer(l, x);
      // The last layer's stage also scores its output (the output projection runs in the
      // loss: CausalLM::layer_loss); the sample's tokens serve as targets.
      if (l + 1 == model.layer_count()) x = model.layer_loss(x, sample);
      runs[static_cast<size_t>(l)].push_back(std::llround(now_us() - start));
    }
  }
  std::vector<int64_t> medians;
  for (std::vector<int64_t>& t : runs) {
    std::nth_element(t.begin(), t.begin() + static_cast<int64_t>(t.size() / 2), t.end());
    medians.push_back(std::max<int64_t>(t[t.size() / 2], 1));
  }
  return medians;
}

}  // namespace loom::strategies::pipeline
