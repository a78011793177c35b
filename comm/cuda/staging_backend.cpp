#include "comm/cuda/staging_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <string>

#include "comm/cuda/event_wait.h"
#include "comm/cuda_support.h"
#include "core/tags.h"
#include "kernels/cuda/check.h"
#include "tensor/cuda/device.h"
#include "tensor/cuda/stream.h"

namespace loom::comm {

namespace {

constexpr size_t kGrain = size_t{1} << 20;  // pinned buffers grow in whole MiB

}  // namespace

std::unique_ptr<Backend> make_staging_backend(Backend& host) {
  return std::make_unique<StagingBackend>(host);
}

StagingBackend::StagingBackend(Backend& host) : host_(host) {}

StagingBackend::~StagingBackend() {
  release(inputs_);
  release(outputs_);
}

void StagingBackend::release(HostBuffer& buffer) noexcept {
  if (buffer.registered) LOOM_CUDA_WARN(cudaHostUnregister(buffer.storage->data()));
  buffer.registered = false;
  buffer.storage.reset();
}

Tensor StagingBackend::host_tensor(HostBuffer& buffer, const Tensor& like) {
  const size_t bytes = like.nbytes();
  if (!buffer.storage || buffer.storage->nbytes() < bytes) {
    release(buffer);
    const size_t capacity = std::max<size_t>(1, (bytes + kGrain - 1) / kGrain) * kGrain;
    auto storage = std::make_shared<Storage>(capacity, Device::cpu());
    LOOM_CUDA_CHECK(cudaHostRegister(storage->data(), capacity, cudaHostRegisterPortable));
    buffer.storage = std::move(storage);
    buffer.registered = true;
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = like.shape();
  impl->strides = contiguous_strides(like.shape());
  impl->dtype = like.dtype();
  impl->storage = buffer.storage;
  return Tensor(std::move(impl));
}

void StagingBackend::copy(void* dst, const void* src, size_t bytes, int device, bool to_host,
                          Deadline deadline, const char* op) {
  if (bytes == 0) return;
  cuda::DeviceGuard guard(device);
  cudaStream_t stream = cuda::current_stream(device);
  LOOM_CUDA_CHECK(cudaMemcpyAsync(
      dst, src, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, stream));
  cuda::Event copied;
  copied.record(stream);
  if (!wait_event(copied, deadline)) {
    throw CommError(tag::kCommStaging.prefix() + "rank " + std::to_string(rank()) + ": copying " +
                        std::to_string(bytes) + " bytes of a CUDA tensor " +
                        (to_host ? "to" : "from") + " pinned host memory for " + op +
                        " did not finish by the deadline (is the stream of cuda:" +
                        std::to_string(device) + " blocked?)",
                    rank());
  }
}

void StagingBackend::download(const Tensor& device_tensor, const Tensor& host, Deadline deadline,
                              const char* op) {
  copy(host.raw_data(), device_tensor.raw_data(), device_tensor.nbytes(),
       device_tensor.device().index, /*to_host=*/true, deadline, op);
}

void StagingBackend::upload(const Tensor& host, const Tensor& device_tensor, Deadline deadline,
                            const char* op) {
  copy(device_tensor.raw_data(), host.raw_data(), device_tensor.nbytes(),
       device_tensor.device().index, /*to_host=*/false, deadline, op);
}

// Inputs and outputs always get separate host buffers, so in-place calls (input aliasing
// output or a slice of it) are out of place on the host and stay correct.
void StagingBackend::allreduce(const Tensor& input, Tensor& output, ReduceOp op,
                               Deadline deadline) {
  Tensor in = host_tensor(inputs_, input);
  download(input, in, deadline, "allreduce");
  Tensor out = host_tensor(outputs_, output);
  host_.allreduce(in, out, op, deadline);
  upload(out, output, deadline, "allreduce");
}

void StagingBackend::broadcast(Tensor& tensor, int root, Deadline deadline) {
  Tensor staged = host_tensor(inputs_, tensor);
  if (rank() == root) download(tensor, staged, deadline, "broadcast");
  host_.broadcast(staged, root, deadline);
  if (rank() != root) upload(staged, tensor, deadline, "broadcast");
}

void StagingBackend::reduce(Tensor& tensor, int root, ReduceOp op, Deadline deadline) {
  Tensor staged = host_tensor(inputs_, tensor);
  download(tensor, staged, deadline, "reduce");
  host_.reduce(staged, root, op, deadline);
  if (rank() == root) upload(staged, tensor, deadline, "reduce");
}

void StagingBackend::all_gather(Tensor& output, const Tensor& input, Deadline deadline) {
  Tensor in = host_tensor(inputs_, input);
  download(input, in, deadline, "all_gather");
  Tensor out = host_tensor(outputs_, output);
  host_.all_gather(out, in, deadline);
  upload(out, output, deadline, "all_gather");
}

void StagingBackend::reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op,
                                    Deadline deadline) {
  Tensor in = host_tensor(inputs_, input);
  download(input, in, deadline, "reduce_scatter");
  Tensor out = host_tensor(outputs_, output);
  host_.reduce_scatter(out, in, op, deadline);
  upload(out, output, deadline, "reduce_scatter");
}

void StagingBackend::all_to_all(Tensor& output, const Tensor& input, Deadline deadline) {
  Tensor in = host_tensor(inputs_, input);
  download(input, in, deadline, "all_to_all");
  Tensor out = host_tensor(outputs_, output);
  host_.all_to_all(out, in, deadline);
  upload(out, output, deadline, "all_to_all");
}

void StagingBackend::send(const Tensor& tensor, int dst, int tag, Deadline deadline) {
  Tensor staged = host_tensor(inputs_, tensor);
  download(tensor, staged, deadline, "send");
  host_.send(staged, dst, tag, deadline);
}

void StagingBackend::recv(Tensor& tensor, int src, int tag, Deadline deadline) {
  Tensor staged = host_tensor(outputs_, tensor);
  host_.recv(staged, src, tag, deadline);
  upload(staged, tensor, deadline, "recv");
}

void StagingBackend::barrier(Deadline deadline) {
  host_.barrier(deadline);
}

}  // namespace loom::comm
