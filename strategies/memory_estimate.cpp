#include "strategies/memory_estimate.h"

#include <algorithm>
#include <map>
#include <optional>

#include "core/tags.h"
#include "strategies/registry.h"
#include "strategies/sharded/units.h"
#include "tensor/allocator.h"
#include "tensor/autocast.h"
#include "tensor/ops.h"

namespace loom::strategies {

namespace {

int64_t& at(MemoryEstimate& e, MemoryKind kind) {
  return e.peak_by_kind[static_cast<size_t>(kind)];
}

// Every parameter once, full size: single device and DDP. The DDP reducer's buckets are the
// gradients (gradient_as_bucket_view) or a communication copy next to them.
MemoryEstimate replicated(const nn::Module& model, bool ddp, bool gradient_as_bucket_view,
                          int states_per_parameter) {
  MemoryEstimate e;
  for (const Tensor& p : model.parameters()) {
    const int64_t bytes = static_cast<int64_t>(p.nbytes());
    at(e, MemoryKind::Parameters) += bytes;
    at(e, MemoryKind::Gradients) += bytes;
    at(e, MemoryKind::OptimizerState) += states_per_parameter * bytes;
    if (ddp && !gradient_as_bucket_view) at(e, MemoryKind::Communication) += bytes;
  }
  return e;
}

// One unit's flat buffers (one per dtype), as ShardedEngine lays them out.
struct UnitBytes {
  int64_t full = 0;        // padded full buffers
  int64_t shard = 0;       // this rank's shards
  int64_t shard_real = 0;  // rank 0's elements that are parameters, not padding, in bytes
  int parent = -1;
};

// The sharding engine (strategies/sharded/engine.h): units in forward order (the plan's
// pre-order), each gathered or holding full gradients together with its enclosing units.
// `host_compute`: the ranks compute on the CPU, where the engine's host tensors and device
// tensors are one pool (a GPU job's are not: see the parameter-offload case below).
MemoryEstimate sharded_estimate(const nn::Module& model, const sharded::ShardingOptions& o,
                                int world_size, int states_per_parameter, bool host_compute) {
  // HYBRID_SHARD shards over one node's ranks (shard_group_size; 0, the launcher's node size,
  // is not known here and counts as the whole world).
  const int shards = o.stage == 0                                  ? 1
                     : o.hybrid_shard && o.shard_group_size > 0 ? o.shard_group_size
                                                                 : world_size;
  const sharded::WrapPolicy policy =
      o.wrap_policy ? o.wrap_policy : sharded::make_wrap_policy(o.auto_wrap_policy, model);
  const sharded::UnitPlan plan = sharded::plan_units(model, policy);
  const std::vector<std::pair<std::string, Tensor>> params = model.named_parameters();
  const bool wide = o.weights_dtype != DType::F32;  // 16-bit weights, f32 masters

  std::vector<UnitBytes> units;
  for (const sharded::Unit& unit : plan.units) {
    std::map<DType, int64_t> numel;
    for (size_t k : unit.params)
      numel[wide ? o.weights_dtype : params[k].second.dtype()] += params[k].second.numel();
    UnitBytes bytes{.parent = unit.parent};
    for (const auto& [dtype, n] : numel) {
      const int64_t element = static_cast<int64_t>(dtype_size(dtype));
      const int64_t shard_numel = (n + shards - 1) / shards;
      bytes.full += shard_numel * shards * element;
      bytes.shard += shard_numel * element;
      bytes.shard_real += std::min(shard_numel, n) * element;
    }
    units.push_back(bytes);
  }
  // Bytes of unit u and every unit enclosing it.
  auto with_ancestors = [&](size_t u) {
    int64_t total = 0;
    for (int v = static_cast<int>(u); v >= 0; v = units[static_cast<size_t>(v)].parent)
      total += units[static_cast<size_t>(v)].full;
    return total;
  };
  int64_t all_full = 0, all_shards = 0, all_real = 0;
  for (const UnitBytes& u : units) {
    all_full += u.full;
    all_shards += u.shard;
    all_real += u.shard_real;
  }

  // Stage 3: while unit u runs (forward or backward), it and its enclosing units are
  // gathered, plus the next unit (two without limit_all_gathers) when it is prefetched;
  // SHARD_GRAD_OP keeps every unit gathered from its forward to its backward.
  const bool prefetch = o.forward_prefetch || o.backward_prefetch == sharded::BackwardPrefetch::Pre;
  const size_t ahead = !prefetch ? 0 : o.limit_all_gathers ? 1 : 2;
  int64_t gathered = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    int64_t next = 0;
    for (size_t v = u + 1; v <= u + ahead && v < units.size(); ++v)
      next += units[v].full;
    gathered = std::max(gathered, with_ancestors(u) + next);
  }
  if (!o.reshard_after_forward) gathered = all_full;
  // Stages 2-3: a unit's full gradients live from its backward until its reduce-scatter is
  // finished, which the engine checks when the next unit's reduction starts: so unit u's
  // backward runs beside its enclosing units' and the unit reduced just before it
  // (the next one in forward order).
  int64_t full_grads = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    const int64_t reducing = u + 1 < units.size() ? units[u + 1].full : 0;
    full_grads = std::max(full_grads, with_ancestors(u) + reducing);
  }

