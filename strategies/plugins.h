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

// NVIDIA GPUs (builds with LOOM_WITH_CUDA). Local rank r computes on cuda:(r mod the number
// of GPUs), so several processes may share one GPU (with the shm backend, which stages CUDA
// tensors through pinned memory; NCCL refuses two ranks on one GPU).
class CUDAAccelerator final : public Accelerator {
 public:
  CUDAAccelerator();  // throws loom::Error saying why when no GPU can be used
  std::string name() const override { return "cuda"; }
  Device device(int local_rank) const override;

 private:
  int device_count_ = 0;
};

// "cpu", "cuda" or "auto". "auto" is the CPU, even where a GPU is present: the CUDA path has
// not been verified on hardware yet (docs/cuda.md), so using it is an explicit choice.
// Anything else is loom::Error naming what exists.
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
