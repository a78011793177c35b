#pragma once
// The options of the sharding engine (strategies/sharded/engine.h). Every named sharded
// strategy is a point in this space (strategies/registry.cpp; docs/sharding.md):
//   stage 0  NO_SHARD: nothing sharded (DDP through the engine)
//   stage 1  optimizer state sharded (ZeRO-1)
//   stage 2  + gradients (ZeRO-2)
//   stage 3  + parameters (ZeRO-3, FSDP FULL_SHARD; SHARD_GRAD_OP with
//            reshard_after_forward = false)

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "strategies/sharded/units.h"

namespace loom::strategies::sharded {

// When backward all-gathers the next unit's parameters (FSDP's BackwardPrefetch):
// Pre: when a unit's backward starts; Post: once its gradients are reduced; None: on demand.
enum class BackwardPrefetch { None, Pre, Post };

struct ShardingOptions {
  int stage = 3;
  // Stage 3: free a unit's gathered parameters after its forward (gather again for its
  // backward). False keeps them until the unit's backward is done (SHARD_GRAD_OP).
  bool reshard_after_forward = true;
  bool forward_prefetch = false;  // stage 3: gather the next unit while this one runs
  BackwardPrefetch backward_prefetch = BackwardPrefetch::Pre;
  // At most one all-gather issued ahead of the unit that needs it.
  bool limit_all_gathers = true;
  // fp32 master shards and optimizer state in the host pool; the step runs there and the
  // updated shard is copied back (DeepSpeed offload_optimizer, FSDP CPUOffload).
  bool offload_optimizer = false;
  // Stage 3: the parameter shards themselves live in the host pool (offload_param).
  bool offload_params = false;
  // NVMe offload (ZeRO-Infinity, offload_optimizer device "nvme"): with offload_optimizer,
  // the master shards and optimizer state live in an unlinked file under nvme_path between
  // steps; the step pages them through host memory in sub-groups of at most sub_group_size
  // elements, nvme_buffer_count of them in memory at once (strategies/sharded/nvme_swap.h).
  // With nvme_params too (stage 3, offload_params), the parameter shards live in the same
  // file, read just before their all-gather (offload_param device "nvme").
  std::string nvme_path;  // empty: host memory
  bool nvme_params = false;
  int64_t sub_group_size = 1'000'000'000;  // DeepSpeed's default
  int nvme_buffer_count = 4;                // DeepSpeed's offload_optimizer default
  // HYBRID_SHARD (stage 3): parameters are sharded over groups of shard_group_size
  // consecutive ranks (0: the ranks of one node, LOCAL_WORLD_SIZE) and replicated across
  // those groups; gradients are reduce-scattered inside a group, then all-reduced across
  // groups (FSDP's HYBRID_SHARD, DeepSpeed's ZeRO++ hpZ for parameters).
  bool hybrid_shard = false;
  int shard_group_size = 0;
  // FSDP's MixedPrecision: param_dtype is what stage 3 stores its parameter shards in and
  // all-gathers (the master shards stay in the parameters' dtype, f32); reduce_dtype is what
  // gradients are reduced in, any stage. F32 (the default) leaves both alone. On the CPU the
  // modules compute in f32 from the gathered values (bf16/f16-exact): the numerics and the
  // bytes on the wire are the low-precision ones, not the kernels.
  DType param_dtype = DType::F32;
  DType reduce_dtype = DType::F32;
  // DeepSpeed's bf16/fp16 modes, the ZeRO paper's mixed-precision training: the module's
  // parameters become weights_dtype (bf16 or f16), so its forward, its backward and its
  // gradients (and their reduction) run in it; the optimizer updates f32 master copies of
  // this rank's shard (counted as optimizer state: the paper's K = 12 bytes per parameter
  // with AdamW's two moments), rounded into the parameters after every step. The masters
  // start from the rounded parameters, as DeepSpeed's do. The step reads an f32 copy of the
  // gradient shard, alive from the end of backward to the end of the step (DeepSpeed's
  // single_grad_partition). F32 (the default) leaves the module alone. Distinct from
  // param_dtype (f32 shards, low-precision gathers) and from autocast (f32 weights).
  DType weights_dtype = DType::F32;
  // Units: make_wrap_policy's spec ("", "none", "params", "min_params:N", a class name),
  // or wrap_policy when set.
  std::string auto_wrap_policy;
  WrapPolicy wrap_policy;
};

// What a ZeRO stage splits over the ranks (docs/sharding.md): stage 1 the optimizer state
// (and master weights), stage 2 the gradients too, stage 3 the parameters too; stage 0 none
// (every rank keeps everything, gradients all-reduced: DDP, FSDP's NO_SHARD). The engine
// reads these, never the stage number.
struct ShardingBehaviour {
  bool shards_optimizer = false;
  bool shards_gradients = false;
  bool shards_parameters = false;
};
ShardingBehaviour behaviour_of_stage(int stage);

// Throws loom::Error naming the first option that is out of range or contradicts another
// (offload_params without stage 3, nvme_path without offload_optimizer, ...), and saying
// what to set instead. HYBRID_SHARD's group size is checked against the world size where
// the engine splits its groups.
void check_sharding_options(const ShardingOptions& options);

// "FULL_SHARD" (stage 3), "SHARD_GRAD_OP" (stage 3 without resharding after forward),
// "NO_SHARD" (stage 0), "HYBRID_SHARD" (stage 3 inside each node) applied to `options`;
// unknown names are errors saying what is available.
void apply_fsdp_sharding_strategy(const std::string& name, ShardingOptions& options);

}  // namespace loom::strategies::sharded
