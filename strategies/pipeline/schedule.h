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
//   interleaved_1f1b  Megatron's interleaved schedule: each stage holds v model chunks
//          (virtual stages: chunk j of stage s is the model's chunk j*p + s), forwards
//          cycle through the chunks p micro-batches at a time; m must be a multiple of p.
//
// GPipe and 1F1B idle a stage (p - 1) / (m + p - 1) of a step when every action takes as
// long; interleaving divides the idle time by v: (p - 1) / (v m + p - 1).

#include <memory>
#include <string>
#include <vector>

namespace loom::strategies::pipeline {

struct Action {
  enum Kind { Forward, Backward } kind;
  int micro_batch;
  int chunk = 0;  // which of the stage's model chunks (0 unless interleaved)
  bool operator==(const Action&) const = default;
};

class Schedule {
 public:
  virtual ~Schedule() = default;
  virtual std::string name() const = 0;
  // Model chunks per stage (virtual stages): the model is split into stages x this many.
  virtual int chunks_per_stage() const { return 1; }
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

class InterleavedOneFOneBSchedule : public Schedule {
 public:
  explicit InterleavedOneFOneBSchedule(int chunks);
  std::string name() const override { return "interleaved_1f1b"; }
  int chunks_per_stage() const override { return chunks_; }
  std::vector<Action> actions(int stage, int stages, int micro_batches) const override;
  double theoretical_bubble(int stages, int micro_batches) const override;

 private:
  int chunks_;
};

// "gpipe", "1f1b", "interleaved_1f1b" (with `chunks` model chunks per stage, >= 2); anything
// else is loom::Error listing them.
std::unique_ptr<Schedule> make_schedule(const std::string& name, int chunks = 2);

// Throws loom::Error unless `actions` run every micro-batch's forward once on each of the
// `chunks` chunks and then its backward once, each chunk's backward passes in increasing
// micro-batch order.
void check_actions(const std::vector<Action>& actions, int micro_batches, int chunks,
                   const std::string& schedule);

// The most micro-batches whose activations a stage holds at once under `actions`.
int peak_in_flight(const std::vector<Action>& actions);

}  // namespace loom::strategies::pipeline
