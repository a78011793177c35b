#include "strategies/registry.h"

#include "core/registry.h"
#include "core/tags.h"
#include "strategies/data_parallel.h"
#include "strategies/ddp/ddp_strategy.h"
#include "strategies/pipeline/pipeline_strategy.h"
#include "strategies/sharded/sharded_strategy.h"
#include "strategies/tp/model_parallel_strategy.h"

namespace loom::strategies {

namespace {

struct Entry {
  StrategyFactory factory;
  std::string description;
  OptionsDefaults defaults;
};

// The built-in strategies, added when the registry is first used.
struct Registry : NamedRegistry<Entry> {
  Registry() : NamedRegistry<Entry>(tag::kStrategy, "strategy") {
    add("single_device",
        {[](const StrategyOptions& o) { return std::make_unique<SingleDeviceStrategy>(o); },
         "everything on one device in one process",
         {}});
    add("ddp", {[](const StrategyOptions& o) { return std::make_unique<DDPStrategy>(o); },
                "distributed data parallel: one process per device (launch with loomrun)",
                {}});
    add("dp",
        {[](const StrategyOptions& o) { return std::make_unique<DataParallelStrategy>(o); },
         "data parallel in one process: the module replicated over --devices threads, the batch "
         "split by rows",
         {}});
    add("ddp_spawn",
        {[](const StrategyOptions& o) { return std::make_unique<DDPLaunchingStrategy>(o, false); },
         "ddp whose ranks the program starts itself (re-executes itself --devices times)",
         {}});
    add("ddp_fork",
        {[](const StrategyOptions& o) { return std::make_unique<DDPLaunchingStrategy>(o, true); },
         "ddp whose ranks the program forks itself (--devices processes)",
         {}});
    add("ddp_find_unused_parameters_true",
        {[](const StrategyOptions& o) { return std::make_unique<DDPStrategy>(o); },
         "ddp that tolerates parameters without gradients",
         [](StrategyOptions& o) { o.ddp.find_unused_parameters = true; }});
    add("pipeline",
        {[](const StrategyOptions& o) { return std::make_unique<PipelineStrategy>(o); },
         "pipeline parallel: the model's layers split into --pp stages that pass micro-batches "
         "along, data parallel across the rest of the ranks",
         {}});
    add("model_parallel",
        {[](const StrategyOptions& o) { return std::make_unique<ModelParallelStrategy>(o); },
         "tensor parallel (Megatron-LM's): each layer split over --tp ranks, data parallel "
         "across the rest",
         {}});
    add_sharded_strategies();
  }

  // The sharded names (Lightning's), each the sharding engine with its options
  // (docs/sharding.md). A name's defaults set the stage and offload; the wrap policy and
  // prefetching stay the user's.
  void add_sharded_strategies() {
    auto sharded = [this](const std::string& name, std::string description,
                          std::function<void(sharded::ShardingOptions&)> set) {
      add(name,
          {[name](const StrategyOptions& o) { return std::make_unique<ShardedStrategy>(o, name); },
           std::move(description), [set](StrategyOptions& o) { set(o.sharding); }});
    };
    auto fsdp = [this](const std::string& name, std::string description, bool offload) {
      add(name,
          {[name](const StrategyOptions& o) { return std::make_unique<ShardedStrategy>(o, name); },
           std::move(description),
           [offload](StrategyOptions& o) {
             sharded::apply_fsdp_sharding_strategy(o.fsdp_sharding_strategy, o.sharding);
             o.sharding.offload_optimizer = offload;
             o.sharding.offload_params = offload && o.sharding.stage == 3;
           }});
    };
    fsdp("fsdp",
         "fully sharded data parallel: parameters, gradients and optimizer state sharded "
         "(sharding_strategy FULL_SHARD; SHARD_GRAD_OP and NO_SHARD by option)",
         false);
    fsdp("fsdp_cpu_offload",
         "fsdp with parameter shards, master weights and optimizer state "
         "in host memory (the optimizer steps on the CPU)",
         true);
    sharded("deepspeed",
            "ZeRO stage 2 (DeepSpeed's default): optimizer state and gradients "
            "sharded",
            [](sharded::ShardingOptions& s) { s.stage = 2; });
    sharded("deepspeed_stage_1", "ZeRO stage 1: optimizer state sharded",
            [](sharded::ShardingOptions& s) { s.stage = 1; });
    sharded("deepspeed_stage_2", "ZeRO stage 2: optimizer state and gradients sharded",
            [](sharded::ShardingOptions& s) { s.stage = 2; });
    sharded("deepspeed_stage_2_offload",
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
    sharded("deepspeed_stage_3",
            "ZeRO stage 3: parameters, gradients and optimizer state "
            "sharded, each module's parameters gathered just before it runs",
            stage3);
    sharded("deepspeed_stage_3_offload",
            "ZeRO stage 3 with parameter shards, master weights "
            "and optimizer state in host memory",
            [stage3](sharded::ShardingOptions& s) {
              stage3(s);
              s.offload_optimizer = true;
              s.offload_params = true;
            });
    sharded("deepspeed_stage_3_offload_nvme",
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

void StrategyRegistry::register_strategy(const std::string& name, StrategyFactory factory,
                                         std::string description, OptionsDefaults defaults) {
  registry().add(name, {std::move(factory), std::move(description), std::move(defaults)});
}

bool StrategyRegistry::remove(const std::string& name) {
  return registry().remove(name);
}

std::unique_ptr<Strategy> StrategyRegistry::get(const std::string& name, StrategyOptions options) {
  const Entry entry = registry().at(name);
  if (entry.defaults) entry.defaults(options);
  return entry.factory(options);
}

std::vector<std::pair<std::string, std::string>> StrategyRegistry::available_strategies() {
  return registry().list();
}

}  // namespace loom::strategies
