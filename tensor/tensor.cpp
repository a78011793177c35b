#include "tensor/tensor.h"

#include <cstring>
#include <sstream>

#include "tensor/autograd/node.h"
#include "tensor/ops.h"

namespace loom {

namespace {
thread_local bool grad_mode = true;
}  // namespace

bool grad_mode_enabled() {
  return grad_mode;
}
NoGradGuard::NoGradGuard() : previous_(grad_mode) {
  grad_mode = false;
}
NoGradGuard::~NoGradGuard() {
  grad_mode = previous_;
}
EnableGradGuard::EnableGradGuard() : previous_(grad_mode) {
  grad_mode = true;
}
EnableGradGuard::~EnableGradGuard() {
  grad_mode = previous_;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  // The size in bytes, refusing a shape whose element count or byte count does not fit in
  // int64 (a corrupt file's header, a product of dimensions gone wrong), which would
  // otherwise wrap around to a small or negative allocation.
  int64_t bytes = static_cast<int64_t>(dtype_size(dtype));
  for (int64_t d : shape) {
    if (d < 0) fail("Tensor::empty: negative dimension in shape ", shape_str(shape));
    if (__builtin_mul_overflow(bytes, d, &bytes)) {
      fail("Tensor::empty: shape ", shape_str(shape), " of ", dtype_name(dtype),
           " needs more than 2^63 bytes; check the shape");
    }
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = dtype;
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(bytes), device);
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  fill_(t, value);
  return t;
}

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device) {
  check_eq(static_cast<int64_t>(values.size()), numel_of(shape),
           "Tensor::from_vector: number of values vs numel of shape " + shape_str(shape));
  Tensor host = empty(shape, dtype_of<T>(), Device::cpu());
  if (!values.empty()) std::memcpy(host.raw_data(), values.data(), values.size() * sizeof(T));
  return device.is_cpu() ? host : host.to(device);
}

Tensor Tensor::make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  impl->storage = base.storage();
  return Tensor(std::move(impl));
}

void Tensor::throw_undefined() {
  throw Error("use of an undefined Tensor (default-constructed or moved-from)");
}

void Tensor::throw_no_data() const {
  fail("the data of ", str(),
       " was asked for, but a meta tensor holds no bytes: the op that asked has no meta "
       "implementation (tensor/meta.h says how to add one)");
}

int64_t Tensor::size(int64_t d) const {
  return shape()[wrap_dim(d, dim(), "Tensor::size")];
}

bool Tensor::holds_storage_alone() const {
  return impl_.use_count() == 1 && storage().use_count() == 1 && offset() == 0 && is_contiguous() &&
         storage()->nbytes() == nbytes();
}

bool Tensor::is_contiguous() const {
  const Shape& s = shape();
  const Shape& st = strides();
  if (numel() == 0) return true;  // no element to be out of place (as in PyTorch)
  int64_t expected = 1;
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] == 1) continue;
    if (st[i] != expected) return false;
    expected *= s[i];
  }
  return true;
}

template <typename T>
T* Tensor::data() const {
  if (dtype() != dtype_of<T>()) {
    fail("Tensor::data<", dtype_of<T>(), ">: tensor has dtype ", dtype());
  }
  return static_cast<T*>(raw_data());
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  Tensor host = to(Device::cpu()).to(dtype_of<T>()).contiguous();
  std::vector<T> values(static_cast<size_t>(host.numel()));
  if (!values.empty()) std::memcpy(values.data(), host.raw_data(), values.size() * sizeof(T));
  return values;
}

double Tensor::item() const {
  check(numel() == 1, "Tensor::item: expected one element, tensor has shape " + shape_str(shape()));
  return to_vector<double>()[0];
}

Tensor Tensor::contiguous() const {
  return loom::contiguous(*this);
}
Tensor Tensor::to(DType dtype) const {
  return dtype == this->dtype() ? *this : cast(*this, dtype);
}

Tensor Tensor::to(Device device) const {
  if (device == this->device()) return *this;
  Tensor src = *this;
  Tensor out = empty(shape(), dtype(), device);
  {
    NoGradGuard no_grad;
    copy_(out, src);
  }
  if (autograd::any_requires_grad({src})) {
    autograd::record("ToDevice", {src}, {out},
                     [from = this->device()](const std::vector<Tensor>& g, const autograd::Node&) {
                       return std::vector<Tensor>{g[0].to(from)};
                     });
  }
  return out;
}

