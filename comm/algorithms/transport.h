#pragma once
// The point-to-point interface the generic algorithms are written against. A backend that
// can move bytes between two ranks (shm channels, TCP connections, UCX tags) gets every
// collective in comm/algorithms/ by implementing these three calls (TransportBackend).

#include <cstddef>

#include "comm/error.h"

namespace loom::comm {

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Blocks until `bytes` bytes were handed to `dst` (or buffered for it). CommError on
  // deadline or a dead peer.
  virtual void send(const void* data, size_t bytes, int dst, Deadline deadline) = 0;
  // Blocks until `bytes` bytes from `src` arrived in `data`.
  virtual void recv(void* data, size_t bytes, int src, Deadline deadline) = 0;
  // Sends to `dst` and receives from `src` at the same time (no deadlock when both peers
  // call it towards each other with messages larger than any buffer).
  virtual void send_recv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                         size_t recv_bytes, int src, Deadline deadline) = 0;
};

}  // namespace loom::comm
