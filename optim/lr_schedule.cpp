#include "optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "core/tags.h"

namespace loom::optim {

namespace {

void check_step(int64_t step) {
  if (step < 0) tag::kOptim.fail("lr schedule: step ", step, " is negative; steps are 0-based");
}

}  // namespace

void LrSchedule::apply(Optimizer& optimizer, int64_t step) const {
  set_lr(optimizer, lr_at(step));
}

void set_lr(Optimizer& optimizer, double lr) {
  for (ParamGroup& group : optimizer.param_groups())
    group.lr = lr;
}

ConstantSchedule::ConstantSchedule(double lr) : lr_(lr) {
  if (!(std::isfinite(lr) && lr >= 0.0)) tag::kOptim.fail("ConstantSchedule: invalid lr ", lr);
}

double ConstantSchedule::lr_at(int64_t step) const {
  check_step(step);
  return lr_;
}

WarmupCosineSchedule::WarmupCosineSchedule(double max_lr, int64_t warmup_steps, int64_t total_steps,
                                           double min_lr)
    : max_lr_(max_lr), warmup_steps_(warmup_steps), total_steps_(total_steps), min_lr_(min_lr) {
  if (!(warmup_steps >= 0 && warmup_steps <= total_steps)) {
    tag::kOptim.fail("WarmupCosineSchedule: expected 0 <= warmup_steps <= total_steps, got ",
                     warmup_steps, " and ", total_steps);
  }
  if (!(std::isfinite(max_lr) && std::isfinite(min_lr) && min_lr >= 0.0 && min_lr <= max_lr)) {
    tag::kOptim.fail("WarmupCosineSchedule: expected 0 <= min_lr <= max_lr, got min_lr ", min_lr,
                     " and max_lr ", max_lr);
  }
}

double WarmupCosineSchedule::lr_at(int64_t step) const {
  check_step(step);
  if (step < warmup_steps_) {
    return max_lr_ * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
  }
  if (step >= total_steps_) return min_lr_;
  const double progress =
      static_cast<double>(step - warmup_steps_) / static_cast<double>(total_steps_ - warmup_steps_);
  return min_lr_ + 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) * (max_lr_ - min_lr_);
}

}  // namespace loom::optim
