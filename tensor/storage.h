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

  // What the memory holds, for the allocator's reports (MemoryKind in tensor/allocator.h).
  MemoryKind kind() const { return kind_; }
  void set_kind(MemoryKind kind) noexcept {
    if (kind == kind_) return;
    if (held_) {
      allocator_->uncount_kind(kind_, nbytes_);
      allocator_->count_kind(kind, nbytes_);
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
    allocator_->uncount_kind(kind_, nbytes_);
    allocator_->deallocate(data_, nbytes_);
    data_ = nullptr;
    held_ = false;
  }
  void materialize() {
    if (held_ || nbytes_ == 0) return;
    data_ = allocator_->allocate(nbytes_);
    allocator_->count_kind(kind_, nbytes_);
    held_ = true;
  }
  bool materialized() const { return held_ || nbytes_ == 0; }

 private:
  Allocator* allocator_;
  void* data_;
  size_t nbytes_;
  Device device_;
  bool held_;  // the bytes are allocated (and counted); data_ is null on meta all the same
  MemoryKind kind_ = MemoryKind::Activations;
};

}  // namespace loom
