#include <functional>
#include <queue>
#include <unordered_map>
#include <unordered_set>

#include "core/tags.h"
#include "tensor/autograd/node.h"
#include "tensor/ops.h"

namespace loom::autograd {

namespace {
std::atomic<uint64_t> next_sequence_nr{0};
}  // namespace

Node::Node(std::string name) : name_(std::move(name)), sequence_nr_(next_sequence_nr++) {}

std::vector<Tensor> FunctionNode::apply(const std::vector<Tensor>& grad_outputs) {
  if (!vjp_) {
    tag::kAutograd.fail(
        "backward through '", name(),
        "' a second time: its saved tensors were freed after the first backward; "
        "pass retain_graph=true to the first backward() if you need to run it again");
  }
  return vjp_(grad_outputs, *this);
}

AccumulateGrad::AccumulateGrad(std::shared_ptr<TensorImpl> leaf)
    : Node("AccumulateGrad"), leaf_(std::move(leaf)) {
  outputs().push_back({leaf_->shape, leaf_->dtype, leaf_->storage->device()});
}

namespace {

// A gradient the pass may take over or add into: nothing else can see it.
bool held_only_here(const Tensor& t) {
  return t.holds_storage_alone() && !t.requires_grad();
}

// Note [A first gradient is taken, not copied]
// A leaf without a gradient takes the incoming one as it is when nothing else can see it:
// the engine's own vector holds the only handle, no other tensor shares its storage, and it
// covers that storage exactly in the leaf's layout. Otherwise (a view, a gradient delivered
// to two leaves, a hook's copy) the leaf gets a copy. PyTorch's AccumulateGrad does the same:
// since optimizers drop gradients between steps (zero_grad sets them to none), every step
// would otherwise copy every parameter's gradient into fresh memory (500 MB for GPT-2 small:
// train_gpt's step at 124M, one thread, 0.95-0.96 of the copying one's on an AVX2 host,
// interleaved, 2026-12-04; the same losses to the bit).
bool takes_as_is(const Tensor& incoming, const TensorImpl& leaf) {
  return held_only_here(incoming) && incoming.dtype() == leaf.dtype &&
         incoming.shape() == leaf.shape && incoming.device() == leaf.storage->device();
}

}  // namespace

std::vector<Tensor> AccumulateGrad::apply(const std::vector<Tensor>& grad_outputs) {
  const Tensor& incoming = grad_outputs[0];
  Tensor leaf(leaf_);
  // An f32 leaf may receive its gradient in 16 bits (autocast's cached weight casts pass theirs
  // as they are: Note [Autocast's weight cache]): widened into a new gradient, or added to the
  // one there widening on load, the values of widening first either way.
  if (leaf_->grad) {
    // In place, so a gradient that is a view into a bucket (DDP) stays one.
    Tensor grad(leaf_->grad);
    add_(grad, incoming);
  } else if (takes_as_is(incoming, *leaf_)) {
    incoming.storage()->set_kind(MemoryKind::Gradients);
    leaf_->grad = incoming.impl_ptr();
  } else {
    Tensor grad;
    if (incoming.dtype() == leaf_->dtype) {
      grad = incoming.clone();
    } else {
      NoGradGuard no_grad;
      grad = Tensor::empty(incoming.shape(), leaf_->dtype, incoming.device());
      copy_(grad, incoming);
    }
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
  std::vector<Edge> edges;
  for (const Tensor& input : inputs)
    edges.push_back(gradient_edge(input));
  record_edges(std::move(name), std::move(edges), outputs, std::move(vjp));
}

void record_edges(std::string name, std::vector<Edge> edges, const std::vector<Tensor>& outputs,
                  VjpFunction vjp) {
  auto node = std::make_shared<FunctionNode>(std::move(name), std::move(vjp));
  node->next_edges() = std::move(edges);
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    TensorImpl& out = outputs[i].impl();
    out.requires_grad = true;
    out.grad_fn = node;
    out.output_nr = i;
    node->outputs().push_back({out.shape, out.dtype, outputs[i].device()});
  }
}

void accept_wider_gradient(const Tensor& output, DType dtype) {
  TensorImpl& impl = output.impl();
  if (impl.grad_fn == nullptr || !is_floating(dtype) || dtype_size(dtype) <= dtype_size(impl.dtype)) {
    fail("accept_wider_gradient: expected a recorded output and a floating dtype wider than its ",
         dtype_name(impl.dtype), ", got ", impl.grad_fn ? "a recorded output" : "a leaf", " and ",
         dtype_name(dtype));
  }
  impl.grad_fn->outputs()[impl.output_nr].gradient_dtype = dtype;
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
//
// Note [Split backward]
// run_backward_input runs the nodes from which an input's gradient edge can be reached (the
// input half; every edge into them comes from the half itself, so their gradients are
// complete there). Such a node computes only its edges into the half (needs_input_grad
// says so), and when it has edges outside it (a Linear's weight and bias), it is held with
// its output gradients and its saved tensors. WeightGradients::run then runs the held
// nodes again for those edges only, together with the roots' seeds that lead to no input,
// as one ordinary pass over the rest of the graph. Each gradient is the same arithmetic on
// the same operands as in one pass, and every leaf still accumulates its gradient once.
//
// Note [Adding into the partial gradient]
// A tensor read by several ops gets its gradient as their sum: the pass adds each arriving
// gradient to the one summed so far, a new tensor each time. Where an op's backward scatters
// into a gradient of the input's size, as an embedding's does (a tied embedding's table is
// also the output projection, whose weight gradient arrives first), it would zero a table,
// scatter into it and have the pass add the two tables: three passes over 154 MB in f32 for
// GPT-2 small. Node::partial_gradient instead hands the vjp the sum so far when nothing else
// can see it; the vjp adds its own gradient into it and returns it, and the pass, seeing the
// tensor it handed out come back, takes it as the new sum. The values are those of adding the
// op's gradient, as computed alone, to the sum (the embedding adds each row's own sum once:
// kernels/cpu/embedding.h). llm.c's encoder backward adds into the classifier's gradient
// the same way; PyTorch's engine sums two tables.

// Restricts a node to computing some of its edges while alive, says whether this is the last
// use of what it saved, and answers its partial_gradient().
class ComputingOnly {
 public:
  ComputingOnly(Node& node, const std::vector<bool>& edges, bool last_use,
                const std::function<Tensor(size_t)>& partial_gradient)
      : node_(node) {
    node_.computing_ = &edges;
    node_.last_use_ = last_use;
    node_.partial_gradient_ = &partial_gradient;
  }
  ~ComputingOnly() {
    node_.computing_ = nullptr;
    node_.last_use_ = false;
    node_.partial_gradient_ = nullptr;
  }
  ComputingOnly(const ComputingOnly&) = delete;
  ComputingOnly& operator=(const ComputingOnly&) = delete;

 private:
  Node& node_;
};

namespace {

// One backward pass over the nodes `in_pass` accepts: edges into them counted, gradients
// summed per output, ready nodes run latest-created first.
class Pass {
 public:
  using Filter = std::function<bool(const Node*)>;
  Pass(Filter in_pass, bool retain_graph)
      : in_pass_(std::move(in_pass)), retain_graph_(retain_graph) {}

  // Counts the edges into the nodes of the pass reachable from `starts` (one per start).
  void count(const std::vector<Edge>& starts) {
    std::vector<Node*> stack;
    auto visit = [&](const Edge& edge) {
      if (!edge.node || !in_pass_(edge.node.get())) return;
      auto [it, inserted] = pending_.try_emplace(edge.node.get());
      it->second.dependencies++;
      if (inserted) {
        it->second.grads.resize(edge.node->outputs().size());
        keep_alive_.push_back(edge.node);
        stack.push_back(edge.node.get());
      }
    };
    for (const Edge& edge : starts)
      visit(edge);
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      for (const Edge& edge : node->next_edges())
        visit(edge);
    }
  }

  // One of the counted edges delivers `grad` (undefined: nothing, as for an input the node
  // computed no gradient for).
  // `summed`: grad is the slot's own tensor, which the sender's vjp added into (Note [Adding
  // into the partial gradient]).
  void deliver(const Edge& edge, const Tensor& grad, bool summed = false) {
    Pending& target = pending_.at(edge.node.get());
    if (grad.defined() && !summed) {
      Tensor& slot = target.grads[edge.input_nr];
      slot = slot.defined() ? add(slot, grad) : grad;
    }
    if (--target.dependencies == 0) ready_.push(edge.node.get());
  }

  // The gradient summed so far for what `edge` leads to, when only the pass holds it.
  Tensor partial(const Edge& edge) const {
    auto it = pending_.find(edge.node.get());
    if (it == pending_.end()) return {};
    const Tensor& slot = it->second.grads[edge.input_nr];
    return slot.defined() && held_only_here(slot) ? slot : Tensor();
  }

  // A node ready at the start with its output gradients, computing only `edges`.
  void add_held(WeightGradients::Held held) {
    ready_.push(held.node.get());
    held_.emplace(held.node.get(), std::move(held));
  }

  // Runs nodes until none is ready. Where a node has edges outside the pass, it computes
  // the others and, when `held_back` is given, is held there for the rest.
  void run(std::vector<WeightGradients::Held>* held_back) {
    while (!ready_.empty()) {
      Node* node = ready_.top();
      ready_.pop();
      std::vector<Edge>& edges = node->next_edges();
      std::vector<Tensor> grads;
      std::vector<bool> computing(edges.size());
      bool holds_back = false;
      if (auto held = held_.find(node); held != held_.end()) {
        grads = std::move(held->second.grad_outputs);
        computing = std::move(held->second.edges);
      } else {
        grads = std::move(pending_.at(node).grads);
        // Outputs that received no gradient (unused outputs of multi-output ops) count as zero.
        for (size_t i = 0; i < grads.size(); ++i) {
          if (!grads[i].defined()) {
            const OutputMeta& meta = node->outputs()[i];
            grads[i] = Tensor::zeros(meta.shape, meta.dtype, meta.device);
          }
        }
        for (size_t i = 0; i < edges.size(); ++i) {
          computing[i] = edges[i].node && in_pass_(edges[i].node.get());
          holds_back = holds_back || (edges[i].node && !computing[i]);
        }
      }
      if (holds_back && held_back) {
        std::vector<bool> rest(edges.size());
        for (size_t i = 0; i < edges.size(); ++i)
          rest[i] = edges[i].node && !computing[i];
        held_back->push_back({node->shared_from_this(), grads, std::move(rest)});
      }
      std::vector<Tensor> input_grads;
      std::vector<const TensorImpl*> handed_out(edges.size(), nullptr);
      {
        const std::function<Tensor(size_t)> partial_gradient = [&](size_t i) {
          Tensor sum = partial(edges[i]);
          handed_out[i] = sum.defined() ? &sum.impl() : nullptr;
          return sum;
        };
        ComputingOnly only(*node, computing, !retain_graph_ && !holds_back, partial_gradient);
        input_grads = node->apply(grads);
      }
      if (!retain_graph_ && !holds_back) node->release_saved();
      for (size_t i = 0; i < edges.size(); ++i) {
        if (!computing[i]) continue;
        const Tensor grad = i < input_grads.size() ? input_grads[i] : Tensor();
        deliver(edges[i], grad, grad.defined() && &grad.impl() == handed_out[i]);
      }
    }
  }

 private:
  struct Pending {
    std::vector<Tensor> grads;
    int dependencies = 0;
  };
  struct BySequence {
    bool operator()(const Node* a, const Node* b) const { return a->sequence_nr() < b->sequence_nr(); }
  };
  Filter in_pass_;
  bool retain_graph_;
  std::unordered_map<Node*, Pending> pending_;
  std::unordered_map<Node*, WeightGradients::Held> held_;
  std::vector<std::shared_ptr<Node>> keep_alive_;
  std::priority_queue<Node*, std::vector<Node*>, BySequence> ready_;
};

bool every_node(const Node*) { return true; }

// The roots' gradient edges with their seeds (ones for a one-element root given none).
std::vector<std::pair<Edge, Tensor>> seeded_roots(const std::vector<Tensor>& roots,
                                                  const std::vector<Tensor>& grad_roots) {
  check_eq(roots.size(), grad_roots.size(), "run_backward: one seed gradient per root");
  std::vector<std::pair<Edge, Tensor>> seeded;
  for (size_t i = 0; i < roots.size(); ++i) {
    check(roots[i].requires_grad(),
          "backward: tensor " + roots[i].str() + " does not require grad and has no grad_fn");
    Tensor seed = grad_roots[i];
    if (!seed.defined()) {
      check(roots[i].numel() == 1,
            "backward: a gradient must be given for non-scalar root " + roots[i].str());
      seed = Tensor::ones(roots[i].shape(), roots[i].dtype(), roots[i].device());
    }
    check(seed.shape() == roots[i].shape(),
          "backward: seed gradient shape " + shape_str(seed.shape()) +
              " does not match root shape " + shape_str(roots[i].shape()));
    seeded.emplace_back(gradient_edge(roots[i]), seed);
  }
  return seeded;
}

// Runs one pass over every node reachable from the seeded edges and the held nodes.
void run_pass(const std::vector<std::pair<Edge, Tensor>>& seeds,
              std::vector<WeightGradients::Held> held, bool retain_graph) {
  Pass pass(every_node, retain_graph);
  std::vector<Edge> starts;
  for (const auto& [edge, seed] : seeds)
    starts.push_back(edge);
  for (const WeightGradients::Held& h : held) {
    for (size_t i = 0; i < h.edges.size(); ++i)
      if (h.edges[i]) starts.push_back(h.node->next_edges()[i]);
  }
  pass.count(starts);
  for (const auto& [edge, seed] : seeds)
    pass.deliver(edge, seed);
  for (WeightGradients::Held& h : held)
    pass.add_held(std::move(h));
  pass.run(nullptr);
}

// The nodes reachable from `roots` from which one of `targets` can be reached.
std::unordered_set<const Node*> nodes_leading_to(const std::vector<Edge>& roots,
                                                 const std::vector<Edge>& targets) {
  std::unordered_map<const Node*, std::vector<const Node*>> consumers;
  std::unordered_set<const Node*> seen;
  std::vector<Node*> stack;
  for (const Edge& root : roots) {
    if (root.node && seen.insert(root.node.get()).second) stack.push_back(root.node.get());
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& edge : node->next_edges()) {
      if (!edge.node) continue;
      consumers[edge.node.get()].push_back(node);
      if (seen.insert(edge.node.get()).second) stack.push_back(edge.node.get());
    }
  }
  std::unordered_set<const Node*> leading;
  std::vector<const Node*> backwards;
  for (const Edge& target : targets) {
    if (target.node && seen.count(target.node.get()) && leading.insert(target.node.get()).second)
      backwards.push_back(target.node.get());
  }
  while (!backwards.empty()) {
    const Node* node = backwards.back();
    backwards.pop_back();
    for (const Node* consumer : consumers[node]) {
      if (leading.insert(consumer).second) backwards.push_back(consumer);
    }
  }
  return leading;
}

}  // namespace

