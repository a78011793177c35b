#include "comm/process_group.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "comm/backend_registry.h"
#include "comm/debug_check.h"

namespace loom::comm {

namespace {

std::string human_bytes(size_t bytes) {
  char text[32];
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) {
    std::snprintf(text, sizeof text, "%zu MiB", bytes >> 20);
  } else if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) {
    std::snprintf(text, sizeof text, "%zu KiB", bytes >> 10);
  } else {
    std::snprintf(text, sizeof text, "%zu B", bytes);
  }
  return text;
}

bool debug_from_env() {
  static const bool enabled = [] {
    const char* v = std::getenv("LOOM_DEBUG");
    return v != nullptr && std::string(v) == "detail";
  }();
  return enabled;
}

void check_buffer(const char* op, const char* what, const Tensor& t) {
  if (!t.defined()) fail("[comm] ", op, ": ", what, " is undefined");
  if (!t.is_contiguous()) {
    fail("[comm] ", op, ": ", what, " must be contiguous (call .contiguous() first), got ", t.str(),
         " with strides ", shape_str(t.strides()));
  }
}

}  // namespace

// One queued operation: what it is (for errors and debug checks) and how to run it.
struct ProcessGroup::Op {
  std::string kind;       // "allreduce"
  std::string signature;  // what every rank must agree on, e.g. "allreduce 1024 f32 sum root 0"
  bool collective = true;
  std::function<void(Backend&, Deadline)> body;
  Duration timeout;
  uint64_t seq = 0;
  std::string description;  // "allreduce #12, 4 MiB f32"
  WorkPtr work = nullptr;
};

ProcessGroup::ProcessGroup(int rank, int size, std::shared_ptr<Store> store,
                           const GroupOptions& options, std::string name)
    : rank_(rank),
      size_(size),
      store_(std::move(store)),
      options_(options),
      name_(std::move(name)) {
  if (size_ < 1 || rank_ < 0 || rank_ >= size_) {
    fail("[comm] ProcessGroup: rank ", rank_, " is not in [0, ", size_, ")");
  }
  if (!store_) fail("[comm] ProcessGroup: a store is required");
  std::string backend = options_.backend;
  if (backend == "auto") backend = resolve_auto_backend(false, Device::cpu());
  BackendContext context{rank_, size_, std::make_shared<PrefixStore>("pg/" + name_, store_),
                         options_.timeout, name_};
  backend_ = create_backend(backend, context);
  options_.debug_checks = options_.debug_checks || debug_from_env();
  progress_ = std::thread([this] { progress_loop(); });
}

ProcessGroup::~ProcessGroup() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_all();
  if (progress_.joinable()) progress_.join();
}

WorkPtr ProcessGroup::enqueue(Op op, bool async_op) {
  auto owned = std::make_unique<Op>(std::move(op));
  std::unique_lock lock(mutex_);
  owned->seq = next_seq_++;
  owned->description = owned->kind + " #" + std::to_string(owned->seq) + owned->description;
  owned->work = std::make_shared<Work>(owned->description, owned->timeout);
  WorkPtr work = owned->work;
  if (broken_) {
    work->complete(broken_error(*owned));
    return work;
  }
  if (!async_op && queue_.empty() && !running_) {
    // Nothing ahead of it: run on this thread, in order, without waking the progress thread.
    running_ = true;
    lock.unlock();
    run(*owned);
    lock.lock();
    running_ = false;
    lock.unlock();
    queued_.notify_all();
    return work;
  }
  queue_.push_back(std::move(owned));
  lock.unlock();
  queued_.notify_all();
  if (!async_op) work->wait();
  return work;
}

std::exception_ptr ProcessGroup::broken_error(const Op& op) const {
  std::string cause = "an earlier failure";
  try {
    std::rethrow_exception(broken_);
  } catch (const std::exception& e) {
    cause = e.what();
  }
  return std::make_exception_ptr(CommError("[comm] rank " + std::to_string(rank_) + ": " +
                                               op.description +
                                               " not started: the group is broken by " + cause,
                                           rank_));
}

