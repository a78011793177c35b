#include "nn/causal_lm.h"

#include "tensor/ops.h"

namespace loom::nn {

Tensor CausalLM::loss(const Tensor& tokens, const Tensor& targets) const {
  if (targets.shape() != tokens.shape()) {
    fail("loss: targets ", shape_str(targets.shape()), " must match tokens ",
         shape_str(tokens.shape()));
  }
  return layer_loss(forward(tokens), targets);
}

Tensor CausalLM::layer_loss(const Tensor& logits, const Tensor& targets) const {
  const Tensor rows = logits.reshape({-1, logits.size(-1)});
  if (tp_) return parallel_cross_entropy(rows, targets.reshape({-1}), vocab_first(), *tp_);
  return cross_entropy(rows, targets.reshape({-1}));
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
