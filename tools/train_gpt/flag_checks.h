#pragma once
// train_gpt's checks of its command line, all made before any work starts: numeric bounds,
// seeds, empty values, outputs that cannot be written, models too large for this machine,
// flags that would have no effect, and the flags every rank must agree on. Each failure is a
// loom::Error naming the flag, the value and what is accepted (flag_checks.cpp says why).

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "nn/gpt.h"
#include "strategies/registry.h"
#include "tools/train_gpt/trainer.h"

namespace loom::train_gpt {

// A number in [low, high] (or (low, high] when not inclusive), named in the message.
CLI::Validator bounded(double low, bool inclusive, double high = HUGE_VAL);
extern const CLI::Validator kAtLeastOne, kNonNegative, kPositive;
extern const CLI::Validator kSeed;  // a whole number in 0 .. 2^64 - 1

void refuse_empty_values(const CLI::App& app);
void check_model_fits(const nn::GPTConfig& model, int64_t batch);
// `strategy`: the registered name the run uses.
void refuse_flags_without_effect(const CLI::App& app, const TrainOptions& o,
                                 const std::string& strategy,
                                 const strategies::StrategyConfig& config);
// `directory`: the path is a folder that may not exist yet (its parent must).
void check_output_path(const char* flag, const std::string& path, bool directory = false);
// Collective: every rank calls it with the same flags in the same order.
void check_same_flags_on_every_rank(strategies::Strategy& strategy,
                                    const std::vector<std::pair<const char*, double>>& flags);
void check_devices(const std::string& devices, const strategies::Strategy& strategy);

}  // namespace loom::train_gpt