void ProcessGroup::progress_loop() {
  while (true) {
    std::unique_ptr<Op> op;
    {
      std::unique_lock lock(mutex_);
      queued_.wait(lock,
                   [&] { return (stopping_ && !running_) || (!queue_.empty() && !running_); });
      if (queue_.empty()) return;
      op = std::move(queue_.front());
      queue_.pop_front();
      if (broken_) {
        op->work->complete(broken_error(*op));
        continue;
      }
      running_ = true;
    }
    run(*op);
    {
      std::lock_guard lock(mutex_);
      running_ = false;
    }
    queued_.notify_all();
  }
}

// Runs one operation on the current thread; the caller holds the running_ flag.
void ProcessGroup::run(Op& op) {
  op.work->mark_started();
  Deadline deadline = deadline_after(op.timeout);
  try {
    if (options_.debug_checks && op.collective) {
      check_same_collective(*store_, name_, rank_, size_, op.seq, op.signature, op.timeout);
    }
    op.body(*backend_, deadline);
    op.work->complete();
  } catch (const CommError& e) {
    auto error =
        std::make_exception_ptr(CommError(std::string(e.what()) + " (" + op.description +
                                              ", timeout " + duration_str(op.timeout) + ")",
                                          e.rank(), e.peer()));
    {
      std::lock_guard lock(mutex_);
      broken_ = error;
    }
    op.work->complete(error);
  } catch (...) {
    op.work->complete(std::current_exception());
  }
}

namespace {

std::string signature_of(const char* kind, const Tensor& t, std::optional<ReduceOp> op,
                         std::optional<int> root) {
  std::ostringstream s;
  s << kind << ' ' << t.numel() << ' ' << t.dtype();
  if (op) s << ' ' << reduce_op_name(*op);
  if (root) s << " root " << *root;
  return s.str();
}

}  // namespace

#define LOOM_DESCRIBE(t) \
  (", " + human_bytes((t).nbytes()) + " " + std::string(dtype_name((t).dtype())))

WorkPtr ProcessGroup::allreduce(Tensor& tensor, const CollectiveOptions& o) {
  check_buffer("allreduce", "tensor", tensor);
  if (o.op == ReduceOp::Avg && !is_floating(tensor.dtype())) {
    fail("[comm] allreduce: ReduceOp::Avg needs a floating dtype, got ", tensor.dtype(),
         " (use Sum and divide)");
  }
  Tensor t = tensor;
  ReduceOp op = o.op;
  return enqueue({.kind = "allreduce",
                  .signature = signature_of("allreduce", t, op, std::nullopt),
                  .body = [t, op](Backend& b, Deadline d) mutable { b.allreduce(t, op, d); },
                  .timeout = o.timeout.value_or(options_.timeout),
                  .description = LOOM_DESCRIBE(t)},
                 o.async_op);
}

WorkPtr ProcessGroup::allreduce(const Tensor& input, Tensor& output, const CollectiveOptions& o) {
  check_buffer("allreduce", "input", input);
  check_buffer("allreduce", "output", output);
  if (input.shape() != output.shape() || input.dtype() != output.dtype()) {
    fail("[comm] allreduce: output ", output.str(), " must match input ", input.str());
  }
  if (o.op == ReduceOp::Avg && !is_floating(input.dtype())) {
    fail("[comm] allreduce: ReduceOp::Avg needs a floating dtype, got ", input.dtype());
  }
  Tensor in = input, out = output;
  ReduceOp op = o.op;
  return enqueue({.kind = "allreduce",
                  .signature = signature_of("allreduce", in, op, std::nullopt),
                  .body =
                      [in, out, op](Backend& b, Deadline d) mutable {
                        if (out.raw_data() != in.raw_data()) {
                          std::memcpy(out.raw_data(), in.raw_data(), in.nbytes());
                        }
                        b.allreduce(out, op, d);
                      },
                  .timeout = o.timeout.value_or(options_.timeout),
                  .description = LOOM_DESCRIBE(in)},
                 o.async_op);
}

