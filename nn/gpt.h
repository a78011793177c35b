#pragma once
// GPT-2: pre-LayerNorm blocks (eps 1e-5), tanh GELU, learned positions, the output
// projection tied to the token embedding, no dropout, biases everywhere. Parameter names and
// layouts are those of Hugging Face GPT-2 safetensors files (see docs/architecture.md).

#include <memory>

#include <map>
#include <string>

#include "nn/causal_lm.h"
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
  // [B, T, C] -> [B, T, C]; with a cache, these are its next positions (KVCache::attend).
  Tensor forward(const Tensor& x, KVCache::Layer* cache = nullptr) const;
  // Tensor parallel (GPT::parallelize): this rank's heads only; c_attn column-parallel by
  // head, c_proj row-parallel.
  void parallelize(const TensorParallelGroup* tp);

 private:
  Tensor attend(const Tensor& x, KVCache::Layer* cache) const;  // between the forward hooks

  int64_t heads_;  // this rank's
  const TensorParallelGroup* tp_ = nullptr;
  std::shared_ptr<Linear> c_attn_, c_proj_;
};

class MLP : public Module {
 public:
  MLP(const GPTConfig& config, Generator& gen);
  Tensor forward(const Tensor& x) const;
  // Tensor parallel: c_fc column-parallel, c_proj row-parallel.
  void parallelize(const TensorParallelGroup* tp) { tp_ = tp; }

 private:
  const TensorParallelGroup* tp_ = nullptr;
  std::shared_ptr<Linear> c_fc_, c_proj_;
};

class Block : public Module {
 public:
  Block(const GPTConfig& config, Generator& gen);
  Tensor forward(const Tensor& x, KVCache::Layer* cache = nullptr) const;
  void parallelize(const TensorParallelGroup* tp);

 private:
  std::shared_ptr<LayerNorm> ln_1_, ln_2_;
  std::shared_ptr<CausalSelfAttention> attn_;
  std::shared_ptr<MLP> mlp_;
};

// As a LayeredModel: layer 0 is the embedding (wte + wpe), layers 1..L the blocks, layer L+1
// the head (ln_f and the output projection tied to wte).
class GPT : public CausalLM {
 public:
  // Initialises like GPT-2: N(0, 0.02) weights, residual projections (c_proj) scaled by
  // 1/sqrt(2 * layers), zero biases, LayerNorm weight 1. Deterministic given `seed`.
  GPT(const GPTConfig& config, uint64_t seed);
  // tokens [B, T] (i32/i64, T <= context) -> logits [B, T, vocab].
  Tensor forward(const Tensor& tokens) const override;
  Tensor forward_cached(const Tensor& tokens, KVCache& cache) const override;
  const GPTConfig& config() const { return config_; }

  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t context() const override { return config_.context; }
  int64_t blocks() const override { return config_.layers; }
  double flops_per_token(int64_t time) const override;
  std::unique_ptr<CausalLM> make_like() const override;

  // Tensor parallelism (Megatron-LM's): replaces every split parameter by this rank's part
  // (tensor_parallel_splits()) and runs the forward split: the embedding by vocabulary rows,
  // attention by heads, the MLP's first layer by columns and the projections after attention
  // and the MLP by rows, the head's logits by vocabulary with a parallel cross-entropy. The
  // group must outlive the model; loss() then needs every rank of it. Once only.
  void parallelize(std::shared_ptr<const TensorParallelGroup> tp) override;
  // How each parameter is split under parallelize() (by name; replicated ones absent).
  std::map<std::string, TensorParallelSplit> tensor_parallel_splits() const override;

  int64_t layer_count() const override { return config_.layers + 2; }
  // Layer 0 takes tokens [B, T]; the head gives ln_f's features [B, T, embd], which
  // layer_loss() projects onto the vocabulary with the loss (logits under tensor parallelism).
  Tensor forward_layer(int64_t layer, const Tensor& x) const override;
  std::vector<std::string> layer_parameters(int64_t layer) const override;

 protected:
  Tensor features(const Tensor& tokens) const override;
  Tensor classifier_loss(const Tensor& features, const Tensor& targets) const override;

 private:
  // The embedding and the blocks, after the argument checks (between the forward hooks).
  Tensor trunk(const Tensor& tokens, const Tensor& positions) const;
  // Checks tokens [B, T] and gives the positions first..first+T-1, on the model's device
  // (wpe's), wherever the tokens are: the embedding reads indices from any device, and
  // moving the positions to host tokens would make a GPU model wait for a download.
  Tensor positions_for(const Tensor& tokens, int64_t first = 0) const;
  Tensor block_forward(int64_t index, const Tensor& x) const;
  Tensor head(const Tensor& x) const;

  Tensor embed(const Tensor& tokens, const Tensor& positions) const;

  GPTConfig config_;
  Tensor positions_;  // 0..context-1, a buffer (on the model's device)
  std::shared_ptr<Embedding> wte_, wpe_;
  std::shared_ptr<ModuleList<Block>> h_;
  std::shared_ptr<LayerNorm> ln_f_;
};

}  // namespace loom::nn
