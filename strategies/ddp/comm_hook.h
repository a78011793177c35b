#pragma once
// DDP communication hooks (torch.distributed.algorithms.ddp_comm_hooks): how the Reducer
// averages one bucket of gradients across ranks. A hook is selected by name in
// ReducerOptions::comm_hook; users register their own as easily as a strategy:
//
//   CommHookRegistry::add("sum_then_scale",
//       {[] { return std::make_unique<MyHook>(); }, "allreduce Sum, then scale by 1/W"});
//   Reducer reducer(params, pg, {.comm_hook = "sum_then_scale"});
//
// Built-ins: allreduce (the default: ReduceOp::Avg on the bucket), bf16_compress and
// fp16_compress (the bucket travels as bf16/f16 and is averaged in that dtype, then cast
// back), powersgd (PowerSGD, Vogels et al. 2019, as torch's powerSGD_hook; see
// PowerSGDOptions).
//
// Contract: the Reducer calls launch() for its buckets in index order and then, in
// finalize_backward, finish() on each handle in index order, the same on every rank. A hook
// may issue collectives in both calls, so long as it issues the same ones on every rank.
// Each Reducer creates its own hook instance, so a hook may keep state across iterations
// (PowerSGD's error feedback). Hooks run on the thread that calls backward/finalize.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "tensor/tensor.h"

namespace loom::strategies {

// One bucket as a hook sees it.
struct GradBucket {
  size_t index = 0;  // bucket index, identical on every rank
  Tensor buffer;     // flat f32/f64 gradients, contiguous; the hook writes the result here
  // Each parameter's gradient: contiguous views into `buffer` with the parameter's shape, in
  // the bucket's order.
  std::vector<Tensor> gradients;
  bool is_last = false;  // the last bucket of this backward pass
};

// An averaging in flight. finish() blocks until it is done (bounded by the group's timeout)
// and leaves the averaged values in the bucket's buffer; loom::CommError on peer failures.
class PendingBucket {
 public:
  virtual ~PendingBucket() = default;
  virtual void finish() = 0;
  // When the bucket's communication really started and finished (after finish(); empty where
  // the hook cannot say), for the trace (Note [Bucket spans in the trace] in reducer.cpp).
  using Span = std::pair<loom::Clock::time_point, loom::Clock::time_point>;
  virtual std::optional<Span> comm_span() const { return std::nullopt; }
};

// The name before 2026-12-03 of measured_span (strategies/trace.h), kept for existing hooks.
[[deprecated("use measured_span in strategies/trace.h")]] std::optional<PendingBucket::Span>
span_of(const comm::Work& work);


class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  // Starts averaging `bucket` across `group` and may return before that is done. The bucket's
  // buffer must stay alive and unmodified until finish() returns.
  virtual std::unique_ptr<PendingBucket> launch(const GradBucket& bucket,
                                                comm::ProcessGroup& group) = 0;
};

using CommHookFactory = std::function<std::unique_ptr<CommHook>()>;

struct CommHookEntry {
  CommHookFactory factory;
  std::string description;
};

// Hooks by name, with every Loom registry's verbs (core/registry.h).
class CommHookRegistry {
 public:
  // Throws loom::Error when the name is empty or taken, or the factory empty.
  static void add(const std::string& name, CommHookEntry entry);
  static bool remove(const std::string& name);
  static bool contains(const std::string& name);
  // A new instance of the hook `name`; an unknown name is loom::Error listing the available
  // names and the closest match.
  static std::unique_ptr<CommHook> create(const std::string& name);
  // (name, description) of every registered hook, sorted by name.
  static std::vector<std::pair<std::string, std::string>> list();
};

// The names before 2026-12-03, kept for existing programs.
[[deprecated("use CommHookRegistry::add")]] void register_comm_hook(const std::string& name,
                                                                    CommHookFactory factory,
                                                                    std::string description);
[[deprecated("use CommHookRegistry::remove")]] bool remove_comm_hook(const std::string& name);
[[deprecated("use CommHookRegistry::create")]] std::unique_ptr<CommHook> make_comm_hook(
    const std::string& name);
[[deprecated("use CommHookRegistry::list")]] std::vector<std::pair<std::string, std::string>>
available_comm_hooks();

// PowerSGD (torch's PowerSGDState). Per bucket: tensors with ndim >= 2 are viewed as
// n x m matrices M (n = the first dimension) and replaced by the rank-r approximation
// P Q^T / W, where P = orthogonalize(sum_ranks M Q) and Q = sum_ranks M^T P (two
// allreduces for the whole bucket); vectors, and matrices that would not shrink by
// min_compression_rate, go through a plain allreduce Avg.
struct PowerSGDOptions {
  int64_t matrix_approximation_rank = 1;  // r (capped at min(n, m) per matrix)
  // Iterations (backward passes) of plain allreduce before compression starts.
  int64_t start_powersgd_iter = 1000;
  double min_compression_rate = 2;  // compress when (n + m) r * rate < n m
  // Error feedback: what compression lost on this rank is added to its next gradient.
  bool use_error_feedback = true;
  // Reuse the last iteration's Q instead of drawing a fresh random one each time.
  bool warm_start = true;
  // Random Q comes from this seed, identical on every rank (a rank-independent generator).
  uint64_t seed = 0;
  double orthogonalization_epsilon = 0;  // added to column norms in Gram-Schmidt
};
std::unique_ptr<CommHook> make_powersgd_hook(const PowerSGDOptions& options = {});

}  // namespace loom::strategies
