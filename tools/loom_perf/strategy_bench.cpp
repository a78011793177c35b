#include "tools/loom_perf/strategy_bench.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "comm/error.h"
#include "core/tunables.h"
#include "data/token_blocks.h"
#include "kernels/cpu/thread_pool.h"
#include "strategies/memory_report.h"
#include "strategies/registry.h"
#include "strategies/trace.h"
#include "tools/loom_perf/launch.h"
#include "tools/loom_perf/options.h"
#include "tools/loom_perf/report.h"
#include "tools/train_gpt/trainer.h"

namespace loom::perf {

namespace {

struct StrategyBenchOptions {
  std::string strategy = "ddp";
  strategies::StrategyConfig strategy_options;
  train_gpt::TrainOptions train;
  int64_t warmup = 2;
  int np = 0;
  std::string csv_path, json_path, command;
  std::string param_dtype = "f32", reduce_dtype = "f32";
  int threads = 1;
};

using Traffic = std::map<std::string, comm::ProcessGroup::Traffic, std::less<>>;

// The strategy's process group; null for strategies without one (single_device, dp).
const comm::ProcessGroup* group_of(const strategies::Strategy& strategy) {
  auto* parallel = dynamic_cast<const strategies::ParallelStrategy*>(&strategy);
  return parallel != nullptr ? parallel->process_group().get() : nullptr;
}

// What one rank measured.
struct RankResult {
  std::vector<double> step_ms;       // every step, warm-up included
  std::vector<double> exposed_ms;    // per step: the training thread blocked on collectives
  Traffic traffic;  // steps 1 to the last
  strategies::MemoryReport memory;   // this rank's peaks over the training steps
};

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

// Time per step the training thread spent waiting for communication: the sharded engine's
// "wait ..." spans and DDP's "ddp wait for buckets", inside each "step K" span.
std::vector<double> exposed_communication_ms(const strategies::Trace& trace, int64_t steps) {
  std::vector<double> per_step(static_cast<size_t>(steps), 0.0);
  std::vector<std::pair<int64_t, int64_t>> bounds(static_cast<size_t>(steps), {0, -1});
  const std::vector<strategies::Trace::Event> events = trace.events();
  for (const auto& e : events) {
    if (e.phase != 'X' || e.category != "step" || e.name.rfind("step ", 0) != 0) continue;
    const int64_t step = std::stoll(e.name.substr(5));
    if (step >= 0 && step < steps) bounds[static_cast<size_t>(step)] = {e.ts, e.ts + e.dur};
  }
  for (const auto& e : events) {
    const bool wait = e.phase == 'X' && e.tid == strategies::Trace::kMainThread &&
                      (e.name.rfind("wait ", 0) == 0 || e.name == "ddp wait for buckets");
    if (!wait) continue;
    for (size_t s = 0; s < bounds.size(); ++s) {
      if (e.ts >= bounds[s].first && e.ts < bounds[s].second) per_step[s] += e.dur / 1e3;
    }
  }
  return per_step;
}

RankResult run_rank(const StrategyBenchOptions& o, strategies::Strategy& strategy) {
  const train_gpt::TrainOptions& t = o.train;
  nn::GPT model(t.model, t.seed);
  const int64_t tokens_needed = (t.steps * t.grad_accum * strategy.world_size() + 1) * t.batch *
                                    t.model.context + 1;
  data::TokenBlocks data(
      data::synthetic_tokens(tokens_needed, t.model.vocab_size, t.seed), t.batch,
      t.model.context, t.model.vocab_size, false, t.seed);
  strategies::Trace trace;
  strategies::set_current_trace(&trace);
  RankResult result;
  // Traffic between the end of step 0 and the end of the last step: setup's broadcasts
  // before and gather_full_module's all-gathers after are not the steps' own.
  const comm::ProcessGroup* group = group_of(strategy);
  Traffic first;
  train_gpt::train(
      model, data, t,
      [&](const train_gpt::StepMetrics& m) {
        result.step_ms.push_back(m.ms_per_step);
        result.memory = strategies::local_memory_report(strategy.root_device());
        if (group == nullptr) return;
        if (m.step == 0) first = group->traffic();
        if (m.step == t.steps - 1) result.traffic = group->traffic();
      },
      &strategy);
  strategies::set_current_trace(nullptr);
  result.exposed_ms = exposed_communication_ms(trace, t.steps);
  for (auto& [kind, count] : result.traffic) {
    auto it = first.find(kind);
    if (it == first.end()) continue;
    count.calls -= it->second.calls;
    count.bytes -= it->second.bytes;
  }
  return result;
}

// Collective bytes per step as nccl-tests sizes them (ProcessGroup::traffic): the whole
// buffer. The traffic covers steps - 1 steps.
double mib_per_step(const RankResult& r, const std::string& kind, int64_t steps) {
  auto it = r.traffic.find(kind);
  if (it == r.traffic.end() || steps < 2) return 0.0;
  return static_cast<double>(it->second.bytes) / static_cast<double>(steps - 1) / (1 << 20);
}

std::vector<double> gather_doubles(strategies::Strategy& strategy, const std::vector<double>& v) {
  if (strategy.world_size() == 1) return v;
  Tensor mine = Tensor::from_vector<double>(v, {static_cast<int64_t>(v.size())})
                    .to(strategy.root_device());
  return strategy.all_gather(mine).to(Device::cpu()).contiguous().to_vector<double>();
}

int run(const StrategyBenchOptions& o) {
  std::unique_ptr<strategies::Strategy> strategy =
      strategies::StrategyRegistry::create(o.strategy, o.strategy_options);
  strategy->setup_environment();
  const RankResult r = run_rank(o, *strategy);
  const int world = strategy->world_size();
  const int64_t steps = o.train.steps;
  const int64_t timed_from = std::min<int64_t>(o.warmup, steps - 1);

  // Per rank: median step, median exposed, MiB per step of each kind, peaks by kind.
  const std::vector<std::string> kinds = {"all_gather", "reduce_scatter", "allreduce"};
  std::vector<double> mine = {
      median({r.step_ms.begin() + timed_from, r.step_ms.end()}),
      median({r.exposed_ms.begin() + timed_from, r.exposed_ms.end()})};
  for (const std::string& kind : kinds)
    mine.push_back(mib_per_step(r, kind, steps));
  mine.push_back(static_cast<double>(r.memory.peak_bytes));
  for (int64_t bytes : r.memory.peak_by_kind)
    mine.push_back(static_cast<double>(bytes));
  const size_t width = mine.size();
  // The slowest rank's time for each step.
  std::vector<double> step_ms = r.step_ms;
  if (world > 1) {
    Tensor t = Tensor::from_vector<double>(step_ms, {steps}).to(strategy->root_device());
    step_ms = strategy->all_reduce(t, comm::ReduceOp::Max).to(Device::cpu()).to_vector<double>();
  }
  const std::vector<double> all = gather_doubles(*strategy, mine);
  strategy->barrier();
  if (!strategy->is_global_zero()) return 0;

  const std::vector<double> timed(step_ms.begin() + timed_from, step_ms.end());
  const double step_median = median(timed);
  const std::string date = iso_date_now(), device = "cpu (" + cpu_model() + ")";
  const train_gpt::TrainOptions& t = o.train;
  std::printf("# loom-perf strategy: %s on %d rank(s) (%s), %s, %s\n", o.strategy.c_str(), world,
              group_of(*strategy) ? group_of(*strategy)->backend_name().c_str() : "no group",
              device.c_str(), date.c_str());
  std::printf("# command: %s\n", o.command.c_str());
  std::printf("# model: GPT %lld layers, %lld heads, embd %lld, ctx %lld, vocab %lld; batch %lld "
              "per rank, grad accum %lld, %s; %lld steps timed after %lld warm-up\n",
              static_cast<long long>(t.model.layers), static_cast<long long>(t.model.heads),
              static_cast<long long>(t.model.embd), static_cast<long long>(t.model.context),
              static_cast<long long>(t.model.vocab_size), static_cast<long long>(t.batch),
              static_cast<long long>(t.grad_accum), o.strategy_options.precision.c_str(),
              static_cast<long long>(timed.size()), static_cast<long long>(timed_from));
  std::printf("# step time (slowest rank): median %.2f ms, min %.2f ms, max %.2f ms\n",
              step_median, *std::min_element(timed.begin(), timed.end()),
              *std::max_element(timed.begin(), timed.end()));
  std::printf("# per step and rank; MiB as nccl-tests size collectives (the whole buffer)\n");
  std::printf("#%5s %9s %12s %14s %18s %13s %9s", "rank", "step_ms", "exposed_ms",
              "all_gather_MiB", "reduce_scatter_MiB", "allreduce_MiB", "peak_MiB");
  for (size_t k = 0; k < kMemoryKindCount; ++k)
    std::printf(" %s_MiB", memory_kind_name(static_cast<MemoryKind>(k)));
  std::printf("\n");
  nlohmann::ordered_json results = nlohmann::ordered_json::array();
  std::ofstream csv;
  if (!o.csv_path.empty()) {
    csv.open(o.csv_path, std::ios::trunc);
    if (!csv) fail("loom-perf strategy: cannot write --csv file '", o.csv_path, "'");
    csv << "strategy,ranks,rank,step_ms,exposed_comm_ms,all_gather_mib,reduce_scatter_mib,"
           "allreduce_mib,peak_bytes";
    for (size_t k = 0; k < kMemoryKindCount; ++k)
      csv << ",peak_" << memory_kind_name(static_cast<MemoryKind>(k)) << "_bytes";
    csv << "\n";
  }
  for (int rank = 0; rank < world; ++rank) {
    const double* row = all.data() + static_cast<size_t>(rank) * width;
    std::printf(" %5d %9.2f %12.2f %14.2f %18.2f %13.2f %9.2f", rank, row[0], row[1], row[2],
                row[3], row[4], row[5] / (1 << 20));
    for (size_t k = 0; k < kMemoryKindCount; ++k) {
      const int label = static_cast<int>(std::string(memory_kind_name(static_cast<MemoryKind>(k))).size()) + 4;
      std::printf(" %*.2f", label, row[6 + k] / (1 << 20));
    }
    std::printf("\n");
    nlohmann::ordered_json by_kind = nlohmann::ordered_json::object();
    for (size_t k = 0; k < kMemoryKindCount; ++k)
      by_kind[memory_kind_name(static_cast<MemoryKind>(k))] = static_cast<int64_t>(row[6 + k]);
    results.push_back({{"rank", rank},
                       {"step_ms", row[0]},
                       {"exposed_comm_ms", row[1]},
                       {"all_gather_mib", row[2]},
                       {"reduce_scatter_mib", row[3]},
                       {"allreduce_mib", row[4]},
                       {"peak_bytes", static_cast<int64_t>(row[5])},
                       {"peak_bytes_by_kind", by_kind}});
    if (csv.is_open()) {
      csv << o.strategy << ',' << world << ',' << rank;
      for (size_t c = 0; c < 5; ++c)
        csv << ',' << row[c];
      for (size_t c = 5; c < width; ++c)
        csv << ',' << static_cast<int64_t>(row[c]);
      csv << "\n";
    }
  }
  if (!o.json_path.empty()) {
    nlohmann::ordered_json doc = {
        {"metadata",
         {{"benchmark", "strategy"},
          {"strategy", o.strategy},
          {"ranks", world},
          {"device", device},
          {"date", date},
          {"command", o.command},
          {"layers", t.model.layers},
          {"heads", t.model.heads},
          {"embd", t.model.embd},
          {"context", t.model.context},
          {"vocab", t.model.vocab_size},
          {"batch", t.batch},
          {"precision", o.strategy_options.precision},
          {"timed_steps", timed.size()},
          {"step_ms_median", step_median},
          {"step_ms_slowest_rank", timed}}},
        {"results", results}};
    std::ofstream out(o.json_path, std::ios::trunc);
    out << doc.dump(2) << "\n";
    if (!out) fail("loom-perf strategy: cannot write --json file '", o.json_path, "'");
  }
  return 0;
}

}  // namespace

int strategy_main(int argc, char** argv) {
  StrategyBenchOptions o;
  train_gpt::TrainOptions& t = o.train;
  t.steps = 12;
  t.grad_clip = 0.0;  // the update is not what is measured
  CLI::App app{"loom-perf strategy: time train_gpt's steps under a registered strategy"};
  app.add_option("--strategy", o.strategy, "a registered strategy name")->capture_default_str();
  app.add_option("--layers", t.model.layers, "transformer blocks")->capture_default_str();
  app.add_option("--heads", t.model.heads, "attention heads")->capture_default_str();
  app.add_option("--embd", t.model.embd, "embedding width")->capture_default_str();
  app.add_option("--ctx", t.model.context, "context length")->capture_default_str();
  app.add_option("--vocab", t.model.vocab_size, "vocabulary size")->capture_default_str();
  // Ranges as train_gpt's (a batch or accumulation of 0 would time nothing, and a negative
  // one reaches the data loader as a huge size).
  app.add_option("--batch", t.batch, "sequences per step and rank")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  app.add_option("--grad-accum", t.grad_accum, "micro-batches per step")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16));
  app.add_option("--steps", t.steps, "steps in all (warm-up included)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 40));
  app.add_option("--warmup", o.warmup,
                 "untimed first steps (capped at --steps - 1: the last step is always timed)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--precision", o.strategy_options.precision, "32-true, bf16-mixed, 16-mixed")
      ->capture_default_str();
  app.add_option("--wrap-policy", o.strategy_options.sharding.auto_wrap_policy,
                 "sharded strategies: none, params, min_params:N or a class name");
  app.add_option("--fsdp-sharding-strategy", o.strategy_options.fsdp_sharding_strategy,
                 "fsdp names: FULL_SHARD, SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD")
      ->capture_default_str();
  app.add_option("--threads", o.threads, "threads per rank for the optimizer step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--param-dtype", o.param_dtype, "stage 3: f32, bf16 or f16 parameter shards")
      ->capture_default_str();
  app.add_option("--reduce-dtype", o.reduce_dtype, "gradient reduction in f32, bf16 or f16")
      ->capture_default_str();
  app.add_option("--nvme-path", o.strategy_options.sharding.nvme_path,
                 "NVMe offload: directory for the optimizer's swap file");
  app.add_option("--sub-group-size", o.strategy_options.sharding.sub_group_size,
                 "NVMe offload: elements per sub-group paged at once")
      ->capture_default_str();
  app.add_option("--nvme-buffer-count", o.strategy_options.sharding.nvme_buffer_count,
                 "NVMe offload: sub-groups in host memory at once")
      ->capture_default_str();
  app.add_flag("--forward-prefetch", o.strategy_options.sharding.forward_prefetch,
               "stage 3: gather the next unit during this one's forward");
  app.add_option("--csv", o.csv_path, "also write one row per rank as CSV here");
  app.add_option("--json", o.json_path, "also write the rows and metadata as JSON here");
  app.add_option("--np", o.np, "launch this many ranks on this host (else join loomrun's)")
      ->check(CLI::PositiveNumber);
  try {
    app.parse(argc - 1, argv + 1);
  } catch (const CLI::ParseError& e) {
    const int printed = app.exit(e);  // CLI11's own codes (105, ...) mean bad usage here
    return printed == 0 ? 0 : 2;
  }
  const char* launched_as = tunable_value(tunables::kPerfCommand);
  o.command = launched_as != nullptr ? launched_as : join_command(argc, argv);
  try {
    kernels::cpu::set_num_threads(o.threads);
    o.strategy_options.sharding.param_dtype = parse_dtype(o.param_dtype);
    o.strategy_options.sharding.reduce_dtype = parse_dtype(o.reduce_dtype);
    // A known name whose defaults accept these options (nothing is built yet).
    strategies::StrategyRegistry::with_defaults(o.strategy, o.strategy_options);
  } catch (const Error& e) {
    std::cerr << "loom-perf strategy: " << e.what() << "\n";
    return 2;
  }
  try {
    if (o.np > 0) return launch_ranks(o.np, false, argc, argv, o.command);
    return run(o);
  } catch (const std::exception& e) {
    report_rank_error("loom-perf strategy", e);
  }
  return 1;
}

}  // namespace loom::perf
