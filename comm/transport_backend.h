#pragma once
// A Backend whose collectives are the generic algorithms of comm/algorithms/ over its own
// point-to-point Transport: a network backend (ucx, tcp) implements rank, size, name and
// send_recv, and gets the rest here (Note [Collectives over a Transport]); send and recv are
// send_recv with one direction empty.

#include <string>

#include "comm/algorithms/transport.h"
#include "comm/backend.h"

namespace loom::comm {

class TransportBackend : public Backend, public Transport {
 public:
  int rank() const override = 0;
  int size() const override = 0;

  void allreduce(const Tensor& input, Tensor& output, ReduceOp op, Deadline deadline) override;
  void broadcast(Tensor& tensor, int root, Deadline deadline) override;
  void reduce(Tensor& tensor, int root, ReduceOp op, Deadline deadline) override;
  void all_gather(Tensor& output, const Tensor& input, Deadline deadline) override;
  void reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op, Deadline deadline) override;
  void all_to_all(Tensor& output, const Tensor& input, Deadline deadline) override;
  void send(const Tensor& tensor, int dst, int tag, Deadline deadline) override;
  void recv(Tensor& tensor, int src, int tag, Deadline deadline) override;
  void barrier(Deadline deadline) override;

  void send(const void* data, size_t bytes, int dst, Deadline deadline) override;
  void recv(void* data, size_t bytes, int src, Deadline deadline) override;
};

// How a network backend's messages name a rank's host: LOOM_HOST_ID when set (the
// hierarchical backend's host key), else the host name.
std::string host_label();

// Whether this host has an RDMA device (/sys/class/infiniband not empty), where UCX's
// rendezvous is zero-copy: ucx's defaults and the hierarchical backend's network ask.
bool has_rdma_device();

}  // namespace loom::comm
