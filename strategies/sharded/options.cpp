#include "strategies/sharded/options.h"

#include "core/error.h"
#include "core/tags.h"

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
    options.stage = 3;
    options.reshard_after_forward = true;
    options.hybrid_shard = true;
  } else {
    tag::kFsdp.fail("unknown sharding_strategy '", name,
                    "'; expected FULL_SHARD, SHARD_GRAD_OP, NO_SHARD or HYBRID_SHARD");
  }
}

}  // namespace loom::strategies::sharded
