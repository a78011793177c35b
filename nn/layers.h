#pragma once
// The basic layers. Parameter names and layouts follow Hugging Face checkpoints: Linear stores
// weight as [in, out] (GPT-2's Conv1D), so y = x @ weight + bias; LinearNoBias as [out, in]
// (torch.nn.Linear, Llama's).

#include "nn/module.h"
#include "tensor/ops.h"
#include "tensor/random.h"

namespace loom::nn {

struct Options {
  DType dtype = DType::F32;
  Device device = Device::cpu();
};

class Linear : public Module {
 public:
  // weight ~ N(0, init_std), bias = 0.
  Linear(int64_t in_features, int64_t out_features, Generator& gen, double init_std = 0.02,
         const Options& options = {});
  Tensor forward(const Tensor& x) const;
  // gelu(forward(x)) in the fewest passes the device has, as linear_gelu_keeping_input, between
  // the forward hooks, which see the tensor the gradient flows through (GELU's input where it is
  // kept, else the output): GPT-2's MLP's first layer, whose result the second reads with
  // forward_after_gelu (or, split over a tensor-parallel group, linear_after_gelu without a bias).
  GeluOutput forward_gelu(const Tensor& x) const;
  // linear_after_gelu(gelu, weight, bias) between the forward hooks.
  Tensor forward_after_gelu(const GeluOutput& gelu) const;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  Tensor weight_, bias_;
};

class Embedding : public Module {
 public:
  // weight ~ N(0, init_std).
  Embedding(int64_t count, int64_t width, Generator& gen, double init_std = 0.02,
            const Options& options = {});
  Tensor forward(const Tensor& indices) const;
  const Tensor& weight() const { return weight_; }

 private:
  Tensor weight_;
};

// What reads a norm's output. Any: any op, so under autocast it is f32 (autocast's f32 list,
// PyTorch's). ForProducts: only matmul, linear and attention, which autocast casts to its low
// dtype first, so under autocast the norm writes that dtype itself (layer_norm's out_dtype):
// the same values and gradients as the f32 output and the casts, without a pass each way.
// The transformers' norms before their projections and output head are of this kind; under
// tensor parallelism the gradient that returns through the column-parallel layers' input is
// then reduced in 16 bits, as Megatron-LM's.
enum class NormOutput { Any, ForProducts };

class LayerNorm : public Module {
 public:
  explicit LayerNorm(int64_t width, double eps = 1e-5, const Options& options = {},
                     NormOutput output = NormOutput::Any);
  Tensor forward(const Tensor& x) const;
  // {x + residual, forward(x + residual)} in one pass (add_layer_norm), between the forward
  // hooks, which see the normalised output: a pre-LN block's residual add and the norm after.
  AddNorm forward_after_add(const Tensor& x, const Tensor& residual) const;
  // {x, forward(x)} where x also continues as the residual stream (layer_norm_keeping_stream):
  // a pre-LN block's first norm, whose backward takes the stream's gradient too. Between the
  // forward hooks, which see the normalised output.
  AddNorm forward_keeping_stream(const Tensor& x) const;
  // forward(x) where the residual stream ends (layer_norm_ending_stream): a model's final norm.
  Tensor forward_ending_stream(const Tensor& x) const;

 private:
  Tensor weight_, bias_;
  double eps_;
  NormOutput output_;
};

// torch.nn.Linear(bias=False), Llama's projections: weight [out, in] (Hugging Face's layout for
// Llama), y = x @ weight^T; weight ~ N(0, init_std).
class LinearNoBias : public Module {
 public:
  LinearNoBias(int64_t in_features, int64_t out_features, Generator& gen, double init_std = 0.02,
               const Options& options = {});
  Tensor forward(const Tensor& x) const;
  // linear_cross_entropy of x [N, in] through this layer against targets [N], between the
  // forward hooks as forward() runs: the mean loss of the logits, never held.
  Tensor loss(const Tensor& x, const Tensor& targets) const;
  const Tensor& weight() const { return weight_; }

 private:
  Tensor weight_;
};

// Llama's RMSNorm: x / sqrt(mean(x^2) + eps) * weight (weight 1 at start), in f32.
class RMSNorm : public Module {
 public:
  RMSNorm(int64_t width, double eps, const Options& options = {},
          NormOutput output = NormOutput::Any);
  Tensor forward(const Tensor& x) const;
  // {x + residual, forward(x + residual)} in one pass (add_rms_norm), between the forward hooks,
  // as LayerNorm's: a Llama layer's residual add and its post-attention norm.
  AddNorm forward_after_add(const Tensor& x, const Tensor& residual) const;
  // {x, forward(x)} where x also continues as the residual stream, as LayerNorm's: a Llama
  // layer's input norm; and where the stream ends, Llama's final norm.
  AddNorm forward_keeping_stream(const Tensor& x) const;
  Tensor forward_ending_stream(const Tensor& x) const;

 private:
  Tensor weight_;
  double eps_;
  NormOutput output_;
};

// Stateless tanh-approximation GELU, a module so that it can sit in a module tree.
class GELU : public Module {
 public:
  Tensor forward(const Tensor& x) const;
};

}  // namespace loom::nn
