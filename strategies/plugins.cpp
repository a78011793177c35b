#include "strategies/plugins.h"

#if LOOM_WITH_CUDA
#include "tensor/cuda/device.h"
#endif

#include "core/tags.h"
#include "tensor/safetensors.h"

namespace loom::strategies {

CUDAAccelerator::CUDAAccelerator() {
#if LOOM_WITH_CUDA
  visible_devices_ = cuda::device_count();
  if (visible_devices_ == 0) {
    tag::kStrategy.fail("accelerator 'cuda': no usable GPU (", cuda::unavailable_reason(),
                        "); use accelerator 'cpu'");
  }
#else
  tag::kStrategy.fail(
      "accelerator 'cuda' is not available in this build; configure with "
      "-DLOOM_WITH_CUDA=ON on a machine with the CUDA toolkit, or use 'cpu'");
#endif
}

CUDAAccelerator::CUDAAccelerator(int visible_devices) : visible_devices_(visible_devices) {
  if (visible_devices < 1)
    tag::kStrategy.fail("accelerator 'cuda' with ", visible_devices,
                        " visible GPUs: expected at least 1");
}

void CUDAAccelerator::select(const std::vector<int>& indices) {
  for (int index : indices) {
    if (index < 0 || index >= visible_devices_) {
      tag::kStrategy.fail("GPU index ", index, " is not visible: this process sees ",
                          visible_devices_, " GPU(s), indices 0..", visible_devices_ - 1,
                          " (after CUDA_VISIBLE_DEVICES)");
    }
  }
  selected_ = indices;
}

Device CUDAAccelerator::device(int local_rank) const {
  if (selected_.empty()) return Device::cuda(local_rank % visible_devices_);
  return Device::cuda(selected_[static_cast<size_t>(local_rank) % selected_.size()]);
}

std::shared_ptr<Accelerator> make_accelerator(const std::string& name) {
  if (name == "cpu" || name == "auto") return std::make_shared<CPUAccelerator>();
  if (name == "cuda" || name == "gpu") return std::make_shared<CUDAAccelerator>();
  tag::kStrategy.fail("unknown accelerator '", name, "'; expected 'cpu', 'cuda' or 'auto'");
}

void SafetensorsCheckpointIO::save(const std::filesystem::path& path,
                                   const std::map<std::string, Tensor>& state) {
  safetensors::save(path, state);
}

std::map<std::string, Tensor> SafetensorsCheckpointIO::load(const std::filesystem::path& path) {
  return safetensors::load(path).tensors;
}

}  // namespace loom::strategies
