#include "strategies/pipeline/schedule.h"

#include <algorithm>

#include "tensor/error.h"

namespace loom::strategies::pipeline {

double Schedule::theoretical_bubble(int stages, int micro_batches) const {
  return static_cast<double>(stages - 1) / static_cast<double>(micro_batches + stages - 1);
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
    fail("[pipeline] interleaved_1f1b needs at least 2 model chunks per stage, got ", chunks,
         "; with 1 it is 1f1b");
  }
}

// Megatron's order: forward i runs micro-batch (i / (p v)) p + i % p on chunk (i / p) % v,
// backward i the same micro-batch on chunk v - 1 - (i / p) % v; a stage runs
// (p - s - 1) 2 + (v - 1) p forwards ahead, then alternates, then drains.
std::vector<Action> InterleavedOneFOneBSchedule::actions(int stage, int stages,
                                                         int micro_batches) const {
  const int p = stages, v = chunks_, m = micro_batches;
  if (p < 2) fail("[pipeline] interleaved_1f1b needs at least 2 stages");
  if (m % p != 0) {
    fail("[pipeline] interleaved_1f1b needs --micro-batches a multiple of --pp ", p, ", got ", m);
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

double InterleavedOneFOneBSchedule::theoretical_bubble(int stages, int micro_batches) const {
  return static_cast<double>(stages - 1) /
         static_cast<double>(chunks_ * micro_batches + stages - 1);
}

std::unique_ptr<Schedule> make_schedule(const std::string& name, int chunks) {
  if (name == "gpipe") return std::make_unique<GPipeSchedule>();
  if (name == "1f1b") return std::make_unique<OneFOneBSchedule>();
  if (name == "interleaved_1f1b") return std::make_unique<InterleavedOneFOneBSchedule>(chunks);
  fail("[pipeline] unknown schedule '", name, "'; expected gpipe, 1f1b or interleaved_1f1b");
}

void check_actions(const std::vector<Action>& actions, int micro_batches, int chunks,
                   const std::string& schedule) {
  std::vector<std::vector<int>> forwards(chunks, std::vector<int>(micro_batches, 0));
  std::vector<int> next_backward(chunks, 0);
  for (const Action& a : actions) {
    if (a.micro_batch < 0 || a.micro_batch >= micro_batches || a.chunk < 0 || a.chunk >= chunks) {
      fail("[pipeline] schedule ", schedule, ": micro-batch ", a.micro_batch, " of ",
           micro_batches, ", chunk ", a.chunk, " of ", chunks);
    }
    if (a.kind == Action::Forward) {
      if (forwards[a.chunk][a.micro_batch]++ != 0) {
        fail("[pipeline] schedule ", schedule, ": micro-batch ", a.micro_batch, " runs forward "
             "twice on chunk ", a.chunk);
      }
      continue;
    }
    if (a.micro_batch != next_backward[a.chunk]) {
      fail("[pipeline] schedule ", schedule, ": backward of micro-batch ", a.micro_batch,
           " where ", next_backward[a.chunk], " is due (backward passes run in increasing order)");
    }
    if (forwards[a.chunk][a.micro_batch] == 0) {
      fail("[pipeline] schedule ", schedule, ": backward of micro-batch ", a.micro_batch,
           " before its forward");
    }
    ++next_backward[a.chunk];
  }
  for (int c = 0; c < chunks; ++c) {
    if (next_backward[c] != micro_batches) {
      fail("[pipeline] schedule ", schedule, ": ", next_backward[c], " backward passes for ",
           micro_batches, " micro-batches on chunk ", c);
    }
  }
}
int peak_in_flight(const std::vector<Action>& actions) {
  int held = 0, peak = 0;
  for (const Action& a : actions) {
    held += a.kind == Action::Forward ? 1 : -1;
    peak = std::max(peak, held);
  }
  return peak;
}

}  // namespace loom::strategies::pipeline