WorkPtr ProcessGroup::broadcast(Tensor& tensor, const CollectiveOptions& o) {
  check_buffer("broadcast", "tensor", tensor);
  if (o.root < 0 || o.root >= size_)
    fail("[comm] broadcast: root ", o.root, " is not in [0, ", size_, ")");
  Tensor t = tensor;
  int root = o.root;
  return enqueue({.kind = "broadcast",
                  .signature = signature_of("broadcast", t, std::nullopt, root),
                  .body = [t, root](Backend& b, Deadline d) mutable { b.broadcast(t, root, d); },
                  .timeout = o.timeout.value_or(options_.timeout),
                  .description = LOOM_DESCRIBE(t)},
                 o.async_op);
}

WorkPtr ProcessGroup::reduce(Tensor& tensor, const CollectiveOptions& o) {
  check_buffer("reduce", "tensor", tensor);
  if (o.root < 0 || o.root >= size_)
    fail("[comm] reduce: root ", o.root, " is not in [0, ", size_, ")");
  if (o.op == ReduceOp::Avg && !is_floating(tensor.dtype())) {
    fail("[comm] reduce: ReduceOp::Avg needs a floating dtype, got ", tensor.dtype());
  }
  Tensor t = tensor;
  int root = o.root;
  ReduceOp op = o.op;
  return enqueue(
      {.kind = "reduce",
       .signature = signature_of("reduce", t, op, root),
       .body = [t, root, op](Backend& b, Deadline d) mutable { b.reduce(t, root, op, d); },
       .timeout = o.timeout.value_or(options_.timeout),
       .description = LOOM_DESCRIBE(t)},
      o.async_op);
}

WorkPtr ProcessGroup::all_gather(Tensor& output, const Tensor& input, const CollectiveOptions& o) {
  check_buffer("all_gather", "input", input);
  check_buffer("all_gather", "output", output);
  if (output.dtype() != input.dtype() || output.numel() != input.numel() * size_) {
    fail("[comm] all_gather: output must hold size x input elements of the same dtype (", size_,
         " x ", input.numel(), " ", input.dtype(), "), got ", output.str());
  }
  Tensor in = input, out = output;
  return enqueue({.kind = "all_gather",
                  .signature = signature_of("all_gather", in, std::nullopt, std::nullopt),
                  .body = [in, out](Backend& b, Deadline d) mutable { b.all_gather(out, in, d); },
                  .timeout = o.timeout.value_or(options_.timeout),
                  .description = LOOM_DESCRIBE(in)},
                 o.async_op);
}

WorkPtr ProcessGroup::reduce_scatter(Tensor& output, const Tensor& input,
                                     const CollectiveOptions& o) {
  check_buffer("reduce_scatter", "input", input);
  check_buffer("reduce_scatter", "output", output);
  if (output.dtype() != input.dtype() || input.numel() != output.numel() * size_) {
    fail("[comm] reduce_scatter: input must hold size x output elements of the same dtype (", size_,
         " x ", output.numel(), " ", output.dtype(), "), got ", input.str());
  }
  if (o.op == ReduceOp::Avg && !is_floating(input.dtype())) {
    fail("[comm] reduce_scatter: ReduceOp::Avg needs a floating dtype, got ", input.dtype());
  }
  Tensor in = input, out = output;
  ReduceOp op = o.op;
  return enqueue(
      {.kind = "reduce_scatter",
       .signature = signature_of("reduce_scatter", out, op, std::nullopt),
       .body = [in, out, op](Backend& b, Deadline d) mutable { b.reduce_scatter(out, in, op, d); },
       .timeout = o.timeout.value_or(options_.timeout),
       .description = LOOM_DESCRIBE(in)},
      o.async_op);
}

