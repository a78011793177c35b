#include <queue>
#include <unordered_map>

#include "tensor/autograd/node.h"
#include "tensor/ops.h"

namespace loom::autograd {

namespace {
std::atomic<uint64_t> next_sequence_nr{0};
}  // namespace

Node::Node(std::string name) : name_(std::move(name)), sequence_nr_(next_sequence_nr++) {}

std::vector<Tensor> FunctionNode::apply(const std::vector<Tensor>& grad_outputs) {
  if (!vjp_) {
    fail("[autograd] backward through '", name(),
         "' a second time: its saved tensors were freed after the first backward; "
         "pass retain_graph=true to the first backward() if you need to run it again");
  }
  return vjp_(grad_outputs, *this);
}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
    : Node("AccumulateGrad"), leaf_(std::move(leaf)) {
  outputs().push_back({leaf_->shape, leaf_->dtype, leaf_->storage->device()});
}

std::vector<Tensor> AccumulateGrad::apply(const std::vector<Tensor>& grad_outputs) {
  const Tensor& incoming = grad_outputs[0];
  Tensor leaf(leaf_);
  if (leaf_->grad) {
    // In place, so a gradient that is a view into a bucket (DDP) stays one.
    Tensor grad(leaf_->grad);
    add_(grad, incoming);
  } else {
    Tensor grad = incoming.clone();
    grad.storage()->set_kind(MemoryKind::Gradients);
    leaf_->grad = grad.impl_ptr();
  }
  for (GradReadyHook& hook : leaf_->grad_ready_hooks)
    hook(leaf);
  return {};
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!grad_mode_enabled()) return false;
  for (const Tensor& t : inputs) {
    if (t.defined() && t.requires_grad()) return true;
  }
  return false;
}

Edge gradient_edge(const Tensor& tensor) {
  if (!tensor.defined() || !tensor.requires_grad()) return {};
  TensorImpl& impl = tensor.impl();
  if (impl.grad_fn) return {impl.grad_fn, impl.output_nr};
  std::shared_ptr<AccumulateGrad> accumulator = impl.grad_accumulator.lock();
  if (!accumulator) {
    accumulator = std::make_shared<AccumulateGrad>(tensor.impl_ptr());
    impl.grad_accumulator = accumulator;
  }
  return {accumulator, 0};
}

void record(std::string name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            VjpFunction vjp) {
  auto node = std::make_shared<FunctionNode>(std::move(name), std::move(vjp));
  for (const Tensor& input : inputs)
    node->next_edges().push_back(gradient_edge(input));
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    TensorImpl& out = outputs[i].impl();
    out.requires_grad = true;
    out.grad_fn = node;
    out.output_nr = i;
    node->outputs().push_back({out.shape, out.dtype, outputs[i].device()});
  }
}

std::vector<const TensorImpl*> reachable_leaves(const Tensor& root) {
  std::vector<const TensorImpl*> leaves;
  Edge start = gradient_edge(root);
  if (!start.node) return leaves;
  std::vector<Node*> stack{start.node.get()};
  std::unordered_map<Node*, bool> seen{{start.node.get(), true}};
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (auto* sink = dynamic_cast<AccumulateGrad*>(node)) leaves.push_back(sink->leaf());
    for (Edge& edge : node->next_edges()) {
      if (edge.node && seen.emplace(edge.node.get(), true).second) stack.push_back(edge.node.get());
    }
  }
  return leaves;
}

// Note [Backward order]
// The engine counts, for every node reachable from the roots, how many edges lead into it.
// A node runs once all of them delivered their gradient (summed per output), so each leaf's
// AccumulateGrad runs exactly once per pass with its complete gradient: that is when the
// grad-ready hooks fire, and why DDP can launch a bucket's allreduce from them. Among ready
// nodes the most recently created runs first (highest sequence number), which walks the
// model from the last layer to the first, the order in which DDP fills its buckets.
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
                  bool retain_graph) {
  check_eq(roots.size(), grad_roots.size(), "run_backward: one seed gradient per root");
  NoGradGuard no_grad;

  struct Pending {
    std::vector<Tensor> grads;
    int dependencies = 0;
  };
  std::unordered_map<Node*, Pending> pending;
  std::vector<std::shared_ptr<Node>> keep_alive;

  // Count incoming edges with an iterative depth-first walk.
  std::vector<Node*> stack;
  auto visit = [&](const std::shared_ptr<Node>& node) {
    auto [it, inserted] = pending.try_emplace(node.get());
    it->second.dependencies++;
    if (inserted) {
      it->second.grads.resize(node->outputs().size());
      keep_alive.push_back(node);
      stack.push_back(node.get());
    }
  };
  std::vector<Edge> root_edges;
  for (size_t i = 0; i < roots.size(); ++i) {
    check(roots[i].requires_grad(),
          "backward: tensor " + roots[i].str() + " does not require grad and has no grad_fn");
    root_edges.push_back(gradient_edge(roots[i]));
    visit(root_edges.back().node);
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (Edge& edge : node->next_edges()) {
      if (edge.node) visit(edge.node);
    }
  }

  auto deliver = [](Pending& target, uint32_t input_nr, const Tensor& grad) {
    Tensor& slot = target.grads[input_nr];
    slot = slot.defined() ? add(slot, grad) : grad;
  };
  auto by_sequence = [](Node* a, Node* b) { return a->sequence_nr() < b->sequence_nr(); };
  std::priority_queue<Node*, std::vector<Node*>, decltype(by_sequence)> ready(by_sequence);

  for (size_t i = 0; i < roots.size(); ++i) {
    Tensor seed = grad_roots[i];
    if (!seed.defined()) {
      check(roots[i].numel() == 1,
            "backward: a gradient must be given for non-scalar root " + roots[i].str());
      seed = Tensor::ones(roots[i].shape(), roots[i].dtype(), roots[i].device());
    }
    check(seed.shape() == roots[i].shape(),
          "backward: seed gradient shape " + shape_str(seed.shape()) +
              " does not match root shape " + shape_str(roots[i].shape()));
    Pending& target = pending[root_edges[i].node.get()];
    deliver(target, root_edges[i].input_nr, seed);
    if (--target.dependencies == 0) ready.push(root_edges[i].node.get());
  }

  while (!ready.empty()) {
    Node* node = ready.top();
    ready.pop();
    Pending& mine = pending[node];
    // Outputs that received no gradient (unused outputs of multi-output ops) count as zero.
    for (size_t i = 0; i < mine.grads.size(); ++i) {
      if (!mine.grads[i].defined()) {
        const OutputMeta& meta = node->outputs()[i];
        mine.grads[i] = Tensor::zeros(meta.shape, meta.dtype, meta.device);
      }
    }
    std::vector<Tensor> input_grads = node->apply(mine.grads);
    mine.grads.clear();
    if (!retain_graph) node->release_saved();
    std::vector<Edge>& edges = node->next_edges();
    for (size_t i = 0; i < edges.size(); ++i) {
      if (!edges[i].node) continue;
      Pending& target = pending[edges[i].node.get()];
      if (i < input_grads.size() && input_grads[i].defined()) {
        deliver(target, edges[i].input_nr, input_grads[i]);
      }
      if (--target.dependencies == 0) ready.push(edges[i].node.get());
    }
  }
}

}  // namespace loom::autograd
