#include "nn/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "tensor/random.h"

namespace loom::nn {

int64_t choose_token(const std::vector<double>& logits, const SamplingOptions& options,
                     double uniform) {
  const auto largest = std::max_element(logits.begin(), logits.end());  // the first of equals
  if (options.temperature == 0) return largest - logits.begin();
  // Tokens by decreasing logit (stable: ties keep id order), then the warpers in
  // transformers' order: temperature, top-k, top-p.
  std::vector<int64_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  size_t kept = order.size();
  if (options.top_k > 0) kept = std::min(kept, static_cast<size_t>(options.top_k));
  std::vector<double> weights(kept);
  double total = 0;
  for (size_t i = 0; i < kept; ++i) {
    weights[i] = std::exp((logits[order[i]] - *largest) / options.temperature);
    total += weights[i];
  }
  if (options.top_p < 1) {  // the smallest prefix whose probability reaches top_p (at least one)
    double mass = 0;
    size_t n = 0;
    while (n < kept && mass < options.top_p * total)
      mass += weights[n++];
    kept = std::max<size_t>(n, 1);
    total = std::accumulate(weights.begin(), weights.begin() + static_cast<ptrdiff_t>(kept), 0.0);
  }
  double target = uniform * total;
  for (size_t i = 0; i < kept; ++i) {
    if (target < weights[i]) return order[i];
    target -= weights[i];
  }
  return order[kept - 1];  // rounding at the end of the cumulative sum
}

std::vector<int64_t> generate(const CausalLM& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options) {
  const int64_t vocab = model.vocab_size(), context = model.context();
  if (prompt.empty()) fail("generate: the prompt is empty; give at least one token");
  if (static_cast<int64_t>(prompt.size()) >= context) {
    fail("generate: the prompt has ", prompt.size(), " tokens but the model's context is ",
         context, "; no room to generate (shorten the prompt)");
  }
  for (int64_t id : prompt)
    if (id < 0 || id >= vocab)
      fail("generate: prompt token ", id, " is outside the vocabulary of ", vocab);
  if (options.temperature < 0 || options.top_k < 0 || !(options.top_p > 0 && options.top_p <= 1)) {
    fail("generate: expected temperature >= 0, top_k >= 0 and 0 < top_p <= 1, got ",
         options.temperature, ", ", options.top_k, ", ", options.top_p);
  }
  NoGradGuard no_grad;
  Generator gen(options.seed);
  KVCache cache;
  const Device device = model.parameters().front().device();
  Tensor input = Tensor::from_vector(prompt, {1, static_cast<int64_t>(prompt.size())}, device);
  std::vector<int64_t> out;
  while (static_cast<int64_t>(out.size()) < options.max_new_tokens && cache.length < context) {
    if (cache.length + input.size(1) > context) break;
    const Tensor logits = model.forward_cached(input, cache);  // [1, T, V]
    const std::vector<double> last = logits.narrow(1, logits.size(1) - 1, 1)
                                         .reshape({vocab})
                                         .to(DType::F64)
                                         .to(Device::cpu())
                                         .to_vector<double>();
    const int64_t next = choose_token(last, options, options.temperature == 0 ? 0 : gen.uniform());
    out.push_back(next);
    if (options.stop_token && next == *options.stop_token) break;
    input = Tensor::from_vector(std::vector<int64_t>{next}, {1, 1}, device);
  }
  return out;
}

}  // namespace loom::nn
