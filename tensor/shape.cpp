#include "tensor/shape.h"

#include <algorithm>

#include "core/error.h"

namespace loom {

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  return strides;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  int64_t wrapped = dim < 0 ? dim + ndim : dim;
  if (wrapped < 0 || wrapped >= ndim) {
    fail(op, ": dimension ", dim, " is out of range for a tensor with ", ndim, " dimensions");
  }
  return wrapped;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  size_t ndim = std::max(a.size(), b.size());
  Shape out(ndim);
  for (size_t i = 0; i < ndim; ++i) {
    int64_t da = i < ndim - a.size() ? 1 : a[i - (ndim - a.size())];
    int64_t db = i < ndim - b.size() ? 1 : b[i - (ndim - b.size())];
    if (da != db && da != 1 && db != 1) {
      fail(op, ": shapes ", shape_str(a), " and ", shape_str(b), " cannot be broadcast (dimension ",
           i, ": ", da, " vs ", db, ")");
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace loom
