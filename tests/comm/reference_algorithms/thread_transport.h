#pragma once
// A Transport for ranks that are threads of one process, for the tests of the algorithms. Messages are copied into per-pair FIFO
// mailboxes, so send never waits for the receiver; recv waits on a condition variable
// until its message arrives, the sender closes, or the deadline passes.

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "comm/algorithms/transport.h"

namespace loom::comm {

// The shared state of `size` thread ranks. Create one, then one ThreadTransport per rank.
class ThreadFabric {
 public:
  explicit ThreadFabric(int size);
  int size() const { return size_; }

 private:
  friend class ThreadTransport;
  struct Inbox {  // everything sent to one rank
    std::mutex mutex;
    std::condition_variable arrived;
    std::vector<std::deque<std::vector<std::byte>>> from;  // FIFO per source rank
  };
  int size_;
  std::vector<std::unique_ptr<Inbox>> inboxes_;
  std::unique_ptr<std::atomic<bool>[]> closed_;
};

// One rank's end of a ThreadFabric. Each method is called by that rank's thread only.
// Errors are loom::CommError with the peer: a recv that passes its deadline, a message of
// the wrong size (mismatched collectives), or a peer that closed.
class ThreadTransport final : public Transport {
 public:
  ThreadTransport(std::shared_ptr<ThreadFabric> fabric, int rank);
  ~ThreadTransport() override;  // closes
  ThreadTransport(const ThreadTransport&) = delete;
  ThreadTransport& operator=(const ThreadTransport&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return fabric_->size(); }
  void send(const void* data, size_t bytes, int dst, Deadline deadline) override;
  void recv(void* data, size_t bytes, int src, Deadline deadline) override;
  void send_recv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                 size_t recv_bytes, int src, Deadline deadline) override;

  // Marks this rank gone: messages it already sent are still delivered, after that its
  // peers' receives from it (and sends to it) fail at once instead of at their deadline.
  void close();

 private:
  void check_peer(int peer, const char* what) const;

  std::shared_ptr<ThreadFabric> fabric_;
  int rank_;
};

// Runs fn(transport) for ranks 0..size-1, each on its own thread over a fresh fabric, and
// waits for all of them. A rank whose fn throws closes its transport, so peers waiting on
// it fail fast. Returns each rank's exception (null when fn returned normally).
std::vector<std::exception_ptr> run_in_threads(int size,
                                               const std::function<void(ThreadTransport&)>& fn);

}  // namespace loom::comm
