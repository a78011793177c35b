#include "tools/train_gpt/flag_checks.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <string_view>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/tags.h"
#include "strategies/devices.h"
#include "strategies/registry.h"

namespace loom::train_gpt {

// Numeric flag checks whose messages name the bounds (CLI11's PositiveNumber prints a range up
// to the largest double): "--steps: must be at least 1, got 0".
CLI::Validator bounded(double low, bool inclusive, double high) {
  char bound[64];
  if (high == HUGE_VAL) {
    std::snprintf(bound, sizeof bound, "%s %g", inclusive ? "at least" : "above", low);
  } else {
    std::snprintf(bound, sizeof bound, "%s %g and at most %g", inclusive ? "at least" : "above",
                  low, high);
  }
  const std::string rule = bound;
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        char* end = nullptr;
        const double value = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0') return "expected a number, got '" + text + "'";
        const bool ok = (inclusive ? value >= low : value > low) && value <= high;
        return ok ? std::string() : "must be " + rule + ", got " + text;
      },
      rule);
}
const CLI::Validator kAtLeastOne = bounded(1, true);
const CLI::Validator kNonNegative = bounded(0, true);
const CLI::Validator kPositive = bounded(0, false);

// A seed is a whole number that fits in 64 bits (CLI11 alone would wrap 2^64 and -1).
const CLI::Validator kSeed(
    [](std::string& text) -> std::string {
      uint64_t value = 0;
      const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (text.empty() || error != std::errc() || end != text.data() + text.size())
        return "expected a whole number from 0 to 18446744073709551615, got '" + text + "'";
      return "";
    },
    "0 to 2^64 - 1");

// Every option that takes a value must be given one: CLI11 reads --seed '' as 0 and
// --powersgd-warm-start '' as false, and an empty path as "no output".
void refuse_empty_values(const CLI::App& app) {
  for (const CLI::Option* option : app.get_options()) {
    if (option->count() == 0 || option->get_type_size() == 0) continue;  // absent, or a flag
    for (const std::string& value : option->results()) {
      if (value.empty())
        tag::kTrainGpt.fail(option->get_name(),
                            " was given an empty value; give one or drop "
                            "the flag (see --help)");
    }
  }
}

// The whole model is built on every rank before any strategy shards it, so its f32 weights
// must fit in this machine's memory: a size typed with a digit too many is refused here,
// not after minutes of allocation or by the kernel's OOM killer.
void check_model_fits(const nn::GPTConfig& m, int64_t batch) {
  const double embd = static_cast<double>(m.embd);
  const double parameters = static_cast<double>(m.vocab_size + m.context) * embd +
                            static_cast<double>(m.layers) * (12 * embd * embd + 13 * embd) +
                            2 * embd;
  const double bytes = 4 * parameters;
  const double memory =
      static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  if (memory > 0 && bytes > memory) {
    tag::kTrainGpt.fail("the model (--layers ", m.layers, " --heads ", m.heads, " --embd ", m.embd,
                        " --ctx ", m.context, " --vocab ", m.vocab_size, ") has about ", parameters,
                        " parameters: ", bytes / (1 << 30),
                        " GiB of f32 weights, more than this machine's ", memory / (1 << 30),
                        " GiB of memory; make it smaller");
  }
  // The logits of one step (batch x ctx x vocab f32) are the largest activation.
  const double logits = 4.0 * static_cast<double>(batch) * static_cast<double>(m.context) *
                        static_cast<double>(m.vocab_size);
  if (memory > 0 && logits > memory) {
    tag::kTrainGpt.fail("--batch ", batch, " x --ctx ", m.context, " x --vocab ", m.vocab_size,
                        " logits take ", logits / (1 << 30), " GiB, more than this machine's ",
                        memory / (1 << 30), " GiB of memory; make them smaller");
  }
}

