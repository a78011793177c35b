#include "tensor/autograd/function.h"

#include "tensor/autocast.h"
#include "tensor/autograd/node.h"

namespace loom::autograd {

std::vector<Tensor> apply(const CustomOp& op, const std::vector<Tensor>& inputs) {
  auto ctx = std::make_shared<Context>();
  for (const Tensor& input : inputs)
    ctx->needs_input_grad_.push_back(any_requires_grad({input}));
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = op.forward(*ctx, inputs);
  }
  if (any_requires_grad(inputs)) {
    // Outputs of a recorded op must not alias an input's autograd state.
    for (Tensor& out : outputs) {
      for (const Tensor& in : inputs) {
        if (out.is_same(in)) out = out.detach();
      }
    }
    auto backward = op.backward;
    std::string name = op.name;
    record(op.name, inputs, outputs,
           [ctx, backward, name](const std::vector<Tensor>& grad_outputs, const Node& node) {
             // A split backward (node.h) may ask for fewer inputs than forward recorded.
             for (size_t i = 0; i < node.num_inputs(); ++i)
               ctx->needs_input_grad_[i] = node.needs_input_grad(i);
             std::vector<Tensor> grads = backward(*ctx, grad_outputs);
             check_eq(grads.size(), node.num_inputs(),
                      "custom op '" + name + "' backward must return one gradient per input");
             return grads;
           });
  }
  return outputs;
}

std::vector<Tensor> checkpoint(
    const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& fn,
    const std::vector<Tensor>& inputs) {
  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;
    outputs = fn(inputs);
  }
  // Parameters inside fn are not among `inputs`, so record whenever grad mode is on and
  // either an input or (possibly) a parameter needs a gradient.
  if (!grad_mode_enabled()) return outputs;
  for (Tensor& out : outputs)
    out = out.detach();
  // The backward that recomputes usually runs outside the forward's autocast scope (as in
  // PyTorch): the recomputation re-enters the forward's, or it would compute other numbers.
  const DType autocast = autocast_dtype();
  record("Checkpoint", inputs, outputs,
         [fn, inputs, autocast](const std::vector<Tensor>& grad_outputs, const Node& node) {
           std::vector<Tensor> detached;
           for (size_t i = 0; i < inputs.size(); ++i) {
             Tensor copy = inputs[i].detach();
             if (node.needs_input_grad(i)) copy.set_requires_grad(true);
             detached.push_back(copy);
           }
           std::vector<Tensor> recomputed;
           {
             EnableGradGuard enable;
             AutocastGuard forward_precision(autocast);
             recomputed = fn(detached);
           }
           std::vector<Tensor> roots, seeds;
           for (size_t i = 0; i < recomputed.size(); ++i) {
             if (recomputed[i].requires_grad()) {
               roots.push_back(recomputed[i]);
               seeds.push_back(grad_outputs[i]);
             }
           }
           if (!roots.empty()) run_backward(roots, seeds, /*retain_graph=*/false);
           std::vector<Tensor> grads;
           for (const Tensor& d : detached)
             grads.push_back(d.requires_grad() ? d.grad() : Tensor());
           return grads;
         });
  return outputs;
}

}  // namespace loom::autograd
