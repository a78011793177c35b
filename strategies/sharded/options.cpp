#include "strategies/sharded/options.h"

#include "tensor/error.h"

namespace loom::strategies::sharded {

void apply_fsdp_sharding_strategy(const std::string& name, ShardingOptions& options) {
  if (name == "FULL_SHARD") {
    options.stage = 3;
    options.reshard_after_forward = true;
  } else if (name == "SHARD_GRAD_OP") {
    options.stage = 3;
    options.reshard_after_forward = false;
  } else if (name == "NO_SHARD") {
    options.stage = 0;
  } else if (name == "HYBRID_SHARD") {
    fail("[fsdp] sharding_strategy HYBRID_SHARD is not available yet (it needs the "
         "hierarchical groups); use FULL_SHARD, SHARD_GRAD_OP or NO_SHARD");
  } else {
    fail("[fsdp] unknown sharding_strategy '", name,
         "'; expected FULL_SHARD, SHARD_GRAD_OP or NO_SHARD");
  }
}

}  // namespace loom::strategies::sharded
