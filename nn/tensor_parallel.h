#pragma once
// Tensor parallelism as the layers see it (Megatron-LM's scheme): a group of ranks that
// split each layer's weights, and the collectives between the split layers. The layers (GPT,
// nn/gpt.h) call these; strategies/tp/ gives them over a process group.
//
//   column-parallel  y_r = x W[:, cols_r]     (x replicated: enters through copy_in)
//   row-parallel     y = sum_r x_r W[rows_r, :]  (partial sums: leave through reduce_out,
//                                               then the bias, once)
//
// copy_in and reduce_out are each other's transposes, so gradients of replicated tensors
// come out whole and the same on every rank of the group.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::nn {

class TensorParallelGroup {
 public:
  virtual ~TensorParallelGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Identity forward; the gradient summed over the group backward.
  virtual Tensor copy_in(const Tensor& x) const = 0;
  // The sum over the group forward; identity backward.
  virtual Tensor reduce_out(const Tensor& x) const = 0;
  // Sequence parallelism (Megatron-LM's): between the split layers the activations are
  // split by sequence position over the group instead of replicated; copy_in then gathers
  // the sequence (dimension 1) forward and reduce-scatters the gradient backward, reduce_out
  // reduce-scatters forward and gathers backward. Layers that run on the split sequence
  // (LayerNorm, the embedding's positions) see only this rank's positions.
  virtual bool sequence_parallel() const { return false; }
  // The sum over the group in place, not differentiable (inside custom ops such as the
  // parallel cross-entropy).
  virtual void sum(Tensor& t) const = 0;
};

struct TensorParallelSplit;

// A model that can split itself over a tensor-parallel group (GPT does).
class TensorParallelModel {
 public:
  virtual ~TensorParallelModel() = default;
  // Replaces every split parameter by this rank's part and runs the forward split from now
  // on. The group must outlive the model. Once only.
  virtual void parallelize(std::shared_ptr<const TensorParallelGroup> tp) = 0;
  // How each parameter is split (by name; replicated ones absent).
  virtual std::map<std::string, TensorParallelSplit> tensor_parallel_splits() const = 0;
};

// How a parameter is split over the group: not at all (dim < 0: replicated), or along `dim`,
// whose extent is `blocks` equal blocks (c_attn's q, k and v: 3) each split evenly over the
// ranks, rank r holding the r-th part of every block, in block order.
struct TensorParallelSplit {
  int dim = -1;
  int64_t blocks = 1;
  bool split() const { return dim >= 0; }
};

// Rank `rank`'s part of the whole tensor `full` under `split` (a new contiguous tensor).
Tensor take_split(const Tensor& full, const TensorParallelSplit& split, int rank, int size);
// The whole tensor from every rank's part, parts[r] being rank r's (the inverse of
// take_split).
Tensor join_splits(const std::vector<Tensor>& parts, const TensorParallelSplit& split);

// `x` unchanged forward; backward, its gradient summed over the group (every rank then holds
// the same sum). For a parameter every rank keeps whole but uses only part of, each rank's
// gradient covering its part: Llama's key/value projections when --tp exceeds their heads.
Tensor gradient_summed_over_group(const Tensor& x, const TensorParallelGroup& group);
// The mean cross-entropy of logits split by vocabulary over the group (this rank holds
// columns [first, first + logits.size(1)) of [N, vocab] logits) against targets [N]: each
// part's logsumexp and the target's logit are combined over the group, so no rank holds the
// whole vocabulary (Note [The vocabulary-parallel loss]). On any device; differentiable in
// `logits`.
Tensor parallel_cross_entropy(const Tensor& logits, const Tensor& targets, int64_t first,
                              const TensorParallelGroup& group);

}  // namespace loom::nn
