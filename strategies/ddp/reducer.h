#pragma once
// DDP's gradient reducer: gradients live in flat buckets and each bucket is averaged across
// ranks as soon as its last gradient is ready, overlapping communication with the rest of
// backward (c10d's reducer, llm.c's zero.cuh).
//
//   Reducer reducer(model.parameters(), pg, {.bucket_cap_mb = 25});
//   reducer.prepare_for_backward(loss);
//   loss.backward();              // grad-ready hooks launch the buckets' allreduces
//   reducer.finalize_backward();  // waits; every rank now holds the averaged gradients
//
// Buckets hold parameters in reverse registration order (the order backward produces their
// gradients), the first one capped at first_bucket_mb so that communication starts early,
// the others at bucket_cap_mb; a parameter never straddles two buckets and buckets never mix
// dtypes. The assignment depends only on the parameters' order, sizes and dtypes, so it is
// identical on every rank, and buckets are always launched in index order (a ready bucket
// waits for the ones before it), so every rank issues the same allreduces in the same order.
// Each bucket is averaged by the communication hook named in ReducerOptions::comm_hook
// (strategies/ddp/comm_hook.h); the default, "allreduce", folds the averaging into the
// reduction (ReduceOp::Avg).

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "strategies/ddp/comm_hook.h"
#include "tensor/tensor.h"

namespace loom::strategies {

struct ReducerOptions {
  double bucket_cap_mb = 25;
  double first_bucket_mb = 1;
  // Gradients are views into the buckets (no copy in or out). When false, each gradient is
  // copied into its bucket when ready and the averaged values copied back at the end.
  bool gradient_as_bucket_view = true;
  // Parameters that the loss does not depend on are found by walking the autograd graph in
  // prepare_for_backward and count as ready at once (their gradient contributes zeros).
  // Without it such a parameter is an error naming it, since its bucket could never complete.
  bool find_unused_parameters = false;
  // The set of parameters that receive gradients is the same in every iteration: with
  // find_unused_parameters, the autograd graph is walked in the first iteration only and
  // the unused set reused afterwards (PyTorch's static_graph saves the same walk).
  bool static_graph = false;
  // How each bucket is averaged: a name from CommHookRegistry::list() (allreduce,
  // bf16_compress, fp16_compress, powersgd, or one registered with CommHookRegistry::add).
  // Each Reducer makes its own instance.
  std::string comm_hook = "allreduce";
  // The settings of the powersgd hook (train_gpt's --powersgd-*).
  PowerSGDOptions powersgd = {};
};

class Reducer {
 public:
  // `params` in registration order (Module::parameters()); all must be contiguous leaves that
  // require grad. Collective: every rank must build its reducer over equal parameters.
  // `names` (optional, same order) are used in error messages.
  Reducer(std::vector<Tensor> params, std::shared_ptr<comm::ProcessGroup> group,
          const ReducerOptions& options = {}, std::vector<std::string> names = {});
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // With gradient_as_bucket_view, makes each parameter's .grad a view into its bucket (zeroed
  // where it had none; a gradient it holds is copied in). prepare_for_backward does it too;
  // callers that accumulate several backward passes before the synchronised one (a
  // pipeline's micro-batches) call it before the first, so that nothing is copied later.
  void bind_gradient_views();
  // Call before each backward pass that should synchronise. `loss` is only read when
  // find_unused_parameters is set.
  void prepare_for_backward(const Tensor& loss);
  // Waits for every bucket's allreduce (bounded by the group's timeout) and leaves the
  // averaged gradients in each parameter's .grad. Throws loom::Error naming a parameter that
  // received no gradient (unless find_unused_parameters), loom::CommError on peer failures.
  void finalize_backward();

  // Gradient accumulation: while false, backward passes only accumulate locally (no_sync);
  // the next synchronised pass averages the accumulated sums.
  void set_sync(bool sync) { sync_ = sync; }
  bool sync() const { return sync_; }

  // Runs on a bucket's gradients (its parameters' indices in registration order, and their
  // views in the bucket) just before the comm hook averages them: on every rank, in bucket
  // order, on the thread that runs backward, so it may issue collectives on another group of
  // the same ranks' peers. Tensor parallelism's sequence-parallel sums of replicated
  // parameters' gradients over the tp group run here, before the dp average.
  using BucketPrologue =
      std::function<void(const std::vector<size_t>& params, const std::vector<Tensor>& gradients)>;
  void set_bucket_prologue(BucketPrologue prologue) { prologue_ = std::move(prologue); }

  // Bucket layout, for tests and traces: parameter indices (registration order) per bucket.
  std::vector<std::vector<size_t>> bucket_assignment() const;

 private:
  struct Bucket;
  struct Slot {
    size_t bucket;
    int64_t offset;  // in elements, into the bucket's flat buffer
  };

  void on_gradient_ready(size_t param);
  void mark_ready(size_t param);
  void launch_ready_buckets();

  std::string name_of(size_t param) const;
  Tensor slice_of(size_t param) const;

  std::vector<Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<comm::ProcessGroup> group_;
  ReducerOptions options_;
  std::unique_ptr<CommHook> hook_;
  BucketPrologue prologue_;
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<Slot> slots_;
  std::vector<bool> ready_;
  std::vector<size_t> unused_;  // static_graph: parameters found unused in the first pass
  bool unused_known_ = false;
  size_t next_launch_ = 0;
  bool sync_ = true;
  bool expecting_backward_ = false;
  std::shared_ptr<bool> alive_;  // hooks outlive the reducer; they check this first
};

}  // namespace loom::strategies
