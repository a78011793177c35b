#pragma once
// Finite-difference gradient checks in f64 for the op and model tests.

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "tensor/ops.h"
#include "tensor/random.h"

namespace loom::testing {

// A random f64 leaf that requires grad, values in [-1, 1).
inline Tensor random_leaf(const Shape& shape, Generator& gen, bool requires_grad = true) {
  Tensor t = Tensor::empty(shape, DType::F64);
  uniform_(t, -1.0, 1.0, gen);
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

// Checks the gradients of L = sum(f(inputs) * W), W a fixed random tensor, with respect to
// every input that requires grad against central differences with step `eps`.
// |analytic - numeric| <= tol * (1 + |numeric|) elementwise.
inline void expect_gradients_match(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                                   const std::vector<Tensor>& inputs, double eps = 1e-6,
                                   double tol = 1e-6) {
  Generator gen(1234);
  Tensor out = f(inputs);
  Tensor weights = random_leaf(out.shape(), gen, false);
  auto objective = [&]() {
    NoGradGuard no_grad;
    return sum(mul(f(inputs), weights)).item();
  };
  for (const Tensor& in : inputs) {
    if (in.requires_grad()) in.set_grad(Tensor());
  }
  sum(mul(out, weights)).backward();
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].requires_grad()) continue;
    Tensor grad = inputs[i].grad();
    ASSERT_TRUE(grad.defined()) << "input " << i << " received no gradient";
    ASSERT_EQ(grad.shape(), inputs[i].shape());
    std::vector<double> analytic = grad.to_vector<double>();
    double* data = inputs[i].data<double>();
    for (int64_t j = 0; j < inputs[i].numel(); ++j) {
      double saved = data[j];
      data[j] = saved + eps;
      double plus = objective();
      data[j] = saved - eps;
      double minus = objective();
      data[j] = saved;
      double numeric = (plus - minus) / (2 * eps);
      ASSERT_NEAR(analytic[j], numeric, tol * (1 + std::abs(numeric)))
          << "input " << i << ", element " << j;
    }
  }
}

}  // namespace loom::testing
