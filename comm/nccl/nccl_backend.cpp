#include "comm/nccl/nccl_backend.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "comm/cuda/event_wait.h"
#include "comm/nccl/nccl_check.h"
#include "core/tags.h"
#include "kernels/cuda/check.h"
#include "tensor/cuda/caching_allocator.h"
#include "tensor/cuda/device.h"
#include "tensor/cuda/stream.h"

namespace loom::comm::nccl {

namespace {

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
  }
  tag::kCommNccl.fail("dtype ", dtype,
                      " has no NCCL equivalent (supported: f32, f64, bf16, f16, i32, i64, u8)");
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;  // floating dtypes only (checked by the group)
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Prod: return ncclProd;
  }
  tag::kCommNccl.fail("reduce op ", static_cast<int>(op), " has no NCCL equivalent");
}

size_t count_of(const Tensor& t) {
  return static_cast<size_t>(t.numel());
}

std::string describe(int rank, const std::string& group, int device) {
  return tag::kCommNccl.prefix() + "rank " + std::to_string(rank) + " (group '" + group +
         "', cuda:" + std::to_string(device) + ")";
}

// The device the group's communicator lives on: the one the group was created for, else the
// calling thread's current device (NCCL's own convention).
int group_device(const BackendContext& context) {
  if (!cuda::is_available()) {
    tag::kCommNccl.fail("rank ", context.rank,
                        ": the nccl backend needs a CUDA device: ", cuda::unavailable_reason());
  }
  if (context.device) {
    if (!context.device->is_cuda()) {
      tag::kCommNccl.fail("the nccl backend moves CUDA tensors, but group '", context.group_name,
                          "' was created for ", *context.device,
                          "; use backend 'shm' (or 'auto') for CPU tensors");
    }
    cuda::check_device_index(context.device->index);
    return context.device->index;
  }
  int current = 0;
  LOOM_CUDA_CHECK(cudaGetDevice(&current));
  return current;
}

// Rank 0 makes the unique id that names the new communicator and publishes it in the group's
// store (private to the group); the others wait for it there.
ncclUniqueId exchange_unique_id(Store& store, int rank, Duration timeout, const std::string& who) {
  ncclUniqueId id{};
  if (rank == 0) {
    LOOM_NCCL_CHECK(ncclGetUniqueId(&id), nullptr);
    const auto* bytes = reinterpret_cast<const uint8_t*>(&id);
    store.set("nccl/unique_id", Bytes(bytes, bytes + sizeof id));
    return id;
  }
  Bytes bytes = store.get("nccl/unique_id", timeout);
  if (bytes.size() != sizeof id) {
    fail(who, ": the NCCL unique id in the store has ", bytes.size(), " bytes, expected ",
         sizeof id, " (do all ranks use the same NCCL version?)");
  }
  std::memcpy(&id, bytes.data(), sizeof id);
  return id;
}

void check_tag(const char* op, int tag) {
  if (tag != 0) {
    tag::kCommNccl.fail(op,
                        ": NCCL matches the messages between two ranks by their order and "
                        "has no tags; got tag ",
                        tag,
                        " (use tag 0 and issue matching sends and receives in the same order)");
  }
}

// One ncclGroupStart/ncclGroupEnd bracket; closed on unwinding too.
class GroupCall {
 public:
  explicit GroupCall(ncclComm_t comm) : comm_(comm) { LOOM_NCCL_CHECK(ncclGroupStart(), comm_); }
  ~GroupCall() {
    if (open_) (void)ncclGroupEnd();
  }
  GroupCall(const GroupCall&) = delete;
  GroupCall& operator=(const GroupCall&) = delete;
  ncclResult_t end() {
    open_ = false;
    return LOOM_NCCL_CHECK(ncclGroupEnd(), comm_);
  }

 private:
  ncclComm_t comm_;
  bool open_ = true;
};

bool overlaps(const Tensor& a, const Tensor& b) {
  const auto* a0 = static_cast<const char*>(a.raw_data());
  const auto* b0 = static_cast<const char*>(b.raw_data());
  return a0 < b0 + b.nbytes() && b0 < a0 + a.nbytes();
}

}  // namespace

NcclBackend::NcclBackend(const BackendContext& context)
    : rank_(context.rank),
      size_(context.size),
      device_(group_device(context)),
      group_(context.group_name),
      timeout_(context.timeout) {
  const Deadline deadline = deadline_after(context.timeout);
  cuda::DeviceGuard guard(device_);
  ncclUniqueId id = exchange_unique_id(*context.store, rank_, context.timeout, who());
  try {
    communicator_ = Communicator::create(id, rank_, size_, deadline, who());
  } catch (const CommError& e) {
    rethrow_with_rank(e);
  }
}

