#pragma once
// Where a tensor's bytes live. Every op dispatches on this; nothing assumes the CPU.

#include <cstdint>
#include <ostream>
#include <string>
#include <string_view>

namespace loom {

// Meta: tensors with shape, dtype and device but no storage; ops on them compute nothing
// and report their cost instead (tensor/meta.h). The simulator runs real code on it.
enum class DeviceType : uint8_t { CPU, CUDA, Meta };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;  // always 0 for the CPU and meta

  static Device cpu() { return {DeviceType::CPU, 0}; }
  static Device cuda(int index = 0) { return {DeviceType::CUDA, index}; }
  static Device meta() { return {DeviceType::Meta, 0}; }
  // Parses "cpu", "cuda", "cuda:N", "meta"; throws loom::Error naming the accepted forms.
  static Device parse(std::string_view text);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool is_meta() const { return type == DeviceType::Meta; }
  std::string str() const;
  friend bool operator==(const Device&, const Device&) = default;
};

std::ostream& operator<<(std::ostream& out, const Device& device);

}  // namespace loom
