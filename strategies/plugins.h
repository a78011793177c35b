#pragma once
// The replaceable parts a Strategy is composed of (Lightning's accelerator, checkpoint I/O
// and cluster-environment plugins). Each has a default; users hand in their own with
// Strategy::set_accelerator / set_checkpoint_io and ParallelStrategy::set_cluster_environment.

#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "tensor/tensor.h"

namespace loom::strategies {

class Accelerator {
 public:
  virtual ~Accelerator() = default;
  virtual std::string name() const = 0;
  // The device local rank `local_rank` computes on.
  virtual Device device(int local_rank) const = 0;
};

class CPUAccelerator final : public Accelerator {
 public:
  std::string name() const override { return "cpu"; }
  Device device(int) const override { return Device::cpu(); }
};

// "cpu" or "auto" (the CPU in this build); anything else is loom::Error naming what exists.
std::shared_ptr<Accelerator> make_accelerator(const std::string& name);

class CheckpointIO {
 public:
  virtual ~CheckpointIO() = default;
  virtual void save(const std::filesystem::path& path,
                    const std::map<std::string, Tensor>& state) = 0;
  virtual std::map<std::string, Tensor> load(const std::filesystem::path& path) = 0;
};

// safetensors files, written atomically (tensor/safetensors.h).
class SafetensorsCheckpointIO final : public CheckpointIO {
 public:
  void save(const std::filesystem::path& path, const std::map<std::string, Tensor>& state) override;
  std::map<std::string, Tensor> load(const std::filesystem::path& path) override;
};

}  // namespace loom::strategies
