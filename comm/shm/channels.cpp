// Point-to-point byte streams of the shm backend: one single-producer single-consumer ring
// per ordered pair of ranks in the shared segment.

#include <algorithm>
#include <cstring>

#include "comm/shm/shm_backend.h"

namespace loom::comm::shm {

size_t ShmBackend::push(int dst, const char* data, size_t bytes) {
  ChannelControl& c = channel(rank_, dst);
  const size_t capacity = layout_.channel_bytes;
  uint64_t head = c.head.value.load(std::memory_order_relaxed);
  uint64_t tail = c.tail.value.load(std::memory_order_acquire);
  size_t n = std::min(bytes, capacity - static_cast<size_t>(head - tail));
  if (n == 0) return 0;
  char* base = ring(rank_, dst);
  size_t at = static_cast<size_t>(head % capacity);
  size_t first = std::min(n, capacity - at);
  std::memcpy(base + at, data, first);
  std::memcpy(base, data + first, n - first);
  c.head.value.store(head + n, std::memory_order_release);
  wake_sleepers();
  return n;
}

size_t ShmBackend::pull(int src, char* data, size_t bytes) {
  ChannelControl& c = channel(src, rank_);
  const size_t capacity = layout_.channel_bytes;
  uint64_t tail = c.tail.value.load(std::memory_order_relaxed);
  uint64_t head = c.head.value.load(std::memory_order_acquire);
  size_t n = std::min(bytes, static_cast<size_t>(head - tail));
  if (n == 0) return 0;
  const char* base = ring(src, rank_);
  size_t at = static_cast<size_t>(tail % capacity);
  size_t first = std::min(n, capacity - at);
  std::memcpy(data, base + at, first);
  std::memcpy(data + first, base, n - first);
  c.tail.value.store(tail + n, std::memory_order_release);
  wake_sleepers();
  return n;
}

void ShmBackend::send_recv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                           size_t recv_bytes, int src, Deadline deadline) {
  auto* out = static_cast<const char*>(send_data);
  auto* in = static_cast<char*>(recv_data);
  size_t sent = 0, received = 0;
  ChannelControl& outgoing = channel(rank_, dst);
  ChannelControl& incoming = channel(src, rank_);
  while (sent < send_bytes || received < recv_bytes) {
    // Snapshot the peers' counters before trying, so that a change made while we try is seen
    // by the wait below (reading them after a failed try could miss it and wait forever).
    uint64_t out_tail = outgoing.tail.value.load(std::memory_order_acquire);
    uint64_t in_head = incoming.head.value.load(std::memory_order_acquire);
    size_t moved = 0;
    if (sent < send_bytes) {
      size_t n = push(dst, out + sent, send_bytes - sent);
      sent += n;
      moved += n;
    }
    if (received < recv_bytes) {
      size_t n = pull(src, in + received, recv_bytes - received);
      received += n;
      moved += n;
    }
    if (moved > 0 || (sent == send_bytes && received == recv_bytes)) continue;
    // Nothing moved: wait until the receiver drained or the sender filled some bytes.
    bool sending = sent < send_bytes;
    wait_until(
        scope_,
        [&] {
          return (sending && outgoing.tail.value.load(std::memory_order_acquire) != out_tail) ||
                 (received < recv_bytes &&
                  incoming.head.value.load(std::memory_order_acquire) != in_head);
        },
        [&] { return received < recv_bytes ? src : dst; }, deadline,
        sending ? "receive this rank's message" : "send its message");
  }
}

}  // namespace loom::comm::shm
