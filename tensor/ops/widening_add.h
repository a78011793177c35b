#pragma once
// The add of an f32 stream and a 16-bit branch of its shape (add(), Note [An f32 tensor plus a
// 16-bit one] in elementwise.cpp), as an op after it may take over its backward (Note [A norm
// takes over the residual add before it] in layer_norm.cpp).

#include <optional>

#include "tensor/autograd/node.h"
#include "tensor/tensor.h"

namespace loom::detail {

struct WideningAdd {
  autograd::Edge stream, branch;  // where the f32 operand's and the 16-bit one's gradients go
  DType branch_dtype;
};

// Where `sum`'s operands take their gradients, when `sum` is the recorded output of such an add
// and both operands need one; std::nullopt otherwise.
std::optional<WideningAdd> widening_add_operands(const Tensor& sum);

}  // namespace loom::detail
