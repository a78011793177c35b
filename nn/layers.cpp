#include "nn/layers.h"

#include "tensor/autocast.h"
#include "tensor/ops.h"

namespace loom::nn {

namespace {
// The out_dtype of a norm whose output `output` reads: autocast's low dtype for one that only
// its products read, while autocast is on; otherwise the input's (none).
std::optional<DType> norm_out_dtype(NormOutput output) {
  if (output != NormOutput::ForProducts || autocast_dtype() == DType::F32) return std::nullopt;
  return autocast_dtype();
}

Tensor normal_tensor(const Shape& shape, double stddev, Generator& gen, const Options& options) {
  Tensor t = Tensor::empty(shape, options.dtype, options.device);
  normal_(t, 0.0, stddev, gen);
  return t;
}
}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, Generator& gen, double init_std,
               const Options& options) {
  weight_ = register_parameter("weight",
                               normal_tensor({in_features, out_features}, init_std, gen, options));
  bias_ = register_parameter("bias", Tensor::zeros({out_features}, options.dtype, options.device));
}

Tensor Linear::forward(const Tensor& x) const {
  return run_forward([&] { return linear(x, weight_, bias_); });
}

GeluOutput Linear::forward_gelu(const Tensor& x) const {
  GeluOutput result;
  // The hooks wrap the tensor that carries the gradient: GELU's input where it is kept.
  const auto carrier = [&]() -> Tensor& {
    return result.input.defined() ? result.input : result.out;
  };
  Tensor hooked = run_forward([&] {
    result = linear_gelu_keeping_input(x, weight_, bias_);
    return carrier();
  });
  carrier() = hooked;
  return result;
}

Tensor Linear::forward_after_gelu(const GeluOutput& gelu) const {
  return run_forward([&] { return linear_after_gelu(gelu, weight_, bias_); });
}

LinearNoBias::LinearNoBias(int64_t in_features, int64_t out_features, Generator& gen,
                           double init_std, const Options& options) {
  weight_ = register_parameter("weight",
                               normal_tensor({out_features, in_features}, init_std, gen, options));
}

Tensor LinearNoBias::forward(const Tensor& x) const {
  return run_forward([&] { return matmul(x, transpose(weight_, 0, 1)); });
}

Tensor LinearNoBias::loss(const Tensor& x, const Tensor& targets) const {
  return run_forward([&] { return linear_cross_entropy(x, weight_, targets); });
}

RMSNorm::RMSNorm(int64_t width, double eps, const Options& options, NormOutput output)
    : eps_(eps), output_(output) {
  weight_ = register_parameter("weight", Tensor::ones({width}, options.dtype, options.device));
}

Tensor RMSNorm::forward(const Tensor& x) const {
  return run_forward([&] { return rms_norm(x, weight_, eps_, norm_out_dtype(output_)); });
}

AddNorm RMSNorm::forward_after_add(const Tensor& x, const Tensor& residual) const {
  AddNorm result;
  Tensor normed = run_forward([&] {
    result = add_rms_norm(x, residual, weight_, eps_, norm_out_dtype(output_));
    return result.normed;
  });
  result.normed = normed;
  return result;
}

Tensor RMSNorm::forward_ending_stream(const Tensor& x) const {
  return run_forward(
      [&] { return rms_norm_ending_stream(x, weight_, eps_, norm_out_dtype(output_)); });
}

AddNorm RMSNorm::forward_keeping_stream(const Tensor& x) const {
  AddNorm result;
  Tensor normed = run_forward([&] {
    result = rms_norm_keeping_stream(x, weight_, eps_, norm_out_dtype(output_));
    return result.normed;
  });
  result.normed = normed;
  return result;
}

Embedding::Embedding(int64_t count, int64_t width, Generator& gen, double init_std,
                     const Options& options) {
  weight_ = register_parameter("weight", normal_tensor({count, width}, init_std, gen, options));
}

Tensor Embedding::forward(const Tensor& indices) const {
  return run_forward([&] { return embedding(indices, weight_); });
}

LayerNorm::LayerNorm(int64_t width, double eps, const Options& options, NormOutput output)
    : eps_(eps), output_(output) {
  weight_ = register_parameter("weight", Tensor::ones({width}, options.dtype, options.device));
  bias_ = register_parameter("bias", Tensor::zeros({width}, options.dtype, options.device));
}

Tensor LayerNorm::forward(const Tensor& x) const {
  return run_forward(
      [&] { return layer_norm(x, weight_, bias_, eps_, norm_out_dtype(output_)); });
}

AddNorm LayerNorm::forward_after_add(const Tensor& x, const Tensor& residual) const {
  AddNorm result;
  Tensor normed = run_forward([&] {
    result = add_layer_norm(x, residual, weight_, bias_, eps_, norm_out_dtype(output_));
    return result.normed;
  });
  result.normed = normed;
  return result;
}

Tensor LayerNorm::forward_ending_stream(const Tensor& x) const {
  return run_forward(
      [&] { return layer_norm_ending_stream(x, weight_, bias_, eps_, norm_out_dtype(output_)); });
}

AddNorm LayerNorm::forward_keeping_stream(const Tensor& x) const {
  AddNorm result;
  Tensor normed = run_forward([&] {
    result = layer_norm_keeping_stream(x, weight_, bias_, eps_, norm_out_dtype(output_));
    return result.normed;
  });
  result.normed = normed;
  return result;
}

Tensor GELU::forward(const Tensor& x) const {
  return gelu(x);
}

}  // namespace loom::nn
