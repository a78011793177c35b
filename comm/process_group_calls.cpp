// The entry points of ProcessGroup: each checks its arguments on the calling thread
// (loom::Error on misuse), describes the operation (make_op), places it on a device (place)
// and hands it to the queue (submit or post, in process_group.cpp). Also traffic() and
// split().

#include <algorithm>
#include <sstream>

#include "comm/cuda_support.h"
#include "comm/process_group_op.h"
#include "core/tags.h"

namespace loom::comm {

namespace {

// ProcessGroup::OpKind's names, in its order: labels, messages and traffic() use them.
// (string_views: a label takes one per call, without measuring it)
constexpr std::string_view kOpKindNames[] = {"allreduce",      "broadcast",  "reduce", "all_gather",
                                             "reduce_scatter", "all_to_all", "send",   "recv",
                                             "barrier",        "split"};

void check_buffer(const char* op, const char* what, const Tensor& t) {
  if (!t.defined()) tag::kComm.fail(op, ": ", what, " is undefined");
  if (!t.is_contiguous()) {
    tag::kComm.fail(op, ": ", what, " must be contiguous (call .contiguous() first), got ", t.str(),
                    " with strides ", shape_str(t.strides()));
  }
}

std::string signature_of(std::string_view kind, const Tensor& t, std::optional<ReduceOp> op,
                         std::optional<int> root) {
  std::ostringstream s;
  s << kind << ' ' << t.numel() << ' ' << t.dtype();
  if (op) s << ' ' << reduce_op_name(*op);
  if (root) s << " root " << *root;
  return s.str();
}

void check_avg(const char* kind, ReduceOp op, DType dtype) {
  if (op == ReduceOp::Avg && !is_floating(dtype)) {
    tag::kComm.fail(kind, ": ReduceOp::Avg needs a floating dtype, got ", dtype,
                    " (use Sum and divide)");
  }
}

void check_root(const char* kind, int root, int size) {
  if (root < 0 || root >= size)
    tag::kComm.fail(kind, ": root ", root, " is not in [0, ", size, ")");
}

void check_peer(const char* kind, const char* role, int peer, int rank, int size) {
  if (peer < 0 || peer >= size || peer == rank) {
    tag::kComm.fail(kind, ": ", role, " ", peer, " must be another rank in [0, ", size, ")");
  }
}

}  // namespace

// The parts every call shares: label, signature (built only when debug checks need it),
// timeout.
ProcessGroup::Op ProcessGroup::make_op(OpKind kind, const Tensor* data,
                                       const std::optional<ReduceOp>& op,
                                       const std::optional<int>& root,
                                       const std::optional<Duration>& timeout) const {
  static_assert(std::size(kOpKindNames) == static_cast<size_t>(OpKind::Count));
  const std::string_view name = kOpKindNames[static_cast<size_t>(kind)];
  Op result;
  result.kind = kind;
  result.label.kind = name;
  if (data != nullptr) {
    result.label.bytes = data->nbytes();
    result.label.dtype = dtype_name(data->dtype());
    if (options_.debug_checks) result.signature = signature_of(name, *data, op, root);
  } else if (options_.debug_checks) {
    result.signature = std::string(name);
  }
  result.timeout = timeout.value_or(options_.timeout);
  return result;
}

// Note [Devices of a group]
// The backend says where its tensors live (Backend::device()). An operation's tensors must be
// on one device, and that device must be the backend's, or a GPU when the backend is a host
// backend: then the operation runs through a staging backend wrapped around it (Note
// [Staging CUDA tensors]). A simulated backend (meta) takes CPU tensors too. For CUDA
// tensors the issuing thread's stream is captured here and reinstated on the thread that runs
// the operation (Note [Issue streams]). CPU tensors on a host backend take none of these paths.
void ProcessGroup::place(Op& op, const Tensor& first, const Tensor* second) {
  const Device device = first.device();
  if (second != nullptr && second->device() != device) {
    tag::kComm.fail(op.label.kind, ": the tensors are on two devices, ", first.str(), " and ",
                    second->str(), "; put both on one device");
  }
  const Device home = backend_->device();
  // A simulated group's tensors are on meta, but values a rank must know (a pipeline's message
  // headers) are host tensors, which it passes between the ranks simulated together.
  if (home.is_meta() && device.is_cpu()) return;
  if (device != home) {
    if (!home.is_cpu() || !device.is_cuda()) {
      tag::kComm.fail(op.label.kind, ": the '", backend_->name(), "' backend of group '", name_,
                      "' moves tensors on ", home, ", got ", first.str());
    }
    std::call_once(staged_once_, [this] { staged_ = make_staging_backend(*backend_); });
    op.staged = true;
  }
  if (device.is_cuda()) op.stream = capture_issue_stream(device);
}

WorkPtr ProcessGroup::allreduce(Tensor& tensor, const CollectiveOptions& o) {
  return allreduce(tensor, tensor, o);
}

WorkPtr ProcessGroup::allreduce(const Tensor& input, Tensor& output, const CollectiveOptions& o) {
  check_buffer("allreduce", "input", input);
  if (!input.is_same(output)) {  // (in place: one tensor, checked once)
    check_buffer("allreduce", "output", output);
    if (input.shape() != output.shape() || input.dtype() != output.dtype()) {
      tag::kComm.fail("allreduce: output ", output.str(), " must match input ", input.str());
    }
  }
  check_avg("allreduce", o.op, input.dtype());
  Op op = make_op(OpKind::Allreduce, &input, o.op, std::nullopt, o.timeout);
  place(op, input, &output);
  if (o.async_op && !op.staged && input.device().is_cpu() && !options_.debug_checks &&
      input.nbytes() > 0 && input.nbytes() <= backend_->postable_allreduce_bytes()) {
    return post(std::move(op), input, output, o.op);
  }
  return submit(std::move(op), input, output, allreduce_body(o.op), o.async_op);
}

WorkPtr ProcessGroup::broadcast(Tensor& tensor, const CollectiveOptions& o) {
  check_buffer("broadcast", "tensor", tensor);
  check_root("broadcast", o.root, size_);
  Op op = make_op(OpKind::Broadcast, &tensor, std::nullopt, o.root, o.timeout);
  place(op, tensor, nullptr);
  return submit(
      std::move(op), tensor, Tensor(),
      [root = o.root](Backend& b, Deadline d, Tensor& t, Tensor&) { b.broadcast(t, root, d); },
      o.async_op);
}

WorkPtr ProcessGroup::reduce(Tensor& tensor, const CollectiveOptions& o) {
  check_buffer("reduce", "tensor", tensor);
  check_root("reduce", o.root, size_);
  check_avg("reduce", o.op, tensor.dtype());
  Op op = make_op(OpKind::Reduce, &tensor, o.op, o.root, o.timeout);
  place(op, tensor, nullptr);
  return submit(
      std::move(op), tensor, Tensor(),
      [root = o.root, reduce = o.op](Backend& b, Deadline d, Tensor& t, Tensor&) {
        b.reduce(t, root, reduce, d);
      },
      o.async_op);
}

WorkPtr ProcessGroup::all_gather(Tensor& output, const Tensor& input, const CollectiveOptions& o) {
  check_buffer("all_gather", "input", input);
  check_buffer("all_gather", "output", output);
  if (output.dtype() != input.dtype() || output.numel() != input.numel() * size_) {
    tag::kComm.fail("all_gather: output must hold size x input elements of the same dtype (", size_,
                    " x ", input.numel(), " ", input.dtype(), "), got ", output.str());
  }
  Op op = make_op(OpKind::AllGather, &input, std::nullopt, std::nullopt, o.timeout);
  place(op, input, &output);
  return submit(
      std::move(op), input, output,
      [](Backend& b, Deadline d, Tensor& in, Tensor& out) { b.all_gather(out, in, d); },
      o.async_op);
}

WorkPtr ProcessGroup::reduce_scatter(Tensor& output, const Tensor& input,
                                     const CollectiveOptions& o) {
  check_buffer("reduce_scatter", "input", input);
  check_buffer("reduce_scatter", "output", output);
  if (output.dtype() != input.dtype() || input.numel() != output.numel() * size_) {
    tag::kComm.fail("reduce_scatter: input must hold size x output elements of the same dtype (",
                    size_, " x ", output.numel(), " ", output.dtype(), "), got ", input.str());
  }
  check_avg("reduce_scatter", o.op, input.dtype());
  Op op = make_op(OpKind::ReduceScatter, &output, o.op, std::nullopt, o.timeout);
  place(op, input, &output);
  op.label.bytes = input.nbytes();
  return submit(
      std::move(op), input, output,
      [reduce = o.op](Backend& b, Deadline d, Tensor& in, Tensor& out) {
        b.reduce_scatter(out, in, reduce, d);
      },
      o.async_op);
}

WorkPtr ProcessGroup::all_to_all(Tensor& output, const Tensor& input, const CollectiveOptions& o) {
  check_buffer("all_to_all", "input", input);
  check_buffer("all_to_all", "output", output);
  if (output.dtype() != input.dtype() || output.numel() != input.numel() ||
      input.numel() % size_ != 0) {
    tag::kComm.fail(
        "all_to_all: input and output need the same dtype and a number of elements "
        "divisible by the group size ",
        size_, "; got input ", input.str(), ", output ", output.str());
  }
  Op op = make_op(OpKind::AllToAll, &input, std::nullopt, std::nullopt, o.timeout);
  place(op, input, &output);
  return submit(
      std::move(op), input, output,
      [](Backend& b, Deadline d, Tensor& in, Tensor& out) { b.all_to_all(out, in, d); },
      o.async_op);
}

WorkPtr ProcessGroup::send(const Tensor& tensor, int dst, const P2POptions& o) {
  check_buffer("send", "tensor", tensor);
  check_peer("send", "destination", dst, rank_, size_);
  Op op = make_op(OpKind::Send, &tensor, std::nullopt, std::nullopt, o.timeout);
  place(op, tensor, nullptr);
  op.collective = false;
  op.label.peer = dst;
  op.label.to_peer = true;
  return submit(
      std::move(op), tensor, Tensor(),
      [dst, tag = o.tag](Backend& b, Deadline d, Tensor& t, Tensor&) { b.send(t, dst, tag, d); },
      o.async_op);
}

WorkPtr ProcessGroup::recv(Tensor& tensor, int src, const P2POptions& o) {
  check_buffer("recv", "tensor", tensor);
  check_peer("recv", "source", src, rank_, size_);
  Op op = make_op(OpKind::Recv, &tensor, std::nullopt, std::nullopt, o.timeout);
  place(op, tensor, nullptr);
  op.collective = false;
  op.label.peer = src;
  return submit(
      std::move(op), tensor, Tensor(),
      [src, tag = o.tag](Backend& b, Deadline d, Tensor& t, Tensor&) { b.recv(t, src, tag, d); },
      o.async_op);
}

WorkPtr ProcessGroup::barrier(const CollectiveOptions& o) {
  Op op = make_op(OpKind::Barrier, nullptr, std::nullopt, std::nullopt, o.timeout);
  return submit(
      std::move(op), Tensor(), Tensor(),
      [](Backend& b, Deadline d, Tensor&, Tensor&) { b.barrier(d); }, o.async_op);
}

std::map<std::string, ProcessGroup::Traffic, std::less<>> ProcessGroup::traffic() const {
  std::map<std::string, Traffic, std::less<>> counts;
  for (size_t kind = 0; kind < traffic_.size(); ++kind) {
    const int64_t calls = traffic_[kind].calls.load(std::memory_order_relaxed);
    if (calls > 0) {
      counts[std::string(kOpKindNames[kind])] = {
          .calls = calls, .bytes = traffic_[kind].bytes.load(std::memory_order_relaxed)};
    }
  }
  return counts;
}

std::shared_ptr<ProcessGroup> ProcessGroup::split_by(const SplitAssignment& assignment) {
  const auto [color, key] = assignment(rank_);
  if (!runs_at_issue_) return split(color, key);
  // Numbered as split() numbers them, members or not, so that every simulated rank of a
  // process names the same subgroup alike (docs/simulation.md, "Pipelines").
  const int id = splits_++;
  if (color < 0) return nullptr;
  // Members of the color ordered by (key, rank), as split() orders them.
  std::vector<std::pair<int, int>> members;  // (key, rank)
  for (int r = 0; r < size_; ++r) {
    const auto [c, k] = assignment(r);
    if (c == color) members.emplace_back(k, r);
  }
  std::sort(members.begin(), members.end());
  const int new_size = static_cast<int>(members.size());
  int new_rank = 0;
  auto world_ranks = std::make_shared<std::vector<int>>();
  for (int i = 0; i < new_size; ++i) {
    const int r = members[static_cast<size_t>(i)].second;
    if (r == rank_) new_rank = i;
    world_ranks->push_back(options_.world_ranks ? (*options_.world_ranks)[static_cast<size_t>(r)]
                                                : r);
  }
  GroupOptions options = options_;
  options.backend = backend_->name();
  options.world_ranks = std::move(world_ranks);
  const std::string name =
      name_ + ".split" + std::to_string(id) + ".color" + std::to_string(color);
  return std::make_shared<ProcessGroup>(new_rank, new_size, store_, options, name);
}

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key) {
  backend_->check_can_split();
  // Every rank publishes (color, key); members of a color are ordered by (key, rank).
  const int id = splits_++;
  const std::string prefix = "pg/" + name_ + "/split" + std::to_string(id) + "/";
  store_->set(prefix + std::to_string(rank_),
              to_bytes(std::to_string(color) + " " + std::to_string(key)));
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r)
    keys.push_back(prefix + std::to_string(r));
  store_->wait(keys, options_.timeout);
  // A native split is a collective of the backend: ranks without a color take part too.
  const bool native = backend_->splits_natively();
  if (color < 0 && !native) return nullptr;
  struct Member {
    int key, rank;
  };
  std::vector<Member> members;
  for (int r = 0; color >= 0 && r < size_; ++r) {
    std::istringstream in(to_string(store_->get(keys[r], options_.timeout)));
    int c = 0, k = 0;
    in >> c >> k;
    if (c == color) members.push_back({k, r});
  }
  std::sort(members.begin(), members.end(), [](const Member& a, const Member& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  int new_rank = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i].rank == rank_) new_rank = static_cast<int>(i);
  }
  const int new_size = static_cast<int>(members.size());
  GroupOptions options = options_;
  options.backend = backend_->name();
  std::string name = name_ + ".split" + std::to_string(id) + ".color" + std::to_string(color);
  if (!native) return std::make_shared<ProcessGroup>(new_rank, new_size, store_, options, name);

  // Queued behind this group's earlier operations, so that every rank's backend sees the
  // split at the same point of its operation sequence. The key is the position in the
  // subgroup, so the backend orders members exactly as above.
  const BackendContext child = group_backend_context(new_rank, new_size, store_, options, name);
  auto made = std::make_shared<std::unique_ptr<Backend>>();
  Op op = make_op(OpKind::Split, nullptr, std::nullopt, std::nullopt, std::nullopt);
  submit(
      std::move(op), Tensor(), Tensor(),
      [made, color, new_rank, child](Backend& b, Deadline d, Tensor&, Tensor&) {
        *made = b.split(color, new_rank, child, d);
      },
      /*async_op=*/false)
      ->wait();
  if (color < 0) return nullptr;
  if (*made == nullptr) {
    tag::kComm.fail("split: the '", backend_->name(), "' backend made no subgroup for color ",
                    color);
  }
  return std::shared_ptr<ProcessGroup>(
      new ProcessGroup(new_rank, new_size, store_, options, name, std::move(*made)));
}

}  // namespace loom::comm
