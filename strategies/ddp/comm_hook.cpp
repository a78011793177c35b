#include "strategies/ddp/comm_hook.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/registry.h"
#include "core/tags.h"
#include "strategies/trace.h"
#include "tensor/ops.h"

namespace loom::strategies {

namespace {

void check_float_bucket(const GradBucket& bucket, const char* hook) {
  DType d = bucket.buffer.dtype();
  if (d != DType::F32 && d != DType::F64) {
    fail("[ddp/", hook, "] expected an f32 or f64 bucket, got ", d);
  }
}

class WorkPending : public PendingBucket {
 public:
  explicit WorkPending(comm::WorkPtr work) : work_(std::move(work)) {}
  void finish() override { work_->wait(); }
  std::optional<Span> comm_span() const override { return measured_span(*work_); }

 private:
  comm::WorkPtr work_;
};

class AllreduceHook : public CommHook {
 public:
  std::string name() const override { return "allreduce"; }
  std::unique_ptr<PendingBucket> launch(const GradBucket& bucket,
                                        comm::ProcessGroup& group) override {
    Tensor buffer = bucket.buffer;
    return std::make_unique<WorkPending>(group.allreduce(buffer, {.op = comm::ReduceOp::Avg}));
  }
};

// The bucket travels as bf16/f16: a quarter/half of the bytes, averaged in that dtype.
class CompressHook : public CommHook {
 public:
  CompressHook(std::string name, DType wire) : name_(std::move(name)), wire_(wire) {}
  std::string name() const override { return name_; }

  std::unique_ptr<PendingBucket> launch(const GradBucket& bucket,
                                        comm::ProcessGroup& group) override {
    check_float_bucket(bucket, name_.c_str());
    auto pending = std::make_unique<Pending>();
    pending->bucket = bucket.buffer;
    pending->wire = bucket.buffer.to(wire_);
    pending->work = group.allreduce(pending->wire, {.op = comm::ReduceOp::Avg});
    return pending;
  }