NcclBackend::NcclBackend(const BackendContext& context, int device, Communicator communicator)
    : rank_(context.rank),
      size_(context.size),
      device_(device),
      group_(context.group_name),
      timeout_(context.timeout),
      communicator_(std::move(communicator)) {
  int count = 0, rank = 0;
  LOOM_NCCL_CHECK(ncclCommCount(communicator_.get(), &count), communicator_.get());
  LOOM_NCCL_CHECK(ncclCommUserRank(communicator_.get(), &rank), communicator_.get());
  if (count != size_ || rank != rank_) {
    fail(who(), ": ncclCommSplit made rank ", rank, " of ", count, ", but the group expects rank ",
         rank_, " of ", size_);
  }
}

NcclBackend::~NcclBackend() {
  std::optional<cuda::DeviceGuard> guard;
  try {
    guard.emplace(device_);
  } catch (...) {
    // NCCL selects the communicator's device itself; the guard only spares it the switch.
  }
  barrier_buffer_ = Tensor();
  communicator_.close(deadline_after(timeout_));
}

std::string NcclBackend::who() const {
  return describe(rank_, group_, device_);
}

// Errors raised inside Communicator (which knows no rank) carry this rank outward.
void NcclBackend::rethrow_with_rank(const CommError& error) const {
  if (error.rank() >= 0) throw error;
  throw CommError(error.what(), rank_, error.peer(), error.failure());
}

void NcclBackend::check_usable(const char* op) const {
  if (!communicator_.valid()) {
    throw CommError(who() + ": " + op +
                        " cannot run: the NCCL communicator was aborted after an earlier failure "
                        "(destroy the process group and create a new one)",
                    rank_);
  }
}

template <typename Enqueue>
void NcclBackend::run(const char* op, std::initializer_list<const Tensor*> tensors,
                      Deadline deadline, Enqueue&& enqueue) {
  check_usable(op);
  cuda::DeviceGuard guard(device_);
  try {
    cudaStream_t caller = cuda::current_stream(device_);
    cudaStream_t stream = cuda::comm_stream(device_);
    // 1. The collective starts after the caller's queued work (the producers of the inputs).
    cuda::Event inputs_ready;
    inputs_ready.record(caller);
    inputs_ready.wait_on(stream);
    // 2. Enqueue; a non-blocking communicator may still be working on it.
    communicator_.settle(enqueue(stream), deadline, op);
    cuda::CachingAllocator& allocator = cuda::caching_allocator(device_);
    for (const Tensor* tensor : tensors) {
      void* block = tensor->storage()->data();
      if (allocator.owns(block)) allocator.record_stream(block, stream);
    }
    // 3. Later work on the caller's stream sees the result.
    cuda::Event done;
    done.record(stream);
    done.wait_on(caller);
    // 4. The watchdog (Note [NCCL watchdog]).
    bool finished = false;
    try {
      finished = wait_event(done, deadline, [&] { communicator_.check_async(op); });
    } catch (const CommError&) {
      throw;  // the communicator's own failure, already named
    } catch (const Error& e) {
      // The device failed while running the collective (a sticky CUDA error).
      throw CommError(who() + ": " + op + " failed on the device: " + e.what(), rank_);
    }
    if (!finished) {
      throw CommError(who() + ": " + op +
                          " did not complete by its deadline; the NCCL communicator was aborted "
                          "(ncclCommAbort): destroy the process group and create a new one",
                      rank_);
    }
  } catch (const CommError& e) {
    communicator_.abort();
    rethrow_with_rank(e);
  }
}

void NcclBackend::allreduce(const Tensor& input, Tensor& output, ReduceOp op, Deadline deadline) {
  if (input.numel() == 0) return;
  const ncclDataType_t type = nccl_type(input.dtype());
  run("allreduce", {&input, &output}, deadline, [&](cudaStream_t stream) {
    ncclComm_t comm = communicator_.get();
    return LOOM_NCCL_CHECK(ncclAllReduce(input.raw_data(), output.raw_data(), count_of(input), type,
                                         nccl_op(op), comm, stream),
                           comm);
  });
}

void NcclBackend::broadcast(Tensor& tensor, int root, Deadline deadline) {
  if (tensor.numel() == 0) return;
  const ncclDataType_t type = nccl_type(tensor.dtype());
  run("broadcast", {&tensor}, deadline, [&](cudaStream_t stream) {
    ncclComm_t comm = communicator_.get();
    return LOOM_NCCL_CHECK(ncclBroadcast(tensor.raw_data(), tensor.raw_data(), count_of(tensor),
                                         type, root, comm, stream),
                           comm);
  });
}

void NcclBackend::reduce(Tensor& tensor, int root, ReduceOp op, Deadline deadline) {
  if (tensor.numel() == 0) return;
  const ncclDataType_t type = nccl_type(tensor.dtype());
  run("reduce", {&tensor}, deadline, [&](cudaStream_t stream) {
    ncclComm_t comm = communicator_.get();
    return LOOM_NCCL_CHECK(ncclReduce(tensor.raw_data(), tensor.raw_data(), count_of(tensor), type,
                                      nccl_op(op), root, comm, stream),
                           comm);
  });
}

