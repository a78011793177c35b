#pragma once
// Note [Staging CUDA tensors]
// A host backend (shm, or any backend whose device() is the CPU) moves bytes in host memory.
// When a process group of such a backend is given CUDA tensors, it runs the operation
// through a StagingBackend wrapped around the host backend: each input is copied device to
// host into page-locked (pinned) host memory on the caller's stream (Note [Issue streams]),
// the host collective runs on those host tensors, and each output is copied back host to
// device on the same stream. The copies are waited for (polling an event, never past the
// operation's deadline) before the operation returns, so that
//   - the host collective reads data the device finished writing,
//   - a completed Work means the result is in the CUDA tensor (later work on the caller's
//     stream is ordered after the upload anyway), and
//   - the pinned buffers can be reused by the next operation.
// Staging is the slow path (two PCIe copies and a host round trip per operation); the nccl
// backend moves CUDA tensors without it. A copy that misses the deadline is a CommError: the
// peers of the host collective are then out of step, so the group is broken.
//
// Pinned memory: two grow-only host buffers (inputs, outputs), allocated through the CPU
// allocator (so they can back ordinary CPU tensors) and page-locked with cudaHostRegister
// (portable: usable with every device). They are unregistered when the backend is destroyed.
//
// Thread-safety: like every backend, one operation at a time (the group's progress thread).

#include <memory>

#include "comm/backend.h"

namespace loom::comm {

class StagingBackend final : public Backend {
 public:
  explicit StagingBackend(Backend& host);  // `host` must outlive this; touches no CUDA API
  ~StagingBackend() override;
  StagingBackend(const StagingBackend&) = delete;
  StagingBackend& operator=(const StagingBackend&) = delete;

  std::string name() const override { return host_.name(); }
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }

  void allreduce(const Tensor& input, Tensor& output, ReduceOp op, Deadline deadline) override;
  void broadcast(Tensor& tensor, int root, Deadline deadline) override;
  void reduce(Tensor& tensor, int root, ReduceOp op, Deadline deadline) override;
  void all_gather(Tensor& output, const Tensor& input, Deadline deadline) override;
  void reduce_scatter(Tensor& output, const Tensor& input, ReduceOp op, Deadline deadline) override;
  void all_to_all(Tensor& output, const Tensor& input, Deadline deadline) override;
  void send(const Tensor& tensor, int dst, int tag, Deadline deadline) override;
  void recv(Tensor& tensor, int src, int tag, Deadline deadline) override;
  void barrier(Deadline deadline) override;

 private:
  // A grow-only page-locked host buffer.
  struct HostBuffer {
    std::shared_ptr<Storage> storage;
    bool registered = false;
  };

  // A contiguous CPU tensor shaped like `like` over `buffer` (grown when too small).
  Tensor host_tensor(HostBuffer& buffer, const Tensor& like);
  // Copies a CUDA tensor to its host twin (download) or back (upload) on the caller's
  // stream of the tensor's device, and waits for the copy until `deadline`.
  void download(const Tensor& device_tensor, const Tensor& host, Deadline deadline, const char* op);
  void upload(const Tensor& host, const Tensor& device_tensor, Deadline deadline, const char* op);
  void copy(void* dst, const void* src, size_t bytes, int device, bool to_host, Deadline deadline,
            const char* op);
  static void release(HostBuffer& buffer) noexcept;

  Backend& host_;
  HostBuffer inputs_, outputs_;
};

}  // namespace loom::comm
