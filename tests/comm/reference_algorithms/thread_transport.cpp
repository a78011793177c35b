#include "reference_algorithms/thread_transport.h"

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "core/error.h"
#include "core/tags.h"

namespace loom::comm {

namespace {

std::string prefix(int rank) {
  return tag::kCommThread.prefix() + "rank " + std::to_string(rank) + ": ";
}

}  // namespace

ThreadFabric::ThreadFabric(int size)
    : size_(size), closed_(std::make_unique<std::atomic<bool>[]>(static_cast<size_t>(size))) {
  check(size >= 1, tag::kCommThread.prefix() + "a fabric needs at least one rank, got " +
                       std::to_string(size));
  for (int r = 0; r < size; ++r) {
    inboxes_.push_back(std::make_unique<Inbox>());
    inboxes_.back()->from.resize(static_cast<size_t>(size));
    closed_[static_cast<size_t>(r)] = false;
  }
}

ThreadTransport::ThreadTransport(std::shared_ptr<ThreadFabric> fabric, int rank)
    : fabric_(std::move(fabric)), rank_(rank) {
  check(fabric_ != nullptr, tag::kCommThread.prefix() + "ThreadTransport needs a fabric");
  check(rank >= 0 && rank < fabric_->size(),
        tag::kCommThread.prefix() + "rank " + std::to_string(rank) +
            " is outside a fabric of size " + std::to_string(fabric_->size()));
}

ThreadTransport::~ThreadTransport() {
  close();
}

void ThreadTransport::close() {
  fabric_->closed_[static_cast<size_t>(rank_)] = true;
  // Lock each inbox so a receiver between its check and its wait cannot miss the wake-up.
  for (auto& inbox : fabric_->inboxes_) {
    std::lock_guard lock(inbox->mutex);
    inbox->arrived.notify_all();
  }
}

void ThreadTransport::check_peer(int peer, const char* what) const {
  check(peer >= 0 && peer < size() && peer != rank_,
        prefix(rank_) + what + " peer " + std::to_string(peer) +
            " is not another rank of a group of size " + std::to_string(size()));
}

void ThreadTransport::send(const void* data, size_t bytes, int dst, Deadline /*deadline*/) {
  check_peer(dst, "send to");
  if (fabric_->closed_[static_cast<size_t>(dst)]) {
    throw CommError(prefix(rank_) + "peer " + std::to_string(dst) + " closed (send of " +
                        std::to_string(bytes) + " bytes)",
                    rank_, dst);
  }
  const auto* begin = static_cast<const std::byte*>(data);
  std::vector<std::byte> message(begin, begin + bytes);
  ThreadFabric::Inbox& inbox = *fabric_->inboxes_[static_cast<size_t>(dst)];
  {
    std::lock_guard lock(inbox.mutex);
    inbox.from[static_cast<size_t>(rank_)].push_back(std::move(message));
  }
  inbox.arrived.notify_all();
}

void ThreadTransport::recv(void* data, size_t bytes, int src, Deadline deadline) {
  check_peer(src, "receive from");
  ThreadFabric::Inbox& inbox = *fabric_->inboxes_[static_cast<size_t>(rank_)];
  auto& queue = inbox.from[static_cast<size_t>(src)];
  const auto start = Clock::now();
  std::unique_lock lock(inbox.mutex);
  const bool ready = inbox.arrived.wait_until(
      lock, deadline, [&] { return !queue.empty() || fabric_->closed_[static_cast<size_t>(src)]; });
  if (!ready) {
    const auto waited = std::chrono::duration_cast<Duration>(Clock::now() - start);
    throw CommError(prefix(rank_) + "peer " + std::to_string(src) + " did not send " +
                        std::to_string(bytes) + " bytes within " + duration_str(waited),
                    rank_, src);
  }
  if (queue.empty()) {
    throw CommError(prefix(rank_) + "peer " + std::to_string(src) + " closed before sending " +
                        std::to_string(bytes) + " bytes",
                    rank_, src);
  }
  std::vector<std::byte> message = std::move(queue.front());
  queue.pop_front();
  lock.unlock();
  if (message.size() != bytes) {
    throw CommError(prefix(rank_) + "peer " + std::to_string(src) + " sent " +
                        std::to_string(message.size()) + " bytes, expected " +
                        std::to_string(bytes) + " (mismatched collectives?)",
                    rank_, src);
  }
  if (bytes > 0) std::memcpy(data, message.data(), bytes);
}

void ThreadTransport::send_recv(const void* send_data, size_t send_bytes, int dst, void* recv_data,
                                size_t recv_bytes, int src, Deadline deadline) {
  // send only buffers, so sending first cannot deadlock.
  send(send_data, send_bytes, dst, deadline);
  recv(recv_data, recv_bytes, src, deadline);
}

std::vector<std::exception_ptr> run_in_threads(int size,
                                               const std::function<void(ThreadTransport&)>& fn) {
  auto fabric = std::make_shared<ThreadFabric>(size);
  std::vector<std::unique_ptr<ThreadTransport>> transports;
  for (int r = 0; r < size; ++r)
    transports.push_back(std::make_unique<ThreadTransport>(fabric, r));
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      ThreadTransport& transport = *transports[static_cast<size_t>(r)];
      try {
        fn(transport);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
        transport.close();
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  return errors;
}

}  // namespace loom::comm
