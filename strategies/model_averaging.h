#pragma once
// Periodic model averaging ("local SGD"), as torch.distributed.algorithms.model_averaging
// .averagers.PeriodicModelAverager: each call counts one optimizer step; the call whose step
// index s (0-based) satisfies s >= warmup_steps and (s - warmup_steps) % period == 0 averages
// the parameters over the group (allreduce Avg, in place), every other call only counts.
//
//   PeriodicModelAverager averager(/*period=*/4, /*warmup_steps=*/100);
//   for (...) { loss.backward(); optimizer.step(); averager.average_parameters(params, pg); }
//
// DDPStrategy drives one from DDPOptions::local_sgd_period / local_sgd_warmup (ddp/options.h).

#include <cstdint>
#include <vector>

#include "comm/process_group.h"

namespace loom::strategies {

class PeriodicModelAverager {
 public:
  // period >= 1, warmup_steps >= 0 (loom::Error otherwise).
  PeriodicModelAverager(int period, int warmup_steps);

  // Every rank of `group` must call this with the same parameters (same order, shapes and
  // dtypes; contiguous, floating). Averages in place on averaging steps, then counts the step.
  void average_parameters(const std::vector<Tensor>& params, comm::ProcessGroup& group);

  // Calls so far: the index of the next step.
  int64_t step() const { return step_; }
  int period() const { return period_; }
  int warmup_steps() const { return warmup_steps_; }
  // Whether the call for step index `s` averages.
  bool averages_at(int64_t s) const {
    return s >= warmup_steps_ && (s - warmup_steps_) % period_ == 0;
  }

 private:
  int period_;
  int warmup_steps_;
  int64_t step_ = 0;
};

}  // namespace loom::strategies