void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grad_roots,
                  bool retain_graph) {
  NoGradGuard no_grad;
  run_pass(seeded_roots(roots, grad_roots), {}, retain_graph);
}

WeightGradients run_backward_input(const std::vector<Tensor>& roots,
                                   const std::vector<Tensor>& grad_roots,
                                   const std::vector<Tensor>& inputs) {
  NoGradGuard no_grad;
  const std::vector<std::pair<Edge, Tensor>> seeds = seeded_roots(roots, grad_roots);
  std::vector<Edge> root_edges, input_edges;
  for (const auto& [edge, seed] : seeds)
    root_edges.push_back(edge);
  for (const Tensor& input : inputs) {
    check(input.requires_grad(), "backward_input: input " + input.str() + " does not require grad");
    input_edges.push_back(gradient_edge(input));
  }
  const std::unordered_set<const Node*> input_half = nodes_leading_to(root_edges, input_edges);
  auto in_half = [&input_half](const Node* node) { return input_half.count(node) > 0; };

  WeightGradients rest;
  Pass pass(in_half, /*retain_graph=*/false);
  pass.count(root_edges);
  for (const auto& [edge, seed] : seeds) {
    if (in_half(edge.node.get())) {
      pass.deliver(edge, seed);
    } else {
      rest.seeds_.emplace_back(edge, seed);
    }
  }
  pass.run(&rest.held_);
  return rest;
}

void WeightGradients::run() {
  NoGradGuard no_grad;
  std::vector<std::pair<Edge, Tensor>> seeds = std::move(seeds_);
  std::vector<Held> held = std::move(held_);
  seeds_.clear();
  held_.clear();
  run_pass(seeds, std::move(held), /*retain_graph=*/false);
}

}  // namespace loom::autograd
