#pragma once
// The autograd graph. Every recorded op is one Node holding its vector-Jacobian product;
// edges point from an op to the ops (or leaf accumulators) that produced its inputs.
// See Note [Backward order] in engine.cpp for how nodes are scheduled.

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::autograd {

class Node;

struct Edge {
  std::shared_ptr<Node> node;  // null when that input needs no gradient
  uint32_t input_nr = 0;       // which of node's outputs the gradient belongs to
};

// What an output looked like, so a missing output gradient can be filled with zeros.
// `gradient_dtype` is the dtype in which the node takes that output's gradient: the output's
// own, or a wider one where the node declared it (accept_wider_gradient).
struct OutputMeta {
  Shape shape;
  DType dtype;
  Device device;
  DType gradient_dtype = dtype;
};

class Node : public std::enable_shared_from_this<Node> {
 public:
  explicit Node(std::string name);
  virtual ~Node() = default;

  // Maps the gradients of this node's outputs (one per output, all defined) to gradients of
  // its inputs (one per next edge; undefined where needs_input_grad(i) is false).
  // Runs with graph recording off.
  virtual std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) = 0;
  // Drops saved tensors after a backward pass that does not retain the graph.
  virtual void release_saved() {}

  const std::string& name() const { return name_; }
  // Creation order; the engine runs later nodes first.
  uint64_t sequence_nr() const { return sequence_nr_; }
  std::vector<Edge>& next_edges() { return next_edges_; }
  // Whether apply() must compute input i's gradient: the input needs one and the pass
  // running this node asked for it (a split backward computes some edges later).
  bool needs_input_grad(size_t i) const {
    return next_edges_[i].node != nullptr && (!computing_ || (*computing_)[i]);
  }
  size_t num_inputs() const { return next_edges_.size(); }
  // The dtype in which input i's gradient is best delivered: the one its producer takes
  // (OutputMeta::gradient_dtype). A vjp may write that gradient in it instead of the input's
  // dtype, saving the widening pass the producer would otherwise make (autocast's weight casts:
  // Note [Weight gradients in f32] in autocast.cpp). Meaningful where needs_input_grad(i).
  DType input_gradient_dtype(size_t i) const {
    const Edge& edge = next_edges_[i];
    return edge.node->outputs()[edge.input_nr].gradient_dtype;
  }
  std::vector<OutputMeta>& outputs() { return outputs_; }
  // Whether the running apply() is the last use of what the node saved: the pass drops it
  // right after (no retain_graph, no edges held back for later). A vjp may then reuse a saved
  // buffer that nothing outside the node holds, as cross-entropy does with its logits.
  bool last_use() const { return last_use_; }
  // Input i's gradient as the running pass has summed it so far, from the other ops that read
  // the input, when nothing but the pass holds it (its own tensor, a whole storage); undefined
  // otherwise: no such sum yet, one that something else can see, or no pass running. A vjp
  // may add its gradient for input i into it, in place, and return it as that gradient: the
  // pass then takes it as the sum instead of adding the two (Note [Adding into the partial
  // gradient] in engine.cpp). Meaningful only while apply() runs, where needs_input_grad(i).
  Tensor partial_gradient(size_t i) const {
    return partial_gradient_ && needs_input_grad(i) ? (*partial_gradient_)(i) : Tensor();
  }

 private:
  friend class ComputingOnly;
  std::string name_;
  uint64_t sequence_nr_;
  std::vector<Edge> next_edges_;
  std::vector<OutputMeta> outputs_;
  const std::vector<bool>* computing_ = nullptr;  // per edge; null: every edge
  bool last_use_ = false;
  const std::function<Tensor(size_t)>* partial_gradient_ = nullptr;  // set by the running pass
};

// Signature of an op's vector-Jacobian product: output gradients -> input gradients.
using VjpFunction =
    std::function<std::vector<Tensor>(const std::vector<Tensor>& grad_outputs, const Node& node)>;

