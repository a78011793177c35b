#pragma once
// The replaceable parts a Strategy is composed of (Lightning's accelerator, checkpoint I/O
// and cluster-environment plugins). Each has a default; users hand in their own with
// Strategy::set_accelerator / set_checkpoint_io and ParallelStrategy::set_cluster_environment.

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tensor/tensor.h"

namespace loom::strategies {

class Accelerator {
 public:
  virtual ~Accelerator() = default;
  virtual std::string name() const = 0;
  // How many devices this accelerator can address: the visible GPUs (CUDA_VISIBLE_DEVICES
  // applied, as the driver reports them), 1 for the CPU.
  virtual int visible_devices() const = 0;
  // The devices the job uses, as indices into the visible ones (parse_devices' selection);
  // all visible devices until this is called.
  virtual void select(const std::vector<int>& indices) = 0;
  // The device local rank `local_rank` computes on: the selected devices in order, wrapping.
  virtual Device device(int local_rank) const = 0;
};

class CPUAccelerator final : public Accelerator {
 public:
  std::string name() const override { return "cpu"; }
  int visible_devices() const override { return 1; }
  void select(const std::vector<int>&) override {}
  Device device(int) const override { return Device::cpu(); }
};

// The meta device (tensor/meta.h): for simulating a rank, with the sim backend's groups
// (comm/sim/sim_backend.h). Not one of make_accelerator's names: a simulation sets it.
class MetaAccelerator final : public Accelerator {
 public:
  std::string name() const override { return "meta"; }
  // A simulated node has as many devices as a job asks for (--devices 8): every rank
  // computes on the one meta device.
  int visible_devices() const override { return kSimulatedDevices; }
  void select(const std::vector<int>&) override {}
  Device device(int) const override { return Device::meta(); }
  static constexpr int kSimulatedDevices = 1 << 20;
};

// NVIDIA GPUs (builds with LOOM_WITH_CUDA). Local rank r computes on the (r mod n)-th of the n
// selected GPUs, so several processes may share one GPU (with the shm backend, which stages
// CUDA tensors through pinned memory; NCCL refuses two ranks on one GPU).
class CUDAAccelerator final : public Accelerator {
 public:
  CUDAAccelerator();  // throws loom::Error saying why when no GPU can be used
  // As if the driver reported `visible_devices` GPUs (tests of device selection).
  explicit CUDAAccelerator(int visible_devices);
  std::string name() const override { return "cuda"; }
  int visible_devices() const override { return visible_devices_; }
  void select(const std::vector<int>& indices) override;  // throws naming a bad index
  Device device(int local_rank) const override;

 private:
  int visible_devices_ = 0;
  std::vector<int> selected_;  // empty: all visible devices
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
