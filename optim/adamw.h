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
#include <memory>
#include <string>
#include <utility>
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
  ~AdamW() override;

  const AdamWOptions& options() const { return options_; }

  // Per-parameter state, created at the parameter's first update. The accessors throw
  // loom::Error for a parameter without state.
  bool has_state(const Tensor& param) const;
  const Tensor& exp_avg(const Tensor& param) const;
  const Tensor& exp_avg_sq(const Tensor& param) const;
  int64_t param_step(const Tensor& param) const;  // t of the formula above
  bool is_scalar_state(const std::string& name) const override { return name == "step"; }

  // Note [Capturable AdamW]
  // For a step that a CUDA graph captures (tensor/cuda/graph.h), as torch's capturable=True:
  // with set_capturable(true), each fused CUDA update reads its scalars (the learning rate,
  // the decay, the bias corrections) from device memory, filled just before the launch, on its
  // stream, by a copy from pinned host memory the host wrote at step(), instead of from the
  // launch's parameters. A replay of the captured step copies what the host wrote last:
  // prepare_replay() does on the host what step() does but launch (every step count advances,
  // the next update's scalars are written) and is called before each replay. Outside a
  // capture, writing a slot first waits for the stream, whose earlier copy or replay may still
  // read it (one synchronisation per step). The bits are those of step(). Set it before the
  // eager steps that precede the capture (its pinned and device buffers are allocated at the
  // first update, which a capture would refuse).
  void set_capturable(bool capturable) { capturable_ = capturable; }
  void prepare_replay();
  // Every CUDA gradient multiplied by `factor` (f32 [], on their device) as it is read, as if
  // scaled in place first (clip_grad_norm_on_device's factor); undefined: none.
  void set_grad_scale(Tensor factor) { grad_scale_ = std::move(factor); }

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
  bool capturable_ = false;
  bool preparing_replay_ = false;
  Tensor grad_scale_;
  struct ScalarSlots;  // Note [Capturable AdamW]'s buffers (adamw.cpp)
  std::unique_ptr<ScalarSlots> slots_;
};

}  // namespace loom::optim
