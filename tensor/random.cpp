#include "tensor/random.h"

#include <cmath>
#include <numbers>
#include <vector>

#include "tensor/meta.h"
#include "tensor/ops.h"

namespace loom {

double Generator::uniform() {
  return static_cast<double>(engine_() >> 11) * 0x1.0p-53;
}

double Generator::normal() {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  double u1 = 1.0 - uniform();  // (0, 1], keeps log finite
  double u2 = uniform();
  double radius = std::sqrt(-2.0 * std::log(u1));
  double angle = 2.0 * std::numbers::pi * u2;
  spare_ = radius * std::sin(angle);
  has_spare_ = true;
  return radius * std::cos(angle);
}

namespace {

template <typename Draw>
void fill_with(Tensor& t, Draw draw, const char* op) {
  if (!is_floating(t.dtype())) fail(op, ": expected a floating tensor, got ", t.dtype());
  if (reports_op_cost(t.device())) {
    record_meta_op(op, OpClass::Copy, 0, {}, {t});
  }
  if (t.device().is_meta()) {  // no values to draw: the generator does not advance
    return;
  }
  std::vector<double> values(static_cast<size_t>(t.numel()));
  for (double& v : values)
    v = draw();
  copy_(t, Tensor::from_vector(values, t.shape()));
}

}  // namespace

void normal_(Tensor& t, double mean, double stddev, Generator& gen) {
  fill_with(
      t, [&] { return mean + stddev * gen.normal(); }, "normal_");
}

void uniform_(Tensor& t, double low, double high, Generator& gen) {
  fill_with(
      t, [&] { return low + (high - low) * gen.uniform(); }, "uniform_");
}

}  // namespace loom
