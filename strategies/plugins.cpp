#include "strategies/plugins.h"

#include "tensor/safetensors.h"

namespace loom::strategies {

std::shared_ptr<Accelerator> make_accelerator(const std::string& name) {
  if (name == "cpu" || name == "auto") return std::make_shared<CPUAccelerator>();
  fail("[strategy] accelerator '", name,
       "' is not available in this build; expected 'cpu' or 'auto' (CUDA needs LOOM_WITH_CUDA)");
}

void SafetensorsCheckpointIO::save(const std::filesystem::path& path,
                                   const std::map<std::string, Tensor>& state) {
  safetensors::save(path, state);
}

std::map<std::string, Tensor> SafetensorsCheckpointIO::load(const std::filesystem::path& path) {
  return safetensors::load(path).tensors;
}

}  // namespace loom::strategies
