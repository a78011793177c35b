#pragma once
// Which CUDA devices this process can use, and a scoped "current device".
// Nothing here throws when there is no driver or no device: device_count() is then 0 and
// unavailable_reason() says why, so callers (and tests) can skip cleanly on CPU machines.

#include <string>

namespace loom::cuda {

// Number of visible CUDA devices; 0 when the driver is missing or reports an error.
// Queried once per process (CUDA_VISIBLE_DEVICES is read by the driver at that point).
// Thread-safe, never throws.
int device_count() noexcept;

// device_count() > 0.
bool is_available() noexcept;

// Why is_available() is false ("cudaGetDeviceCount failed: cudaErrorNoDevice (...)"), for
// skip and error messages; empty when devices are available.
std::string unavailable_reason();

// Throws loom::Error naming the valid range (or why there are no devices) unless
// 0 <= index < device_count().
void check_device_index(int index);

// Makes `index` the calling thread's current device for the guard's lifetime and restores
// the previous one on destruction (which never throws). Checks the index.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // -1 when the device was already `index` (nothing to restore)
};

}  // namespace loom::cuda