// In place when input is this rank's slice of output (NCCL's own in-place convention).
void NcclBackend::all_gather(Tensor& output, const Tensor& input, Deadline deadline) {
  if (input.numel() == 0) return;
  const ncclDataType_t type = nccl_type(input.dtype());
  run("all_gather", {&input, &output}, deadline, [&](cudaStream_t stream) {
    ncclComm_t comm = communicator_.get();
    return LOOM_NCCL_CHECK(
        ncclAllGather(input.raw_data(), output.raw_data(), count_of(input), type, comm, stream),
        comm);
  });
}

// In place when output is this rank's slice of input (NCCL's own in-place convention).
void NcclBackend::reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op,
                                 Deadline deadline) {
  if (output.numel() == 0) return;
  const ncclDataType_t type = nccl_type(input.dtype());
  run("reduce_scatter", {&input, &output}, deadline, [&](cudaStream_t stream) {
    ncclComm_t comm = communicator_.get();
    return LOOM_NCCL_CHECK(ncclReduceScatter(input.raw_data(), output.raw_data(), count_of(output),
                                             type, nccl_op(op), comm, stream),
                           comm);
  });
}

// One group of a send and a receive per peer (this rank included). Grouped point-to-point
// calls read and write concurrently, so an input that overlaps the output is first copied
// to a temporary on the comm stream.
void NcclBackend::all_to_all(Tensor& output, const Tensor& input, Deadline deadline) {
  const size_t n = count_of(input) / static_cast<size_t>(size_);
  if (n == 0) return;
  const ncclDataType_t type = nccl_type(input.dtype());
  const size_t piece = n * dtype_size(input.dtype());
  const bool copy_first = overlaps(input, output);
  Tensor source = input;
  if (copy_first) {
    cuda::DeviceGuard guard(device_);
    source = Tensor::empty(input.shape(), input.dtype(), input.device());
  }
  run("all_to_all", {&input, &output, &source}, deadline, [&](cudaStream_t stream) {
    if (copy_first) {
      LOOM_CUDA_CHECK(cudaMemcpyAsync(source.raw_data(), input.raw_data(), input.nbytes(),
                                      cudaMemcpyDeviceToDevice, stream));
    }
    ncclComm_t comm = communicator_.get();
    const auto* from = static_cast<const char*>(source.raw_data());
    auto* to = static_cast<char*>(output.raw_data());
    GroupCall group(comm);
    for (int peer = 0; peer < size_; ++peer) {
      const size_t offset = static_cast<size_t>(peer) * piece;
      LOOM_NCCL_CHECK(ncclSend(from + offset, n, type, peer, comm, stream), comm);
      LOOM_NCCL_CHECK(ncclRecv(to + offset, n, type, peer, comm, stream), comm);
    }
    return group.end();
  });
}

void NcclBackend::send(const Tensor& tensor, int dst, int tag, Deadline deadline) {
  check_tag("send", tag);
  if (tensor.numel() == 0) return;
  const ncclDataType_t type = nccl_type(tensor.dtype());
  run("send", {&tensor}, deadline, [&](cudaStream_t stream) {
    ncclComm_t comm = communicator_.get();
    return LOOM_NCCL_CHECK(ncclSend(tensor.raw_data(), count_of(tensor), type, dst, comm, stream),
                           comm);
  });
}

void NcclBackend::recv(Tensor& tensor, int src, int tag, Deadline deadline) {
  check_tag("recv", tag);
  if (tensor.numel() == 0) return;
  const ncclDataType_t type = nccl_type(tensor.dtype());
  run("recv", {&tensor}, deadline, [&](cudaStream_t stream) {
    ncclComm_t comm = communicator_.get();
    return LOOM_NCCL_CHECK(ncclRecv(tensor.raw_data(), count_of(tensor), type, src, comm, stream),
                           comm);
  });
}

void NcclBackend::barrier(Deadline deadline) {
  check_usable("barrier");
  if (!barrier_buffer_.defined()) {
    cuda::DeviceGuard guard(device_);
    barrier_buffer_ = Tensor::empty({1}, DType::F32, device());
    LOOM_CUDA_CHECK(cudaMemsetAsync(barrier_buffer_.raw_data(), 0, barrier_buffer_.nbytes(),
                                    cuda::current_stream(device_)));
  }
  allreduce(barrier_buffer_, barrier_buffer_, ReduceOp::Sum, deadline);
}

std::unique_ptr<Backend> NcclBackend::split(int color, int key, const BackendContext& child,
                                            Deadline deadline) {
  check_usable("split");
  cuda::DeviceGuard guard(device_);
  Communicator sub;
  try {
    sub =
        communicator_.split(color, key, deadline, describe(child.rank, child.group_name, device_));
  } catch (const CommError& e) {
    communicator_.abort();
    rethrow_with_rank(e);
  }
  if (!sub.valid()) return nullptr;
  return std::unique_ptr<Backend>(new NcclBackend(child, device_, std::move(sub)));
}

}  // namespace loom::comm::nccl
