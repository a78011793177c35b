#pragma once
// Module: a node in a tree of layers that owns named parameters. Names are hierarchical
// ("h.0.attn.c_attn.weight") and follow registration order, which is also the order of
// parameters() -- the rank-identical order that DDP buckets and checkpoints rely on.

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace loom::nn {

using StateDict = std::map<std::string, Tensor>;

class Module;

// What a strategy runs around a module's forward: sharded strategies all-gather a wrapped
// module's parameters in before() and, in after(), free them and return the output wrapped
// so that its backward gathers them again (strategies/sharded/). Called on the thread that
// runs the forward.
class ForwardHook {
 public:
  virtual ~ForwardHook() = default;
  virtual void before(const Module& module) = 0;
  virtual Tensor after(const Module& module, const Tensor& output) = 0;
};

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  // Every parameter of this module and its descendants, depth first in registration order.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  // This module's direct children, in registration order.
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const {
    return children_;
  }
  int64_t parameter_count() const;
  // Moves every parameter and buffer to `device` in place (each keeps its identity, so
  // optimizers and hooks created afterwards see the moved tensors; gradients are dropped). A
  // no-op for tensors already there.
  void to(Device device);

  // Name -> parameter. The tensors share storage with the parameters (detached views).
  StateDict state_dict() const;
  // Copies every tensor of `state` into the parameter of the same name (converting dtype).
  // With strict, throws loom::Error listing missing and unexpected names; a shape mismatch is
  // always an error naming the parameter and both shapes. Nothing is copied unless all checks
  // pass.
  void load_state_dict(const StateDict& state, bool strict = true);

  // The hook run around this module's forward (null: none). Built-in modules run their
  // forward through run_forward(); a user module that a strategy may wrap does the same.
  void set_forward_hook(std::shared_ptr<ForwardHook> hook) { forward_hook_ = std::move(hook); }
  // Parameters owned by another module (a descendant) that this module's forward also reads,
  // such as GPT's output head reading the token embedding (declare_parameter_use). Sharded
  // strategies place such a parameter in the smallest wrapped unit containing all its users.
  const std::vector<Tensor>& used_parameters() const { return used_parameters_; }

  // Expires when this module is destroyed: a strategy that hooked the module checks it before
  // unhooking, so destroying the module before the strategy is safe.
  std::weak_ptr<const void> lifetime() const { return lifetime_; }

 protected:
  // Runs body() (the forward's computation, returning its output) between the forward hook's
  // before() and after(); just body() when there is no hook.
  template <typename Body>
  Tensor run_forward(Body&& body) const {
    if (!forward_hook_) return body();
    forward_hook_->before(*this);
    return forward_hook_->after(*this, body());
  }
  void declare_parameter_use(const Tensor& parameter) { used_parameters_.push_back(parameter); }

  // Registers a parameter (marked requires_grad) and returns the stored handle.
  Tensor register_parameter(std::string name, Tensor value);
  // Registers a constant the forward reads (positions, rotary tables): to() moves it with the
  // parameters, so a forward on the module's device never copies it from the host (which a
  // CUDA graph capture would refuse); it is not a parameter and not in the state dict
  // (PyTorch's non-persistent buffers). Returns the stored handle.
  Tensor register_buffer(Tensor value);
  template <typename M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> module) {
    children_.emplace_back(std::move(name), module);
    return module;
  }

 private:
  void collect(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const;
  void collect_buffers(std::vector<Tensor>& out) const;

  std::vector<std::pair<std::string, Tensor>> parameters_;
  std::vector<Tensor> buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  std::shared_ptr<ForwardHook> forward_hook_;
  std::vector<Tensor> used_parameters_;
  std::shared_ptr<const void> lifetime_ = std::make_shared<char>();
};

// An indexed list of modules whose children are named "0", "1", ...
template <typename M>
class ModuleList : public Module {
 public:
  void push_back(std::shared_ptr<M> module) {
    items_.push_back(register_module(std::to_string(items_.size()), std::move(module)));
  }
  size_t size() const { return items_.size(); }
  M& operator[](size_t i) const { return *items_.at(i); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<std::shared_ptr<M>> items_;
};

}  // namespace loom::nn
