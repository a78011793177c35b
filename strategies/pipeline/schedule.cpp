#include "strategies/pipeline/schedule.h"

#include <algorithm>

#include "core/error.h"
#include "core/registry.h"
#include "core/tags.h"

namespace loom::strategies::pipeline {

double Schedule::theoretical_bubble(int stages, int micro_batches) const {
  const Simulation run = simulate(*this, stages, micro_batches);
  double idle = 0;
  for (double busy : run.busy)
    idle += 1.0 - busy / run.makespan;
  return idle / static_cast<double>(stages);
}

std::vector<Action> GPipeSchedule::actions(int, int, int micro_batches) const {
  std::vector<Action> out;
  for (int k = 0; k < micro_batches; ++k)
    out.push_back({Action::Forward, k});
  for (int k = 0; k < micro_batches; ++k)
    out.push_back({Action::Backward, k});
  return out;
}

std::vector<Action> OneFOneBSchedule::actions(int stage, int stages, int micro_batches) const {
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<Action> out;
  for (int k = 0; k < warmup; ++k)
    out.push_back({Action::Forward, k});
  for (int k = 0; k + warmup < micro_batches; ++k) {
    out.push_back({Action::Forward, k + warmup});
    out.push_back({Action::Backward, k});
  }
  for (int k = micro_batches - warmup; k < micro_batches; ++k)
    out.push_back({Action::Backward, k});
  return out;
}

InterleavedOneFOneBSchedule::InterleavedOneFOneBSchedule(int chunks) : chunks_(chunks) {
  if (chunks < 2) {
    tag::kPipeline.fail("interleaved_1f1b needs at least 2 model chunks per stage, got ", chunks,
                        "; with 1 it is 1f1b");
  }
}

// Megatron's order: forward i runs micro-batch (i / (p v)) p + i % p on chunk (i / p) % v,
// backward i the same micro-batch on chunk v - 1 - (i / p) % v; a stage runs
// (p - s - 1) 2 + (v - 1) p forwards ahead, then alternates, then drains.
std::vector<Action> InterleavedOneFOneBSchedule::actions(int stage, int stages,
                                                         int micro_batches) const {
  const int p = stages, v = chunks_, m = micro_batches;
  if (p < 2) tag::kPipeline.fail("interleaved_1f1b needs at least 2 stages");
  if (m % p != 0) {
    tag::kPipeline.fail("interleaved_1f1b needs --micro-batches a multiple of --pp ", p, ", got ",
                        m);
  }
  const int total = m * v;
  auto micro_batch = [&](int i) { return i / (p * v) * p + i % p; };
  auto forward = [&](int i) { return Action{Action::Forward, micro_batch(i), (i / p) % v}; };
  auto backward = [&](int i) {
    return Action{Action::Backward, micro_batch(i), v - 1 - (i / p) % v};
  };
  const int warmup = std::min((p - stage - 1) * 2 + (v - 1) * p, total);
  std::vector<Action> out;
  for (int i = 0; i < warmup; ++i)
    out.push_back(forward(i));
  for (int i = 0; i + warmup < total; ++i) {
    out.push_back(forward(i + warmup));
    out.push_back(backward(i));
  }
  for (int i = total - warmup; i < total; ++i)
    out.push_back(backward(i));
  return out;
}

// PyTorch's and the paper's ZB-H1: 1F1B's order with I for B, and a W after each I from
// the (s + 1)-th on, the rest at the end.
std::vector<Action> ZeroBubbleSchedule::actions(int stage, int stages, int micro_batches) const {
  const int warmup = std::min(stages - stage - 1, micro_batches);
  std::vector<Action> out;
  for (int k = 0; k < warmup; ++k)
    out.push_back({Action::Forward, k});
  int weights = 0;
  for (int k = 0; k < micro_batches; ++k) {
    if (k + warmup < micro_batches) out.push_back({Action::Forward, k + warmup});
    out.push_back({Action::BackwardInput, k});
    if (k >= stage) out.push_back({Action::BackwardWeight, weights++});
  }
  while (weights < micro_batches)
    out.push_back({Action::BackwardWeight, weights++});
  return out;
}

namespace {

// The built-in schedules, added when the registry is first used.
struct Registry : NamedRegistry<ScheduleEntry> {
  Registry() : NamedRegistry<ScheduleEntry>(tag::kPipeline, "schedule") {
    add("gpipe", {[](int) { return std::make_unique<GPipeSchedule>(); },
                  "every forward, then every backward (GPipe)"});
    add("1f1b", {[](int) { return std::make_unique<OneFOneBSchedule>(); },
                 "one forward, one backward after a warm-up (PipeDream-Flush)"});
    add("interleaved_1f1b",
        {[](int chunks) { return std::make_unique<InterleavedOneFOneBSchedule>(chunks); },
         "1f1b over --pp-chunks model chunks per stage (Megatron-LM's interleaving)"});
    add("zero_bubble", {[](int) { return std::make_unique<ZeroBubbleSchedule>(); },
                        "1f1b with backward split into input and weight halves (ZB-H1)"});
  }
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

void ScheduleRegistry::add(const std::string& name, ScheduleEntry entry) {
  registry().add(name, std::move(entry));
}

bool ScheduleRegistry::remove(const std::string& name) {
  return registry().remove(name);
}

bool ScheduleRegistry::contains(const std::string& name) {
  return registry().contains(name);
}

std::unique_ptr<Schedule> ScheduleRegistry::create(const std::string& name, int chunks) {
  std::unique_ptr<Schedule> schedule = registry().at(name).factory(chunks);
  if (schedule == nullptr) tag::kPipeline.fail("the factory of schedule '", name, "' returned null");
  return schedule;
}

std::vector<std::pair<std::string, std::string>> ScheduleRegistry::list() {
  return registry().list();
}

std::unique_ptr<Schedule> make_schedule(const std::string& name, int chunks) {
  return ScheduleRegistry::create(name, chunks);
}

void check_actions(const std::vector<Action>& actions, int micro_batches, int chunks,
                   const std::string& schedule) {
  std::vector<std::vector<int>> forwards(chunks, std::vector<int>(micro_batches, 0));
  std::vector<int> next_backward(chunks, 0), next_weight(chunks, 0);
  std::vector<std::vector<bool>> split(chunks, std::vector<bool>(micro_batches, false));
  for (const Action& a : actions) {
    if (a.micro_batch < 0 || a.micro_batch >= micro_batches || a.chunk < 0 || a.chunk >= chunks) {
      tag::kPipeline.fail("schedule ", schedule, ": micro-batch ", a.micro_batch, " of ",
                          micro_batches, ", chunk ", a.chunk, " of ", chunks);
    }
    switch (a.kind) {
      case Action::Forward:
        if (forwards[a.chunk][a.micro_batch]++ != 0) {
          tag::kPipeline.fail("schedule ", schedule, ": micro-batch ", a.micro_batch,
                              " runs forward twice on chunk ", a.chunk);
        }
        break;
      case Action::Backward:
      case Action::BackwardInput:
        if (a.micro_batch != next_backward[a.chunk]) {
          tag::kPipeline.fail("schedule ", schedule, ": backward of micro-batch ", a.micro_batch,
                              " where ", next_backward[a.chunk],
                              " is due (backward passes run in increasing order)");
        }
        if (forwards[a.chunk][a.micro_batch] == 0) {
          tag::kPipeline.fail("schedule ", schedule, ": backward of micro-batch ", a.micro_batch,
                              " before its forward");
        }
        ++next_backward[a.chunk];
        if (a.kind == Action::Backward) {
          ++next_weight[a.chunk];  // a whole backward does its weight half too
        } else {
          split[a.chunk][a.micro_batch] = true;
        }
        break;
      case Action::BackwardWeight:
        if (a.micro_batch != next_weight[a.chunk] || !split[a.chunk][a.micro_batch]) {
          tag::kPipeline.fail(
              "schedule ", schedule, ": weight half of micro-batch ", a.micro_batch, " on chunk ",
              a.chunk, " where ", next_weight[a.chunk],
              "'s is due (after its input half; weight halves run in increasing order)");
        }
        ++next_weight[a.chunk];
        break;
    }
  }
  for (int c = 0; c < chunks; ++c) {
    if (next_backward[c] != micro_batches || next_weight[c] != micro_batches) {
      tag::kPipeline.fail("schedule ", schedule, ": ", next_backward[c], " backward passes and ",
                          next_weight[c], " weight halves for ", micro_batches,
                          " micro-batches on chunk ", c);
    }
  }
}

int peak_in_flight(const std::vector<Action>& actions) {
  int held = 0, peak = 0;
  for (const Action& a : actions) {
    if (a.kind == Action::Forward) ++held;
    if (a.kind == Action::Backward || a.kind == Action::BackwardWeight) --held;
    peak = std::max(peak, held);
  }
  return peak;
}

Simulation simulate(const Schedule& schedule, int stages, int micro_batches) {
  const int p = stages, v = schedule.chunks_per_stage(), chunks = p * v;
  const double unit = 1.0 / v;  // a chunk is 1/v of a stage's layers
  std::vector<std::vector<Action>> actions(p);
  for (int s = 0; s < p; ++s) {
    actions[s] = schedule.actions(s, p, micro_batches);
    check_actions(actions[s], micro_batches, v, schedule.name());
  }
  // When each (global chunk, micro-batch)'s forward and its input gradient are done.
  const double kNotYet = -1;
  std::vector<std::vector<double>> forward_done(chunks, std::vector<double>(micro_batches, kNotYet));
  std::vector<std::vector<double>> backward_done = forward_done;
  Simulation run;
  run.busy.assign(p, 0);
  run.spans.resize(p);
  std::vector<double> free_at(p, 0);
  std::vector<size_t> next(p, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < p; ++s) {
      for (; next[s] < actions[s].size(); ++next[s]) {
        const Action& a = actions[s][next[s]];
        const int g = a.chunk * p + s;
        double ready = free_at[s];
        double cost = unit;
        if (a.kind == Action::Forward && g > 0) {
          if (forward_done[g - 1][a.micro_batch] == kNotYet) break;
          ready = std::max(ready, forward_done[g - 1][a.micro_batch]);
        }
        if (a.kind == Action::Backward || a.kind == Action::BackwardInput) {
          if (g + 1 < chunks) {
            if (backward_done[g + 1][a.micro_batch] == kNotYet) break;
            ready = std::max(ready, backward_done[g + 1][a.micro_batch]);
          }
          if (a.kind == Action::Backward) cost = 2 * unit;
        }
        free_at[s] = ready + cost;
        run.busy[s] += cost;
        run.spans[s].emplace_back(ready, free_at[s]);
        if (a.kind == Action::Forward) forward_done[g][a.micro_batch] = free_at[s];
        if (a.kind == Action::Backward || a.kind == Action::BackwardInput)
          backward_done[g][a.micro_batch] = free_at[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < p; ++s) {
    if (next[s] < actions[s].size()) {
      const Action& a = actions[s][next[s]];
      tag::kPipeline.fail("schedule ", schedule.name(), " deadlocks: stage ", s, " of ", p,
                          " waits forever to run ",
                          a.kind == Action::Forward ? "the forward" : "the backward",
                          " of micro-batch ", a.micro_batch, " on chunk ", a.chunk);
    }
    run.makespan = std::max(run.makespan, free_at[s]);
  }
  return run;
}

}  // namespace loom::strategies::pipeline