  MemoryEstimate e;
  e.units = static_cast<int64_t>(units.size());
  const bool offload_params = o.offload_params && o.stage == 3;
  const bool own_master = o.offload_optimizer && !offload_params;
  // Parameters: full buffers (stages 0-2) or shards plus what is gathered (stage 3).
  if (o.stage < 3) {
    at(e, MemoryKind::Parameters) = all_full;
  } else {
    at(e, MemoryKind::Parameters) = gathered + (offload_params ? 0 : all_shards);
    if (offload_params) at(e, MemoryKind::Offloaded) += all_shards;
  }
  // Gradients: full buffers kept (stages 0-1) or shards plus the full working set (2-3).
  at(e, MemoryKind::Gradients) = o.stage < 2 ? all_full : all_shards + full_grads;
  if (wide) {
    // The f32 masters of this rank's shard (optimizer state, the ZeRO paper's K) and their
    // gradient's f32 copy, alive from the end of backward (the full gradients of stages 2-3
    // gone) to the end of the step: in the host pool when offloaded.
    // Every flat is in weights_dtype (the engine refuses other parameters): 4 / element
    // bytes of f32 per byte of shard.
    const auto element = static_cast<int64_t>(dtype_size(o.weights_dtype));
    const int64_t master = 4 * all_shards / element;
    const int64_t state = states_per_parameter * 4 * all_real / element;
    if (o.offload_optimizer) {
      at(e, MemoryKind::Offloaded) += state + 2 * master;
    } else {
      at(e, MemoryKind::OptimizerState) = state + master;
      at(e, MemoryKind::Gradients) = o.stage < 2 ? all_full + master
                                                 : all_shards + std::max(full_grads, master);
    }
    return e;
  }
  // Optimizer state: per real element of this rank's shard; the master copy and its
  // gradient in the host pool when offloaded.
  const int64_t state = states_per_parameter * all_real;
  if (o.offload_optimizer && !o.nvme_path.empty()) {
    // NVMe (nvme_swap.h): the master and state of every sub-group in the swap file; in host
    // memory the gradient of each (whole sub-groups: the real elements, an upper bound for
    // the pages' padding aside) and, during the step, at most buffer_count sub-groups with
    // their state.
    const int64_t element = static_cast<int64_t>(dtype_size(params.at(0).second.dtype()));
    const int64_t resident =
        std::min(static_cast<int64_t>(o.nvme_buffer_count) * o.sub_group_size * element, all_real);
    int64_t paged = (1 + states_per_parameter) * resident;
    e.nvme_bytes = (1 + states_per_parameter) * all_real;
    if (o.nvme_params && offload_params) {
      // The parameter shards are on disk too, in memory only while their units are gathered
      // (forward and backward), never during the step: the larger of the two counts.
      at(e, MemoryKind::Offloaded) -= all_shards;
      paged = std::max(paged, gathered / shards);
      e.nvme_bytes += all_shards;
    }
    at(e, MemoryKind::Offloaded) += all_real + paged;
  } else if (o.offload_optimizer || offload_params) {
    at(e, MemoryKind::Offloaded) += state;
    if (own_master) at(e, MemoryKind::Offloaded) += 2 * all_shards;  // master and its grad
    // Offloaded parameters are the master; on a GPU their gradient shard is on the device,
    // so the optimizer reads a host copy of it (ShardedEngine's master_grad). On the CPU the
    // gradient shard is read in place.
    if (offload_params && !host_compute) at(e, MemoryKind::Offloaded) += all_shards;
  } else {
    at(e, MemoryKind::OptimizerState) = state;
  }
  return e;
}

}  // namespace

