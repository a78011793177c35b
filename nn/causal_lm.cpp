#include "nn/causal_lm.h"

namespace loom::nn {

Tensor CausalLM::loss(const Tensor& tokens, const Tensor& targets) const {
  if (targets.shape() != tokens.shape()) {
    fail("loss: targets ", shape_str(targets.shape()), " must match tokens ",
         shape_str(tokens.shape()));
  }
  return layer_loss(forward(tokens), targets);
}

}  // namespace loom::nn
