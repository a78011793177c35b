#pragma once
// Llama (Hugging Face's LlamaForCausalLM, and the models of its family: SmolLM, Llama 2/3
// without rope scaling, TinyLlama): pre-norm decoder layers with RMSNorm, rotary positions
// (rope_theta, Hugging Face's rotate-half layout), grouped-query attention (kv_heads <= heads:
// GQA, MQA at 1), a SwiGLU MLP, no biases, no dropout, the output projection lm_head or, with
// tie_embeddings, the token embedding. Parameter names, shapes and initialisation
// (N(0, 0.02), RMSNorm weights 1) are Hugging Face's:
//   model.embed_tokens.weight                    [vocab, hidden]
//   model.layers.N.input_layernorm.weight        [hidden]
//   model.layers.N.self_attn.{q,k,v,o}_proj.weight  q [heads*head_dim, hidden],
//                                                k, v [kv_heads*head_dim, hidden],
//                                                o [hidden, heads*head_dim]
//   model.layers.N.post_attention_layernorm.weight [hidden]
//   model.layers.N.mlp.{gate,up,down}_proj.weight  gate, up [intermediate, hidden],
//                                                down [hidden, intermediate]
//   model.norm.weight                            [hidden]
//   lm_head.weight                               [vocab, hidden] (absent when tied)

#include <map>
#include <memory>
#include <string>

#include "nn/causal_lm.h"
#include "nn/layers.h"

namespace loom::nn {

struct LlamaConfig {
  int64_t vocab_size = 256;
  int64_t context = 128;  // max_position_embeddings
  int64_t layers = 4;     // num_hidden_layers
  int64_t heads = 4;      // num_attention_heads
  int64_t kv_heads = 2;   // num_key_value_heads: divides heads
  int64_t hidden = 128;   // hidden_size
  int64_t intermediate = 344;  // intermediate_size
  int64_t head_dim = 0;   // 0: hidden / heads (Hugging Face's default)
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-5;
  bool tie_embeddings = false;  // tie_word_embeddings
  bool checkpoint_activations = false;  // recompute each decoder layer in backward
  Options options;

  int64_t attention_head_dim() const { return head_dim > 0 ? head_dim : hidden / heads; }
  // Throws loom::Error describing the first inconsistency (kv_heads not dividing heads, ...).
  void validate() const;
};

// The rotary tables of positions 0..time-1: cos and sin [time, head_dim], each row
// cat(freqs, freqs) with freqs[i] = position * theta^(-2i / head_dim), computed in f32 as
// Hugging Face's LlamaRotaryEmbedding does, then converted to `dtype` (the model's).
struct RotaryTables {
  Tensor cos, sin;
};
RotaryTables rotary_tables(int64_t time, int64_t head_dim, double theta, DType dtype,
                           Device device);
// x * cos + rotate_half(x) * sin for x [B, H, T, D], rotate_half(x) = cat(-x2, x1) with x1, x2
// the halves of the last dimension (Hugging Face's apply_rotary_pos_emb).
Tensor apply_rotary(const Tensor& x, const RotaryTables& tables);

class LlamaAttention : public Module {
 public:
  LlamaAttention(const LlamaConfig& config, Generator& gen);
  // [B, T, hidden]; rotary holds the rows of x's positions; with a cache, these are its next
  // positions (KVCache::attend).
  Tensor forward(const Tensor& x, const RotaryTables& rotary,
                 KVCache::Layer* cache = nullptr) const;
  // Tensor parallel: this rank's query and key/value heads (q, k, v column-parallel by head,
  // o_proj row-parallel). With replicate_kv (the group larger than the key/value heads, a
  // multiple of them), k_proj and v_proj stay whole on every rank and each rank uses the one
  // key/value head its query heads read, their gradients summed over the group.
  void parallelize(const TensorParallelGroup* tp, bool replicate_kv);

 private:
  int64_t heads_, kv_heads_, head_dim_;  // heads this rank's
  int64_t kv_head_ = -1;                 // with replicated key/value heads: the one used here
  const TensorParallelGroup* tp_ = nullptr;
  std::shared_ptr<LinearNoBias> q_proj_, k_proj_, v_proj_, o_proj_;
};

class LlamaMLP : public Module {
 public:
  LlamaMLP(const LlamaConfig& config, Generator& gen);
  // down_proj(silu(gate_proj(x)) * up_proj(x)).
  Tensor forward(const Tensor& x) const;
  // Tensor parallel: gate and up column-parallel, down row-parallel.
  void parallelize(const TensorParallelGroup* tp) { tp_ = tp; }