MemoryEstimate estimate_memory(const nn::Module& model, const std::string& strategy,
                               int world_size, const StrategyConfig& options,
                               int states_per_parameter) {
  if (world_size < 1)
    tag::kMemory.fail("estimate_memory: world_size must be >= 1, got ", world_size);
  if (states_per_parameter < 0) {
    tag::kMemory.fail(
        "estimate_memory: states_per_parameter must be >= 0 (AdamW 2, SGD with "
        "momentum 1), got ",
        states_per_parameter);
  }
  // The name's kind picks the memory model; its defaults set the stage, offload and wrap
  // policy.
  const StrategyConfig config = StrategyRegistry::with_defaults(strategy, options);
  switch (StrategyRegistry::entry(strategy).kind) {
    case StrategyKind::Sharded:
      return sharded_estimate(model, config.sharding, world_size, states_per_parameter,
                              /*host_compute=*/config.accelerator != "cuda");
    case StrategyKind::DataParallel:
      return replicated(model, true, config.ddp.gradient_as_bucket_view, states_per_parameter);
    case StrategyKind::SingleDevice:
      return replicated(model, false, false, states_per_parameter);
    default:
      break;
  }
  tag::kMemory.fail("estimate_memory: no memory model for strategy '", strategy,
                    "'; estimates cover single_device, the ddp names and the sharded names "
                    "(deepspeed*, fsdp*)");
}

bool weight_casts_outlive_last_forward(const nn::ModelSpec& spec) {
  return spec.checkpoints_activations();
}

MicroBatchEstimate estimate_micro_batch(nn::ModelSpec spec, int64_t batch, int64_t time,
                                        const Precision& precision, int64_t grad_accum,
                                        DType weights_dtype, bool weight_cast_cache) {
  const Device meta = Device::meta();
  spec.gpt.options.device = spec.llama.options.device = meta;
  Allocator& allocator = allocator_for(meta);
  const auto activations = static_cast<size_t>(MemoryKind::Activations);
  const size_t before = allocator.stats().current_by_kind[activations];
  const std::unique_ptr<nn::CausalLM> model = spec.build(/*seed=*/0);  // no draws on meta
  if (weights_dtype != DType::F32) {  // 16-bit weights, as the sharding engine makes them
    NoGradGuard no_grad;
    for (const Tensor& p : model->parameters())
      p.set_data(cast(p, weights_dtype));
  }
  allocator.reset_peak();
  MicroBatchEstimate estimate;
  {
    MetaCostScope costs(estimate.costs);
    const Tensor tokens = Tensor::zeros({batch, time}, DType::I64, meta);
    const Tensor targets = Tensor::zeros({batch, time}, DType::I64, meta);
    std::optional<WeightCastScope> weight_casts;
    if (weight_cast_cache && precision.compute_dtype() != DType::F32)
      weight_casts.emplace(model->parameters());
    Tensor loss;
    {
      AutocastGuard autocast(precision.compute_dtype());
      loss = model->loss(tokens, targets);
    }
    if (grad_accum == 1 && !weight_casts_outlive_last_forward(spec)) weight_casts.reset();
    // The loss is kept (the trainer reports it) while its scaled copy is back-propagated: one
    // product for the loss scale and the division among micro-batches together.
    const bool scaled_copy = precision.make_scaler() != nullptr || grad_accum > 1;
    const Tensor scaled = scaled_copy ? mul(loss, 2.0) : loss;
    scaled.backward();
  }
  estimate.activation_bytes =
      static_cast<int64_t>(allocator.stats().peak_by_kind[activations] - before);
  return estimate;
}

}  // namespace loom::strategies
