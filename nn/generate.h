#pragma once
// Text generation from a causal language model, one sequence at a time with a key/value cache
// (KVCache): the prompt's forward once, then one token's. Greedy decoding (temperature 0)
// takes the largest logit, the first of equal ones, as transformers' generate does; sampling
// applies the temperature, then top-k, then top-p (nucleus) to the logits, as transformers'
// logits warpers do, and draws with Loom's generator (so sampled text is reproducible by seed,
// though not transformers' draws).

#include <cstdint>
#include <optional>
#include <vector>

#include "nn/causal_lm.h"

namespace loom::nn {

struct SamplingOptions {
  int64_t max_new_tokens = 64;
  double temperature = 1.0;  // 0: greedy
  int64_t top_k = 0;         // keep the k most likely tokens; 0: all
  double top_p = 1.0;        // keep the smallest set whose probability reaches p; 1: all
  uint64_t seed = 0;
  std::optional<int64_t> stop_token;  // generation ends after producing it
};

// The tokens that continue `prompt` (ids below the model's vocabulary; at least one), at most
// max_new_tokens and never past the model's context. Throws loom::Error for an empty prompt,
// an id outside the vocabulary, a prompt as long as the context, or options out of range
// (temperature < 0, top_k < 0, top_p outside (0, 1]).
std::vector<int64_t> generate(const CausalLM& model, const std::vector<int64_t>& prompt,
                              const SamplingOptions& options);

// The next token from one row of logits under `options` (greedy when temperature is 0);
// `uniform` is a draw from [0, 1).
int64_t choose_token(const std::vector<double>& logits, const SamplingOptions& options,
                     double uniform);

}  // namespace loom::nn
