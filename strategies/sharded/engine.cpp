#include "strategies/sharded/engine.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "core/tags.h"
#include "strategies/gradient_sync_hint.h"
#include "strategies/sharded/shard_uploads.h"
#include "strategies/sharded/unit_state.h"
#include "strategies/trace.h"
#include "tensor/autograd/function.h"
#include "tensor/meta.h"
#include "tensor/ops.h"

namespace loom::strategies::sharded {

// Runs the engine's unit hooks around a wrapped module's forward.
class UnitHook final : public nn::ForwardHook {
 public:
  UnitHook(ShardedEngine* engine, size_t unit) : engine_(engine), unit_(unit) {}
  void before(const nn::Module&) override { engine_->pre_forward(unit_); }
  Tensor after(const nn::Module&, const Tensor& output) override {
    return engine_->post_forward(unit_, output);
  }

 private:
  ShardedEngine* engine_;
  size_t unit_;
};

namespace {

// A zero-filled 1-D tensor whose storage starts released (allocated when first needed).
Tensor released_buffer(int64_t numel, DType dtype, Device device) {
  Tensor t = Tensor::empty({numel}, dtype, device);
  t.storage()->release();
  return t;
}

// Where offloaded buffers live: the host's memory. A rank on the CPU's code path offloads into
// the pool it computes in: a CPU rank, and a simulated rank that follows the CPU's path (meta
// without a MetaCudaPathScope: a CPU cluster's rank), which so holds what a CPU rank holds (no
// host copy of a gradient shard already beside its master). A GPU rank, and a simulated one,
// offloads to real host tensors; so does every rank under NVMe offload, whose swap file is
// written and read with real bytes.
Device offload_host(const Device& compute, bool nvme) {
  return nvme || takes_cuda_path(compute) ? Device::cpu() : compute;
}

}  // namespace

ShardedEngine::ShardedEngine(nn::Module& module, std::shared_ptr<comm::ProcessGroup> group,
                             const ShardingOptions& options)
    : module_(module),
      module_alive_(module.lifetime()),
      group_(std::move(group)),
      options_(options),
      shards_(behaviour_of_stage(options.stage)),
      params_(module.named_parameters()),
      alive_(std::make_shared<bool>(true)) {
  check(group_ != nullptr, tag::kSharded.prefix() + "the engine needs a process group");
  check_sharding_options(options_);
  shard_group_ = group_;
  if (options_.hybrid_shard) {
    const int size = options_.shard_group_size, world = group_->size();
    if (size < 1 || world % size != 0) {
      tag::kSharded.fail("HYBRID_SHARD: the world size ", world,
                         " must be a multiple of the shard "
                         "group size ",
                         size,
                         " (the ranks of one node); start the same number of ranks on "
                         "every node, or use FULL_SHARD");
    }
    // Collective: every rank makes both splits, in the same order.
    shard_group_ = group_->split_by([size](int r) { return std::pair{r / size, r}; });
    replicate_group_ = group_->split_by([size](int r) { return std::pair{r % size, r}; });
    if (group_->rank() == 0) {
      std::fprintf(stderr,
                   "%sHYBRID_SHARD: parameters sharded over %d group(s) of %d "
                   "rank(s), replicated across the groups\n",
                   tag::kSharded.prefix().c_str(), world / size, size);
    }
    if (replicate_group_->size() == 1) replicate_group_.reset();  // one node: FULL_SHARD
  }
  shard_world_ = shards_.shards_optimizer ? shard_group_->size() : 1;
  shard_rank_ = shards_.shards_optimizer ? shard_group_->rank() : 0;
  for (size_t k = 0; k < params_.size(); ++k) {
    const Tensor& p = params_[k].second;
    if (!p.is_leaf() || !p.requires_grad() || !p.is_contiguous()) {
      tag::kSharded.fail("parameter ", params_[k].first, " (", p.str(),
                         ") must be a contiguous leaf that requires grad");
    }
  }

  WrapPolicy policy = options_.wrap_policy ? options_.wrap_policy
                                           : make_wrap_policy(options_.auto_wrap_policy, module);
  UnitPlan plan = plan_units(module, policy);
  if (policy && !plan.policy_matched && group_->rank() == 0) {
    std::fprintf(stderr, "%sthe wrap policy '%s' matched no module: the whole model is one unit\n",
                 tag::kSharded.prefix().c_str(),
                 options_.wrap_policy ? "(user predicate)" : options_.auto_wrap_policy.c_str());
  }

  NoGradGuard no_grad;
  unit_of_param_.assign(params_.size(), 0);
  ready_.assign(params_.size(), false);
  for (size_t u = 0; u < plan.units.size(); ++u) {
    auto state = std::make_unique<UnitState>();
    unit_paths_.push_back(plan.units[u].path);
    std::map<DType, size_t> flat_of_dtype;
    for (size_t k : plan.units[u].params) {
      unit_of_param_[k] = u;
      const Tensor& p = params_[k].second;
      const DType dtype = stored_dtype(p);
      auto [it, added] = flat_of_dtype.emplace(dtype, state->flats.size());
      if (added) {
        state->flats.emplace_back();
        state->flats.back().dtype = dtype;
      }
      FlatParam& flat = state->flats[it->second];
      flat.params.push_back(k);
      flat.offsets.push_back(flat.numel);
      flat.numel += p.numel();
    }
    state->param_count = plan.units[u].params.size();
    for (FlatParam& flat : state->flats) {
      const Device device = params_[flat.params[0]].second.device();
      const Device host = offload_host(device, !options_.nvme_path.empty());
      flat.shard_numel = (flat.numel + shard_world_ - 1) / shard_world_;
      flat.shard_begin = static_cast<int64_t>(shard_rank_) * flat.shard_numel;
      const int64_t padded = flat.shard_numel * shard_world_;
      flat.full = Tensor::zeros({padded}, flat.dtype, device);
      flat.full.storage()->set_kind(MemoryKind::Parameters);
      for (size_t i = 0; i < flat.params.size(); ++i) {
        const Tensor& p = params_[flat.params[i]].second;
        Tensor view = Tensor::make_view(flat.full, p.shape(), contiguous_strides(p.shape()),
                                        flat.offsets[i]);
        copy_(view, p);
        p.set_data(view);  // the parameter is now a view into the flat buffer
      }
      Tensor mine = slice(flat.full, flat.shard_begin, flat.shard_numel);
      if (!shards_.shards_parameters) {
        flat.shard = mine;
      } else {
        flat.shard = options_.offload_params ? mine.to(host).clone() : mine.clone();
        flat.full.storage()->release();
      }
      // With offload_params the shard already lives on the host and is the master itself;
      // under NVMe offload the masters are the sub-groups' (adopt_optimizer).
      const bool nvme = !options_.nvme_path.empty();
      const bool wide = sixteen_bit_weights();
      const bool own_master = options_.offload_optimizer && !options_.offload_params && !nvme;
      if (wide) {  // from the rounded shard, as DeepSpeed's masters
        flat.master = flat.shard.to(options_.offload_optimizer ? host : device).to(DType::F32);
      } else {
        flat.master = !own_master                    ? flat.shard
                      : flat.shard.device() == host ? flat.shard.clone()
                                                    : flat.shard.to(host);
      }
      flat.full_grad = released_buffer(padded, flat.dtype, device);
      flat.grad_shard = !shards_.shards_gradients ? slice(flat.full_grad, flat.shard_begin,
                                                   flat.shard_numel)
                                           : Tensor::zeros({flat.shard_numel}, flat.dtype, device);
      // The optimizer reads the gradient where the master lives: with offload_params on a GPU
      // the master is the host shard while grad_shard stays on the device.
      const bool grad_beside_master =
          nvme || (flat.master.is_same(flat.shard) &&
                   flat.master.device() == flat.grad_shard.device());
      if (wide) {  // materialised for the step only (finalize_backward to after_step)
        flat.master_grad = released_buffer(flat.shard_numel, DType::F32, flat.master.device());
      } else {
        flat.master_grad = grad_beside_master
                               ? flat.grad_shard
                               : Tensor::zeros({flat.shard_numel}, flat.dtype, host);
      }
      // Offloaded buffers that cross to a GPU every step (the shard gathered from, the master
      // copied back, the gradient copied down): page-locked, so the copies go straight to the
      // copy engine instead of through staging buffers.
      if (device.is_cuda()) {
        for (const Tensor* t : {&flat.shard, &flat.master, &flat.master_grad})
          if (t->device().is_cpu()) t->storage()->pin();
      }
      // Memory reports (MemoryKind): what lives in the host pool on purpose is offloaded.
      flat.shard.storage()->set_kind(options_.offload_params ? MemoryKind::Offloaded
                                                             : MemoryKind::Parameters);
      flat.full_grad.storage()->set_kind(MemoryKind::Gradients);
      flat.grad_shard.storage()->set_kind(MemoryKind::Gradients);
      // 16-bit weights: the f32 masters are optimizer state (the ZeRO paper's K) and their
      // f32 gradient copy is gradients, both offloaded under offload_optimizer.
      const MemoryKind master_kind =
          options_.offload_optimizer ? MemoryKind::Offloaded : MemoryKind::OptimizerState;
      if (!flat.master.is_same(flat.shard)) flat.master.storage()->set_kind(master_kind);
      if (!flat.master_grad.is_same(flat.grad_shard)) {
        flat.master_grad.storage()->set_kind(wide && !options_.offload_optimizer
                                                 ? MemoryKind::Gradients
                                                 : MemoryKind::Offloaded);
      }
      if (options_.param_dtype != flat.dtype && options_.param_dtype != DType::F32) {
        flat.shard_lp = flat.shard.to(device).to(options_.param_dtype);
        flat.shard_lp.storage()->set_kind(MemoryKind::Parameters);
        flat.full_lp = released_buffer(padded, options_.param_dtype, device);
        flat.full_lp.storage()->set_kind(MemoryKind::Parameters);
      }
      if (options_.reduce_dtype != flat.dtype && options_.reduce_dtype != DType::F32) {
        flat.full_grad_lp = released_buffer(padded, options_.reduce_dtype, device);
        flat.full_grad_lp.storage()->set_kind(MemoryKind::Communication);
        if (shards_.shards_gradients) {
          flat.grad_shard_lp = released_buffer(flat.shard_numel, options_.reduce_dtype, device);
          flat.grad_shard_lp.storage()->set_kind(MemoryKind::Communication);
        }
      }
    }
    units_.push_back(std::move(state));
  }
  if (!options_.nvme_path.empty()) {
    // Room for the master shards and two state tensors each (AdamW), and the page padding
    // of every sub-group: reserved now, so that a small disk fails before training starts.
    size_t bytes = 0, pieces = params_.size() + 1;
    for (const auto& unit : units_) {
      for (const FlatParam& flat : unit->flats) {
        bytes += static_cast<size_t>(flat.shard_numel) * dtype_size(flat.dtype);
        pieces += static_cast<size_t>(flat.shard_numel / options_.sub_group_size) + 1;
      }
    }
    const size_t copies = options_.nvme_params ? 4 : 3;  // (+ the parameter shards)
    swap_ = std::make_unique<OptimizerSwap>(options_.nvme_path, options_.nvme_buffer_count,
                                            copies * (bytes + pieces * SwapFile::kDirectAlignment));
    if (group_->rank() == 0) {
      std::fprintf(stderr, "%sNVMe offload: %s swap file under %s (%s)\n",
                   tag::kSharded.prefix().c_str(),
                   options_.nvme_params ? "parameter and optimizer" : "optimizer",
                   options_.nvme_path.c_str(), swap_->file().mode().c_str());
    }
    if (options_.nvme_params) {
      for (auto& unit : units_) {
        for (FlatParam& flat : unit->flats) {
          SwapFile& file = swap_->file();
          flat.shard_file_offset = static_cast<int64_t>(file.allocate(flat.shard.nbytes()));
          file.wait(file.write(static_cast<uint64_t>(flat.shard_file_offset),
                               flat.shard.storage()->data(), flat.shard.nbytes()));
          flat.shard.storage()->release();
        }
      }
    }
  }
  for (size_t u = 0; u < plan.units.size(); ++u) {
    auto* m = const_cast<nn::Module*>(plan.units[u].module);  // we were handed it mutable
    m->set_forward_hook(std::make_shared<UnitHook>(this, u));
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    std::weak_ptr<bool> alive = alive_;
    params_[k].second.register_grad_ready_hook([this, alive, k](Tensor&) {
      if (alive.lock()) on_gradient_ready(k);
    });
  }
}

ShardedEngine::~ShardedEngine() {
  *alive_ = false;
  for (auto& unit : units_) {
    for (FlatParam& flat : unit->flats) {
      try {
        if (flat.gather) flat.gather->wait();
        if (flat.reduce) flat.reduce->wait();
      } catch (...) {
        // The group is broken; its error was or will be reported by whoever waits on it.
      }
    }
  }
  remove_forward_hooks();
}

void ShardedEngine::remove_forward_hooks() {
  if (module_alive_.expired()) return;  // its hooks went with it
  std::vector<nn::Module*> stack{&module_};
  while (!stack.empty()) {
    nn::Module* m = stack.back();
    stack.pop_back();
    m->set_forward_hook(nullptr);
    for (const auto& [name, child] : m->children())
      stack.push_back(child.get());
  }
}

size_t ShardedEngine::unit_count() const {
  return units_.size();
}

DType ShardedEngine::stored_dtype(const Tensor& param) const {
  if (!sixteen_bit_weights()) return param.dtype();
  if (param.dtype() != DType::F32) {
    tag::kSharded.fail("weights_dtype ", options_.weights_dtype, " rounds f32 parameters; ",
                       "this module has a ", param.dtype(), " parameter (", param.str(),
                       "): build the module in f32");
  }
  return options_.weights_dtype;
}

std::string ShardedEngine::name_of(size_t param) const {
  return params_[param].first;
}

void ShardedEngine::gather(size_t unit) {
  if (!shards_.shards_parameters) return;
  for (FlatParam& flat : units_[unit]->flats) {
    if (flat.gather || flat.gathered()) continue;
    load_shard(flat);  // read synchronously; prefetching issues this early
    Trace* trace = current_trace();
    if (trace != nullptr) shard_group_->time_precisely();
    flat.gather_issued_us = trace != nullptr ? trace->now_us() : -1;
    if (flat.shard_lp.defined() && !full_precision_gathers_) {
      // Mixed precision: gathered in param_dtype, widened into `full` when waited for.
      flat.full_lp.storage()->materialize();
      flat.gather = shard_group_->all_gather(flat.full_lp, flat.shard_lp);
      continue;
    }
    flat.full.storage()->materialize();
    flat.gather = flat.shard.device() == flat.full.device()
                      ? shard_group_->all_gather(flat.full, flat.shard)
                      : all_gather_from_host(*shard_group_, flat.full, flat.shard);
  }
}

// Note [Unit spans in the trace]
// A unit's all-gather and reduction show on the comm rows as communication spans (Note
// [Communication spans in the trace] in strategies/trace.h: from the moment they really ran,
// as DDP's buckets), named "unit 3 all-gather (blocks.1, 4096 bytes)"; the time the training
// thread spent blocked in that wait shows on the main row as "wait all-gather unit 3":
// communication that compute did not hide.
void ShardedEngine::wait_for(FlatParam& flat, size_t unit, bool gather) {
  comm::WorkPtr& work = gather ? flat.gather : flat.reduce;
  int64_t& issued_us = gather ? flat.gather_issued_us : flat.reduce_issued_us;
  if (!work) return;
  const char* op = gather ? "all-gather" : !shards_.shards_gradients ? "allreduce" : "reduce-scatter";
  Trace* trace = issued_us >= 0 ? current_trace() : nullptr;
  const int64_t wait_start = trace != nullptr ? trace->now_us() : 0;
  comm::WorkPtr done = std::move(work);
  done->wait();
  if (gather) drop_shard(flat);
  if (gather && flat.full_lp.defined() && flat.full_lp.storage()->materialized()) {
    NoGradGuard no_grad;
    flat.full.storage()->materialize();
    copy_(flat.full, flat.full_lp);
    flat.full_lp.storage()->release();
  }
  if (trace == nullptr) return;
  const int64_t end = trace->now_us();
  const int64_t bytes = static_cast<int64_t>(gather ? flat.full.nbytes() : flat.full_grad.nbytes());
  const Trace::Args args = {{"unit", static_cast<int64_t>(unit)}, {"bytes", bytes}};
  const std::string label = "unit " + std::to_string(unit) + " " + op;
  if (end > wait_start)
    trace->complete("wait " + label, "sharded", wait_start, end - wait_start, Trace::kMainThread,
                    args);
  record_comm_span(*trace, lanes_,
                   label + " (" + (unit_paths_[unit].empty() ? "root" : unit_paths_[unit]) +
                       ", " + std::to_string(bytes) + " bytes)",
                   "sharded", issued_us, end, measured_span(*done), args);
  issued_us = -1;
}

void ShardedEngine::wait_gathered(size_t unit) {
  gather(unit);
  for (FlatParam& flat : units_[unit]->flats)
    wait_for(flat, unit, true);
}

void ShardedEngine::free_full(size_t unit) {
  if (!shards_.shards_parameters) return;
  for (FlatParam& flat : units_[unit]->flats) {
    wait_for(flat, unit, true);
    if (!flat.gathered()) continue;
    flat.full.storage()->release();
  }
}

// Forward order is recorded by the first forward; prefetching follows it (and its reverse
// in backward), as FSDP does. Every rank records the same order.
void ShardedEngine::prefetch_after(size_t unit, bool forward) {
  if (!shards_.shards_parameters || !order_known_) return;
  auto at = std::find(forward_order_.begin(), forward_order_.end(), unit);
  if (at == forward_order_.end()) return;
  const int depth = options_.limit_all_gathers ? 1 : 2;
  std::ptrdiff_t pos = at - forward_order_.begin();
  for (int step = 1; step <= depth; ++step) {
    std::ptrdiff_t next = forward ? pos + step : pos - step;
    if (next < 0 || next >= static_cast<std::ptrdiff_t>(forward_order_.size())) return;
    const size_t target = forward_order_[static_cast<size_t>(next)];
    // A unit whose backward already finished (a tied root, say) needs nothing more.
    if (!forward && units_[target]->pending == 0) continue;
    gather(target);
  }
}

void ShardedEngine::pre_forward(size_t unit) {
  if (!in_backward_ && !order_known_) forward_order_.push_back(unit);
  wait_gathered(unit);
  if (!in_backward_ && options_.forward_prefetch) prefetch_after(unit, /*forward=*/true);
}

Tensor ShardedEngine::post_forward(size_t unit, const Tensor& output) {
  // Under activation checkpointing a unit's forward runs again inside backward: keep it.
  if (!in_backward_ && options_.reshard_after_forward && unit != 0) free_full(unit);
  if (!grad_mode_enabled() || !output.requires_grad()) return output;
  std::weak_ptr<bool> alive = alive_;
  autograd::CustomOp entry{
      .name = "sharded_unit_backward_entry",
      .forward = [](autograd::Context&,
                    const std::vector<Tensor>& in) { return std::vector<Tensor>{in[0]}; },
      .backward = [this, unit, alive](autograd::Context&, const std::vector<Tensor>& grad) {
        if (alive.lock()) pre_backward(unit);
        return std::vector<Tensor>{grad[0]};
      }};
  return autograd::apply(entry, {output})[0];
}

void ShardedEngine::pre_backward(size_t unit) {
  wait_gathered(unit);
  ensure_gradients(unit);
  if (options_.backward_prefetch == BackwardPrefetch::Pre) prefetch_after(unit, false);
}

// The unit's full gradient buffer, zeroed when a new accumulation starts, with every
// parameter's .grad a view into it so that backward accumulates in place.
void ShardedEngine::ensure_gradients(size_t unit) {
  NoGradGuard no_grad;
  UnitState& state = *units_[unit];
  for (FlatParam& flat : state.flats) {
    if (!flat.full_grad.storage()->materialized()) {
      flat.full_grad.storage()->materialize();
      fill_(flat.full_grad, 0.0);
    } else if (state.grads_stale) {
      fill_(flat.full_grad, 0.0);
    }
    for (size_t i = 0; i < flat.params.size(); ++i) {
      const Tensor& p = params_[flat.params[i]].second;
      Tensor grad = p.grad();
      if (grad.defined() && grad.storage() == flat.full_grad.storage() &&
          grad.offset() == flat.offsets[i])
        continue;
      Tensor view = Tensor::make_view(flat.full_grad, p.shape(), contiguous_strides(p.shape()),
                                      flat.offsets[i]);
      if (grad.defined()) add_(view, grad);  // a gradient accumulated before the hook ran
      p.set_grad(view);
    }
  }
  state.grads_stale = false;
}

void ShardedEngine::prepare_for_backward() {
  order_known_ = true;
  in_backward_ = true;
  std::fill(ready_.begin(), ready_.end(), false);
  for (auto& unit : units_)
    unit->pending = unit->param_count;
}

void ShardedEngine::on_gradient_ready(size_t param) {
  if (!in_backward_ || ready_[param]) return;
  const size_t unit = unit_of_param_[param];
  ensure_gradients(unit);  // no-op unless the unit's backward entry did not run
  ready_[param] = true;
  if (--units_[unit]->pending > 0) return;
  if (sync_) reduce(unit);
  if (shards_.shards_parameters) free_full(unit);
  if (options_.backward_prefetch == BackwardPrefetch::Post) prefetch_after(unit, false);
}

void ShardedEngine::reduce(size_t unit) {
  Trace* trace = current_trace();
  if (trace != nullptr) {
    group_->time_precisely();
    shard_group_->time_precisely();
  }
  for (FlatParam& flat : units_[unit]->flats) {
    flat.reduce_issued_us = trace != nullptr ? trace->now_us() : -1;
    Tensor& full = flat.full_grad_lp.defined() ? flat.full_grad_lp : flat.full_grad;
    Tensor& shard = flat.grad_shard_lp.defined() ? flat.grad_shard_lp : flat.grad_shard;
    if (flat.full_grad_lp.defined()) {  // mixed precision: reduced in reduce_dtype
      NoGradGuard no_grad;
      flat.full_grad_lp.storage()->materialize();
      copy_(flat.full_grad_lp, flat.full_grad);
      if (flat.grad_shard_lp.defined()) flat.grad_shard_lp.storage()->materialize();
    }
    flat.reduce = !shards_.shards_gradients
                      ? group_->allreduce(full, {.op = comm::ReduceOp::Avg})
                      : shard_group_->reduce_scatter(shard, full, {.op = comm::ReduceOp::Avg});
  }
  if (shards_.shards_gradients) queue_reduction(unit);
}

// Stages 2-3 keep only the shard of a reduced gradient. Each unit's reduction is finished when
// the next one is issued: it had that unit's whole backward to run, so finishing it rarely
// waits, and it frees its full gradients, so that at most this unit's, the previous unit's
// and their enclosing units' full gradients are alive at once, whatever the timing
// (memory_estimate.cpp counts on it). Under HYBRID_SHARD a finished reduction starts the
// unit's allreduce across groups, which is finished one issue later in turn.
void ShardedEngine::queue_reduction(size_t unit) {
  if (!replicating_.empty()) {
    finish_replication(replicating_.front());
    replicating_.pop_front();
  }
  if (!reducing_.empty()) {
    const size_t previous = reducing_.front();
    reducing_.pop_front();
    finish_reduction(previous);
    if (replicate_group_) replicating_.push_back(previous);
  }
  reducing_.push_back(unit);
}

void ShardedEngine::finish_reduction(size_t unit) {
  NoGradGuard no_grad;
  for (FlatParam& flat : units_[unit]->flats) {
    if (!flat.reduce) continue;
    try {
      wait_for(flat, unit, false);
    } catch (const CommError& e) {
      throw e.rephrased(tag::kSharded.prefix() + "rank " + std::to_string(group_->rank()) +
                        ": a gradient reduction failed: " + e.what() + skipped_backward_hint(e));
    }
    if (flat.full_grad_lp.defined()) {  // widen the reduced gradient back
      if (!shards_.shards_gradients) {
        copy_(flat.full_grad, flat.full_grad_lp);
      } else {
        copy_(flat.grad_shard, flat.grad_shard_lp);
        flat.grad_shard_lp.storage()->release();
      }
      flat.full_grad_lp.storage()->release();
    }
    if (replicate_group_)
      flat.replicate = replicate_group_->allreduce(flat.grad_shard, {.op = comm::ReduceOp::Avg});
    else
      deliver_gradients(flat);
    if (shards_.shards_gradients) {
      for (size_t k : flat.params)
        params_[k].second.set_grad(Tensor());
      flat.full_grad.storage()->release();
    }
  }
  units_[unit]->grads_stale = !shards_.shards_gradients;
}

void ShardedEngine::finish_replication(size_t unit) {
  NoGradGuard no_grad;
  for (FlatParam& flat : units_[unit]->flats) {
    if (!flat.replicate) continue;
    comm::WorkPtr done = std::move(flat.replicate);
    try {
      done->wait();
    } catch (const CommError& e) {
      throw e.rephrased(
          tag::kSharded.prefix() + "rank " + std::to_string(group_->rank()) +
          ": HYBRID_SHARD's gradient allreduce across shard groups failed: " + e.what());
    }
    deliver_gradients(flat);
  }
}

void ShardedEngine::load_shard(FlatParam& flat) {
  if (flat.shard_file_offset < 0 || flat.shard.storage()->materialized()) return;
  flat.shard.storage()->materialize();
  SwapFile& file = swap_->file();
  file.wait(file.read(static_cast<uint64_t>(flat.shard_file_offset), flat.shard.storage()->data(),
                      flat.shard.nbytes()));
}

void ShardedEngine::drop_shard(FlatParam& flat) {
  if (flat.shard_file_offset >= 0) flat.shard.storage()->release();
}

void ShardedEngine::deliver_gradients(FlatParam& flat) {
  if (flat.wide_master()) return;  // widened for the step (finalize_backward)
  // Offloaded: on the copy stream, finished in finalize_backward (Note [Offloaded gradients on
  // the copy stream]).
  if (!flat.master_grad.is_same(flat.grad_shard))
    downloads_.start(flat.master_grad, flat.grad_shard);
  copy_gradients_out(flat);
}

void ShardedEngine::finalize_backward() {
  in_backward_ = false;
  if (!sync_) return;
  for (size_t k = 0; k < params_.size(); ++k) {
    if (!ready_[k]) {
      tag::kSharded.fail(
          "parameter ", name_of(k),
          " received no gradient in this backward pass, so its unit's gradients were never "
          "reduced; every parameter of the module must take part in the loss");
    }
  }
  reducing_.clear();
  replicating_.clear();
  for (size_t unit = 0; unit < units_.size(); ++unit)
    finish_reduction(unit);
  for (size_t unit = 0; unit < units_.size(); ++unit)
    finish_replication(unit);
  downloads_.finish();
  NoGradGuard no_grad;
  for (auto& unit : units_) {
    for (FlatParam& flat : unit->flats) {
      if (!flat.wide_master()) continue;
      flat.master_grad.storage()->materialize();  // released again by after_step
      copy_(flat.master_grad, flat.grad_shard);    // widened
    }
  }
  for (size_t i = 0; i < segments_.size(); ++i)
    segments_[i].set_grad(segment_grads_[i]);
  for (size_t i = 0; i < sub_group_masters_.size(); ++i)
    sub_group_masters_[i].set_grad(sub_group_grads_[i]);
}

Tensor ShardedEngine::gather_masters(const FlatParam& flat) {
  NoGradGuard no_grad;
  const Device device = flat.full.device();
  Tensor master = flat.master.device() == device ? flat.master : flat.master.to(device);
  if (shard_world_ == 1) return master.clone();
  Tensor all = Tensor::empty({flat.shard_numel * shard_world_}, DType::F32, device);
  shard_group_->all_gather(all, master)->wait();
  return all;
}

std::vector<std::pair<Tensor, Tensor>> ShardedEngine::full_parameters() {
  NoGradGuard no_grad;
  std::vector<std::pair<Tensor, Tensor>> out;
  const bool was = full_precision_gathers_;
  full_precision_gathers_ = true;
  for (size_t u = 0; u < units_.size(); ++u) {
    free_full(u);  // stage 3: nothing gathered survives a step; drop a low-precision gather
    if (sixteen_bit_weights()) {  // the f32 masters, not their rounding
      for (const FlatParam& flat : units_[u]->flats) {
        const Tensor all = gather_masters(flat);
        for (size_t i = 0; i < flat.params.size(); ++i) {
          const Tensor& p = params_[flat.params[i]].second;
          out.emplace_back(p, slice(all, flat.offsets[i], p.numel()).reshape(p.shape()).clone());
        }
      }
      continue;
    }
    wait_gathered(u);
    for (const FlatParam& flat : units_[u]->flats) {
      for (size_t k : flat.params) {
        const Tensor& p = params_[k].second;
        out.emplace_back(p, p.detach().clone());
      }
    }
    free_full(u);  // one unit at a time
  }
  full_precision_gathers_ = was;
  return out;
}


std::vector<ParameterPart> ShardedEngine::held_parameters() {
  NoGradGuard no_grad;
  std::vector<ParameterPart> parts;
  for (auto& unit : units_) {
    for (FlatParam& flat : unit->flats) {
      load_shard(flat);
      for (size_t i = 0; i < flat.params.size(); ++i) {
        const auto& [name, p] = params_[flat.params[i]];
        const auto [begin, end] = shard_part(flat, i, p.numel());
        if (begin >= end) continue;
        // 16-bit weights: the f32 masters, so that a resumed run continues from them.
        const Tensor& held = flat.wide_master() ? flat.master : flat.shard;
        Tensor values = slice(held, begin - flat.shard_begin, end - begin);
        if (flat.shard_file_offset >= 0) values = values.clone();  // the shard goes back to disk
        parts.push_back({name, begin - flat.offsets[i], values});
      }
      drop_shard(flat);
    }
  }
  return parts;
}

std::pair<int, int> ShardedEngine::replica_of_held() const {
  // Stage 0 (NO_SHARD): every rank holds the whole model, a replica of each other's.
  if (!shards_.shards_optimizer) return {group_->rank(), group_->size()};
  if (!replicate_group_) return {0, 1};
  return {replicate_group_->rank(), replicate_group_->size()};
}

void ShardedEngine::load_parameter_parts(const ReadParameter& read) {
  NoGradGuard no_grad;
  for (size_t u = 0; u < units_.size(); ++u) {
    free_full(u);  // stage 3: nothing gathered may outlive new values
    for (FlatParam& flat : units_[u]->flats) {
      load_shard(flat);
      for (size_t i = 0; i < flat.params.size(); ++i) {
        const auto& [name, p] = params_[flat.params[i]];
        // Stages 0-2: the full buffer is the parameter; stage 3: the part in this shard.
        const auto [begin, end] = !shards_.shards_parameters
                                      ? std::pair{flat.offsets[i], flat.offsets[i] + p.numel()}
                                      : shard_part(flat, i, p.numel());
        if (begin >= end) continue;
        // 16-bit weights: read in f32 for the masters (held_parameters wrote them).
        const DType read_dtype = flat.wide_master() ? DType::F32 : p.dtype();
        Tensor host = Tensor::empty({end - begin}, read_dtype, Device::cpu());
        read(name, begin - flat.offsets[i], host);
        Tensor target = !shards_.shards_parameters ? slice(flat.full, begin, end - begin)
                                           : slice(flat.shard, begin - flat.shard_begin, end - begin);
        copy_(target, host);
        if (flat.wide_master()) {  // this rank's part of it into the master
          const auto [mine, mine_end] = shard_part(flat, i, p.numel());
          if (mine < mine_end) {
            Tensor master = slice(flat.master, mine - flat.shard_begin, mine_end - mine);
            copy_(master, slice(host, mine - begin, mine_end - mine));
          }
        }
      }
      if (!flat.master.is_same(flat.shard) && !flat.wide_master()) copy_(flat.master, flat.shard);
      if (flat.shard_lp.defined()) copy_(flat.shard_lp, flat.shard);
      if (flat.shard_file_offset >= 0) {  // nvme_params: the new shard back to its file
        SwapFile& file = swap_->file();
        file.wait(file.write(static_cast<uint64_t>(flat.shard_file_offset),
                             flat.shard.storage()->data(), flat.shard.nbytes()));
      }
      drop_shard(flat);
    }
  }
  if (!swap_) return;
  // NVMe offload: the sub-groups' masters (the optimizer's copies of the shards) too.
  swap_->rewrite_masters([&](size_t id) {
    for (size_t s : sub_group_segments_[id]) {
      FlatParam& flat = *segment_source_[s].first;
      load_shard(flat);
      copy_(segments_[s], slice(flat.shard, segment_source_[s].second, segments_[s].numel()));
      drop_shard(flat);
    }
  });
}

void ShardedEngine::unshard_module() {
  NoGradGuard no_grad;
  // The whole model as the master weights hold it, not rounded to param_dtype or to 16-bit
  // weights (full_parameters): the module is as before setup.
  const std::vector<std::pair<Tensor, Tensor>> whole = full_parameters();
  *alive_ = false;
  for (const auto& [param, value] : whole)
    param.set_data(value);
  remove_forward_hooks();
  units_.clear();
  segments_.clear();
}

}  // namespace loom::strategies::sharded
