#pragma once
// Pipeline schedules: for one stage of a pipeline, the order of its forward and backward
// actions over the micro-batches of a batch (strategies/pipeline/stage_runner.h runs them).
// A schedule is one small class; a new one overrides actions(). Every schedule here runs the
// backward passes in increasing micro-batch order, so gradients accumulate in the order
// gradient accumulation on one device gives, and every schedule gives the same weights.
//
//   gpipe  fill-drain: every forward, then every backward. A stage holds all m
//          micro-batches' activations.
//   1f1b   PipeDream-flush: stage s of p runs min(p - s - 1, m) forwards ahead, then
//          alternates one forward and one backward, then drains. A stage holds at most
//          p - s micro-batches' activations.
//
// Both idle a stage for (p - 1) / (m + p - 1) of a step when every action takes as long.

#include <memory>
#include <string>
#include <vector>

namespace loom::strategies::pipeline {

struct Action {
  enum Kind { Forward, Backward } kind;
  int micro_batch;
  bool operator==(const Action&) const = default;
};

class Schedule {
 public:
  virtual ~Schedule() = default;
  virtual std::string name() const = 0;
  virtual std::vector<Action> actions(int stage, int stages, int micro_batches) const = 0;
  // The fraction of a step a stage idles when every action takes the same time.
  virtual double theoretical_bubble(int stages, int micro_batches) const;
};

class GPipeSchedule : public Schedule {
 public:
  std::string name() const override { return "gpipe"; }
  std::vector<Action> actions(int stage, int stages, int micro_batches) const override;
};

class OneFOneBSchedule : public Schedule {
 public:
  std::string name() const override { return "1f1b"; }
  std::vector<Action> actions(int stage, int stages, int micro_batches) const override;
};

// "gpipe", "1f1b"; anything else is loom::Error listing them.
std::unique_ptr<Schedule> make_schedule(const std::string& name);

// Throws loom::Error unless `actions` run every micro-batch's forward once and then its
// backward once, with the backward passes in increasing micro-batch order.
void check_actions(const std::vector<Action>& actions, int micro_batches, const std::string& schedule);

// The most micro-batches whose activations a stage holds at once under `actions`.
int peak_in_flight(const std::vector<Action>& actions);

}  // namespace loom::strategies::pipeline
