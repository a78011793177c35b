#pragma once
// The UCX backend: ranks on any hosts exchange tagged messages through UCX (Debian's
// libucx-dev, UCX 1.13), which picks the transport itself (TCP, shared memory, InfiniBand;
// UCX_TLS narrows it). Each group has its own UCX context and worker; the workers' addresses
// travel through the group's store. Every collective comes from the generic algorithms of
// comm/algorithms/ over the point-to-point Transport this backend implements
// (TransportBackend; Note [UCX collectives] in ucx_backend.cpp): the reductions are
// rank-ordered, so results are bitwise the shm backend's. Waits drive the worker until the
// operation completes, a peer's endpoint reports an error (CommError naming the peer, PeerDied) or
// the deadline passes (Timeout).
//
// Not provided: the shm backend's always-on fingerprints. Ranks that issue different
// collectives over ucx may hang until the deadline or exchange mismatched messages (sizes
// are checked: a message of the wrong length is a CommError naming the peer).

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "comm/transport_backend.h"

namespace loom::comm::ucx {

class UcxBackend final : public TransportBackend {
 public:
  // Collective over the group: creates the context and worker, publishes this worker's
  // address in the store, connects an endpoint to every peer's.
  explicit UcxBackend(const BackendContext& context);
  ~UcxBackend() override;
  UcxBackend(const UcxBackend&) = delete;
  UcxBackend& operator=(const UcxBackend&) = delete;

  std::string name() const override { return "ucx"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Transport: ordered byte streams between ranks (one UCX tag per sending rank). Starts the
  // send and the receive (either may be absent: bytes 0) and drives the worker until both
  // completed.
  void send_recv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                 size_t recv_bytes, int src, Deadline deadline) override;

 private:
  struct State;  // the UCX handles (ucp.h stays out of this header)

  int rank_, size_;
  std::unique_ptr<State> state_;
};

}  // namespace loom::comm::ucx
