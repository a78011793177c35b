#pragma once
// The sharding engine: one implementation behind ZeRO stages 0-3 and FSDP's sharding
// strategies (options.h). Per unit (units.h) and dtype, parameters are flattened into one
// padded buffer split evenly across the ranks (flat_param.h). One step:
//
//   forward    stage 3: each unit's shard all-gathered before it runs (the next unit's
//              prefetched), freed after it (reshard_after_forward); other stages keep full
//              parameters.
//   backward   a unit's parameters gathered again when its backward starts (stage 3); its
//              gradients land in a flat buffer and, as soon as the last one is ready, are
//              averaged: allreduce (stages 0-1) or reduce-scatter into this rank's shard
//              (stages 2-3), overlapping the rest of backward; stage 3 frees the unit again.
//   step       the optimizer updates only this rank's shard: its parameters are replaced by
//              views of the shard (adopt_optimizer), so AdamW/SGD state is sharded too;
//              stages 0-2 then all-gather the updated parameters.
//
// Reductions run in rank order on the shm backend, and the optimizer sees exactly the
// elements DDP would give it, so every stage gives bitwise the weights DDP gives (tested).
// Collectives are issued in the same order on every rank because the forward and backward
// orders are deterministic.
//
// Threading: everything runs on the training thread (the forward and backward hooks
// included); the group's progress thread moves the bytes.

#include <map>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "nn/module.h"
#include "optim/optimizer.h"
#include "strategies/sharded/flat_param.h"
#include "strategies/sharded/gradient_downloads.h"
#include "strategies/sharded/nvme_swap.h"
#include "strategies/parameter_parts.h"
#include "strategies/sharded/options.h"
#include "strategies/trace.h"

namespace loom::strategies::sharded {

struct UnitState;

class ShardedEngine {
 public:
  // Collective. `module`'s parameters must be equal on every rank (setup checks and
  // broadcasts them first); they become views into the units' flat buffers.
  ShardedEngine(nn::Module& module, std::shared_ptr<comm::ProcessGroup> group,
                const ShardingOptions& options);
  ~ShardedEngine();
  ShardedEngine(const ShardedEngine&) = delete;
  ShardedEngine& operator=(const ShardedEngine&) = delete;

  // Replaces the optimizer's parameters by this rank's pieces of them (views into the master
  // shards), group by group, so that step() updates and keeps state for the shard only.
  // Under NVMe offload the optimizer gets one tensor per sub-group instead (this rank's
  // pieces of consecutive parameters of a group, packed), and step hooks that page each in
  // and out (nvme_swap.h). Call before the optimizer's first step, once.
  void adopt_optimizer(optim::Optimizer& optimizer);
  // The tensors adopt_optimizer gave the optimizer, with their gradients set once a
  // synchronised backward is finalised.
  const std::vector<Tensor>& shard_parameters() const { return segments_; }

  void prepare_for_backward();
  // Waits for the gradient reductions and leaves the averaged shard gradients on
  // shard_parameters(). Throws loom::Error naming a parameter that got no gradient,
  // loom::CommError when a peer fails.
  void finalize_backward();
  // While false, backward passes accumulate full gradients locally (no_sync).
  void set_sync(bool sync) { sync_ = sync; }

  // The global gradient norm over all shards (bitwise what optim::grad_norm gives on the
  // full gradients, for f32 and the 2-norm; Note [Exact sums of squares]). Collective.
  double grad_norm(double norm_type = 2.0);
  // Clips the shard gradients to max_norm by that norm; returns the norm. Collective.
  double clip_grad_norm(double max_norm, double norm_type = 2.0);
  // True when any rank's shard gradient holds inf or NaN. Collective.
  bool any_nonfinite_gradient();

  // After optimizer.step(): copies offloaded master shards back and, for stages 0-2,
  // all-gathers the updated parameters. Collective.
  void after_step();

  // optimizer.state_dict(), as copies; under NVMe offload its state is read from the swap
  // file for it (all of it in memory for a moment) and let go again.
  std::map<std::string, Tensor> optimizer_state(const optim::Optimizer& optimizer);

  // Every parameter with a copy of its whole value (gathered unit by unit, in the
  // parameters' own dtype, never rounded to param_dtype). Between steps only; collective.
  std::vector<std::pair<Tensor, Tensor>> full_parameters();

  // Distributed checkpoints (strategies/parameter_parts.h). This rank's pieces of the
  // parameters' shards (views; copies under nvme_params). Between steps.
  std::vector<ParameterPart> held_parameters();
  // (rank, size) among the ranks holding the same shard: (0, 1) unless HYBRID_SHARD
  // replicates shards across groups, or stage 0 the whole model on every rank.
  std::pair<int, int> replica_of_held() const;
  // What each tensor of `optimizer` (adopted) is made of: a piece of one parameter, or under
  // NVMe offload the pieces packed into a sub-group.
  OptimizerLayout optimizer_layout(const optim::Optimizer& optimizer) const;
  // Reads parameter values into this rank's part of each unit: the shards (and their
  // offloaded masters, low-precision copies) or, for stages 0-2, the full buffers (whole
  // parameters); under NVMe offload the sub-groups' masters in the swap file too. Between
  // steps.
  void load_parameter_parts(const ReadParameter& read);

  // Gathers every unit and gives each parameter its own storage again, with the hooks
  // removed: the module is whole on every rank, as before setup (for saving, evaluation).
  // The engine must not be used afterwards. Collective.
  void unshard_module();

