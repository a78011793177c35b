#include "comm/transport_backend.h"

#include <unistd.h>

#include <filesystem>
#include <system_error>

#include "comm/algorithms/algorithms.h"
#include "comm/algorithms/tagged_messages.h"
#include "core/tunables.h"

namespace loom::comm {

// Note [Collectives over a Transport]
// Rank-ordered allreduce, reduce and reduce-scatter (Note [Rank-ordered reductions]: the shm
// backend's bits), ring all-gather, binomial-tree broadcast, pairwise all-to-all,
// dissemination barrier; tensor send/recv are the tagged messages of
// comm/algorithms/tagged_messages.h, as on the shm backend.

void TransportBackend::send(const void* data, size_t bytes, int dst, Deadline deadline) {
  send_recv(data, bytes, dst, nullptr, 0, dst, deadline);
}

void TransportBackend::recv(void* data, size_t bytes, int src, Deadline deadline) {
  send_recv(nullptr, 0, src, data, bytes, src, deadline);
}

void TransportBackend::allreduce(const Tensor& input, Tensor& output, ReduceOp op,
                                 Deadline deadline) {
  algorithms::rank_ordered_allreduce(*this, input.raw_data(), output.raw_data(),
                                     static_cast<size_t>(output.numel()), output.dtype(), op,
                                     deadline);
}

void TransportBackend::broadcast(Tensor& tensor, int root, Deadline deadline) {
  algorithms::tree_broadcast(*this, tensor.raw_data(), static_cast<size_t>(tensor.numel()),
                             tensor.dtype(), root, deadline);
}

void TransportBackend::reduce(Tensor& tensor, int root, ReduceOp op, Deadline deadline) {
  algorithms::rank_ordered_reduce(*this, tensor.raw_data(), static_cast<size_t>(tensor.numel()),
                                  tensor.dtype(), op, root, deadline);
}

void TransportBackend::all_gather(Tensor& output, const Tensor& input, Deadline deadline) {
  algorithms::ring_all_gather(*this, input.raw_data(), output.raw_data(),
                              static_cast<size_t>(input.numel()), input.dtype(), deadline);
}

void TransportBackend::reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op,
                                      Deadline deadline) {
  algorithms::rank_ordered_reduce_scatter(*this, input.raw_data(), output.raw_data(),
                                          static_cast<size_t>(output.numel()), input.dtype(), op,
                                          deadline);
}

void TransportBackend::all_to_all(Tensor& output, const Tensor& input, Deadline deadline) {
  algorithms::pairwise_all_to_all(*this, input.raw_data(), output.raw_data(),
                                  static_cast<size_t>(input.numel()) / static_cast<size_t>(size()),
                                  input.dtype(), deadline);
}

void TransportBackend::barrier(Deadline deadline) {
  algorithms::dissemination_barrier(*this, deadline);
}

void TransportBackend::send(const Tensor& tensor, int dst, int tag, Deadline deadline) {
  algorithms::send_tagged(*this, tensor.raw_data(), tensor.nbytes(), tag, dst, deadline);
}

void TransportBackend::recv(Tensor& tensor, int src, int tag, Deadline deadline) {
  const std::string prefix = "[comm/" + name() + "]";
  algorithms::recv_tagged(*this, tensor.raw_data(), tensor.nbytes(), tag, src, deadline,
                          prefix.c_str());
}

bool has_rdma_device() {
  std::error_code ignored;
  std::filesystem::directory_iterator devices("/sys/class/infiniband", ignored);
  return !ignored && devices != std::filesystem::directory_iterator();
}

std::string host_label() {
  const char* id = tunable_value(tunables::kHostId);
  if (id != nullptr && *id != '\0') return id;
  char name[256] = {};
  gethostname(name, sizeof name - 1);
  return name;
}

}  // namespace loom::comm