 private:
  const TensorParallelGroup* tp_ = nullptr;
  std::shared_ptr<LinearNoBias> gate_proj_, up_proj_, down_proj_;
};

class LlamaDecoderLayer : public Module {
 public:
  LlamaDecoderLayer(const LlamaConfig& config, Generator& gen);
  Tensor forward(const Tensor& x, const RotaryTables& rotary,
                 KVCache::Layer* cache = nullptr) const;
  void parallelize(const TensorParallelGroup* tp, bool replicate_kv);

 private:
  std::shared_ptr<RMSNorm> input_layernorm_, post_attention_layernorm_;
  std::shared_ptr<LlamaAttention> self_attn_;
  std::shared_ptr<LlamaMLP> mlp_;
};

// Hugging Face's LlamaModel: the embedding, the decoder layers and the final norm (the
// "model." prefix of every name but lm_head's).
class LlamaModel : public Module {
 public:
  LlamaModel(const LlamaConfig& config, Generator& gen);
  const std::shared_ptr<Embedding>& embed_tokens() const { return embed_tokens_; }
  const std::shared_ptr<ModuleList<LlamaDecoderLayer>>& layers() const { return layers_; }
  const std::shared_ptr<RMSNorm>& norm() const { return norm_; }

 private:
  std::shared_ptr<Embedding> embed_tokens_;
  std::shared_ptr<ModuleList<LlamaDecoderLayer>> layers_;
  std::shared_ptr<RMSNorm> norm_;
};

// As a LayeredModel: layer 0 is the embedding, layers 1..L the decoder layers, layer L+1 the
// head (the final norm and lm_head).
class Llama : public CausalLM {
 public:
  // Initialises as Hugging Face does; deterministic given `seed`.
  Llama(const LlamaConfig& config, uint64_t seed);
  Tensor forward(const Tensor& tokens) const override;
  Tensor forward_cached(const Tensor& tokens, KVCache& cache) const override;
  const LlamaConfig& config() const { return config_; }

  int64_t vocab_size() const override { return config_.vocab_size; }
  int64_t context() const override { return config_.context; }
  int64_t blocks() const override { return config_.layers; }
  double flops_per_token(int64_t time) const override;
  std::unique_ptr<CausalLM> make_like() const override;

  // Tensor parallelism as GPT's (nn/gpt.h): embedding and lm_head by vocabulary rows, q/k/v
  // and gate/up by output rows (heads), o_proj and down_proj by input columns. --tp must
  // divide the heads, the intermediate size and the vocabulary, and divide the key/value
  // heads or be a multiple of them: then k_proj and v_proj are replicated, each rank using
  // the key/value head of its query heads (as Megatron-LM replicates key/value heads).
  void parallelize(std::shared_ptr<const TensorParallelGroup> tp) override;
  std::map<std::string, TensorParallelSplit> tensor_parallel_splits() const override;

  int64_t layer_count() const override { return config_.layers + 2; }
  // The head's output is the final norm's features (logits under tensor parallelism), as
  // GPT's.
  Tensor forward_layer(int64_t layer, const Tensor& x) const override;
  std::vector<std::string> layer_parameters(int64_t layer) const override;

 protected:
  Tensor features(const Tensor& tokens) const override;
  Tensor classifier_loss(const Tensor& features, const Tensor& targets) const override;

 private:
  Tensor trunk(const Tensor& tokens) const;  // the embedding and the decoder layers
  // Checks tokens [B, T] at positions first.. against the context.
  void check_tokens(const Tensor& tokens, int64_t first = 0) const;
  // The rotary tables of positions first..first+time-1 on `device` (views of the whole
  // context's, made once; copied when the model has moved to another device since), in the
  // model's dtype: rotary_embedding reads them in q's and k's dtype (autocast's while it is
  // on), with no cast of its own.
  RotaryTables rotary(int64_t time, Device device, int64_t first = 0) const;
  Tensor embed(const Tensor& tokens) const;
  Tensor layer_forward(int64_t index, const Tensor& x) const;
  Tensor head(const Tensor& x) const;
  const Tensor& output_weight() const;  // lm_head's, or the embedding's when tied

  LlamaConfig config_;
  std::shared_ptr<LlamaModel> model_;
  std::shared_ptr<LinearNoBias> lm_head_;  // null when tied
  bool kv_replicated_ = false;             // under tensor parallelism (parallelize)
  RotaryTables rotary_;  // positions 0..context-1
};

}  // namespace loom::nn
