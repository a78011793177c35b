#include "nn/gpt.h"

#include <cmath>

#include "tensor/autograd/function.h"
#include "tensor/ops.h"

namespace loom::nn {

namespace {
constexpr double kInitStd = 0.02;
constexpr double kLayerNormEps = 1e-5;

// GPT-2's layer norms: each feeds a projection or the output head only (NormOutput).
std::shared_ptr<LayerNorm> layer_norm_before_products(const GPTConfig& config) {
  return std::make_shared<LayerNorm>(config.embd, kLayerNormEps, config.options,
                                     NormOutput::ForProducts);
}
}  // namespace

void GPTConfig::validate() const {
  if (vocab_size <= 0 || context <= 0 || layers <= 0 || heads <= 0 || embd <= 0) {
    fail("GPTConfig: vocab_size, context, layers, heads and embd must be positive (got ",
         vocab_size, ", ", context, ", ", layers, ", ", heads, ", ", embd, ")");
  }
  if (embd % heads != 0) {
    fail("GPTConfig: embd (", embd, ") must be divisible by heads (", heads, ")");
  }
}

CausalSelfAttention::CausalSelfAttention(const GPTConfig& config, Generator& gen)
    : heads_(config.heads) {
  double proj_std = kInitStd / std::sqrt(2.0 * static_cast<double>(config.layers));
  c_attn_ = register_module("c_attn", std::make_shared<Linear>(config.embd, 3 * config.embd, gen,
                                                               kInitStd, config.options));
  c_proj_ = register_module(
      "c_proj", std::make_shared<Linear>(config.embd, config.embd, gen, proj_std, config.options));
}

Tensor CausalSelfAttention::forward(const Tensor& x, KVCache::Layer* cache) const {
  return run_forward([&] { return attend(x, cache); });
}

void CausalSelfAttention::parallelize(const TensorParallelGroup* tp) {
  heads_ /= tp->size();
  tp_ = tp;
}

Tensor CausalSelfAttention::attend(const Tensor& x, KVCache::Layer* cache) const {
  // Under tensor parallelism the input enters the group (the whole sequence, when sequence
  // parallel) and this rank's width is its heads' share.
  const Tensor in = tp_ != nullptr ? tp_->copy_in(x) : x;
  int64_t batch = in.size(0), time = in.size(1);
  const int64_t width = tp_ != nullptr ? in.size(2) / tp_->size() : in.size(2);
  // q, k, v are the three column blocks of c_attn's output, read where they are; training
  // attends to the packed projection, whose gradient the kernel writes as one tensor.
  Tensor y;
  if (cache == nullptr) {
    y = causal_attention_packed(c_attn_->forward(in), heads_);
  } else {
    std::vector<Tensor> qkv = split(c_attn_->forward(in), {width, width, width}, -1);
    auto heads_view = [&](const Tensor& t) {
      return t.reshape({batch, time, heads_, width / heads_}).permute({0, 2, 1, 3});
    };
    y = KVCache::attend(*cache, heads_view(qkv[0]), heads_view(qkv[1]), heads_view(qkv[2]))
            .permute({0, 2, 1, 3})
            .reshape({batch, time, width});
  }
  if (tp_ == nullptr) return c_proj_->forward(y);
  // Row-parallel: the heads' partial sums, summed over the group, then the bias once.
  return add(tp_->reduce_out(matmul(y, c_proj_->weight())), c_proj_->bias());
}

MLP::MLP(const GPTConfig& config, Generator& gen) {
  double proj_std = kInitStd / std::sqrt(2.0 * static_cast<double>(config.layers));
  c_fc_ = register_module("c_fc", std::make_shared<Linear>(config.embd, 4 * config.embd, gen,
                                                           kInitStd, config.options));
  c_proj_ = register_module("c_proj", std::make_shared<Linear>(4 * config.embd, config.embd, gen,
                                                               proj_std, config.options));
}

Tensor MLP::forward(const Tensor& x) const {
  return run_forward([&] {
    if (tp_ == nullptr) return c_proj_->forward_after_gelu(c_fc_->forward_gelu(x));
    const GeluOutput h = c_fc_->forward_gelu(tp_->copy_in(x));
    return add(tp_->reduce_out(linear_after_gelu(h, c_proj_->weight(), Tensor())), c_proj_->bias());
  });
}

Block::Block(const GPTConfig& config, Generator& gen) {
  ln_1_ = register_module("ln_1", layer_norm_before_products(config));
  attn_ = register_module("attn", std::make_shared<CausalSelfAttention>(config, gen));
  ln_2_ = register_module("ln_2", layer_norm_before_products(config));
  mlp_ = register_module("mlp", std::make_shared<MLP>(config, gen));
}

void Block::parallelize(const TensorParallelGroup* tp) {
  attn_->parallelize(tp);
  mlp_->parallelize(tp);
}

Tensor Block::forward(const Tensor& x, KVCache::Layer* cache) const {
  return run_forward([&] {
    const AddNorm in = ln_1_->forward_keeping_stream(x);
    AddNorm h = ln_2_->forward_after_add(in.sum, attn_->forward(in.normed, cache));
    return add(h.sum, mlp_->forward(h.normed));
  });
}

GPT::GPT(const GPTConfig& config, uint64_t seed) : config_(config) {
  config.validate();
  Generator gen(seed);
  wte_ = register_module("wte", std::make_shared<Embedding>(config.vocab_size, config.embd, gen,
                                                            kInitStd, config.options));
  wpe_ = register_module("wpe", std::make_shared<Embedding>(config.context, config.embd, gen,
                                                            kInitStd, config.options));
  h_ = register_module("h", std::make_shared<ModuleList<Block>>());
  for (int64_t i = 0; i < config.layers; ++i)
    h_->push_back(std::make_shared<Block>(config, gen));
  ln_f_ = register_module("ln_f", layer_norm_before_products(config));
  declare_parameter_use(wte_->weight());  // the tied output projection in forward()
  std::vector<int64_t> positions(static_cast<size_t>(config.context));
  for (int64_t t = 0; t < config.context; ++t)
    positions[static_cast<size_t>(t)] = t;
  positions_ =
      register_buffer(Tensor::from_vector(positions, {config.context}, config.options.device));
}

Tensor GPT::positions_for(const Tensor& tokens, int64_t first) const {
  if (tokens.dim() != 2)
    fail("GPT::forward: expected tokens [B, T], got ", shape_str(tokens.shape()));
  int64_t time = tokens.size(1);
  if (first + time > config_.context) {
    fail("GPT::forward: sequence length ", first + time, " exceeds the model's context of ",
         config_.context);
  }
  return positions_.narrow(0, first, time);
}

Tensor GPT::forward(const Tensor& tokens) const {
  Tensor pos = positions_for(tokens);
  return run_forward([&] { return head(trunk(tokens, pos)); });
}

Tensor GPT::forward_cached(const Tensor& tokens, KVCache& cache) const {
  if (tp_) fail("GPT::forward_cached: not under tensor parallelism");
  Tensor pos = positions_for(tokens, cache.length);
  cache.layers.resize(static_cast<size_t>(config_.layers));
  Tensor x = embed(tokens, pos);
  for (int64_t i = 0; i < config_.layers; ++i)
    x = (*(h_->begin() + i))->forward(x, &cache.layers[static_cast<size_t>(i)]);
  cache.length += tokens.size(1);
  return head(x);
}

Tensor GPT::block_forward(int64_t index, const Tensor& x) const {
  const std::shared_ptr<Block> block = *(h_->begin() + index);
  if (!config_.checkpoint_activations) return block->forward(x);
  return autograd::checkpoint(
      [block](const std::vector<Tensor>& in) { return std::vector<Tensor>{block->forward(in[0])}; },
      {x})[0];
}

Tensor GPT::head(const Tensor& x) const {
  Tensor normed = ln_f_->forward_ending_stream(x);
  if (tp_) normed = tp_->copy_in(normed);  // then this rank's vocabulary rows of the logits
  return matmul(normed, transpose(wte_->weight(), 0, 1));  // tied output projection
}

Tensor GPT::embed(const Tensor& tokens, const Tensor& pos) const {
  if (!tp_) return add(wte_->forward(tokens), wpe_->forward(pos));
  // Every position's row comes from the one rank that holds it; the others add zeros.
  Tensor rows = tp_->reduce_out(embedding_part(tokens, wte_->weight(), vocab_first()));
  if (!tp_->sequence_parallel()) return add(rows, wpe_->forward(pos));
  // Sequence parallel: this rank's positions only.
  const int64_t time = pos.size(0), n = tp_->size();
  if (time % n != 0) {
    fail("GPT: sequence parallelism over ", n, " ranks needs a sequence length they divide, got ",
         time);
  }
  return add(rows, wpe_->forward(pos.narrow(0, time / n * tp_->rank(), time / n).contiguous()));
}

void GPT::parallelize(std::shared_ptr<const TensorParallelGroup> tp) {
  if (tp_) fail("GPT::parallelize: the model is already tensor parallel");
  const int n = tp->size();
  if (config_.heads % n != 0 || config_.vocab_size % n != 0) {
    fail("GPT::parallelize: --tp ", n, " must divide the heads (", config_.heads,
         ") and the vocabulary (", config_.vocab_size, ")");
  }
  NoGradGuard no_grad;
  const auto splits = tensor_parallel_splits();
  for (const auto& [name, p] : named_parameters()) {
    auto found = splits.find(name);
    if (found != splits.end()) p.set_data(take_split(p.detach(), found->second, tp->rank(), n));
  }
  for (const auto& block : *h_)
    block->parallelize(tp.get());
  tp_ = std::move(tp);
}

std::map<std::string, TensorParallelSplit> GPT::tensor_parallel_splits() const {
  std::map<std::string, TensorParallelSplit> splits{{"wte.weight", {0, 1}}};
  for (int64_t i = 0; i < config_.layers; ++i) {
    const std::string block = "h." + std::to_string(i) + ".";
    splits[block + "attn.c_attn.weight"] = {1, 3};  // q, k and v columns, by head
    splits[block + "attn.c_attn.bias"] = {0, 3};
    splits[block + "attn.c_proj.weight"] = {0, 1};  // rows: the heads' outputs
    splits[block + "mlp.c_fc.weight"] = {1, 1};
    splits[block + "mlp.c_fc.bias"] = {0, 1};
    splits[block + "mlp.c_proj.weight"] = {0, 1};
  }
  return splits;
}

Tensor GPT::trunk(const Tensor& tokens, const Tensor& pos) const {
  Tensor x = embed(tokens, pos);
  for (int64_t i = 0; i < config_.layers; ++i)
    x = block_forward(i, x);
  return x;
}

Tensor GPT::features(const Tensor& tokens) const {
  return ln_f_->forward_ending_stream(trunk(tokens, positions_for(tokens)));
}

Tensor GPT::classifier_loss(const Tensor& features, const Tensor& targets) const {
  return linear_cross_entropy(features.reshape({-1, config_.embd}), wte_->weight(),
                              targets.reshape({-1}));
}

Tensor GPT::forward_layer(int64_t layer, const Tensor& x) const {
  if (layer < 0 || layer >= layer_count())
    fail("GPT::forward_layer: layer ", layer, " of ", layer_count());
  if (layer == 0) return embed(x, positions_for(x));
  if (layer <= config_.layers) return block_forward(layer - 1, x);
  return tp_ ? head(x) : ln_f_->forward_ending_stream(x);
}

std::vector<std::string> GPT::layer_parameters(int64_t layer) const {
  if (layer < 0 || layer >= layer_count())
    fail("GPT::layer_parameters: layer ", layer, " of ", layer_count());
  std::vector<std::string> prefixes;
  if (layer == 0) prefixes = {"wte.", "wpe."};
  else if (layer <= config_.layers) prefixes = {"h." + std::to_string(layer - 1) + "."};
  else prefixes = {"ln_f.", "wte."};
  return parameters_named(prefixes);
}

double GPT::flops_per_token(int64_t time) const {
  return 6.0 * static_cast<double>(parameter_count()) +
         12.0 * static_cast<double>(config_.layers * config_.embd * time);
}

std::unique_ptr<CausalLM> GPT::make_like() const {
  return std::make_unique<GPT>(config_, 0);
}

}  // namespace loom::nn
