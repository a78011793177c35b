#include "strategies/sharded/options.h"

#include "core/error.h"
#include "core/tags.h"

namespace loom::strategies::sharded {

ShardingBehaviour behaviour_of_stage(int stage) {
  if (stage < 0 || stage > 3) tag::kSharded.fail("stage must be 0, 1, 2 or 3, got ", stage);
  return {.shards_optimizer = stage >= 1, .shards_gradients = stage >= 2,
          .shards_parameters = stage >= 3};
}

void check_sharding_options(const ShardingOptions& options) {
  const ShardingBehaviour shards = behaviour_of_stage(options.stage);
  if (options.offload_params && !shards.shards_parameters) {
    tag::kSharded.fail("offload_params needs stage 3 (parameters sharded), got stage ",
                       options.stage,
                       "; use offload_optimizer to offload master weights and optimizer state");
  }
  if (!options.nvme_path.empty() && !options.offload_optimizer) {
    tag::kSharded.fail(
        "nvme_path '", options.nvme_path,
        "' is set but offload_optimizer is not: "
        "NVMe offload moves the offloaded master shards and optimizer state to disk");
  }
  if (!options.nvme_path.empty() && options.sub_group_size < 1)
    tag::kSharded.fail("sub_group_size must be at least 1, got ", options.sub_group_size);
  if (options.param_dtype != DType::F32 && !shards.shards_parameters) {
    tag::kSharded.fail(
        "param_dtype ", options.param_dtype,
        " needs stage 3 (FULL_SHARD, "
        "SHARD_GRAD_OP): stages 0-2 keep whole parameters, which are the master weights");
  }
  if (options.param_dtype != DType::F32 && options.nvme_params)
    tag::kSharded.fail("param_dtype with nvme_params is not built; use one of them");
  for (DType d : {options.param_dtype, options.reduce_dtype}) {
    if (d != DType::F32 && d != DType::BF16 && d != DType::F16)
      tag::kSharded.fail("param_dtype and reduce_dtype are f32, bf16 or f16, got ", d);
  }
  if (options.weights_dtype != DType::F32) {
    if (options.weights_dtype != DType::BF16 && options.weights_dtype != DType::F16)
      tag::kSharded.fail("weights_dtype is f32, bf16 or f16, got ", options.weights_dtype);
    if (options.param_dtype != DType::F32) {
      tag::kSharded.fail("weights_dtype ", options.weights_dtype, " with param_dtype ",
                         options.param_dtype,
                         ": the parameters are already 16-bit; leave param_dtype f32");
    }
    if (options.reduce_dtype != DType::F32) {
      tag::kSharded.fail("weights_dtype ", options.weights_dtype,
                         " reduces the gradients in their own dtype; leave reduce_dtype f32 "
                         "(an f32 reduction of 16-bit gradients is not built)");
    }
    if (options.offload_params && !options.offload_optimizer) {
      tag::kSharded.fail("weights_dtype ", options.weights_dtype,
                         " with offload_params needs offload_optimizer too: the f32 masters "
                         "live in host memory beside the offloaded 16-bit shards");
    }
    if (!options.nvme_path.empty()) {
      tag::kSharded.fail("weights_dtype ", options.weights_dtype,
                         " with NVMe offload is not built; offload to host memory "
                         "(offload_optimizer without nvme_path) or keep f32 weights");
    }
  }
  if (options.nvme_params &&
      (options.nvme_path.empty() || !options.offload_params || !shards.shards_parameters)) {
    tag::kSharded.fail(
        "nvme_params keeps stage 3's offloaded parameter shards in the NVMe swap "
        "file: it needs stage 3 with offload_params and offload_optimizer on nvme_path");
  }
  if (options.hybrid_shard && !shards.shards_parameters)
    tag::kSharded.fail("HYBRID_SHARD shards parameters (stage 3), got stage ", options.stage);
}

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
