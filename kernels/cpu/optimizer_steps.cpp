#include "kernels/cpu/optimizer_steps.h"

#include <cmath>
#include <type_traits>

#include "kernels/cpu/thread_pool.h"

// The AdamW loop calls sqrt. Under the default -fmath-errno GCC guards every call with a branch
// (to set errno for negative inputs) and cannot vectorise the loop; optim/CMakeLists.txt
// therefore compiles this file with -fno-math-errno. Nothing in Loom reads errno.

namespace loom::kernels::cpu {

// Elements per chunk below which the optimizer steps stay on one thread (waking a worker
// costs more than updating fewer).
constexpr int64_t kParallelGrain = 1 << 15;

namespace {

// Both loops keep each statement in the order of the torch op it mirrors; see
// Note [Matching PyTorch's optimizer arithmetic]. All scalars are hoisted and rounded to T
// before the loop, and the loops have no data-dependent branches, so they vectorise.
template <typename T>
struct AdamWScalars {
  T decay, beta1, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps,
      neg_step_size;
};

template <typename T>
void adamw_loop(T* __restrict p, const T* __restrict g, T* __restrict m, T* __restrict v, int64_t n,
                const AdamWScalars<T> s) {
  for (int64_t i = 0; i < n; ++i) {
    const T gi = g[i];
    const T pi = p[i] * s.decay;                                // param.mul_(1 - lr*wd)
    const T mi = m[i] * s.beta1 + s.one_minus_beta1 * gi;       // exp_avg.mul_(b1).add_(g, 1-b1)
    const T vi = v[i] * s.beta2 + s.one_minus_beta2 * gi * gi;  // .mul_(b2).addcmul_(g, g, 1-b2)
    const T denom = std::sqrt(vi) / s.bias_correction2_sqrt + s.eps;
    m[i] = mi;
    v[i] = vi;
    p[i] = pi + s.neg_step_size * mi / denom;  // param.addcdiv_(exp_avg, denom, -step_size)
  }
}

}  // namespace

template <typename T>
void adamw_step(T* param, const T* grad, T* exp_avg, T* exp_avg_sq, int64_t n,
                const AdamWStepArgs& args) {
  const double step = static_cast<double>(args.step);
  const double bias_correction1 = 1.0 - std::pow(args.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(args.beta2, step);
  AdamWScalars<T> s;
  s.decay = static_cast<T>(1.0 - args.lr * args.weight_decay);
  s.beta1 = static_cast<T>(args.beta1);
  s.one_minus_beta1 = static_cast<T>(1.0 - args.beta1);
  s.beta2 = static_cast<T>(args.beta2);
  s.one_minus_beta2 = static_cast<T>(1.0 - args.beta2);
  s.bias_correction2_sqrt = static_cast<T>(std::sqrt(bias_correction2));
  s.eps = static_cast<T>(args.eps);
  s.neg_step_size = static_cast<T>(-(args.lr / bias_correction1));
  // Elementwise: any split gives the same bits (kernels/cpu/thread_pool.h).
  parallel_for(n, kParallelGrain, [&](int64_t begin, int64_t end) {
    adamw_loop(param + begin, grad + begin, exp_avg + begin, exp_avg_sq + begin, end - begin, s);
  });
}

namespace {

// One loop per combination of the SGD switches, chosen at compile time so that the inner loop
// has no branches.
template <typename T, bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
void sgd_loop(T* __restrict p, const T* __restrict g, T* __restrict buf, int64_t n,
              const SGDStepArgs& args) {
  const T weight_decay = static_cast<T>(args.weight_decay);
  const T momentum = static_cast<T>(args.momentum);
  const T one_minus_dampening = static_cast<T>(1.0 - args.dampening);
  const T neg_lr = static_cast<T>(-args.lr);
  for (int64_t i = 0; i < n; ++i) {
    T d = g[i];
    if constexpr (kDecay) d = d + weight_decay * p[i];  // d_p.add(param, alpha=wd)
    if constexpr (kMomentum) {
      T b;
      if constexpr (kFirst) {
        b = d;  // torch.clone(d_p)
      } else {
        b = buf[i] * momentum + one_minus_dampening * d;  // buf.mul_(m).add_(d_p, 1-dampening)
      }
      buf[i] = b;
      if constexpr (kNesterov) {
        d = d + momentum * b;  // d_p.add(buf, alpha=momentum)
      } else {
        d = b;
      }
    }
    p[i] = p[i] + neg_lr * d;  // param.add_(d_p, alpha=-lr)
  }
}

// Calls f(std::true_type{}) or f(std::false_type{}).
template <typename F>
void with_bool(bool value, F&& f) {
  if (value) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

constexpr int kLanes = 8;  // independent partial sums, so that the reductions vectorise

}  // namespace

template <typename T>
void sgd_step(T* param, const T* grad, T* momentum_buffer, int64_t n, const SGDStepArgs& args) {
  with_bool(args.weight_decay != 0.0, [&](auto decay) {
    with_bool(args.momentum != 0.0, [&](auto momentum) {
      with_bool(args.first_step, [&](auto first) {
        with_bool(args.nesterov, [&](auto nesterov) {
          parallel_for(n, kParallelGrain, [&](int64_t begin, int64_t end) {
            sgd_loop<T, decltype(decay)::value, decltype(momentum)::value,
                     decltype(first)::value, decltype(nesterov)::value>(
                param + begin, grad + begin,
                momentum_buffer != nullptr ? momentum_buffer + begin : nullptr, end - begin,
                args);
          });
        });
      });
    });
  });
}

template <typename T>
double sum_of_squares(const T* x, int64_t n) {
  double partial[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double v = static_cast<double>(x[i + j]);
      partial[j] += v * v;
    }
  }
  double total = 0.0;
  for (; i < n; ++i)
    total += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  for (double s : partial)
    total += s;
  return total;
}

template <typename T>
double sum_of_abs_powers(const T* x, int64_t n, double p) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i)
    total += std::pow(std::abs(static_cast<double>(x[i])), p);
  return total;
}

template <typename T>
double max_abs(const T* x, int64_t n) {
  // `a > m || a != a` keeps a NaN once seen (comparisons with NaN are false), like torch's max.
  double partial[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double a = std::abs(static_cast<double>(x[i + j]));
      partial[j] = (a > partial[j] || a != a) ? a : partial[j];
    }
  }
  double result = 0.0;
  for (; i < n; ++i) {
    const double a = std::abs(static_cast<double>(x[i]));
    result = (a > result || a != a) ? a : result;
  }
  for (double a : partial)
    result = (a > result || a != a) ? a : result;
  return result;
}

#define LOOM_INSTANTIATE(T)                                                         \
  template void adamw_step<T>(T*, const T*, T*, T*, int64_t, const AdamWStepArgs&); \
  template void sgd_step<T>(T*, const T*, T*, int64_t, const SGDStepArgs&);         \
  template double sum_of_squares<T>(const T*, int64_t);                             \
  template double sum_of_abs_powers<T>(const T*, int64_t, double);                  \
  template double max_abs<T>(const T*, int64_t);
LOOM_INSTANTIATE(float)
LOOM_INSTANTIATE(double)
#undef LOOM_INSTANTIATE

}  // namespace loom::kernels::cpu
