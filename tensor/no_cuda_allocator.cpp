// builtin_cuda_allocator (tensor/allocator.h) in a build without CUDA, which has no CUDA
// allocator: creating a cuda:N tensor is an error saying how to get one.

#include "core/tags.h"
#include "tensor/allocator.h"

namespace loom {

Allocator& builtin_cuda_allocator(int index) {
  tag::kTensor.fail("no allocator for cuda:", index,
                    ": this build has no CUDA support (configure with -DLOOM_WITH_CUDA=ON on a "
                    "machine with the CUDA toolkit)");
}

}  // namespace loom
