#pragma once
// Optimizer base: parameter groups with per-group hyper-parameters, gradient reset, a step
// counter, and export/import of the optimizer state for checkpoints.
//
// Threading: an optimizer is not thread-safe. Call step() and zero_grad() from the training
// thread, never while a backward pass is still writing gradients.

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::optim {

// A per-group hyper-parameter left at kUseDefault takes the optimizer's value (torch's
// param-group dict without that key).
inline constexpr double kUseDefault = std::numeric_limits<double>::quiet_NaN();

// Parameters that share hyper-parameters, e.g. weights with weight decay and biases without:
//   AdamW opt({{.params = weights, .weight_decay = 0.1}, {.params = biases, .weight_decay = 0}},
//             {.lr = 6e-4});
// Parameters are leaf tensors (contiguous f32 or f64 on the CPU, f32 on CUDA), updated in place; a parameter whose
// grad() is undefined is skipped by step(). lr and weight_decay may be changed between steps
// through Optimizer::param_groups() (LR schedules do this). Algorithm constants (betas, eps,
// momentum, ...) are optimizer-wide and live in each optimizer's options.
struct ParamGroup {
  std::vector<Tensor> params;
  double lr = kUseDefault;
  double weight_decay = kUseDefault;
};

class Optimizer {
 public:
  // Validates the groups (see ParamGroup); every lr and weight_decay must be set by now.
  // `name` prefixes error messages ("AdamW", "SGD").
  explicit Optimizer(std::vector<ParamGroup> groups, std::string name = "Optimizer");
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // Updates every parameter that has a gradient, then increments step_count().
  void step();
  // Drops every parameter's gradient (torch's zero_grad(set_to_none=True)).
  void zero_grad();

  // Calls around step() for a strategy that keeps parameters and their state out of memory
  // between steps (NVMe offload: strategies/sharded/nvme_swap.h). With hooks set, step()
  // calls begin(), then for each parameter that has a gradient, in group order,
  // before_update(group, index) and its update (one parameter at a time), then end(). An
  // exception from a hook ends the step uncounted. Empty hooks: none.
  struct StepHooks {
    std::function<void()> begin;
    std::function<void(size_t group, size_t index)> before_update;
    std::function<void()> end;
  };
  void set_step_hooks(StepHooks hooks) { hooks_ = std::move(hooks); }
  // The state tensors of `param` shaped like it (moments, momentum buffer), in a fixed order;
  // empty before its first update.
  std::vector<Tensor> state_tensors(const Tensor& param) const;

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  // All parameters, group by group, in order (e.g. for clip_grad_norm).
  std::vector<Tensor> parameters() const;
  // Number of completed step() calls.
  int64_t step_count() const { return step_count_; }
  const std::string& name() const { return name_; }

  // The optimizer state as named tensors, for checkpoints:
  //   "step_count"                       i64 []
  //   "param_groups.<g>.lr"              f64 []   (and ".weight_decay")
  //   "state.<g>.<i>.<name>"             per-parameter state of parameter i of group g, e.g.
  //                                      "state.0.3.exp_avg"; only parameters that have state.
  // The returned tensors alias the live state: copy them before the next step() if needed.
  // Throws loom::Error while some state is out of memory (NVMe offload).
  std::map<std::string, Tensor> state_dict() const;
  // True for a per-parameter state entry that is one number per parameter (AdamW's "step")
  // rather than one per element (moments); distributed checkpoints store those once.
  virtual bool is_scalar_state(const std::string& /*name*/) const { return false; }
  // Restores what state_dict() produced for an optimizer over parameters of the same shapes and
  // dtypes, in the same groups. Copies the tensors. Throws loom::Error on unknown keys,
  // mismatched shapes or dtypes, or incomplete per-parameter state (the optimizer may then be
  // partly loaded; build a fresh one before retrying).
  void load_state_dict(const std::map<std::string, Tensor>& state);

 protected:
  // Replaces kUseDefault entries of every group by the given defaults.
  static std::vector<ParamGroup> with_defaults(std::vector<ParamGroup> groups, double lr,
                                               double weight_decay);

  // Per-parameter state (moments, momentum): zeros shaped like `param`, counted as
  // optimizer state in memory reports, or as offloaded when the parameter is (a sharded
  // strategy's host master shard). `like` copies a loaded value the same way.
  static Tensor new_state(const Tensor& param);
  static Tensor state_copy(const Tensor& param, const Tensor& like);

  // Throws unless the group's lr and weight_decay are finite and non-negative.
  void check_group(size_t group) const;
  // Throws unless the parameter is a contiguous f32/f64 CPU tensor and its gradient (when
  // defined) matches it in dtype, device and shape. Returns the gradient, made contiguous.
  Tensor checked_grad(size_t group, size_t index) const;
  // "[optim] AdamW: parameter 3 of group 1 (Tensor(bf16, [4], cpu))"
  std::string describe(size_t group, size_t index) const;

  // Updates one parameter of `group` with its (checked, contiguous) gradient; step() calls
  // it for every parameter that has a gradient, in group order, with graph recording off.
  virtual void update(const ParamGroup& group, const Tensor& param, const Tensor& grad) = 0;
  // Updates the parameters of one group that have gradients (params[i] with grads[i]).
  // The default calls update() for each; optimizers with fused multi-tensor kernels
  // override it.
  virtual void update_group(const ParamGroup& group, const std::vector<Tensor>& params,
                            const std::vector<Tensor>& grads);
  // Per-parameter state hooks for state_dict()/load_state_dict(). `param` is parameter `index`
  // of `group`; names are the last component of the key ("exp_avg").
  virtual void export_param_state(const Tensor& param,
                                  std::map<std::string, Tensor>& named) const = 0;
  // Returns false when `name` is not a state entry of this optimizer.
  virtual bool import_param_state(const Tensor& param, const std::string& name,
                                  const Tensor& value) = 0;
  // Called after loading; throws if some parameter's state is incomplete.
  virtual void check_loaded_state() const = 0;

  std::vector<ParamGroup> groups_;
  int64_t step_count_ = 0;

 private:
  std::string name_;
  StepHooks hooks_;
};

}  // namespace loom::optim
