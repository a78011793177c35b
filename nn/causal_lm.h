#pragma once
// A causal language model as trainers and tools see it, whatever its architecture (GPT-2,
// Llama): tokens [B, T] -> logits [B, T, vocab], the mean next-token loss, and the views the
// strategies use (a sequence of layers for pipelines, a split over a tensor-parallel group).

#include <memory>
#include <string>
#include <vector>

#include "nn/kv_cache.h"
#include "nn/layered_model.h"
#include "nn/module.h"
#include "nn/tensor_parallel.h"

namespace loom::nn {

class CausalLM : public Module, public LayeredModel, public TensorParallelModel {
 public:
  // tokens [B, T] (i32/i64, T <= context()) -> logits [B, T, vocab].
  virtual Tensor forward(const Tensor& tokens) const = 0;
  // The logits [B, T, vocab] of tokens [B, T] at positions cache.length .. + T - 1, reading and
  // extending `cache` (KVCache::attend: a whole prompt first, then one token at a time); the
  // same logits as forward() of the whole sequence up to rounding. Not under tensor
  // parallelism.
  virtual Tensor forward_cached(const Tensor& tokens, KVCache& cache) const = 0;
  // Mean cross-entropy of next-token prediction; targets [B, T] like tokens. The output
  // projection runs inside the loss (linear_cross_entropy: the [B*T, vocab] logits are never
  // held on the CPU), between the model's forward hooks as forward() runs.
  Tensor loss(const Tensor& tokens, const Tensor& targets) const;
  virtual int64_t vocab_size() const = 0;
  virtual int64_t context() const = 0;
  // The number of transformer blocks (layer_count() - 2: the embedding and the head).
  virtual int64_t blocks() const = 0;
  // nanoGPT's FLOPs estimate of one training step per token of a sequence of `time` tokens:
  // 6 per parameter plus the attention scores' 12 * blocks * attention width * time.
  virtual double flops_per_token(int64_t time) const = 0;
  // A model of the same configuration with seed 0's weights (dp's replicas; a pipeline's
  // sample for balancing by time). Not tensor parallel, whatever this one is.
  virtual std::unique_ptr<CausalLM> make_like() const = 0;

  // The mean next-token cross-entropy of the last layer's output against targets: of its
  // features through the output projection (classifier_loss), or under tensor parallelism of
  // its logits, which hold this rank's vocabulary columns (a parallel cross-entropy).
  Tensor layer_loss(const Tensor& output, const Tensor& targets) const override;
  // The group parallelize() split the model over; null before.
  const TensorParallelGroup* tensor_parallel() const { return tp_.get(); }

 protected:
  // The final normalised hidden states [B, T, C] of tokens: forward() but the output
  // projection, run between the forward hooks by loss() (the body, without the hooks).
  virtual Tensor features(const Tensor& tokens) const = 0;
  // The mean loss of features [B, T, C] projected onto the vocabulary against targets [B, T],
  // without the logits (linear_cross_entropy), through whichever module's forward hook
  // gathers the projection's weight.
  virtual Tensor classifier_loss(const Tensor& features, const Tensor& targets) const = 0;
  // The first vocabulary row of this rank's part of the embedding (and column of the
  // logits): 0 without tensor parallelism.
  int64_t vocab_first() const;
  // The names of the parameters starting with one of `prefixes`, in named_parameters()'s
  // order (for layer_parameters).
  std::vector<std::string> parameters_named(const std::vector<std::string>& prefixes) const;

  std::shared_ptr<const TensorParallelGroup> tp_;  // set by the subclass's parallelize()
};

}  // namespace loom::nn