  // The NVMe swap file, or null without NVMe offload.
  const SwapFile* swap_file() const { return swap_ ? &swap_->file() : nullptr; }

  size_t unit_count() const;
  const std::vector<std::string>& unit_paths() const { return unit_paths_; }

 private:
  friend class UnitHook;
  void pre_forward(size_t unit);
  Tensor post_forward(size_t unit, const Tensor& output);
  void pre_backward(size_t unit);
  void on_gradient_ready(size_t param);

  void gather(size_t unit);         // issues the all-gather when not held
  void wait_gathered(size_t unit);  // issues it if needed, then waits
  void free_full(size_t unit);      // stage 3: releases the gathered storage
  // Waits for the flat's all-gather (gather) or reduction, recording both in the trace.
  void wait_for(FlatParam& flat, size_t unit, bool gather);
  void ensure_gradients(size_t unit);
  void reduce(size_t unit);
  // Waits for the unit's reduction and moves the result where the optimizer reads it (under
  // HYBRID_SHARD: starts the allreduce across shard groups instead); stages 2-3 then
  // release the unit's full gradients. No-op when none is in flight.
  void queue_reduction(size_t unit);
  void finish_reduction(size_t unit);
  // HYBRID_SHARD: waits for the unit's allreduce across shard groups and moves the result.
  void finish_replication(size_t unit);
  void deliver_gradients(FlatParam& flat);
  // nvme_params: reads the shard from the swap file into memory / lets it go again. No-ops
  // otherwise.
  void load_shard(FlatParam& flat);
  void drop_shard(FlatParam& flat);
  void prefetch_after(size_t unit, bool forward);
  void remove_forward_hooks();
  // This rank's part of one parameter: `length` elements at `shard_offset` of flat's shard.
  struct Piece {
    FlatParam* flat;
    size_t param;
    int64_t shard_offset, length;
  };
  void add_segment(const Tensor& view, const Piece& piece, const Tensor& grad);
  // NVMe offload: packs one optimizer group's pieces into sub-groups (Note [NVMe
  // sub-groups]); returns the sub-groups' tensors for the optimizer.
  std::vector<Tensor> adopt_into_sub_groups(const std::vector<Piece>& pieces);
  void install_step_hooks(optim::Optimizer& optimizer, std::vector<size_t> group_base);
  // Copies sub-group `id`'s updated values into the shards and pages it out.
  void finish_sub_group(size_t id);
  // Moves reduced gradients into the pieces the optimizer reads.
  void copy_gradients_out(const FlatParam& flat);
  std::string name_of(size_t param) const;
  bool sixteen_bit_weights() const { return options_.weights_dtype != DType::F32; }
  // The dtype `param` is kept in: weights_dtype for 16-bit weights, else its own.
  DType stored_dtype(const Tensor& param) const;
  // 16-bit weights: the f32 masters of `flat` gathered into one [padded] f32 tensor on the
  // compute device (the module's exact values, not their rounding). Collective.
  Tensor gather_masters(const FlatParam& flat);

  nn::Module& module_;
  std::weak_ptr<const void> module_alive_;  // the module may be destroyed before the engine
  std::shared_ptr<comm::ProcessGroup> group_;
  // Parameters are sharded over shard_group_ (group_, or under HYBRID_SHARD this rank's
  // node) and replicated over replicate_group_ (HYBRID_SHARD with several groups only).
  std::shared_ptr<comm::ProcessGroup> shard_group_, replicate_group_;
  ShardingOptions options_;
  ShardingBehaviour shards_;  // derived once from options_.stage
  int shard_world_ = 1, shard_rank_ = 0;
  std::vector<std::pair<std::string, Tensor>> params_;  // named_parameters() order
  std::vector<std::unique_ptr<UnitState>> units_;
  std::vector<std::string> unit_paths_;
  std::vector<size_t> unit_of_param_;
  std::vector<bool> ready_;
  // Stages 2-3: units whose reduction (reducing_) or, under HYBRID_SHARD, allreduce across
  // groups (replicating_) is in flight, oldest first (queue_reduction).
  std::deque<size_t> reducing_, replicating_;
  std::vector<size_t> forward_order_;  // units in the order the first forward ran them
  bool order_known_ = false;
  bool in_backward_ = false;
  bool sync_ = true;
  bool full_precision_gathers_ = false;  // unshard_module: gather the f32 shards
  std::vector<Tensor> segments_;
  std::vector<size_t> segment_param_;  // the parameter each segment belongs to
  std::vector<int64_t> segment_param_begin_;  // and its first element within it
  std::vector<Tensor> segment_grads_;  // each segment's gradient: a view of master_grad
  // NVMe offload: where each segment comes from in its flat's shard, the optimizer's tensors
  // (one per sub-group) with their gradients, and the segments of each sub-group.
  std::vector<std::pair<FlatParam*, int64_t>> segment_source_;
  std::unique_ptr<OptimizerSwap> swap_;
  std::vector<Tensor> sub_group_masters_, sub_group_grads_;
  std::vector<std::vector<size_t>> sub_group_segments_;
  optim::Optimizer* swapped_optimizer_ = nullptr;
  int64_t stepping_ = -1;  // the sub-group being updated, during a step
  std::shared_ptr<bool> alive_;
  CommLanes lanes_;  // trace rows for overlapping all-gathers and reductions
  // Offloaded gradients in flight to the host; last, so that it waits for them before the
  // buffers they are written into go.
  GradientDownloads downloads_;
};

}  // namespace loom::strategies::sharded
