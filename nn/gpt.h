#pragma once
// GPT-2: pre-LayerNorm blocks (eps 1e-5), tanh GELU, learned positions, the output
// projection tied to the token embedding, no dropout, biases everywhere. Parameter names and
// layouts are those of Hugging Face GPT-2 safetensors files (see docs/architecture.md).

#include <memory>

#include "nn/layered_model.h"
#include "nn/layers.h"

namespace loom::nn {

struct GPTConfig {
  int64_t vocab_size = 256;
  int64_t context = 128;  // n_positions: the longest sequence, rows of wpe
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t embd = 128;
  // Recompute each block's activations during backward instead of keeping them.
  bool checkpoint_activations = false;
  Options options;

  // Throws loom::Error describing the first inconsistency (e.g. heads not dividing embd).
  void validate() const;
};

class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(const GPTConfig& config, Generator& gen);
  Tensor forward(const Tensor& x) const;  // [B, T, C] -> [B, T, C]

 private:
  Tensor attend(const Tensor& x) const;  // the forward, between the forward hooks

  int64_t heads_;
  std::shared_ptr<Linear> c_attn_, c_proj_;
};

class MLP : public Module {
 public:
  MLP(const GPTConfig& config, Generator& gen);
  Tensor forward(const Tensor& x) const;

 private:
  std::shared_ptr<Linear> c_fc_, c_proj_;
  GELU gelu_;
};

class Block : public Module {
 public:
  Block(const GPTConfig& config, Generator& gen);
  Tensor forward(const Tensor& x) const;

 private:
  std::shared_ptr<LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<MLP> mlp_;
};

// As a LayeredModel: layer 0 is the embedding (wte + wpe), layers 1..L the blocks, layer L+1
// the head (ln_f and the output projection tied to wte).
class GPT : public Module, public LayeredModel {
 public:
  // Initialises like GPT-2: N(0, 0.02) weights, residual projections (c_proj) scaled by
  // 1/sqrt(2 * layers), zero biases, LayerNorm weight 1. Deterministic given `seed`.
  GPT(const GPTConfig& config, uint64_t seed);
  // tokens [B, T] (i32/i64, T <= context) -> logits [B, T, vocab].
  Tensor forward(const Tensor& tokens) const;
  // Mean cross-entropy of next-token prediction; targets [B, T].
  Tensor loss(const Tensor& tokens, const Tensor& targets) const;
  const GPTConfig& config() const { return config_; }

  int64_t layer_count() const override { return config_.layers + 2; }
  // Layer 0 takes tokens [B, T]; the head gives logits [B, T, vocab].
  Tensor forward_layer(int64_t layer, const Tensor& x) const override;
  Tensor layer_loss(const Tensor& logits, const Tensor& targets) const override;
  std::vector<std::string> layer_parameters(int64_t layer) const override;

 private:
  // The forward after its argument checks, run between the forward hooks.
  Tensor forward_body(const Tensor& tokens, const Tensor& positions) const;
  // Checks tokens [B, T] and gives the positions 0..T-1.
  Tensor positions_for(const Tensor& tokens) const;
  Tensor block_forward(int64_t index, const Tensor& x) const;
  Tensor head(const Tensor& x) const;

  GPTConfig config_;
  std::shared_ptr<Embedding> wte_, wpe_;
  std::shared_ptr<ModuleList<Block>> h_;
  std::shared_ptr<LayerNorm> ln_f_;
};

}  // namespace loom::nn
