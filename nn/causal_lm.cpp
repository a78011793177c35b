#include "nn/causal_lm.h"

#include "tensor/ops.h"

namespace loom::nn {

Tensor CausalLM::loss(const Tensor& tokens, const Tensor& targets) const {
  if (targets.shape() != tokens.shape()) {
    fail("loss: targets ", shape_str(targets.shape()), " must match tokens ",
         shape_str(tokens.shape()));
  }
  if (tp_) return layer_loss(forward(tokens), targets);
  return run_forward([&] { return classifier_loss(features(tokens), targets); });
}

Tensor CausalLM::layer_loss(const Tensor& output, const Tensor& targets) const {
  if (!tp_) return classifier_loss(output, targets);
  return parallel_cross_entropy(output.reshape({-1, output.size(-1)}), targets.reshape({-1}),
                                vocab_first(), *tp_);
}

int64_t CausalLM::vocab_first() const {
  return tp_ ? vocab_size() / tp_->size() * tp_->rank() : 0;
}

std::vector<std::string> CausalLM::parameters_named(
    const std::vector<std::string>& prefixes) const {
  std::vector<std::string> names;
  for (const auto& [name, p] : named_parameters()) {
    for (const std::string& prefix : prefixes)
      if (name.starts_with(prefix)) names.push_back(name);
  }
  return names;
}

}  // namespace loom::nn
