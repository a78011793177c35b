#include "strategies/sharded/engine.h"

// The optimizer's side of the sharding engine: the shard pieces it steps (or, under NVMe
// offload, the sub-groups and the step hooks that page them), the updated shards' way back
// into the model, the global gradient norm over the shards, and the optimizer's state for
// checkpoints.

#include <algorithm>
#include <cmath>
#include <map>

#include "core/tags.h"
#include "kernels/cpu/exact_square_sum.h"
#include "optim/clip_grad.h"
#include "strategies/precision.h"
#include "strategies/sharded/unit_state.h"
#include "strategies/trace.h"
#include "tensor/meta.h"
#include "tensor/ops.h"

namespace loom::strategies::sharded {

void ShardedEngine::copy_gradients_out(const FlatParam& flat) {
  for (size_t s : flat.nvme_segments) {
    const Tensor source =
        slice(flat.grad_shard, segment_source_[s].second, segment_grads_[s].numel());
    downloads_.start(segment_grads_[s], source);  // from a GPU: on the copy stream
  }
}

void ShardedEngine::adopt_optimizer(optim::Optimizer& optimizer) {
  if (optimizer.step_count() != 0) {
    tag::kSharded.fail(
        "setup_optimizer after the optimizer stepped: set up the optimizer before "
        "its first step, so that its state is created for this rank's shard only");
  }
  if (!segments_.empty()) tag::kSharded.fail("setup_optimizer called twice");
  std::map<const TensorImpl*, size_t> index;
  for (size_t k = 0; k < params_.size(); ++k)
    index.emplace(params_[k].second.impl_ptr().get(), k);
  std::map<size_t, std::pair<const FlatParam*, size_t>> place;  // param -> (flat, position)
  for (auto& unit : units_)
    for (const FlatParam& flat : unit->flats)
      for (size_t i = 0; i < flat.params.size(); ++i)
        place[flat.params[i]] = {&flat, i};
  std::vector<size_t> group_base;  // NVMe: the first sub-group of each optimizer group
  for (optim::ParamGroup& group : optimizer.param_groups()) {
    std::vector<Tensor> pieces;
    std::vector<Piece> nvme_pieces;
    for (const Tensor& p : group.params) {
      auto found = index.find(p.impl_ptr().get());
      if (found == index.end()) {
        tag::kSharded.fail(
            "the optimizer holds a tensor (", p.str(),
            ") that is not a parameter of the set-up module; build the optimizer over "
            "module.parameters()");
      }
      const size_t k = found->second;
      auto [flat, i] = place.at(k);
      const auto [begin, end] = shard_part(*flat, i, params_[k].second.numel());
      if (begin >= end) continue;  // none of this parameter is on this rank
      Piece piece{const_cast<FlatParam*>(flat), k, begin - flat->shard_begin, end - begin};
      if (swap_) {
        nvme_pieces.push_back(piece);
        continue;
      }
      Tensor view = slice(flat->master, piece.shard_offset, piece.length);
      view.set_requires_grad(true);
      pieces.push_back(view);
      add_segment(view, piece, slice(flat->master_grad, piece.shard_offset, piece.length));
    }
    if (swap_) {
      group_base.push_back(sub_group_masters_.size());
      pieces = adopt_into_sub_groups(nvme_pieces);
    }
    group.params = std::move(pieces);
  }
  if (swap_) install_step_hooks(optimizer, std::move(group_base));
}

// Note [NVMe sub-groups]
// Under NVMe offload the optimizer does not see the pieces (segments) but sub-groups:
// consecutive pieces of one optimizer group and dtype packed into one host tensor of at most
// sub_group_size elements (a piece longer than that is split), padded to whole pages so that
// its transfers and its state's can bypass the page cache. The pieces stay the engine's
// bookkeeping (gradient norms, clipping) as views into the sub-groups; the padding holds
// zeros, which AdamW and SGD keep at zero. Every update is elementwise, so the weights are
// bitwise those of the unpacked pieces.
std::vector<Tensor> ShardedEngine::adopt_into_sub_groups(const std::vector<Piece>& pieces) {
  NoGradGuard no_grad;
  std::vector<Tensor> masters;
  std::vector<Piece> parts;  // of the sub-group being filled
  int64_t filled = 0;
  auto close = [&] {
    if (parts.empty()) return;
    const DType dtype = parts[0].flat->dtype;
    const int64_t page = static_cast<int64_t>(SwapFile::kDirectAlignment / dtype_size(dtype));
    const int64_t padded = (filled + page - 1) / page * page;
    Tensor master = Tensor::zeros({padded}, dtype, Device::cpu());
    Tensor grad = Tensor::zeros({padded}, dtype, Device::cpu());
    master.storage()->set_kind(MemoryKind::Offloaded);
    grad.storage()->set_kind(MemoryKind::Offloaded);
    // Written from a GPU each step: page-locked, so downloaded on the copy stream (Note
    // [Offloaded gradients on the copy stream]).
    if (parts[0].flat->grad_shard.device().is_cuda()) grad.storage()->pin();
    sub_group_segments_.emplace_back();
    int64_t at = 0;
    for (const Piece& part : parts) {
      Tensor view = slice(master, at, part.length);
      load_shard(*part.flat);
      copy_(view, slice(part.flat->shard, part.shard_offset, part.length));
      drop_shard(*part.flat);
      view.set_requires_grad(true);
      part.flat->nvme_segments.push_back(segments_.size());
      sub_group_segments_.back().push_back(segments_.size());
      add_segment(view, part, slice(grad, at, part.length));
      at += part.length;
    }
    master.set_requires_grad(true);
    swap_->add(master);  // written out; its memory released until the step needs it
    sub_group_masters_.push_back(master);
    sub_group_grads_.push_back(grad);
    masters.push_back(master);
    parts.clear();
    filled = 0;
  };
  for (const Piece& piece : pieces) {
    if (!parts.empty() && parts[0].flat->dtype != piece.flat->dtype) close();
    for (int64_t begin = 0; begin < piece.length;) {
      const int64_t take = std::min(piece.length - begin, options_.sub_group_size - filled);
      parts.push_back({piece.flat, piece.param, piece.shard_offset + begin, take});
      filled += take;
      begin += take;
      if (filled == options_.sub_group_size) close();
    }
  }
  close();
  return masters;
}

void ShardedEngine::add_segment(const Tensor& view, const Piece& piece, const Tensor& grad) {
  segments_.push_back(view);
  segment_param_.push_back(piece.param);
  const auto at = std::find(piece.flat->params.begin(), piece.flat->params.end(), piece.param);
  const int64_t param_offset = piece.flat->offsets[at - piece.flat->params.begin()];
  segment_param_begin_.push_back(piece.flat->shard_begin + piece.shard_offset - param_offset);
  segment_grads_.push_back(grad);
  segment_source_.emplace_back(piece.flat, piece.shard_offset);
}

void ShardedEngine::install_step_hooks(optim::Optimizer& optimizer,
                                       std::vector<size_t> group_base) {
  swapped_optimizer_ = &optimizer;
  std::weak_ptr<bool> alive = alive_;
  auto engine = [this, alive] {
    if (!alive.lock()) {
      tag::kSharded.fail(
          "the optimizer stepped after its sharded engine was torn down (NVMe "
          "offload): its parameters were that engine's shards; build a new optimizer");
    }
    return this;
  };
  optimizer.set_step_hooks(
      {.begin = [engine] { engine()->swap_->begin_step(); },
       .before_update =
           [engine, base = std::move(group_base)](size_t group, size_t index) {
             ShardedEngine* e = engine();
             const auto id = static_cast<int64_t>(base.at(group) + index);
             if (e->stepping_ >= 0 && e->stepping_ != id)
               e->finish_sub_group(static_cast<size_t>(e->stepping_));
             e->swap_->acquire(static_cast<size_t>(id));
             e->stepping_ = id;
           },
       .end =
           [engine] {
             ShardedEngine* e = engine();
             if (e->stepping_ >= 0) e->finish_sub_group(static_cast<size_t>(e->stepping_));
             e->stepping_ = -1;
             e->swap_->end_step();
           }});
}

void ShardedEngine::finish_sub_group(size_t id) {
  NoGradGuard no_grad;
  std::vector<SwapFile::Ticket> writes;
  for (size_t s : sub_group_segments_[id]) {
    auto [flat, offset] = segment_source_[s];
    if (flat->shard_file_offset >= 0) {  // the shard is on disk: update it there
      const size_t element = dtype_size(flat->dtype);
      writes.push_back(swap_->file().write(
          static_cast<uint64_t>(flat->shard_file_offset) + static_cast<uint64_t>(offset) * element,
          static_cast<const char*>(segments_[s].storage()->data()) +
              static_cast<size_t>(segments_[s].offset()) * element,
          static_cast<size_t>(segments_[s].numel()) * element));
      continue;
    }
    Tensor target = slice(flat->shard, offset, segments_[s].numel());
    copy_(target, segments_[s]);
  }
  for (SwapFile::Ticket t : writes)
    swap_->file().wait(t);  // before the sub-group's memory may go
  swap_->release(id, swapped_optimizer_->state_tensors(sub_group_masters_[id]));
}

void ShardedEngine::after_step() {
  NoGradGuard no_grad;
  // Stage 3: nothing gathered before the step may outlive it (the shards just changed).
  for (size_t u = 0; u < units_.size(); ++u)
    free_full(u);
  Trace* trace = current_trace();
  for (auto& unit : units_) {
    for (FlatParam& flat : unit->flats) {
      if (!flat.master.is_same(flat.shard)) copy_(flat.shard, flat.master);  // (rounded)
      if (flat.wide_master()) flat.master_grad.storage()->release();
      if (flat.shard_lp.defined()) copy_(flat.shard_lp, flat.shard);  // rounded once a step
      if (!shards_.shards_parameters && shard_world_ > 1) {
        flat.gather_issued_us = trace != nullptr ? trace->now_us() : -1;
        flat.gather = shard_group_->all_gather(flat.full, flat.shard);
      }
    }
  }
  for (size_t u = 0; u < units_.size(); ++u) {
    for (FlatParam& flat : units_[u]->flats)
      wait_for(flat, u, true);
  }
  // 16-bit weights: the f32 gradient copies were let go above; nothing may read them.
  for (size_t i = 0; i < segments_.size(); ++i)
    if (segment_source_[i].first->wide_master()) segments_[i].set_grad(Tensor());
}

double ShardedEngine::grad_norm(double norm_type) {
  if (!(norm_type > 0.0))
    tag::kSharded.fail("grad_norm: norm_type ", norm_type,
                       " is not supported; expected > 0 or inf");
  NoGradGuard no_grad;
  const int64_t count = static_cast<int64_t>(params_.size());
  bool exact = norm_type == 2.0;
  for (const Tensor& s : segments_)
    exact = exact && s.dtype() == DType::F32 && s.device().is_cpu();
  std::vector<double> norms(params_.size(), 0.0);
  // The sums cross the ranks on the group's device: the host for a host backend, the GPU for
  // nccl (which moves CUDA tensors only), meta for a simulated rank (whose sim group moves meta
  // tensors only, which read as zeros: docs/simulation.md).
  const Device exchange = shard_world_ > 1 ? shard_group_->device() : Device::cpu();
  if (exact) {
    // Per parameter, the exact sum of squares of its pieces on every rank.
    using kernels::cpu::ExactSquareSum;
    std::vector<ExactSquareSum> sums(params_.size());
    for (size_t i = 0; i < segments_.size(); ++i) {
      Tensor g = segments_[i].grad();
      if (g.defined()) sums[segment_param_[i]].add_squares(g.data<float>(), g.numel());
    }
    std::vector<int64_t> words;
    for (const ExactSquareSum& s : sums) {
      auto w = s.words();
      words.insert(words.end(), w.begin(), w.end());
    }
    Tensor all = Tensor::from_vector(words, {count * ExactSquareSum::kWords}, exchange);
    if (shard_world_ > 1) shard_group_->allreduce(all, {.op = comm::ReduceOp::Sum})->wait();
    const std::vector<int64_t> sums_of_all = all.to_vector<int64_t>();
    const int64_t* summed = sums_of_all.data();
    for (int64_t k = 0; k < count; ++k) {
      std::array<int64_t, ExactSquareSum::kWords> w;
      std::copy(summed + k * ExactSquareSum::kWords, summed + (k + 1) * ExactSquareSum::kWords,
                w.begin());
      norms[k] = std::sqrt(ExactSquareSum::from_words(w).value());
    }
    return optim::total_norm(norms, norm_type);
  }
  bool on_cuda = norm_type == 2.0;
  for (const Tensor& s : segments_)
    on_cuda = on_cuda && (!s.grad().defined() || takes_cuda_path(s.grad().device()));
  if (on_cuda) {
    // Per parameter, its pieces' sums of squares in double, added across the ranks and then
    // rounded to float as optim::grad_norm rounds a whole CUDA gradient's (optim::cuda_two_norm:
    // its bits unless the two double sums straddle a float's rounding boundary). Each piece's
    // norm rounded apart, as below, would be a float's rounding off the whole's, and the
    // clipping factor with it.
    std::vector<Tensor> grads;
    std::vector<size_t> owners;
    for (size_t i = 0; i < segments_.size(); ++i) {
      if (!segments_[i].grad().defined()) continue;
      grads.push_back(segments_[i].grad());
      owners.push_back(segment_param_[i]);
    }
    std::vector<double> sums(params_.size(), 0.0);
    const std::vector<double> pieces = optim::cuda_sums_of_squares(grads);
    for (size_t k = 0; k < pieces.size(); ++k)
      sums[owners[k]] += pieces[k];
    Tensor all = Tensor::from_vector(sums, {count}, exchange);
    if (shard_world_ > 1) shard_group_->allreduce(all, {.op = comm::ReduceOp::Sum})->wait();
    const std::vector<double> summed = all.to_vector<double>();
    for (int64_t k = 0; k < count; ++k)
      norms[k] = optim::cuda_two_norm(summed[k]);
    return optim::total_norm(norms, norm_type);
  }
  // Other norms and dtypes: per-parameter partial sums of |g|^p (or maxima), combined across
  // ranks; equal to the unsharded norm up to rounding.
  const bool inf = norm_type == optim::kInfNorm;
  std::vector<double> partial(params_.size(), 0.0);
  for (size_t i = 0; i < segments_.size(); ++i) {
    Tensor g = segments_[i].grad();
    if (!g.defined()) continue;
    double n = optim::grad_norm({segments_[i]}, norm_type);
    double& slot = partial[segment_param_[i]];
    slot = inf ? std::max(slot, n) : slot + std::pow(n, norm_type);
  }
  Tensor all = Tensor::from_vector(partial, {count}, exchange);
  if (shard_world_ > 1)
    shard_group_->allreduce(all, {.op = inf ? comm::ReduceOp::Max : comm::ReduceOp::Sum})->wait();
  std::vector<double> summed = all.to_vector<double>();
  for (int64_t k = 0; k < count; ++k)
    norms[k] = inf ? summed[k] : std::pow(summed[k], 1.0 / norm_type);
  return optim::total_norm(norms, norm_type);
}

double ShardedEngine::clip_grad_norm(double max_norm, double norm_type) {
  return optim::clip_grads_to_norm(segments_, max_norm, grad_norm(norm_type), norm_type);
}

bool ShardedEngine::any_nonfinite_gradient() {
  NoGradGuard no_grad;
  double bad = 0.0;
  for (const Tensor& s : segments_) {
    Tensor g = s.grad();
    if (g.defined() && any_non_finite(g)) bad = 1.0;
  }
  if (shard_world_ == 1) return bad > 0.0;
  Tensor flag = Tensor::full({1}, bad, DType::F64, shard_group_->device());  // as in grad_norm
  shard_group_->allreduce(flag, {.op = comm::ReduceOp::Max})->wait();
  return flag.item() > 0.0;
}

OptimizerLayout ShardedEngine::optimizer_layout(const optim::Optimizer& optimizer) const {
  // Each tensor the optimizer holds is a segment, or under NVMe offload a sub-group of
  // segments packed one after another (adopt_into_sub_groups).
  std::map<const TensorImpl*, std::vector<size_t>> segments_of;
  if (swap_) {
    for (size_t j = 0; j < sub_group_masters_.size(); ++j)
      segments_of[sub_group_masters_[j].impl_ptr().get()] = sub_group_segments_[j];
  } else {
    for (size_t s = 0; s < segments_.size(); ++s)
      segments_of[segments_[s].impl_ptr().get()] = {s};
  }
  OptimizerLayout layout;
  for (const optim::ParamGroup& group : optimizer.param_groups()) {
    layout.emplace_back();
    for (const Tensor& tensor : group.params) {
      auto found = segments_of.find(tensor.impl_ptr().get());
      if (found == segments_of.end()) {
        tag::kSharded.fail(
            "the optimizer holds a tensor (", tensor.str(),
            ") the engine did not "
            "give it; pass the optimizer to setup_optimizer() before describing its state");
      }
      std::vector<OptimizerPart> parts;
      int64_t offset = 0;
      for (size_t s : found->second) {
        const int64_t length = segments_[s].numel();
        parts.push_back({params_[segment_param_[s]].first, segment_param_begin_[s], length, offset});
        offset += length;
      }
      layout.back().push_back(std::move(parts));
    }
  }
  return layout;
}

std::map<std::string, Tensor> ShardedEngine::optimizer_state(const optim::Optimizer& optimizer) {
  if (swap_) swap_->read_all();
  std::map<std::string, Tensor> out;
  for (const auto& [name, tensor] : optimizer.state_dict())
    out.emplace(name, tensor.clone());
  if (swap_) swap_->drop_all();
  return out;
}

}  // namespace loom::strategies::sharded
