#include "strategies/parameter_parts.h"

#include <cstring>

#include "core/error.h"
#include "core/tags.h"

namespace loom::strategies {

void copy_into_box(Tensor& target, const Shape& offsets, const Shape& sizes, const Tensor& values) {
  if (!target.is_contiguous() || !target.device().is_cpu() || target.dtype() != values.dtype() ||
      sizes.size() != static_cast<size_t>(target.dim()) || offsets.size() != sizes.size()) {
    tag::kCheckpoint.fail("copy_into_box: a ", values.str(), " box of ", shape_str(sizes), " at ",
                          shape_str(offsets), " into ", target.str());
  }
  const Tensor source = values.contiguous();
  const size_t dims = sizes.size();
  if (dims == 0) {
    std::memcpy(target.raw_data(), source.raw_data(), target.nbytes());
    return;
  }
  std::vector<int64_t> stride(dims, 1);
  for (size_t d = dims - 1; d-- > 0;)
    stride[d] = stride[d + 1] * target.size(static_cast<int64_t>(d + 1));
  const int64_t row = sizes[dims - 1];
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < dims; ++d)
    rows *= sizes[d];
  const size_t element = dtype_size(target.dtype());
  auto* into = static_cast<char*>(target.raw_data());
  const auto* from = static_cast<const char*>(source.raw_data());
  std::vector<int64_t> index(dims, 0);
  for (int64_t r = 0; r < rows; ++r) {
    int64_t at = 0;
    for (size_t d = 0; d < dims; ++d)
      at += (offsets[d] + index[d]) * stride[d];
    std::memcpy(into + static_cast<size_t>(at) * element, from + static_cast<size_t>(r * row) * element,
                static_cast<size_t>(row) * element);
    for (size_t d = dims - 1; d-- > 0;) {
      if (++index[d] < sizes[d]) break;
      index[d] = 0;
    }
  }
}

OptimizerLayout optimizer_layout_of(const optim::Optimizer& optimizer, const PartsByTensor& parts,
                                    const std::string& who) {
  OptimizerLayout layout;
  for (const optim::ParamGroup& group : optimizer.param_groups()) {
    layout.emplace_back();
    for (const Tensor& p : group.params) {
      auto found = parts.find(p.impl_ptr().get());
      if (found == parts.end()) {
        Tag(who).fail(
            "the optimizer holds a tensor (", p.str(),
            ") that is not a parameter "
            "of the set-up module; build the optimizer over module.parameters() and set it up "
            "with the strategy");
      }
      layout.back().push_back(found->second);
    }
  }
  return layout;
}

}  // namespace loom::strategies
