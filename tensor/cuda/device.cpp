#include "tensor/cuda/device.h"

#include <cuda_runtime_api.h>

#include <string>

#include "core/error.h"
#include "core/tags.h"
#include "kernels/cuda/check.h"

namespace loom::cuda {
namespace {

struct DeviceQuery {
  int count = 0;
  std::string reason;  // empty when count > 0
};

// Asks the runtime once. A failing cudaGetDeviceCount (no driver, driver too old, no
// device) is an answer here, not an error: the process simply has no CUDA devices.
const DeviceQuery& query() noexcept {
  static const DeviceQuery result = [] {
    DeviceQuery q;
    try {
      int count = 0;
      cudaError_t status = cudaGetDeviceCount(&count);
      if (status != cudaSuccess) {
        (void)cudaGetLastError();  // do not leave the failure for the next checked call
        q.reason = std::string("cudaGetDeviceCount failed: ") + cudaGetErrorName(status) + " (" +
                   cudaGetErrorString(status) + ")";
      } else if (count <= 0) {
        q.reason = "the CUDA driver reports no devices (check CUDA_VISIBLE_DEVICES)";
      } else {
        q.count = count;
      }
    } catch (...) {  // std::bad_alloc building the message: report no devices
      q.count = 0;
    }
    return q;
  }();
  return result;
}

}  // namespace

int device_count() noexcept {
  return query().count;
}

bool is_available() noexcept {
  return device_count() > 0;
}

std::string unavailable_reason() {
  return query().reason;
}

void check_device_index(int index) {
  int count = device_count();
  if (count == 0) {
    tag::kCuda.fail("device cuda:", index,
                    " requested but no CUDA device is available: ", unavailable_reason());
  }
  if (index < 0 || index >= count) {
    tag::kCuda.fail("device index ", index, " is out of range: expected 0..", count - 1, " (",
                    count, " visible device", count == 1 ? "" : "s", ")");
  }
}

DeviceGuard::DeviceGuard(int index) {
  check_device_index(index);
  int current = -1;
  LOOM_CUDA_CHECK(cudaGetDevice(&current));
  if (current != index) {
    LOOM_CUDA_CHECK(cudaSetDevice(index));
    previous_ = current;
  }
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0) LOOM_CUDA_WARN(cudaSetDevice(previous_));
}

}  // namespace loom::cuda
