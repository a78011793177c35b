#include "strategies/plugins.h"

#if LOOM_WITH_CUDA
#include "tensor/cuda/device.h"
#endif

#include "tensor/safetensors.h"

namespace loom::strategies {

CUDAAccelerator::CUDAAccelerator() {
#if LOOM_WITH_CUDA
  device_count_ = cuda::device_count();
  if (device_count_ == 0) {
    fail("[strategy] accelerator 'cuda': no usable GPU (", cuda::unavailable_reason(),
         "); use accelerator 'cpu'");
  }
#else
  fail("[strategy] accelerator 'cuda' is not available in this build; configure with "
       "-DLOOM_WITH_CUDA=ON on a machine with the CUDA toolkit, or use 'cpu'");
#endif
}

Device CUDAAccelerator::device(int local_rank) const {
  return Device::cuda(local_rank % device_count_);
}

std::shared_ptr<Accelerator> make_accelerator(const std::string& name) {
  if (name == "cpu" || name == "auto") return std::make_shared<CPUAccelerator>();
  if (name == "cuda" || name == "gpu") return std::make_shared<CUDAAccelerator>();
  fail("[strategy] unknown accelerator '", name, "'; expected 'cpu', 'cuda' or 'auto'");
}

void SafetensorsCheckpointIO::save(const std::filesystem::path& path,
                                   const std::map<std::string, Tensor>& state) {
  safetensors::save(path, state);
}

std::map<std::string, Tensor> SafetensorsCheckpointIO::load(const std::filesystem::path& path) {
  return safetensors::load(path).tensors;
}

}  // namespace loom::strategies
