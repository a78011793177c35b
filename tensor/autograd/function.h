#pragma once
// User-defined differentiable ops, the same mechanism the built-in ops use.
//
//   loom::autograd::CustomOp square{
//       .name = "square",
//       .forward = [](Context& ctx, const std::vector<Tensor>& in) {
//         ctx.save(in[0]);
//         return std::vector<Tensor>{mul(in[0], in[0])};
//       },
//       .backward = [](Context& ctx, const std::vector<Tensor>& grad_out) {
//         return std::vector<Tensor>{mul(grad_out[0], mul(ctx.saved(0), 2.0))};
//       }};
//   Tensor y = apply(square, {x})[0];
//
// forward runs with graph recording off; backward gets one defined gradient per output and
// returns one gradient per input (undefined where ctx.needs_input_grad(i) is false).

#include <any>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::autograd {

class Context {
 public:
  void save(const Tensor& tensor) { saved_.push_back(tensor); }
  const Tensor& saved(size_t i) const { return saved_.at(i); }
  bool needs_input_grad(size_t i) const { return needs_input_grad_.at(i); }
  std::any data;  // anything else forward wants to hand to backward

 private:
  friend std::vector<Tensor> apply(const struct CustomOp&, const std::vector<Tensor>&);
  std::vector<Tensor> saved_;
  std::vector<bool> needs_input_grad_;
};

struct CustomOp {
  std::string name;
  std::function<std::vector<Tensor>(Context&, const std::vector<Tensor>&)> forward;
  std::function<std::vector<Tensor>(Context&, const std::vector<Tensor>&)> backward;
};

// Runs op.forward on `inputs` and, when any input requires grad, records op.backward.
std::vector<Tensor> apply(const CustomOp& op, const std::vector<Tensor>& inputs);

// Activation checkpointing: runs `fn` without keeping its intermediate activations and
// recomputes them during backward. Gradients equal those of calling fn directly (bitwise, as
// the recomputation repeats the same arithmetic, under the autocast state the forward ran in).
// Parameters used inside fn receive their gradients during the recomputation's own backward
// pass. fn must be deterministic.
std::vector<Tensor> checkpoint(
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
    const std::vector<Tensor>& inputs);

}  // namespace loom::autograd
