#include "strategies/precision.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/error.h"
#include "core/tags.h"
#include "tensor/ops.h"

namespace loom::strategies {

LossScaler::LossScaler(const LossScalerOptions& options)
    : options_(options), scale_(options.initial_scale) {}

bool any_non_finite(const Tensor& t) {
  // inf * 0 and NaN * 0 are NaN, a finite value * 0 is 0: the sum is NaN exactly when some
  // element is not finite, and one value crosses to the host (a meta tensor's reads as 0).
  return !std::isfinite(sum(mul(t, 0.0)).item());
}

void LossScaler::unscale(const std::vector<Tensor>& params) {
  NoGradGuard no_grad;
  found_inf_ = false;
  for (const Tensor& p : params) {
    Tensor grad = p.grad();
    if (!grad.defined()) continue;
    mul_(grad, 1.0 / scale_);
    found_inf_ = found_inf_ || any_non_finite(grad);
  }
}

void LossScaler::restore(const State& state) {
  if (!(state.scale > 0) || state.clean_steps < 0 || state.skipped < 0) {
    tag::kPrecision.fail("loss scaler state: scale ", state.scale, ", clean steps ",
                         state.clean_steps, ", skipped ", state.skipped,
                         "; expected a positive scale and "
                         "non-negative counts");
  }
  scale_ = state.scale;
  clean_steps_ = state.clean_steps;
  skipped_ = state.skipped;
  found_inf_ = false;
}

void LossScaler::update() {
  if (found_inf_) {
    scale_ = std::max(scale_ * options_.backoff, options_.min_scale);
    clean_steps_ = 0;
    ++skipped_;
  } else if (++clean_steps_ == options_.growth_interval) {
    scale_ *= options_.growth;
    clean_steps_ = 0;
  }
  found_inf_ = false;
}

namespace {

class BuiltinPrecision final : public Precision {
 public:
  BuiltinPrecision(std::string name, DType dtype, std::optional<LossScalerOptions> scaler)
      : name_(std::move(name)), dtype_(dtype), scaler_(scaler) {}
  std::string name() const override { return name_; }
  DType compute_dtype() const override { return dtype_; }
  std::unique_ptr<LossScaler> make_scaler() const override {
    return scaler_ ? std::make_unique<LossScaler>(*scaler_) : nullptr;
  }

 private:
  std::string name_;
  DType dtype_;
  std::optional<LossScalerOptions> scaler_;  // set for 16-mixed
};

}  // namespace

std::shared_ptr<Precision> make_precision(const std::string& name,
                                          const LossScalerOptions& scaler) {
  if (name == "32-true" || name == "32") {
    return std::make_shared<BuiltinPrecision>("32-true", DType::F32, std::nullopt);
  }
  if (name == "bf16-mixed")
    return std::make_shared<BuiltinPrecision>(name, DType::BF16, std::nullopt);
  if (name == "16-mixed") return std::make_shared<BuiltinPrecision>(name, DType::F16, scaler);
  tag::kStrategy.fail("unknown precision '", name,
                      "'; expected '32-true', 'bf16-mixed' or '16-mixed'");
}

}  // namespace loom::strategies
