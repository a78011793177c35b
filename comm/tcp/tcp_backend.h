#pragma once
// The tcp backend: ranks on any hosts exchange messages over TCP connections of Loom's own,
// one per pair of ranks, as Gloo and Open MPI's TCP transport do. Each message lands straight
// in the receiver's buffer: the kernel's copy out of the socket is the only one (UCX's TCP
// transport receives into its own segments and copies from there, an eighth of the cores'
// time in a 4 MiB allreduce; docs/multihost.md, "The tcp backend"). Every collective comes
// from the generic algorithms (TransportBackend), so results are bitwise the shm and ucx
// backends'.
//
// Connections: each rank listens on an ephemeral port of every address it has and publishes
// them in the group's store with a random token; the higher rank of each pair connects and
// proves itself with the token (the store is authenticated, so only members know it). Waits
// spin for kSpinBeforeYielding, then sleep in poll(); a peer that closes its connection fails
// the operation with a CommError naming it (PeerDied), a deadline with one naming the peer
// awaited (Timeout).

#include <memory>
#include <string>

#include "comm/transport_backend.h"

namespace loom::comm::tcp {

class TcpBackend final : public TransportBackend {
 public:
  // Collective over the group: listens, publishes, connects to every peer.
  explicit TcpBackend(const BackendContext& context);
  ~TcpBackend() override;
  TcpBackend(const TcpBackend&) = delete;
  TcpBackend& operator=(const TcpBackend&) = delete;

  std::string name() const override { return "tcp"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void send_recv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                 size_t recv_bytes, int src, Deadline deadline) override;

 private:
  struct State;  // sockets and peers' hosts

  int rank_, size_;
  std::unique_ptr<State> state_;
};

}  // namespace loom::comm::tcp
