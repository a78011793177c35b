#pragma once
// Models as Hugging Face stores them, both ways (docs/models.md): a model directory holds
// config.json and either model.safetensors or shards model-0000K-of-0000N.safetensors listed
// by model.safetensors.index.json (save_pretrained's layout), plus the tokenizer's files. A
// bare safetensors file (Loom's own --save of a file) carries its sizes in "loom.*" metadata.
//
// Architectures: GPT-2 (GPT2LMHeadModel, model_type "gpt2") and Llama (LlamaForCausalLM,
// model_type "llama"). What Loom does not implement is refused, naming the key: rope scaling,
// attention or MLP biases, activations other than gelu_new / silu.

#include <filesystem>
#include <memory>
#include <string>

#include "nn/causal_lm.h"
#include "nn/gpt.h"
#include "nn/llama.h"
#include "tensor/safetensors.h"

namespace loom::nn {

enum class Architecture { kGpt2, kLlama };
// "gpt2", "llama"; parse_architecture throws loom::Error listing them for anything else.
std::string architecture_name(Architecture architecture);
Architecture parse_architecture(const std::string& name);

// What builds a model of either architecture.
struct ModelSpec {
  Architecture architecture = Architecture::kGpt2;
  GPTConfig gpt;      // when kGpt2
  LlamaConfig llama;  // when kLlama
  std::unique_ptr<CausalLM> build(uint64_t seed) const;
  // Whether the model recomputes its layers in backward (activation checkpointing).
  bool checkpoints_activations() const;
};

// Hugging Face's config.json for `spec` (the fields transformers reads; JSON text, keys
// sorted), and back. Reading throws loom::Error "[pretrained] ORIGIN: ..." naming a missing or
// unsupported key.
std::string hf_config(const ModelSpec& spec);
ModelSpec spec_from_hf_config(std::string_view config_json, const std::string& origin);

struct Pretrained {
  ModelSpec spec;
  StateDict state;  // Loom's names (a "transformer." prefix and tied copies dropped)
  std::filesystem::path tokenizer;  // tokenizer.json beside the weights; empty when none
};

// A model directory (config.json and its weights) or a safetensors file. For a file the
// architecture comes from its tensor names and sizes, Llama's head counts and norm epsilon
// from "loom.*" metadata, else from `defaults`. Tensors of any float dtype (bf16 files too)
// are returned as stored; load_state_dict converts them. Throws loom::Error naming the file
// and what was expected: a missing config.json or weights file, an index naming a file that
// is absent, a config whose sizes disagree with a tensor's shape.
Pretrained load_pretrained(const std::filesystem::path& path, const ModelSpec& defaults);

// Writes `model` (of `spec`) as a Hugging Face directory `dir` (created if needed):
// config.json, model.safetensors, or shards of at most `max_shard_bytes` with
// model.safetensors.index.json when the model is larger; the tokenizer's files (tokenizer.json
// and what sits beside it: tokenizer_config.json, special_tokens_map.json) copied in when
// `tokenizer` is given (with a tokenizer_config.json naming PreTrainedTokenizerFast when
// there is none, so that AutoTokenizer loads it). Each file is written atomically. A tied output projection is not
// stored (transformers ties it back from tie_word_embeddings).
void save_pretrained(const std::filesystem::path& dir, const CausalLM& model,
                     const ModelSpec& spec, const std::filesystem::path& tokenizer = {},
                     int64_t max_shard_bytes = int64_t{5} << 30);

// The "loom.*" metadata of a weights file of `spec` (gpt_metadata for GPT-2).
safetensors::Metadata weights_metadata(const ModelSpec& spec);
// `model`'s weights as one safetensors file with "loom.*" metadata (Loom's --save FILE).
void save_weights_file(const std::filesystem::path& path, const CausalLM& model,
                       const ModelSpec& spec);

}  // namespace loom::nn
