#pragma once
// Precision policies (StrategyOptions::precision, Lightning's precision plugins): "32-true";
// "bf16-mixed" and "16-mixed" run the forward under an AutocastGuard (tensor/autocast.h:
// matmul/linear operands and results rounded to bf16/f16, everything else f32, master
// weights f32); "16-mixed" adds a dynamic loss scaler (LossScaler).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "tensor/tensor.h"

namespace loom::strategies {

// PyTorch's GradScaler: the loss is multiplied by scale() before backward, gradients are
// divided by it afterwards; a step whose gradients hold inf/NaN is skipped and the scale
// multiplied by `backoff`; after `growth_interval` clean steps in a row it is multiplied
// by `growth`.
struct LossScalerOptions {
  double initial_scale = 65536.0;
  double growth = 2.0;
  double backoff = 0.5;
  int growth_interval = 2000;
  double min_scale = 0.0;  // backing off never goes below this (DeepSpeed's min_loss_scale)
};

// Whether any element of `t` is inf or NaN, computed on t's device (one value read back). A
// meta tensor has no values and answers false: a simulated step is never skipped
// (docs/simulation.md).
bool any_non_finite(const Tensor& t);

class LossScaler {
 public:
  explicit LossScaler(const LossScalerOptions& options = {});
  double scale() const { return scale_; }
  // Divides every gradient by scale() and records whether all are finite.
  void unscale(const std::vector<Tensor>& params);
  bool found_inf() const { return found_inf_; }
  // After the step (or the skipped step): updates the scale.
  void update();
  int64_t skipped_steps() const { return skipped_; }
  // Overrides what unscale() found: strategies whose ranks each see part of the gradients
  // agree on it first.
  void set_found_inf(bool found) { found_inf_ = found; }

  // What a checkpoint keeps of the scaler between steps, so that a resumed run scales (and
  // skips) exactly as the uninterrupted one.
  struct State {
    double scale = 0;
    int clean_steps = 0;
    int64_t skipped = 0;
  };
  State state() const { return {scale_, clean_steps_, skipped_}; }
  void restore(const State& state);

 private:
  LossScalerOptions options_;
  double scale_;
  bool found_inf_ = false;
  int clean_steps_ = 0;
  int64_t skipped_ = 0;
};

// The precision policy: which dtype the forward's matmuls round to, and whether a loss scaler
// guards the step. make_precision(name) builds the built-in ones; users may derive their own
// (e.g. another scaler schedule) and pass it to Strategy::set_precision.
class Precision {
 public:
  virtual ~Precision() = default;
  virtual std::string name() const = 0;
  virtual DType compute_dtype() const = 0;
  // A fresh scaler for a strategy, or null when the policy does not scale the loss.
  virtual std::unique_ptr<LossScaler> make_scaler() const { return nullptr; }
};

// "32-true", "bf16-mixed", "16-mixed"; anything else is loom::Error listing them.
std::shared_ptr<Precision> make_precision(const std::string& name,
                                          const LossScalerOptions& scaler = {});

}  // namespace loom::strategies
