#pragma once
// Shapes and strides (in elements), and the broadcasting rule shared by all ops.

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace loom {

using Shape = std::vector<int64_t>;

inline int64_t numel_of(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape)
    n *= d;
  return n;
}
Shape contiguous_strides(const Shape& shape);
// Wraps a possibly negative dimension index into [0, ndim); throws naming `op` when out of range.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);
// NumPy broadcasting of two shapes; throws loom::Error naming `op` and both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
std::string shape_str(const Shape& shape);  // "[2, 3]"

}  // namespace loom

namespace std {
// Lets LOOM checks and error messages print shapes.
inline ostream& operator<<(ostream& out, const vector<int64_t>& shape) {
  return out << loom::shape_str(shape);
}
}  // namespace std
