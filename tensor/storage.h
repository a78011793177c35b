#pragma once
// A block of device memory shared by a tensor and all of its views.

#include <cstddef>
#include <memory>

#include "tensor/allocator.h"
#include "tensor/device.h"

namespace loom {

class Storage {
 public:
  // Allocates `nbytes` on `device` through its registered allocator.
  // On the meta device nothing is allocated (data() is null) but the bytes are counted all
  // the same, so memory reports come from the real code path (tensor/meta.h).
  Storage(size_t nbytes, Device device)
      : allocator_(&allocator_for(device)),
        data_(allocator_->allocate(nbytes)),
        nbytes_(nbytes),
        device_(device),
        held_(nbytes > 0) {
    if (held_) allocator_->count_kind(kind_, nbytes_);
  }
  ~Storage() { release(); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // Null while released.
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

  // Page-locks a CPU storage's memory (cudaHostRegister), so that copies between it and a GPU
  // go straight to the copy engine instead of through a staging buffer (Tensor::pin_memory).
  // The memory is reallocated as whole pages first, contents kept (pages are what gets locked,
  // and two pinned storages must not share one); views see the new memory. A released
  // storage is locked when materialized; it stays pinned across release() and materialize().
  // Throws loom::Error for a non-CPU storage or in a build without CUDA.
  void pin();
  bool pinned() const { return pinned_; }

  // What the memory holds, for the allocator's reports (MemoryKind in tensor/allocator.h).
  MemoryKind kind() const { return kind_; }
  void set_kind(MemoryKind kind) noexcept {
    if (kind == kind_) return;
    if (held_) {
      allocator_->uncount_kind(kind_, allocated_bytes());
      allocator_->count_kind(kind, allocated_bytes());
    }
    kind_ = kind;
  }

  // Note [Releasing storage]
  // Sharded strategies keep a parameter's full (gathered) storage only while a module runs
  // (PyTorch FSDP's storage resize to 0 and back): release() returns the memory while every
  // tensor and view keeps pointing at this Storage, and materialize() allocates it again
  // (contents undefined) so that the same views see the next all-gather. Reading a tensor
  // whose storage is released is the caller's bug. Not thread-safe: the owner serialises
  // these calls with every use of the data.
  void release() noexcept {
    if (!held_) return;
    if (pinned_) page_unlock_host_memory(data_);
    allocator_->uncount_kind(kind_, allocated_bytes());
    allocator_->deallocate(data_, allocated_bytes());
    data_ = nullptr;
    held_ = false;
  }
  void materialize() {
    if (held_ || nbytes_ == 0) return;
    data_ = allocator_->allocate(allocated_bytes());
    if (pinned_) {
      try {
        page_lock_host_memory(data_, allocated_bytes());
      } catch (...) {
        allocator_->deallocate(data_, allocated_bytes());
        data_ = nullptr;
        throw;
      }
    }
    allocator_->count_kind(kind_, allocated_bytes());
    held_ = true;
  }
  bool materialized() const { return held_ || nbytes_ == 0; }

 private:
  static constexpr size_t kPageBytes = 4096;
  static size_t whole_pages(size_t nbytes) {
    return (nbytes + kPageBytes - 1) / kPageBytes * kPageBytes;
  }
  // What the allocator handed out: whole pages once pinned (the CPU allocator aligns a
  // multiple of 4096 bytes to a page).
  size_t allocated_bytes() const { return pinned_ ? whole_pages(nbytes_) : nbytes_; }

  Allocator* allocator_;
  void* data_;
  size_t nbytes_;
  Device device_;
  bool held_;  // the bytes are allocated (and counted); data_ is null on meta all the same
  MemoryKind kind_ = MemoryKind::Activations;
  bool pinned_ = false;
};

}  // namespace loom
