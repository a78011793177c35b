#include "tensor/storage.h"

#include <cstring>

#include "core/tags.h"

namespace loom {

void Storage::pin() {
  if (pinned_) return;
  if (!device_.is_cpu()) {
    tag::kTensor.fail("pin: only CPU memory can be pinned (page-locked); this storage is on ",
                      device_);
  }
  if (!held_ || nbytes_ == 0) {  // locked when materialized
    pinned_ = true;
    return;
  }
  const size_t pages = whole_pages(nbytes_);
  void* fresh = allocator_->allocate(pages);
  try {
    page_lock_host_memory(fresh, pages);
  } catch (...) {
    allocator_->deallocate(fresh, pages);
    throw;
  }
  std::memcpy(fresh, data_, nbytes_);
  allocator_->uncount_kind(kind_, nbytes_);
  allocator_->deallocate(data_, nbytes_);
  data_ = fresh;
  pinned_ = true;
  allocator_->count_kind(kind_, allocated_bytes());
}

}  // namespace loom
