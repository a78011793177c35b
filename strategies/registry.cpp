#include "strategies/registry.h"

#include <algorithm>

#include "core/registry.h"
#include "core/tags.h"
#include "strategies/dp/data_parallel.h"
#include "strategies/ddp/ddp_strategy.h"
#include "strategies/pipeline/pipeline_strategy.h"
#include "strategies/sharded/sharded_strategy.h"
#include "strategies/tp/model_parallel_strategy.h"

namespace loom::strategies {

namespace {

// The flags each family reads (StrategyEntry::flags), as train_gpt and loom-perf spell them.
const std::vector<std::string> kDdpFlags = {
    "--ddp-comm-hook", "--powersgd-rank",    "--powersgd-start-iter", "--powersgd-warm-start",
    "--bucket-cap-mb", "--local-sgd-period", "--local-sgd-warmup"};
const std::vector<std::string> kShardedFlags = {
    "--wrap-policy",  "--forward-prefetch", "--backward-prefetch", "--param-dtype",
    "--reduce-dtype", "--weights-dtype",    "--nvme-path",         "--sub-group-size",
    "--nvme-buffer-count"};
const std::vector<std::string> kTensorParallelFlags = {"--tp", "--sequence-parallel"};
const std::vector<std::string> kPipelineFlags = {"--pp",
                                                 "--micro-batches",
                                                 "--pp-schedule",
                                                 "--pp-chunks",
                                                 "--pp-dp",
                                                 "--pp-balance-by",
                                                 "--pp-balance",
                                                 "--tp",
                                                 "--sequence-parallel"};

std::vector<std::string> joined(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// The built-in strategies, added when the registry is first used.
struct Registry : NamedRegistry<StrategyEntry> {
  Registry() : NamedRegistry<StrategyEntry>(tag::kStrategy, "strategy") {
    add("single_device",
        {.factory =
             [](const StrategyConfig& c) { return std::make_unique<SingleDeviceStrategy>(c); },
         .description = "everything on one device in one process",
         .kind = StrategyKind::SingleDevice});
    add("ddp",
        {.factory = [](const StrategyConfig& c) { return std::make_unique<DDPStrategy>(c, c.ddp); },
         .description = "distributed data parallel: one process per device (launch with loomrun)",
         .kind = StrategyKind::DataParallel,
         .flags = kDdpFlags});
    add("dp",
        {.factory =
             [](const StrategyConfig& c) { return std::make_unique<DataParallelStrategy>(c); },
         .description = "data parallel in one process: the module replicated over --devices "
                        "threads, the batch split by rows",
         .kind = StrategyKind::ThreadDataParallel});
    add("ddp_spawn",
        {.factory =
             [](const StrategyConfig& c) {
               return std::make_unique<DDPLaunchingStrategy>(c, c.ddp, /*fork=*/false);
             },
         .description =
             "ddp whose ranks the program starts itself (re-executes itself --devices times)",
         .kind = StrategyKind::DataParallel,
         .flags = kDdpFlags});
    add("ddp_fork",
        {.factory =
             [](const StrategyConfig& c) {
               return std::make_unique<DDPLaunchingStrategy>(c, c.ddp, /*fork=*/true);
             },
         .description = "ddp whose ranks the program forks itself (--devices processes)",
         .kind = StrategyKind::DataParallel,
         .flags = kDdpFlags});
    add("ddp_find_unused_parameters_true",
        {.factory = [](const StrategyConfig& c) { return std::make_unique<DDPStrategy>(c, c.ddp); },
         .description = "ddp that tolerates parameters without gradients",
         .kind = StrategyKind::DataParallel,
         .flags = kDdpFlags,
         .defaults = [](StrategyConfig& c) { c.ddp.find_unused_parameters = true; }});
    add("pipeline",
        {.factory =
             [](const StrategyConfig& c) {
               return std::make_unique<PipelineStrategy>(c, c.pipeline, c.tensor_parallel);
             },
         .description = "pipeline parallel: the model's layers split into --pp stages that pass "
                        "micro-batches along, data parallel across the rest of the ranks",
         .kind = StrategyKind::Pipeline,
         .flags = kPipelineFlags});
    add("model_parallel",
        {.factory =
             [](const StrategyConfig& c) {
               return std::make_unique<ModelParallelStrategy>(c, c.tensor_parallel);
             },
         .description = "tensor parallel (Megatron-LM's): each layer split over --tp ranks, data "
                        "parallel across the rest",
         .kind = StrategyKind::TensorParallel,
         .flags = kTensorParallelFlags});
    add_sharded_strategies();
  }

  // The sharded names (Lightning's), each the sharding engine with its options
  // (docs/sharding.md). A name's defaults set the stage and offload; the wrap policy and
  // prefetching stay the user's.
  void add_sharded_strategies() {
    auto sharded = [this](const std::string& name, std::string description,
                          std::vector<std::string> flags, ConfigDefaults defaults) {
      add(name, {.factory =
                     [name](const StrategyConfig& c) {
                       return std::make_unique<ShardedStrategy>(c, c.sharding, name);
                     },
                 .description = std::move(description),
                 .kind = StrategyKind::Sharded,
                 .flags = std::move(flags),
                 .defaults = std::move(defaults)});
    };
    auto deepspeed = [sharded](const std::string& name, std::string description,
                               std::function<void(sharded::ShardingOptions&)> set) {
      sharded(name, std::move(description), kShardedFlags,
              [set](StrategyConfig& c) { set(c.sharding); });
    };
    auto fsdp = [sharded](const std::string& name, std::string description, bool offload) {
      sharded(name, std::move(description), joined(kShardedFlags, {"--fsdp-sharding-strategy"}),
              [offload](StrategyConfig& c) {
                sharded::apply_fsdp_sharding_strategy(c.fsdp_sharding_strategy, c.sharding);
                c.sharding.offload_optimizer = offload;
                c.sharding.offload_params = offload && c.sharding.stage == 3;
              });
    };
    fsdp("fsdp",
         "fully sharded data parallel: parameters, gradients and optimizer state sharded "
         "(sharding_strategy FULL_SHARD; SHARD_GRAD_OP and NO_SHARD by option)",
         false);
    fsdp("fsdp_cpu_offload",
         "fsdp with parameter shards, master weights and optimizer state "
         "in host memory (the optimizer steps on the CPU)",
         true);
    deepspeed("deepspeed",
              "ZeRO stage 2 (DeepSpeed's default): optimizer state and gradients "
              "sharded",
              [](sharded::ShardingOptions& s) { s.stage = 2; });
    deepspeed("deepspeed_stage_1", "ZeRO stage 1: optimizer state sharded",
              [](sharded::ShardingOptions& s) { s.stage = 1; });
    deepspeed("deepspeed_stage_2", "ZeRO stage 2: optimizer state and gradients sharded",
              [](sharded::ShardingOptions& s) { s.stage = 2; });
    deepspeed("deepspeed_stage_2_offload",
              "ZeRO stage 2 with master weights and optimizer state "
              "in host memory (the optimizer steps on the CPU)",
              [](sharded::ShardingOptions& s) {
                s.stage = 2;
                s.offload_optimizer = true;
              });
    auto stage3 = [](sharded::ShardingOptions& s) {
      s.stage = 3;
      // DeepSpeed fetches each module's own parameters just before it runs.
      if (s.auto_wrap_policy.empty() && !s.wrap_policy) s.auto_wrap_policy = "params";
    };
    deepspeed("deepspeed_stage_3",
              "ZeRO stage 3: parameters, gradients and optimizer state "
              "sharded, each module's parameters gathered just before it runs",
              stage3);
    deepspeed("deepspeed_stage_3_offload",
              "ZeRO stage 3 with parameter shards, master weights "
              "and optimizer state in host memory",
              [stage3](sharded::ShardingOptions& s) {
                stage3(s);
                s.offload_optimizer = true;
                s.offload_params = true;
              });
    deepspeed("deepspeed_stage_3_offload_nvme",
              "ZeRO stage 3 with parameter shards, master "
              "weights and optimizer state in a swap file under nvme_path (ZeRO-Infinity)",
              [stage3](sharded::ShardingOptions& s) {
                stage3(s);
                s.offload_optimizer = true;
                s.offload_params = true;
                s.nvme_params = true;
                if (s.nvme_path.empty()) {
                  fail(
                      "[deepspeed_stage_3_offload_nvme] no nvme_path: give the directory for the "
                      "swap file (train_gpt --nvme-path DIR, or offload_optimizer.nvme_path in "
                      "--deepspeed-config)");
                }
              });
  }
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

const char* strategy_kind_name(StrategyKind kind) {
  switch (kind) {
    case StrategyKind::SingleDevice: return "single device";
    case StrategyKind::DataParallel: return "data parallel";
    case StrategyKind::ThreadDataParallel: return "data parallel over threads";
    case StrategyKind::Sharded: return "sharded";
    case StrategyKind::Pipeline: return "pipeline";
    case StrategyKind::TensorParallel: return "tensor parallel";
    case StrategyKind::Other: return "other";
  }
  return "?";
}

void StrategyRegistry::add(const std::string& name, StrategyEntry entry) {
  registry().add(name, std::move(entry));
}

bool StrategyRegistry::remove(const std::string& name) {
  return registry().remove(name);
}

bool StrategyRegistry::contains(const std::string& name) {
  return registry().contains(name);
}

std::unique_ptr<Strategy> StrategyRegistry::create(const std::string& name, StrategyConfig config) {
  const StrategyEntry entry = registry().at(name);
  if (entry.defaults) entry.defaults(config);
  return entry.factory(config);
}

std::unique_ptr<Strategy> StrategyRegistry::create(const std::string& name,
                                                   const StrategyOptions& options) {
  StrategyConfig config;
  static_cast<StrategyOptions&>(config) = options;
  return create(name, std::move(config));
}

StrategyEntry StrategyRegistry::entry(const std::string& name) {
  return registry().at(name);
}

StrategyConfig StrategyRegistry::with_defaults(const std::string& name, StrategyConfig config) {
  const StrategyEntry entry = registry().at(name);
  if (entry.defaults) entry.defaults(config);
  return config;
}

std::vector<std::pair<std::string, std::string>> StrategyRegistry::list() {
  return registry().list();
}

std::vector<std::string> StrategyRegistry::names_reading(const std::string& flag) {
  std::vector<std::string> names;
  for (const auto& [name, description] : list()) {
    const StrategyEntry e = entry(name);
    if (std::find(e.flags.begin(), e.flags.end(), flag) != e.flags.end()) names.push_back(name);
  }
  return names;
}

void StrategyRegistry::register_strategy(const std::string& name, StrategyFactory factory,
                                         std::string description, ConfigDefaults defaults) {
  add(name, {.factory = std::move(factory),
             .description = std::move(description),
             .defaults = std::move(defaults)});
}

std::unique_ptr<Strategy> StrategyRegistry::get(const std::string& name, StrategyConfig config) {
  return create(name, std::move(config));
}

std::unique_ptr<Strategy> StrategyRegistry::get(const std::string& name,
                                                const StrategyOptions& options) {
  return create(name, options);
}

std::vector<std::pair<std::string, std::string>> StrategyRegistry::available_strategies() {
  return list();
}

}  // namespace loom::strategies
