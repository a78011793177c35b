// builtin_cuda_allocator and the host page-locking (tensor/allocator.h) in a build without
// CUDA, which has neither: creating a cuda:N tensor or pinning memory is an error saying how to
// get them.

#include "core/tags.h"
#include "tensor/allocator.h"

namespace loom {

Allocator& builtin_cuda_allocator(int index) {
  tag::kTensor.fail("no allocator for cuda:", index,
                    ": this build has no CUDA support (configure with -DLOOM_WITH_CUDA=ON on a "
                    "machine with the CUDA toolkit)");
}

void page_lock_host_memory(void*, size_t) {
  tag::kTensor.fail("pinned (page-locked) host memory needs CUDA: this build has none (configure "
                    "with -DLOOM_WITH_CUDA=ON on a machine with the CUDA toolkit)");
}

void page_unlock_host_memory(void*) noexcept {}

}  // namespace loom
