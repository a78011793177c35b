#pragma once
// Learning-rate schedules: pure functions of the 0-based step index. A training loop calls
//   schedule.apply(optimizer, step);  optimizer.step();
// so that step k of training uses lr_at(k).

#include <cstdint>

#include "optim/optimizer.h"

namespace loom::optim {

class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  // The learning rate for 0-based step `step` (>= 0; throws loom::Error otherwise).
  virtual double lr_at(int64_t step) const = 0;
  // Sets every parameter group's lr to lr_at(step).
  void apply(Optimizer& optimizer, int64_t step) const;
};

// lr_at(step) = lr.
class ConstantSchedule final : public LrSchedule {
 public:
  explicit ConstantSchedule(double lr);
  double lr_at(int64_t step) const override;

 private:
  double lr_;
};

// Linear warmup, then cosine decay to min_lr (GPT-2/3 style):
//   step <  warmup_steps:                 max_lr * (step + 1) / warmup_steps
//   step >= total_steps:                  min_lr
//   otherwise, with progress = (step - warmup_steps) / (total_steps - warmup_steps) in [0, 1):
//                                         min_lr + 0.5 * (1 + cos(pi * progress)) * (max_lr -
//                                         min_lr)
// So step warmup_steps - 1 and step warmup_steps both give max_lr, the midpoint of the decay
// gives (max_lr + min_lr) / 2, and total_steps and beyond give min_lr.
// Requires 0 <= warmup_steps <= total_steps and 0 <= min_lr <= max_lr.
class WarmupCosineSchedule final : public LrSchedule {
 public:
  WarmupCosineSchedule(double max_lr, int64_t warmup_steps, int64_t total_steps,
                       double min_lr = 0.0);
  double lr_at(int64_t step) const override;

 private:
  double max_lr_;
  int64_t warmup_steps_;
  int64_t total_steps_;
  double min_lr_;
};

// Sets every parameter group's lr.
void set_lr(Optimizer& optimizer, double lr);

}  // namespace loom::optim