// A flag that has no effect in the configuration asked for is refused, naming what it needs:
// whoever typed it believes it changes something. The strategy flags are those the registry's
// entries declare (StrategyEntry::flags): one the chosen strategy does not declare is refused,
// naming the strategies that read it.
void refuse_flags_without_effect(const CLI::App& app, const TrainOptions& o,
                                 const std::string& strategy,
                                 const strategies::StrategyConfig& config) {
  const auto refuse_unless = [&](bool applies, std::initializer_list<const char*> flags,
                                 const std::string& needs) {
    if (applies) return;
    for (const char* flag : flags) {
      if (app.count(flag) > 0) tag::kTrainGpt.fail(flag, " has no effect here: it needs ", needs);
    }
  };
  refuse_unless(o.optimizer == "sgd", {"--momentum", "--dampening", "--nesterov"},
                "--optimizer sgd (this run uses " + o.optimizer + ")");
  refuse_unless(o.optimizer == "adamw", {"--beta1", "--beta2", "--eps"},
                "--optimizer adamw (this run uses " + o.optimizer + ")");
  refuse_unless(!o.checkpoint_dir.empty(),
                {"--save-every", "--keep-last", "--async-save", "--checkpoint-format"},
                "--checkpoint-dir");
  refuse_unless(!o.checkpoint_dir.empty() || o.resume != "auto", {"--resume"},
                "--checkpoint-dir (--resume auto looks for the newest checkpoint there)");
  refuse_unless(config.tensor_parallel.size > 1, {"--sequence-parallel"}, "--tp 2 or more");
  const strategies::StrategyEntry chosen = strategies::StrategyRegistry::entry(strategy);
  std::set<std::string> declared;
  for (const auto& [name, description] : strategies::StrategyRegistry::list()) {
    for (const std::string& flag : strategies::StrategyRegistry::entry(name).flags)
      declared.insert(flag);
  }
  for (const std::string& flag : declared) {
    const CLI::Option* option = app.get_option_no_throw(flag);
    if (option == nullptr || option->count() == 0) continue;
    // A mesh size of 1 splits nothing: --pp 1 and --tp 1 go with any strategy.
    if ((flag == "--pp" || flag == "--tp") && option->as<int>() == 1) continue;
    if (std::find(chosen.flags.begin(), chosen.flags.end(), flag) != chosen.flags.end())
      continue;
    std::string readers;
    for (const std::string& name : strategies::StrategyRegistry::names_reading(flag))
      readers += (readers.empty() ? "" : ", ") + name;
    tag::kTrainGpt.fail(flag, " has no effect here: it needs a strategy that reads it (",
                        readers, "); --strategy ", strategy, " does not");
  }
  refuse_unless(config.ddp.comm_hook == "powersgd",
                {"--powersgd-rank", "--powersgd-start-iter", "--powersgd-warm-start"},
                "--ddp-comm-hook powersgd");
  refuse_unless(config.pipeline.schedule == "interleaved_1f1b", {"--pp-chunks"},
                "--pp-schedule interleaved_1f1b");
}

// An output named on the command line must be writable where it is asked for: checked before
// any work starts, so that a typo does not cost a training run. `directory`: the path is a
// folder that may not exist yet (its parent must).
void check_output_path(const char* flag, const std::string& path, bool directory) {
  if (path.empty()) return;
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (!directory && fs::is_directory(target)) {
    tag::kTrainGpt.fail(flag, " ", path, " is a folder; give a file name in it");
  }
  // --save and --trace replace their file by a rename; --metrics writes through (a FIFO or
  // /dev/null is its reader's business).
  if (!directory && std::string_view(flag) != "--metrics")
    check_replaceable_file(target, tag::kTrainGpt, flag);
  if (directory && fs::is_directory(target)) {
    if (::access(target.c_str(), W_OK) != 0) {
      tag::kTrainGpt.fail(flag, " ", path, " cannot be written: ", std::strerror(errno));
    }
    return;
  }
  const fs::path folder = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(folder)) {
    tag::kTrainGpt.fail(flag, " ", path, ": the folder ", folder.string(),
                        " does not exist; create it first");
  }
  if (::access(folder.c_str(), W_OK) != 0) {
    tag::kTrainGpt.fail(flag, " ", path, ": the folder ", folder.string(),
                        " cannot be written: ", std::strerror(errno));
  }
}

// The flags every rank must agree on: a rank started with another --batch or model would
// otherwise train on a different problem without a word. Compared once at start-up over the
// job; the first that differs is an error (on every rank) naming it and both values.
void check_same_flags_on_every_rank(strategies::Strategy& strategy,
                                    const std::vector<std::pair<const char*, double>>& flags) {
  if (strategy.world_size() == 1) return;
  std::vector<double> mine;
  for (const auto& flag : flags)
    mine.push_back(flag.second);
  const auto n = static_cast<int64_t>(mine.size());
  const Tensor gathered =
      strategy.all_gather(Tensor::from_vector(mine, {n}).to(strategy.root_device()));
  const std::vector<double> all = gathered.to(Device::cpu()).to_vector<double>();
  for (int r = 1; r < strategy.world_size(); ++r) {
    for (int64_t i = 0; i < n; ++i) {
      const double theirs = all[static_cast<size_t>(r * n + i)], first = all[static_cast<size_t>(i)];
      if (theirs == first) continue;
      tag::kTrainGpt.fail("rank ", r, " was started with ", flags[static_cast<size_t>(i)].first,
                          " ", theirs, " and rank 0 with ", first,
                          ": every rank needs the same value");
    }
  }
}

// Devices per node for this job: "auto" takes what the launcher started; an explicit count
// must match the devices the strategy computes on (a rank each; ddp_spawn/ddp_fork start that
// many themselves; for dp the devices are threads of this one process).
void check_devices(const std::string& devices, const strategies::Strategy& strategy) {
  strategies::DeviceSelection selection =
      strategies::parse_devices(devices, strategy.accelerator());
  if (devices == "auto" || devices == "-1") return;
  if (selection.count != strategy.devices()) {
    tag::kTrainGpt.fail(
        "--devices ", selection.count, " but ", strategy.world_size(),
        " rank(s) are running: start the ranks with `loomrun --nproc-per-node ", selection.count,
        " train_gpt --strategy ddp ...`, or use --strategy ddp_spawn (or ddp_fork), which starts "
        "them itself");
  }
}

}  // namespace loom::train_gpt