void Tensor::set_data(const Tensor& source) const {
  check(source.defined(), "Tensor::set_data: the source tensor is undefined");
  check(is_leaf(), "Tensor::set_data: only leaf tensors (parameters) can be repointed");
  TensorImpl& target = impl();
  const TensorImpl& from = source.impl();
  // The new memory takes over the old one's role in memory reports (a parameter moved to
  // another device or into a flat buffer is still a parameter).
  if (target.storage && from.storage && from.storage->kind() == MemoryKind::Activations)
    from.storage->set_kind(target.storage->kind());
  target.shape = from.shape;
  target.strides = from.strides;
  target.offset = from.offset;
  target.dtype = from.dtype;
  target.storage = from.storage;
  target.grad.reset();
}

Tensor Tensor::pin_memory() const {
  if (is_pinned()) return *this;
  if (!device().is_cpu()) fail("pin_memory: ", str(), " is not on the CPU");
  NoGradGuard no_grad;
  Tensor out = empty(shape(), dtype(), device());
  copy_(out, *this);
  out.storage()->pin();
  return out;
}

bool Tensor::is_pinned() const {
  return defined() && storage() && storage()->pinned();
}

Tensor Tensor::clone() const {
  Tensor src = *this;
  Tensor out = empty(shape(), dtype(), device());
  {
    NoGradGuard no_grad;
    copy_(out, src);
  }
  if (autograd::any_requires_grad({src})) {
    autograd::record("Clone", {src}, {out},
                     [](const std::vector<Tensor>& g, const autograd::Node&) { return g; });
  }
  return out;
}

Tensor Tensor::reshape(const Shape& s) const {
  return loom::reshape(*this, s);
}
Tensor Tensor::permute(const std::vector<int64_t>& d) const {
  return loom::permute(*this, d);
}
Tensor Tensor::transpose(int64_t a, int64_t b) const {
  return loom::transpose(*this, a, b);
}
Tensor Tensor::narrow(int64_t d, int64_t s, int64_t n) const {
  return loom::narrow(*this, d, s, n);
}
Tensor Tensor::expand(const Shape& s) const {
  return loom::expand(*this, s);
}

Tensor& Tensor::set_requires_grad(bool value) {
  if (!is_leaf()) {
    fail("set_requires_grad: ", str(),
         " is the output of an op; only leaves can be marked (use detach() first)");
  }
  if (value && !is_floating(dtype())) {
    fail("set_requires_grad: only floating tensors can require grad, got ", dtype());
  }
  impl().requires_grad = value;
  return *this;
}

Tensor Tensor::grad() const {
  return impl().grad ? Tensor(impl().grad) : Tensor();
}

void Tensor::set_grad(const Tensor& grad) const {
  if (grad.defined()) {
    check(grad.shape() == shape(), "set_grad: gradient shape " + shape_str(grad.shape()) +
                                       " does not match tensor shape " + shape_str(shape()));
  }
  impl().grad = grad.defined() ? grad.impl_ptr() : nullptr;
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  autograd::run_backward({*this}, {gradient}, retain_graph);
}

Tensor Tensor::detach() const {
  return make_view(*this, shape(), strides(), offset());
}

void Tensor::register_grad_ready_hook(GradReadyHook hook) const {
  check(is_leaf() && requires_grad(),
        "register_grad_ready_hook: " + str() + " is not a leaf that requires grad");
  impl().grad_ready_hooks.push_back(std::move(hook));
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  std::ostringstream out;
  out << "Tensor(" << dtype() << ", " << shape_str(shape()) << ", " << device() << ")";
  return out.str();
}

std::ostream& operator<<(std::ostream& out, const Tensor& tensor) {
  return out << tensor.str();
}

#define LOOM_INSTANTIATE(T)                                                            \
  template Tensor Tensor::from_vector<T>(const std::vector<T>&, const Shape&, Device); \
  template T* Tensor::data<T>() const;                                                 \
  template std::vector<T> Tensor::to_vector<T>() const;
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(double)
LOOM_INSTANTIATE(BFloat16)
LOOM_INSTANTIATE(Half)
LOOM_INSTANTIATE(int32_t)
LOOM_INSTANTIATE(int64_t)
LOOM_INSTANTIATE(uint8_t)
#undef LOOM_INSTANTIATE

}  // namespace loom
