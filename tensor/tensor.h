#pragma once
// Tensor: a cheap value handle to a shared descriptor (shape, strides, offset, dtype,
// device, storage, autograd state). Copies of a Tensor alias the same tensor; views made by
// reshape/permute/narrow/expand share storage with their base.

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "tensor/device.h"
#include "tensor/shape.h"
#include "tensor/storage.h"

namespace loom {

namespace autograd {
class Node;
class AccumulateGrad;
}  // namespace autograd

class Tensor;
// Called with the parameter once its gradient for the current backward pass is complete.
using GradReadyHook = std::function<void(Tensor& parameter)>;

struct TensorImpl {
  Shape shape;
  Shape strides;
  int64_t offset = 0;  // in elements, into storage
  DType dtype = DType::F32;
  std::shared_ptr<Storage> storage;

  // Autograd state. A tensor with grad_fn is the output of a recorded op; a tensor with
  // requires_grad and no grad_fn is a leaf whose gradient accumulates into `grad`.
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;
  uint32_t output_nr = 0;  // which output of grad_fn this tensor is
  std::weak_ptr<autograd::AccumulateGrad> grad_accumulator;
  std::vector<GradReadyHook> grad_ready_hooks;
};

class Tensor {
 public:
  Tensor() = default;  // an undefined tensor; most calls on it throw
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // --- creation -------------------------------------------------------------------------
  static Tensor empty(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::F32,
                     Device device = Device::cpu());
  // Copies `values` (row-major, numel(shape) of them) into a new tensor of T's dtype.
  template <typename T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape,
                            Device device = Device::cpu());
  // A view over existing storage; used by view ops. Strides and offset are in elements.
  static Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset);

  // --- metadata -------------------------------------------------------------------------
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t offset() const { return impl().offset; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t dim) const;  // negative dims count from the end
  int64_t numel() const { return numel_of(impl().shape); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  bool is_contiguous() const;
  // Whether this handle is all that can see its memory: no other handle to its descriptor, no
  // other tensor on its storage, which it covers exactly, contiguous from the start. Such a
  // tensor may be taken over or overwritten with no one the wiser (the autograd engine's
  // gradients, logits that cross_entropy turns into their gradient).
  bool holds_storage_alone() const;
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  // Same descriptor (not merely same storage).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }
  TensorImpl& impl() const {
    if (impl_ == nullptr) [[unlikely]]
      throw_undefined();
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }

  // --- data access (host memory only) ---------------------------------------------------
  // Pointer to the first element; throws if T does not match dtype().
  template <typename T>
  T* data() const;
  // Untyped pointer to the first element, any device but meta (whose tensors hold no bytes:
  // it throws, naming the tensor).
  void* raw_data() const {
    const TensorImpl& t = impl();
    if (t.storage->device().is_meta()) [[unlikely]]
      throw_no_data();
    return static_cast<char*>(t.storage->data()) +
           t.offset * static_cast<int64_t>(dtype_size(t.dtype));
  }
  // Copies the elements (any layout, CPU only) into a row-major vector of T's dtype.
  template <typename T>
  std::vector<T> to_vector() const;
  // The single element of a one-element tensor, converted to double.
  double item() const;

  // --- conversions (recorded by autograd) -----------------------------------------------
  Tensor contiguous() const;  // returns *this when already contiguous
  Tensor to(DType dtype) const;
  // A copy on `device` (gradients flow back to this device). A copy to the CPU has finished
  // when this returns; one to a GPU is queued on its current stream.
  Tensor to(Device device) const;
  Tensor clone() const;  // a new contiguous copy with its own storage
  // A contiguous copy of this CPU tensor in pinned (page-locked) memory, or *this when it is
  // pinned already (torch's pin_memory): copies between it and a GPU go straight to the copy
  // engine. Not recorded by autograd. Throws loom::Error off the CPU or without CUDA.
  Tensor pin_memory() const;
  bool is_pinned() const;
  // Points this tensor (and every handle sharing it) at `source`'s data: storage, shape,
  // strides, offset and dtype. Its identity, requires_grad and hooks stay; its gradient is
  // dropped. For moving parameters between devices (torch's `param.data = ...`). Not
  // recorded by autograd; views made earlier keep the old data.
  void set_data(const Tensor& source) const;

  // --- views (recorded by autograd); see tensor/ops.h for the full list --------------------
  Tensor reshape(const Shape& shape) const;
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t dim0, int64_t dim1) const;
  Tensor narrow(int64_t dim, int64_t start, int64_t length) const;
  Tensor expand(const Shape& shape) const;

  // --- autograd -------------------------------------------------------------------------
  bool requires_grad() const { return impl().requires_grad; }
  // Marks a leaf as a parameter whose gradient accumulates into grad(). Returns *this.
  Tensor& set_requires_grad(bool value);
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  Tensor grad() const;  // undefined until a backward pass reached this leaf
  void set_grad(const Tensor& grad) const;
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl().grad_fn; }
  // Back-propagates from this tensor. `gradient` defaults to 1 for a one-element tensor.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  // Same storage, no history, requires_grad false.
  Tensor detach() const;
  // Fires once per backward pass, after this leaf's gradient is fully accumulated.
  void register_grad_ready_hook(GradReadyHook hook) const;

  std::string str() const;  // "Tensor(f32, [2, 3], cpu)"

 private:
  [[noreturn]] static void throw_undefined();
  [[noreturn]] void throw_no_data() const;
  std::shared_ptr<TensorImpl> impl_;
};

// Scoped switch-off of graph recording (optimizer steps, evaluation). Thread-local.
class NoGradGuard {
 public:
  NoGradGuard();
  ~NoGradGuard();
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

// Scoped switch-on of graph recording, e.g. for recomputation inside a backward pass.
class EnableGradGuard {
 public:
  EnableGradGuard();
  ~EnableGradGuard();
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

bool grad_mode_enabled();

std::ostream& operator<<(std::ostream& out, const Tensor& tensor);

}  // namespace loom
