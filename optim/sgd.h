#pragma once
// Stochastic gradient descent with momentum, matching torch.optim.SGD(maximize=False,
// foreach=False) of PyTorch 1.13. For each parameter with a gradient g:
//   d = g + wd*p
//   if momentum != 0:
//     buf = d at the parameter's first update, else momentum*buf + (1-dampening)*d
//     d = nesterov ? d + momentum*buf : buf
//   p -= lr*d
// Nesterov momentum requires momentum > 0 and dampening == 0, as in torch.

#include <map>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace loom::optim {

struct SGDOptions {
  // Default for groups that leave lr at kUseDefault. Like torch, SGD has no default learning
  // rate: construction fails if a group needs this and it is not set.
  double lr = kUseDefault;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
};

class SGD final : public Optimizer {
 public:
  explicit SGD(std::vector<ParamGroup> groups, const SGDOptions& options = {});
  // One group holding every parameter, with the options' lr and weight_decay.
  explicit SGD(std::vector<Tensor> params, const SGDOptions& options = {});

  const SGDOptions& options() const { return options_; }

  // The momentum buffer, created at the parameter's first update when momentum != 0.
  bool has_momentum_buffer(const Tensor& param) const;
  const Tensor& momentum_buffer(const Tensor& param) const;  // throws if there is none

 protected:
  void update(const ParamGroup& group, const Tensor& param, const Tensor& grad) override;
  // State entry: "momentum_buffer" (the parameter's shape and dtype).
  void export_param_state(const Tensor& param, std::map<std::string, Tensor>& named) const override;
  bool import_param_state(const Tensor& param, const std::string& name,
                          const Tensor& value) override;
  void check_loaded_state() const override {}

 private:
  struct State {
    Tensor param;  // keeps the key's TensorImpl alive
    Tensor momentum_buffer;
  };

  SGDOptions options_;
  std::map<const TensorImpl*, State> state_;
};

}  // namespace loom::optim