// A node whose vjp is a closure capturing what the op saved in forward.
class FunctionNode final : public Node {
 public:
  FunctionNode(std::string name, VjpFunction vjp) : Node(std::move(name)), vjp_(std::move(vjp)) {}
  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) override;
  void release_saved() override { vjp_ = nullptr; }

 private:
  VjpFunction vjp_;
};

// The sink for a leaf tensor: adds incoming gradients into leaf.grad, then fires the
// leaf's grad-ready hooks. It runs once per backward pass, after all contributions arrived.
class AccumulateGrad final : public Node {
 public:
  explicit AccumulateGrad(std::shared_ptr<TensorImpl> leaf);
  std::vector<Tensor> apply(const std::vector<Tensor>& grad_outputs) override;
  const TensorImpl* leaf() const { return leaf_.get(); }

 private:
  std::shared_ptr<TensorImpl> leaf_;
};

// True when graph recording is on and any of `inputs` requires a gradient.
bool any_requires_grad(const std::vector<Tensor>& inputs);

// The edge through which a gradient for `tensor` flows (its grad_fn or its accumulator);
// an edge with a null node when it needs none.
Edge gradient_edge(const Tensor& tensor);

// Records one op: attaches a FunctionNode to `outputs` with edges to `inputs`.
// Call only when any_requires_grad(inputs) is true. Undefined inputs get null edges.
void record(std::string name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            VjpFunction vjp);

// As record, with the edges given: the op's gradients go where `edges` lead, which may be
// the inputs of the op that produced an input (an op that takes over its input's producer's
// backward: Note [A norm takes over the residual add before it] in tensor/ops/layer_norm.cpp).
void record_edges(std::string name, std::vector<Edge> edges, const std::vector<Tensor>& outputs,
                  VjpFunction vjp);

// Declares that `output`'s node takes its gradient in `dtype`, wider than output's (a
// floating dtype of more bits): its vjp must accept either. Call right after record().
void accept_wider_gradient(const Tensor& output, DType dtype);

// The leaves whose gradient a backward pass from `root` would accumulate (the leaves that
// requires-grad paths from root reach). DDP's find_unused_parameters uses it.
std::vector<const TensorImpl*> reachable_leaves(const Tensor& root);

// Runs the backward pass from `roots` seeded with `grad_roots` (same length; an undefined
// seed means ones for a one-element root). Leaves reached get their .grad accumulated.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
                  bool retain_graph);

// A backward pass split in two (Note [Split backward] in engine.cpp), as zero-bubble
// pipeline schedules need it: run_backward_input computes only what the gradients of
// `inputs` (leaves) depend on and accumulates those into the inputs' .grad; the WeightGradients it
// returns computes the rest later (every other leaf's gradient, with its hooks), keeping
// the saved tensors that needs until then. The two halves together accumulate exactly the
// gradients one run_backward would, bitwise, and free the graph as it would.
class WeightGradients {
 public:
  WeightGradients() = default;
  WeightGradients(WeightGradients&&) = default;
  WeightGradients& operator=(WeightGradients&&) = default;
  // Runs the held-back half. Call it once; afterwards this is empty.
  void run();
  bool empty() const { return held_.empty() && seeds_.empty(); }

  // A node whose edges outside the input half wait for run(), with its output gradients.
  struct Held {
    std::shared_ptr<Node> node;
    std::vector<Tensor> grad_outputs;
    std::vector<bool> edges;  // the edges run() computes
  };

 private:
  friend WeightGradients run_backward_input(const std::vector<Tensor>&, const std::vector<Tensor>&,
                                            const std::vector<Tensor>&);
  std::vector<Held> held_;
  std::vector<std::pair<Edge, Tensor>> seeds_;  // roots that do not lead to an input
};

WeightGradients run_backward_input(const std::vector<Tensor>& roots,
                                   const std::vector<Tensor>& grad_roots,
                                   const std::vector<Tensor>& inputs);

}  // namespace loom::autograd
