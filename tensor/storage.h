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
  Storage(size_t nbytes, Device device)
      : allocator_(&allocator_for(device)),
        data_(allocator_->allocate(nbytes)),
        nbytes_(nbytes),
        device_(device) {}
  ~Storage() { allocator_->deallocate(data_, nbytes_); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return device_; }

 private:
  Allocator* allocator_;
  void* data_;
  size_t nbytes_;
  Device device_;
};

}  // namespace loom
