#pragma once
// GPT checkpoints in the Hugging Face GPT-2 safetensors layout.

#include <filesystem>

#include "nn/gpt.h"
#include "tensor/safetensors.h"

namespace loom::nn {

// The metadata a GPT file carries: {"format": "pt", "loom.layers", "loom.heads",
// "loom.embd", "loom.context", "loom.vocab_size"}.
safetensors::Metadata gpt_metadata(const GPTConfig& config);
// Writes the parameters with gpt_metadata(); atomic (see safetensors::save).
void save_gpt(const std::filesystem::path& path, const GPT& model);

// The parameters of a GPT-2 checkpoint under Loom's names: a "transformer." prefix is
// stripped, and the tied "lm_head.weight" and the attention-mask buffers ("h.N.attn.bias" of
// shape [1, 1, T, T], "h.N.attn.masked_bias") that Hugging Face files may carry are dropped.
StateDict gpt_state_from_checkpoint(const safetensors::Contents& contents);

// The architecture stored in a checkpoint: vocab_size and embd from wte, context from wpe,
// layers from the h.N blocks; heads from the "loom.heads" metadata when present, else
// `heads_if_unknown` (GPT-2 files do not record it). Throws loom::Error when wte/wpe are
// missing, when "loom.heads" is not a decimal divisor of embd, or when the blocks are not
// h.0 to h.L-1 (a block index past the file's tensor count, or one left out), naming the key or
// tensor and what is accepted.
// The number of numbered layers "<prefix>N.*" in `state` (GPT-2's "h.", Llama's
// "model.layers."): one more than the largest N, every N from 0 up present (so that a damaged
// name cannot ask for a huge model). Throws loom::Error naming a tensor whose N is not a
// decimal below the tensor count, or the first missing N.
int64_t numbered_layer_count(const StateDict& state, const std::string& prefix);

GPTConfig gpt_config_from_checkpoint(const safetensors::Contents& contents,
                                     int64_t heads_if_unknown);

}  // namespace loom::nn
