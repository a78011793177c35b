#include "nn/llama.h"

#include <cmath>

#include "tensor/autograd/function.h"
#include "tensor/ops.h"

namespace loom::nn {

namespace {
constexpr double kLlamaInitStd = 0.02;  // Hugging Face's initializer_range

// Llama's RMS norms: each feeds projections or the output head only (NormOutput).
std::shared_ptr<RMSNorm> rms_norm_before_products(const LlamaConfig& config) {
  return std::make_shared<RMSNorm>(config.hidden, config.rms_norm_eps, config.options,
                                   NormOutput::ForProducts);
}
}  // namespace

void LlamaConfig::validate() const {
  if (vocab_size <= 0 || context <= 0 || layers <= 0 || heads <= 0 || kv_heads <= 0 ||
      hidden <= 0 || intermediate <= 0 || head_dim < 0) {
    fail("LlamaConfig: vocab_size, context, layers, heads, kv_heads, hidden and intermediate must "
         "be positive (got ", vocab_size, ", ", context, ", ", layers, ", ", heads, ", ", kv_heads,
         ", ", hidden, ", ", intermediate, ")");
  }
  if (heads % kv_heads != 0) {
    fail("LlamaConfig: num_key_value_heads (", kv_heads, ") must divide num_attention_heads (",
         heads, ")");
  }
  if (head_dim == 0 && hidden % heads != 0) {
    fail("LlamaConfig: hidden_size (", hidden, ") must be divisible by num_attention_heads (",
         heads, ") unless head_dim is given");
  }
  if (attention_head_dim() % 2 != 0) {
    fail("LlamaConfig: the head dimension (", attention_head_dim(),
         ") must be even for rotary positions");
  }
  if (!(rope_theta > 0) || !(rms_norm_eps > 0)) {
    fail("LlamaConfig: rope_theta (", rope_theta, ") and rms_norm_eps (", rms_norm_eps,
         ") must be positive");
  }
}

RotaryTables rotary_tables(int64_t time, int64_t head_dim, double theta, DType dtype,
                           Device device) {
  const int64_t half = head_dim / 2;
  std::vector<float> cos(static_cast<size_t>(time * head_dim)),
      sin(static_cast<size_t>(time * head_dim));
  const auto theta_f = static_cast<float>(theta);
  for (int64_t i = 0; i < half; ++i) {
    // As Hugging Face: inv_freq = 1 / theta^(arange(0, dim, 2) / dim) in f32, then
    // position * inv_freq rounded to f32, then cos and sin in f32.
    const float inv_freq =
        1.0f / std::pow(theta_f, static_cast<float>(2 * i) / static_cast<float>(head_dim));
    for (int64_t t = 0; t < time; ++t) {
      const float angle = static_cast<float>(t) * inv_freq;
      const float c = std::cos(angle), s = std::sin(angle);
      for (int64_t j : {i, i + half}) {
        cos[static_cast<size_t>(t * head_dim + j)] = c;
        sin[static_cast<size_t>(t * head_dim + j)] = s;
      }
    }
  }
  return {Tensor::from_vector(cos, {time, head_dim}).to(dtype).to(device),
          Tensor::from_vector(sin, {time, head_dim}).to(dtype).to(device)};
}

Tensor apply_rotary(const Tensor& x, const RotaryTables& tables) {
  // One pass each way (tensor/ops.h); the tables are read in x's dtype, as Hugging Face's
  // cos.to(x.dtype): a 16-bit q or k (16-bit weights, autocast) rotates in 16 bits.
  return rotary_embedding(x, tables.cos, tables.sin);
}

LlamaAttention::LlamaAttention(const LlamaConfig& config, Generator& gen)
    : heads_(config.heads), kv_heads_(config.kv_heads), head_dim_(config.attention_head_dim()) {
  const int64_t q_width = config.heads * head_dim_, kv_width = config.kv_heads * head_dim_;
  auto projection = [&](const char* name, int64_t in, int64_t out) {
    return register_module(
        name, std::make_shared<LinearNoBias>(in, out, gen, kLlamaInitStd, config.options));
  };
  q_proj_ = projection("q_proj", config.hidden, q_width);
  k_proj_ = projection("k_proj", config.hidden, kv_width);
  v_proj_ = projection("v_proj", config.hidden, kv_width);
  o_proj_ = projection("o_proj", q_width, config.hidden);
}

void LlamaAttention::parallelize(const TensorParallelGroup* tp, bool replicate_kv) {
  const int64_t n = tp->size();
  if (replicate_kv) {  // rank r's query heads all read key/value head r / (n / kv_heads)
    kv_head_ = tp->rank() / (n / kv_heads_);
    kv_heads_ = 1;
  } else {
    kv_heads_ /= n;
  }
  heads_ /= n;
  tp_ = tp;
}

Tensor LlamaAttention::forward(const Tensor& x, const RotaryTables& rotary,
                               KVCache::Layer* cache) const {
  return run_forward([&] {
    const Tensor in = tp_ != nullptr ? tp_->copy_in(x) : x;
    const int64_t batch = in.size(0), time = in.size(1);
    auto heads_of = [&](const Tensor& t, int64_t heads) {  // [B, T, H*D] -> [B, H, T, D]
      return t.reshape({batch, time, heads, head_dim_}).permute({0, 2, 1, 3});
    };
    // A replicated key/value projection: this rank's head's rows, the whole weight's
    // gradient summed over the group (each rank's covers its head's rows).
    auto kv_projection = [&](const LinearNoBias& proj) {
      if (kv_head_ < 0) return proj.forward(in);
      const Tensor rows = gradient_summed_over_group(proj.weight(), *tp_)
                              .narrow(0, kv_head_ * head_dim_, head_dim_);
      return matmul(in, transpose(rows, 0, 1));
    };
    Tensor q = apply_rotary(heads_of(q_proj_->forward(in), heads_), rotary);
    Tensor k = apply_rotary(heads_of(kv_projection(*k_proj_), kv_heads_), rotary);
    Tensor v = heads_of(kv_projection(*v_proj_), kv_heads_);
    // GQA: each key/value head serves heads / kv_heads queries. causal_attention takes the
    // grouped heads as they are; the cache's one-token step wants them repeated.
    if (cache && kv_heads_ != heads_) {
      const int64_t group = heads_ / kv_heads_;
      auto repeat = [&](const Tensor& t) {
        return t.reshape({batch, kv_heads_, 1, time, head_dim_})
            .expand({batch, kv_heads_, group, time, head_dim_})
            .reshape({batch, heads_, time, head_dim_});
      };
      k = repeat(k);
      v = repeat(v.contiguous());
    }
    Tensor y = cache ? KVCache::attend(*cache, q, k, v) : causal_attention(q, k, v);
    y = y.permute({0, 2, 1, 3}).reshape({batch, time, heads_ * head_dim_});
    if (tp_ == nullptr) return o_proj_->forward(y);
    return tp_->reduce_out(matmul(y, transpose(o_proj_->weight(), 0, 1)));  // row-parallel
  });
}

LlamaMLP::LlamaMLP(const LlamaConfig& config, Generator& gen) {
  auto projection = [&](const char* name, int64_t in, int64_t out) {
    return register_module(
        name, std::make_shared<LinearNoBias>(in, out, gen, kLlamaInitStd, config.options));
  };
  gate_proj_ = projection("gate_proj", config.hidden, config.intermediate);
  up_proj_ = projection("up_proj", config.hidden, config.intermediate);
  down_proj_ = projection("down_proj", config.intermediate, config.hidden);
}

Tensor LlamaMLP::forward(const Tensor& x) const {
  return run_forward([&] {
    const Tensor in = tp_ != nullptr ? tp_->copy_in(x) : x;
    Tensor h = swiglu(gate_proj_->forward(in), up_proj_->forward(in));
    if (tp_ == nullptr) return down_proj_->forward(h);
    return tp_->reduce_out(matmul(h, transpose(down_proj_->weight(), 0, 1)));  // row-parallel
  });
}

LlamaDecoderLayer::LlamaDecoderLayer(const LlamaConfig& config, Generator& gen) {
  input_layernorm_ = register_module("input_layernorm", rms_norm_before_products(config));
  self_attn_ = register_module("self_attn", std::make_shared<LlamaAttention>(config, gen));
  post_attention_layernorm_ =
      register_module("post_attention_layernorm", rms_norm_before_products(config));
  mlp_ = register_module("mlp", std::make_shared<LlamaMLP>(config, gen));
}

void LlamaDecoderLayer::parallelize(const TensorParallelGroup* tp, bool replicate_kv) {
  self_attn_->parallelize(tp, replicate_kv);
  mlp_->parallelize(tp);
}

Tensor LlamaDecoderLayer::forward(const Tensor& x, const RotaryTables& rotary,
                                  KVCache::Layer* cache) const {
  return run_forward([&] {
    const AddNorm in = input_layernorm_->forward_keeping_stream(x);
    AddNorm h = post_attention_layernorm_->forward_after_add(
        in.sum, self_attn_->forward(in.normed, rotary, cache));
    return add(h.sum, mlp_->forward(h.normed));
  });
}

LlamaModel::LlamaModel(const LlamaConfig& config, Generator& gen) {
  embed_tokens_ = register_module(
      "embed_tokens", std::make_shared<Embedding>(config.vocab_size, config.hidden, gen,
                                                  kLlamaInitStd, config.options));
  layers_ = register_module("layers", std::make_shared<ModuleList<LlamaDecoderLayer>>());
  for (int64_t i = 0; i < config.layers; ++i)
    layers_->push_back(std::make_shared<LlamaDecoderLayer>(config, gen));
  norm_ = register_module("norm", rms_norm_before_products(config));
}

Llama::Llama(const LlamaConfig& config, uint64_t seed) : config_(config) {
  config.validate();
  Generator gen(seed);
  model_ = register_module("model", std::make_shared<LlamaModel>(config, gen));
  if (config.tie_embeddings) {
    declare_parameter_use(model_->embed_tokens()->weight());  // the tied head in forward()
  } else {
    lm_head_ = register_module(
        "lm_head", std::make_shared<LinearNoBias>(config.hidden, config.vocab_size, gen,
                                                  kLlamaInitStd, config.options));
  }
  rotary_ = rotary_tables(config.context, config.attention_head_dim(), config.rope_theta,
                          config.options.dtype, config.options.device);
  register_buffer(rotary_.cos);  // moved with the parameters
  register_buffer(rotary_.sin);
}

double Llama::flops_per_token(int64_t time) const {
  return 6.0 * static_cast<double>(parameter_count()) +
         12.0 * static_cast<double>(config_.layers * config_.heads * config_.attention_head_dim() *
                                    time);
}

std::unique_ptr<CausalLM> Llama::make_like() const {
  return std::make_unique<Llama>(config_, 0);
}

void Llama::check_tokens(const Tensor& tokens, int64_t first) const {
  if (tokens.dim() != 2)
    fail("Llama::forward: expected tokens [B, T], got ", shape_str(tokens.shape()));
  if (first + tokens.size(1) > config_.context) {
    fail("Llama::forward: sequence length ", first + tokens.size(1),
         " exceeds the model's context (max_position_embeddings) of ", config_.context);
  }
}

RotaryTables Llama::rotary(int64_t time, Device device, int64_t first) const {
  RotaryTables t{rotary_.cos.narrow(0, first, time), rotary_.sin.narrow(0, first, time)};
  if (t.cos.device() != device) t = {t.cos.to(device), t.sin.to(device)};
  return t;
}

const Tensor& Llama::output_weight() const {
  return lm_head_ ? lm_head_->weight() : model_->embed_tokens()->weight();
}

Tensor Llama::embed(const Tensor& tokens) const {
  check_tokens(tokens);
  if (!tp_) return model_->embed_tokens()->forward(tokens);
  if (tp_->sequence_parallel() && tokens.size(1) % tp_->size() != 0) {
    fail("Llama: sequence parallelism over ", tp_->size(),
         " ranks needs a sequence length they divide, got ", tokens.size(1));
  }
  // Every position's row comes from the one rank that holds it; the others add zeros (with
  // sequence parallelism the sum is scattered: this rank's positions only).
  return tp_->reduce_out(
      embedding_part(tokens, model_->embed_tokens()->weight(), vocab_first()));
}

Tensor Llama::layer_forward(int64_t index, const Tensor& x) const {
  const std::shared_ptr<LlamaDecoderLayer> layer = *(model_->layers()->begin() + index);
  // Attention sees the whole sequence (gathered first under sequence parallelism).
  const int64_t time =
      tp_ && tp_->sequence_parallel() ? x.size(1) * tp_->size() : x.size(1);
  const RotaryTables tables = rotary(time, x.device());
  if (!config_.checkpoint_activations) return layer->forward(x, tables);
  return autograd::checkpoint(
      [layer, tables](const std::vector<Tensor>& in) {
        return std::vector<Tensor>{layer->forward(in[0], tables)};
      },
      {x})[0];
}

Tensor Llama::head(const Tensor& x) const {
  Tensor normed = model_->norm()->forward_ending_stream(x);
  // Through lm_head's own forward where it runs whole, so that a sharded strategy's hook on
  // it gathers its weight.
  if (lm_head_ && !tp_) return lm_head_->forward(normed);
  if (tp_) normed = tp_->copy_in(normed);  // then this rank's vocabulary rows of the logits
  return matmul(normed, transpose(output_weight(), 0, 1));
}

Tensor Llama::trunk(const Tensor& tokens) const {
  Tensor x = embed(tokens);
  for (int64_t i = 0; i < config_.layers; ++i)
    x = layer_forward(i, x);
  return x;
}

Tensor Llama::forward(const Tensor& tokens) const {
  return run_forward([&] { return head(trunk(tokens)); });
}

Tensor Llama::features(const Tensor& tokens) const {
  return model_->norm()->forward_ending_stream(trunk(tokens));
}

Tensor Llama::classifier_loss(const Tensor& features, const Tensor& targets) const {
  const Tensor rows = features.reshape({-1, config_.hidden});
  // Through lm_head's own hook where it runs whole (see head()).
  if (lm_head_) return lm_head_->loss(rows, targets.reshape({-1}));
  return linear_cross_entropy(rows, output_weight(), targets.reshape({-1}));
}

Tensor Llama::forward_cached(const Tensor& tokens, KVCache& cache) const {
  if (tp_) fail("Llama::forward_cached: not under tensor parallelism");
  check_tokens(tokens, cache.length);
  cache.layers.resize(static_cast<size_t>(config_.layers));
  Tensor x = model_->embed_tokens()->forward(tokens);
  const RotaryTables tables = rotary(tokens.size(1), x.device(), cache.length);
  for (int64_t i = 0; i < config_.layers; ++i) {
    x = (*(model_->layers()->begin() + i))
            ->forward(x, tables, &cache.layers[static_cast<size_t>(i)]);
  }
  cache.length += tokens.size(1);
  return head(x);
}

void Llama::parallelize(std::shared_ptr<const TensorParallelGroup> tp) {
  if (tp_) fail("Llama::parallelize: the model is already tensor parallel");
  const int n = tp->size();
  const bool replicate_kv = config_.kv_heads % n != 0;
  if (config_.heads % n != 0 || config_.intermediate % n != 0 || config_.vocab_size % n != 0 ||
      (replicate_kv && n % config_.kv_heads != 0)) {
    fail("Llama::parallelize: --tp ", n, " must divide the attention heads (", config_.heads,
         "), the intermediate size (", config_.intermediate, ") and the vocabulary (",
         config_.vocab_size, "), and divide the key/value heads (", config_.kv_heads,
         ") or be a multiple of them (then they are replicated)");
  }
  kv_replicated_ = replicate_kv;
  NoGradGuard no_grad;
  const auto splits = tensor_parallel_splits();
  for (const auto& [name, p] : named_parameters()) {
    auto found = splits.find(name);
    if (found != splits.end()) p.set_data(take_split(p.detach(), found->second, tp->rank(), n));
  }
  for (const auto& layer : *model_->layers())
    layer->parallelize(tp.get(), replicate_kv);
  tp_ = std::move(tp);
}

std::map<std::string, TensorParallelSplit> Llama::tensor_parallel_splits() const {
  std::map<std::string, TensorParallelSplit> splits{{"model.embed_tokens.weight", {0, 1}}};
  if (lm_head_) splits["lm_head.weight"] = {0, 1};
  for (int64_t i = 0; i < config_.layers; ++i) {
    const std::string layer = "model.layers." + std::to_string(i) + ".";
    for (const char* column : {"self_attn.q_proj", "mlp.gate_proj", "mlp.up_proj"})
      splits[layer + column + ".weight"] = {0, 1};  // output rows: heads, or MLP columns
    if (!kv_replicated_) {
      splits[layer + "self_attn.k_proj.weight"] = {0, 1};
      splits[layer + "self_attn.v_proj.weight"] = {0, 1};
    }
    splits[layer + "self_attn.o_proj.weight"] = {1, 1};  // input columns
    splits[layer + "mlp.down_proj.weight"] = {1, 1};
  }
  return splits;
}

Tensor Llama::forward_layer(int64_t layer, const Tensor& x) const {
  if (layer < 0 || layer >= layer_count())
    fail("Llama::forward_layer: layer ", layer, " of ", layer_count());
  if (layer == 0) return embed(x);
  if (layer <= config_.layers) return layer_forward(layer - 1, x);
  return tp_ ? head(x) : model_->norm()->forward_ending_stream(x);
}

std::vector<std::string> Llama::layer_parameters(int64_t layer) const {
  if (layer < 0 || layer >= layer_count())
    fail("Llama::layer_parameters: layer ", layer, " of ", layer_count());
  std::vector<std::string> prefixes;
  if (layer == 0) prefixes = {"model.embed_tokens."};
  else if (layer <= config_.layers) prefixes = {"model.layers." + std::to_string(layer - 1) + "."};
  else prefixes = {"model.norm.", lm_head_ ? "lm_head." : "model.embed_tokens."};
  return parameters_named(prefixes);
}

}  // namespace loom::nn
