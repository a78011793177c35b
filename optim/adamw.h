#pragma once
// AdamW (Loshchilov & Hutter), matching torch.optim.AdamW(amsgrad=False, maximize=False,
// foreach=False) of PyTorch 1.13. For each parameter with a gradient g, with t its own count
// of updates (parameters skipped for lack of a gradient do not advance):
//   p *= 1 - lr*wd
//   m = b1*m + (1-b1)*g;          v = b2*v + (1-b2)*g*g
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// Bias corrections and the step size are computed in double and applied in the parameter's
// dtype; see Note [Matching PyTorch's optimizer arithmetic] in kernels/cpu/optimizer_steps.h.

#include <map>
#include <string>
#include <vector>

#include "optim/optimizer.h"

namespace loom::optim {

struct AdamWOptions {
  double lr = 1e-3;  // defaults for groups that leave lr / weight_decay at kUseDefault
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

class AdamW final : public Optimizer {
 public:
  explicit AdamW(std::vector<ParamGroup> groups, const AdamWOptions& options = {});
  // One group holding every parameter, with the options' lr and weight_decay.
  explicit AdamW(std::vector<Tensor> params, const AdamWOptions& options = {});

  const AdamWOptions& options() const { return options_; }

  // Per-parameter state, created at the parameter's first update. The accessors throw
  // loom::Error for a parameter without state.
  bool has_state(const Tensor& param) const;
  const Tensor& exp_avg(const Tensor& param) const;
  const Tensor& exp_avg_sq(const Tensor& param) const;
  int64_t param_step(const Tensor& param) const;  // t of the formula above
  bool is_scalar_state(const std::string& name) const override { return name == "step"; }

 protected:
  void update(const ParamGroup& group, const Tensor& param, const Tensor& grad) override;
  // CUDA parameters of a group are updated together by the fused multi-tensor kernel (one
  // launch per batch of tensors, instead of one per tensor); CPU ones one by one.
  void update_group(const ParamGroup& group, const std::vector<Tensor>& params,
                    const std::vector<Tensor>& grads) override;
  // State entries: "exp_avg", "exp_avg_sq" (the parameter's shape and dtype), "step" (i64 []).
  void export_param_state(const Tensor& param, std::map<std::string, Tensor>& named) const override;
  bool import_param_state(const Tensor& param, const std::string& name,
                          const Tensor& value) override;
  void check_loaded_state() const override;

 private:
  struct State {
    Tensor param;  // keeps the key's TensorImpl alive
    Tensor exp_avg;
    Tensor exp_avg_sq;
    int64_t step = 0;
  };
  const State& state_of(const Tensor& param) const;
  // The state of `param`, created (zeroed moments) at its first update; counts the update.
  State& advance_state(const Tensor& param);

  AdamWOptions options_;
  std::map<const TensorImpl*, State> state_;
};

}  // namespace loom::optim