WorkPtr ProcessGroup::all_to_all(Tensor& output, const Tensor& input, const CollectiveOptions& o) {
  check_buffer("all_to_all", "input", input);
  check_buffer("all_to_all", "output", output);
  if (output.dtype() != input.dtype() || output.numel() != input.numel() ||
      input.numel() % size_ != 0) {
    fail(
        "[comm] all_to_all: input and output need the same dtype and a number of elements "
        "divisible by the group size ",
        size_, "; got input ", input.str(), ", output ", output.str());
  }
  Tensor in = input, out = output;
  return enqueue({.kind = "all_to_all",
                  .signature = signature_of("all_to_all", in, std::nullopt, std::nullopt),
                  .body = [in, out](Backend& b, Deadline d) mutable { b.all_to_all(out, in, d); },
                  .timeout = o.timeout.value_or(options_.timeout),
                  .description = LOOM_DESCRIBE(in)},
                 o.async_op);
}

WorkPtr ProcessGroup::send(const Tensor& tensor, int dst, const P2POptions& o) {
  check_buffer("send", "tensor", tensor);
  if (dst < 0 || dst >= size_ || dst == rank_) {
    fail("[comm] send: destination ", dst, " must be another rank in [0, ", size_, ")");
  }
  Tensor t = tensor;
  int tag = o.tag;
  return enqueue({.kind = "send",
                  .signature = "",
                  .collective = false,
                  .body = [t, dst, tag](Backend& b, Deadline d) { b.send(t, dst, tag, d); },
                  .timeout = o.timeout.value_or(options_.timeout),
                  .description = LOOM_DESCRIBE(t) + " to rank " + std::to_string(dst)},
                 o.async_op);
}

WorkPtr ProcessGroup::recv(Tensor& tensor, int src, const P2POptions& o) {
  check_buffer("recv", "tensor", tensor);
  if (src < 0 || src >= size_ || src == rank_) {
    fail("[comm] recv: source ", src, " must be another rank in [0, ", size_, ")");
  }
  Tensor t = tensor;
  int tag = o.tag;
  return enqueue({.kind = "recv",
                  .signature = "",
                  .collective = false,
                  .body = [t, src, tag](Backend& b, Deadline d) mutable { b.recv(t, src, tag, d); },
                  .timeout = o.timeout.value_or(options_.timeout),
                  .description = LOOM_DESCRIBE(t) + " from rank " + std::to_string(src)},
                 o.async_op);
}

WorkPtr ProcessGroup::barrier(const CollectiveOptions& o) {
  return enqueue({.kind = "barrier",
                  .signature = "barrier",
                  .body = [](Backend& b, Deadline d) { b.barrier(d); },
                  .timeout = o.timeout.value_or(options_.timeout),
                  .description = ""},
                 o.async_op);
}

#undef LOOM_DESCRIBE

std::shared_ptr<ProcessGroup> ProcessGroup::split(int color, int key) {
  // Every rank publishes (color, key); members of a color are ordered by (key, rank).
  const int id = splits_++;
  const std::string prefix = "pg/" + name_ + "/split" + std::to_string(id) + "/";
  store_->set(prefix + std::to_string(rank_),
              to_bytes(std::to_string(color) + " " + std::to_string(key)));
  std::vector<std::string> keys;
  for (int r = 0; r < size_; ++r)
    keys.push_back(prefix + std::to_string(r));
  store_->wait(keys, options_.timeout);
  if (color < 0) return nullptr;
  struct Member {
    int key, rank;
  };
  std::vector<Member> members;
  for (int r = 0; r < size_; ++r) {
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
  GroupOptions options = options_;
  options.backend = backend_->name();
  return std::make_shared<ProcessGroup>(
      new_rank, static_cast<int>(members.size()), store_, options,
      name_ + ".split" + std::to_string(id) + ".color" + std::to_string(color));
}

}  // namespace loom::comm
