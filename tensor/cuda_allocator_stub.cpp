// builtin_cuda_allocator in a build without CUDA (tensor/allocator.h): there is none.

#include "core/tags.h"
#include "tensor/allocator.h"

namespace loom {

Allocator& builtin_cuda_allocator(int index) {
  tag::kTensor.fail("no allocator for cuda:", index,
                    ": this build has no CUDA support (configure with -DLOOM_WITH_CUDA=ON on a "
                    "machine with the CUDA toolkit)");
}

}  // namespace loom
