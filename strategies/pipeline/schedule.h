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
//   zero_bubble  ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): 1F1B with each
//          backward split into its input half (I: the gradient the stage before waits for)
//          and its weight half (W: the weights' gradients, which nothing waits for). Stage s
//          runs its W passes s micro-batches behind its I passes, so that they fill the
//          time 1F1B spends waiting; a stage holds at most p micro-batches' activations, as
//          1F1B's first stage does.
//
// GPipe and 1F1B idle a stage (p - 1) / (m + p - 1) of a step when every action takes as
// long; interleaving divides the idle time by v: (p - 1) / (v m + p - 1); zero_bubble, with
// I and W each half of a backward, leaves (p - 1) / (3 m + p - 1).

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace loom::strategies::pipeline {

struct Action {
  // F, B, and a backward split in two halves: I (input gradient) then W (weight gradient).
  enum Kind { Forward, Backward, BackwardInput, BackwardWeight } kind;
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
  // The fraction of a step a stage idles when a chunk's forward takes one unit of time, its
  // backward two (I and W one each) and messages none: simulate()'s figure.
  double theoretical_bubble(int stages, int micro_batches) const;
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

 private:
  int chunks_;
};

class ZeroBubbleSchedule : public Schedule {
 public:
  std::string name() const override { return "zero_bubble"; }
  std::vector<Action> actions(int stage, int stages, int micro_batches) const override;
};

// Makes a schedule; `chunks` is the model chunks per stage, read by the schedules that
// interleave them (and ignored by the others).
using ScheduleFactory = std::function<std::unique_ptr<Schedule>(int chunks)>;

struct ScheduleEntry {
  ScheduleFactory factory;
  std::string description;
};

// Schedules by name, with every Loom registry's verbs (core/registry.h). Built-in: "gpipe",
// "1f1b", "interleaved_1f1b" (chunks >= 2), "zero_bubble". A schedule of one's own overrides
// Schedule::actions() and is added here; --pp-schedule then accepts its name.
class ScheduleRegistry {
 public:
  // Throws loom::Error when the name is empty or taken, or the factory empty.
  static void add(const std::string& name, ScheduleEntry entry);
  static bool remove(const std::string& name);
  static bool contains(const std::string& name);
  // An unknown name is loom::Error listing the registered ones and the closest match.
  static std::unique_ptr<Schedule> create(const std::string& name, int chunks = 2);
  // (name, description) of every registered schedule, sorted by name.
  static std::vector<std::pair<std::string, std::string>> list();
};

// The name before 2026-12-03, kept for existing programs.
[[deprecated("use ScheduleRegistry::create")]] std::unique_ptr<Schedule> make_schedule(
    const std::string& name, int chunks = 2);

// Throws loom::Error unless `actions` run every micro-batch's forward once on each of the
// `chunks` chunks and then its backward once (whole, or its I and later its W half), each
// chunk's backward passes and weight halves in increasing micro-batch order.
void check_actions(const std::vector<Action>& actions, int micro_batches, int chunks,
                   const std::string& schedule);

// The most micro-batches whose activations a stage holds at once under `actions` (from a
// forward until the backward, or its W half, frees them).
int peak_in_flight(const std::vector<Action>& actions);

// Every stage's actions run against each other: each starts once the stage is free and
// what it waits for (the chunk before's forward, the chunk after's backward) is done.
struct Simulation {
  double makespan = 0;
  std::vector<double> busy;                                   // per stage
  std::vector<std::vector<std::pair<double, double>>> spans;  // per stage, per action: start, end
};
// Costs as theoretical_bubble says; a schedule whose stages wait for each other forever is
// loom::Error naming the stages stuck and what they wait for.
Simulation simulate(const Schedule& schedule, int stages, int micro_batches);

}  // namespace loom::strategies::pipeline