 private:
  struct Pending : PendingBucket {
    Tensor bucket, wire;
    comm::WorkPtr work;
    void finish() override {
      work->wait();
      NoGradGuard no_grad;
      copy_(bucket, wire);  // converts back to the bucket's dtype
    }
    std::optional<Span> comm_span() const override { return measured_span(*work); }
  };
  std::string name_;
  DType wire_;
};

// --- PowerSGD ------------------------------------------------------------------------------

// A rank-independent generator (splitmix64 + Box-Muller), so every rank draws the same Q
// whatever its standard library.
class Normal {
 public:
  explicit Normal(uint64_t seed) : state_(seed) {}
  double next() {
    double u1 = (static_cast<double>(bits() >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    double u2 = static_cast<double>(bits() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t bits() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

// Modified Gram-Schmidt on the columns of a contiguous rows x cols matrix, in place.
template <typename T>
void orthogonalize(T* a, int64_t rows, int64_t cols, double epsilon) {
  for (int64_t i = 0; i < cols; ++i) {
    double norm = 0;
    for (int64_t k = 0; k < rows; ++k)
      norm += static_cast<double>(a[k * cols + i]) * a[k * cols + i];
    norm = std::sqrt(norm) + epsilon;
    for (int64_t k = 0; k < rows; ++k)
      a[k * cols + i] = static_cast<T>(a[k * cols + i] / norm);
    for (int64_t j = i + 1; j < cols; ++j) {
      double dot = 0;
      for (int64_t k = 0; k < rows; ++k)
        dot += static_cast<double>(a[k * cols + i]) * a[k * cols + j];
      for (int64_t k = 0; k < rows; ++k)
        a[k * cols + j] = static_cast<T>(a[k * cols + j] - dot * a[k * cols + i]);
    }
  }
}

void orthogonalize(Tensor& m, double epsilon) {
  if (m.device().is_cuda()) {
    // Gram-Schmidt over a few columns runs on the CPU: a round trip of a [rows, rank] matrix.
    Tensor host = m.to(Device::cpu());
    orthogonalize(host, epsilon);
    copy_(m, host);
    return;
  }
  const int64_t rows = m.shape()[0], cols = m.shape()[1];
  if (m.dtype() == DType::F64) {
    orthogonalize(static_cast<double*>(m.raw_data()), rows, cols, epsilon);
  } else {
    orthogonalize(static_cast<float*>(m.raw_data()), rows, cols, epsilon);
  }
}

Tensor view_2d(const Tensor& flat_or_view, int64_t rows, int64_t cols, int64_t offset) {
  return Tensor::make_view(flat_or_view, {rows, cols}, {cols, 1}, offset);
}

class PowerSGDHook : public CommHook {
 public:
  explicit PowerSGDHook(const PowerSGDOptions& options) : options_(options) {
    if (options_.matrix_approximation_rank < 1) {
      tag::kDdpPowersgd.fail("matrix_approximation_rank must be >= 1, got ",
                             options_.matrix_approximation_rank);
    }
  }
  std::string name() const override { return "powersgd"; }

  std::unique_ptr<PendingBucket> launch(const GradBucket& bucket,
                                        comm::ProcessGroup& group) override {
    check_float_bucket(bucket, "powersgd");
    if (iter_ < options_.start_powersgd_iter) {
      if (bucket.is_last) ++iter_;
      return plain_.launch(bucket, group);
    }
    NoGradGuard no_grad;
    auto pending = std::make_unique<Pending>();
    Pending& p = *pending;
    p.hook = this;
    p.group = &group;
    p.bucket = bucket;
    BucketState& state = states_[bucket.index];
    Tensor input = bucket.buffer;
    if (options_.use_error_feedback) {
      if (state.error.defined() && state.error.numel() == input.numel()) {
        add_(input, state.error);
      } else {
        state.error = Tensor::zeros(input.shape(), input.dtype(), input.device());
      }
      p.input_copy = input.clone();
    }
    // Sort the gradients into matrices worth compressing and the rest.
    int64_t p_size = 0, q_size = 0;
    for (const Tensor& g : bucket.gradients) {
      if (g.dim() >= 2 && g.numel() > 0) {
        int64_t n = g.shape()[0], m = g.numel() / n;
        int64_t r = std::min({options_.matrix_approximation_rank, n, m});
        if (static_cast<double>((n + m) * r) * options_.min_compression_rate <
            static_cast<double>(n * m)) {
          p.matrices.push_back({view_2d(g, n, m, g.offset()), n, m, r, p_size, q_size});
          p_size += n * r;
          q_size += m * r;
          continue;
        }
      }
      p.uncompressed.push_back(g);
    }
    // Vectors and small matrices: one plain allreduce Avg of their concatenation.
    if (!p.uncompressed.empty()) {
      std::vector<Tensor> flat;
      for (const Tensor& g : p.uncompressed)
        flat.push_back(reshape(g, {-1}));
      p.uncompressed_flat = concat(flat, 0);
      p.uncompressed_work = group.allreduce(p.uncompressed_flat, {.op = comm::ReduceOp::Avg});
    }
    if (p.matrices.empty()) return pending;
    bool fresh = !state.q.defined() || state.q.numel() != q_size;
    if (fresh) {
      state.p = Tensor::zeros({p_size}, input.dtype(), input.device());
      state.q = Tensor::zeros({q_size}, input.dtype(), input.device());
    }
    if (fresh || !options_.warm_start) {
      // Every rank draws the same sequence: the seed and the number of draws so far.
      Normal normal(options_.seed * 0x100000001b3ull + draws_++);
      for (auto& mat : p.matrices) {
        Tensor q = view_2d(state.q, mat.m, mat.r, mat.q_offset);
        std::vector<double> values(mat.m * mat.r);
        for (double& v : values)
          v = normal.next();
        copy_(q, Tensor::from_vector(values, {mat.m, mat.r}));
        orthogonalize(q, options_.orthogonalization_epsilon);
      }
    }
    for (auto& mat : p.matrices) {
      Tensor pv = view_2d(state.p, mat.n, mat.r, mat.p_offset);
      copy_(pv, matmul(mat.matrix, view_2d(state.q, mat.m, mat.r, mat.q_offset)));
    }
    p.p_work = group.allreduce(state.p, {.op = comm::ReduceOp::Sum});
    return pending;
  }

 private:
  struct BucketState {
    Tensor error;  // this rank's compression residual, added to the next gradient
    Tensor p, q;   // all P and Q matrices of the bucket, back to back
  };
  struct Matrix {
    Tensor matrix;  // n x m view into the bucket
    int64_t n, m, r, p_offset, q_offset;
  };
  struct Pending : PendingBucket {
    PowerSGDHook* hook = nullptr;
    comm::ProcessGroup* group = nullptr;
    GradBucket bucket;
    Tensor input_copy, uncompressed_flat;
    std::vector<Tensor> uncompressed;
    std::vector<Matrix> matrices;
    comm::WorkPtr uncompressed_work, p_work;
    void finish() override { hook->finish(*this); }
  };

  void finish(Pending& p) {
    NoGradGuard no_grad;
    BucketState& state = states_[p.bucket.index];
    if (p.uncompressed_work) {
      p.uncompressed_work->wait();
      int64_t offset = 0;
      for (Tensor& g : p.uncompressed) {
        copy_(g, reshape(narrow(p.uncompressed_flat, 0, offset, g.numel()), g.shape()));
        offset += g.numel();
      }
    }
    if (p.p_work) {
      p.p_work->wait();
      for (auto& mat : p.matrices) {
        Tensor pv = view_2d(state.p, mat.n, mat.r, mat.p_offset);
        orthogonalize(pv, options_.orthogonalization_epsilon);
        Tensor mt = contiguous(transpose(mat.matrix, 0, 1));
        Tensor qv = view_2d(state.q, mat.m, mat.r, mat.q_offset);
        copy_(qv, matmul(mt, pv));
      }
      p.group->allreduce(state.q, {.op = comm::ReduceOp::Sum})->wait();
      mul_(state.q, 1.0 / p.group->size());
      for (auto& mat : p.matrices) {
        Tensor pv = view_2d(state.p, mat.n, mat.r, mat.p_offset);
        Tensor qt = contiguous(transpose(view_2d(state.q, mat.m, mat.r, mat.q_offset), 0, 1));
        copy_(mat.matrix, matmul(pv, qt));
      }
    }
    if (options_.use_error_feedback) state.error = sub(p.input_copy, p.bucket.buffer);
    if (p.bucket.is_last) ++iter_;
  }

  PowerSGDOptions options_;
  AllreduceHook plain_;
  int64_t iter_ = 0;    // backward passes seen (counted at the last bucket)
  uint64_t draws_ = 0;  // random Q initialisations so far
  std::unordered_map<size_t, BucketState> states_;
};

// --- registry ------------------------------------------------------------------------------

// The built-in hooks, added when the registry is first used.
struct Registry : NamedRegistry<CommHookEntry> {
  Registry() : NamedRegistry<CommHookEntry>(tag::kDdp, "comm hook") {
    add("allreduce", {[] { return std::make_unique<AllreduceHook>(); },
                      "allreduce Avg of each bucket (the default)"});
    add("bf16_compress",
        {[] { return std::make_unique<CompressHook>("bf16_compress", DType::BF16); },
         "buckets travel and are averaged as bf16, then cast back"});
    add("fp16_compress",
        {[] { return std::make_unique<CompressHook>("fp16_compress", DType::F16); },
         "buckets travel and are averaged as f16, then cast back"});
    add("powersgd", {[] { return make_powersgd_hook(); },
                     "PowerSGD compression with error feedback (rank 1 after 1000 "
                     "iterations of allreduce unless ReducerOptions::powersgd says "
                     "otherwise)"});
  }
};

Registry& registry() {
  static Registry instance;
  return instance;
}

}  // namespace

std::optional<PendingBucket::Span> span_of(const comm::Work& work) {
  return measured_span(work);
}

std::unique_ptr<CommHook> make_powersgd_hook(const PowerSGDOptions& options) {
  return std::make_unique<PowerSGDHook>(options);
}

void CommHookRegistry::add(const std::string& name, CommHookEntry entry) {
  registry().add(name, std::move(entry));
}

bool CommHookRegistry::remove(const std::string& name) {
  return registry().remove(name);
}

bool CommHookRegistry::contains(const std::string& name) {
  return registry().contains(name);
}

std::unique_ptr<CommHook> CommHookRegistry::create(const std::string& name) {
  std::unique_ptr<CommHook> hook = registry().at(name).factory();
  check(hook != nullptr,
        tag::kDdp.prefix() + "the factory of comm hook '" + name + "' returned null");
  return hook;
}

std::vector<std::pair<std::string, std::string>> CommHookRegistry::list() {
  return registry().list();
}

void register_comm_hook(const std::string& name, CommHookFactory factory, std::string description) {
  CommHookRegistry::add(name, {std::move(factory), std::move(description)});
}

bool remove_comm_hook(const std::string& name) {
  return CommHookRegistry::remove(name);
}

std::unique_ptr<CommHook> make_comm_hook(const std::string& name) {
  return CommHookRegistry::create(name);
}

std::vector<std::pair<std::string, std::string>> available_comm_hooks() {
  return CommHookRegistry::list();
}

}  // namespace loom::strategies
