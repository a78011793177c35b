// DDP communication hooks: the registry (built-ins by name, unknown names, user hooks used
// by the Reducer), bf16/fp16 compression against an f32 allreduce, PowerSGD (warm-up equals
// allreduce, exact on rank-r gradients, error feedback), and bitwise agreement of ranks.
// Ranks are forked processes.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "comm/store/in_process_store.h"
#include "multiprocess.h"
#include "strategies/ddp/comm_hook.h"
#include "strategies/ddp/reducer.h"
#include "tensor/ops.h"

namespace loom::strategies {
namespace {

using comm::testing::expect_all_ok;
using comm::testing::run_ranks;
using namespace std::chrono_literals;

std::shared_ptr<comm::ProcessGroup> group_of(int rank, int size, std::shared_ptr<comm::Store> s) {
  return std::make_shared<comm::ProcessGroup>(rank, size, s, comm::GroupOptions{.timeout = 30s});
}

// Every rank holds the same bits as rank 0.
void expect_same_on_all_ranks(comm::ProcessGroup& pg, const Tensor& mine) {
  Tensor theirs = mine.contiguous().clone();
  pg.broadcast(theirs, {.root = 0})->wait();
  EXPECT_EQ(std::memcmp(mine.raw_data(), theirs.raw_data(), mine.nbytes()), 0)
      << "rank " << pg.rank();
}

// Rank-dependent values of varied magnitude.
std::vector<double> values_for(int rank, int64_t n) {
  std::vector<double> v(n);
  for (int64_t i = 0; i < n; ++i)
    v[i] = std::sin(0.37 * i + rank) * std::pow(10.0, (i % 7) - 3) + 0.01 * rank;
  return v;
}

// One backward through a Reducer whose parameters get gradient `grads[k]` (loss =
// sum(p_k * grads[k])); returns the parameters' averaged gradients.
std::vector<Tensor> reduce_once(Reducer& reducer, const std::vector<Tensor>& params,
                                const std::vector<Tensor>& grads) {
  Tensor loss = sum(mul(params[0], grads[0]));
  for (size_t k = 1; k < params.size(); ++k)
    loss = add(loss, sum(mul(params[k], grads[k])));
  reducer.prepare_for_backward(loss);
  loss.backward();
  reducer.finalize_backward();
  std::vector<Tensor> out;
  for (const Tensor& p : params)
    out.push_back(p.grad().clone());
  return out;
}

TEST(CommHooks, BuiltinsByName) {
  std::vector<std::string> names;
  for (auto& [name, description] : CommHookRegistry::list()) {
    names.push_back(name);
    EXPECT_FALSE(description.empty()) << name;
  }
  for (const char* name : {"allreduce", "bf16_compress", "fp16_compress", "powersgd"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
    EXPECT_EQ(CommHookRegistry::create(name)->name(), name);
  }
}

TEST(CommHooks, UnknownNameListsTheAvailableOnes) {
  try {
    CommHookRegistry::create("bf16_compres");
    FAIL() << "expected loom::Error";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("unknown comm hook 'bf16_compres'"), std::string::npos) << what;
    EXPECT_NE(what.find("did you mean 'bf16_compress'"), std::string::npos) << what;
    EXPECT_NE(what.find("allreduce, bf16_compress, fp16_compress"), std::string::npos) << what;
  }
  auto store = std::make_shared<comm::InProcessStore>();
  auto pg = std::make_shared<comm::ProcessGroup>(0, 1, store);
  Tensor p = Tensor::zeros({3}).set_requires_grad(true);
  EXPECT_THROW(Reducer({p}, pg, {.comm_hook = "nope"}), Error);
  EXPECT_THROW(CommHookRegistry::add(
                   "allreduce", {[] { return CommHookRegistry::create("allreduce"); }, ""}),
               Error);
  EXPECT_THROW(
      CommHookRegistry::add("", {[] { return CommHookRegistry::create("allreduce"); }, ""}),
      Error);
  EXPECT_THROW(CommHookRegistry::add("empty", {nullptr, ""}), Error);
  EXPECT_FALSE(CommHookRegistry::contains("empty"));
}

// A user hook: allreduce Sum, then scale by 1/W in finish(); counts its launches.
int launches = 0;
class SumThenScale : public CommHook {
 public:
  std::string name() const override { return "sum_then_scale"; }
  std::unique_ptr<PendingBucket> launch(const GradBucket& bucket,
                                        comm::ProcessGroup& group) override {
    ++launches;
    struct Pending : PendingBucket {
      Tensor buffer;
      comm::WorkPtr work;
      double scale;
      void finish() override {
        work->wait();
        mul_(buffer, scale);
      }
    };
    auto pending = std::make_unique<Pending>();
    pending->buffer = bucket.buffer;
    pending->scale = 1.0 / group.size();
    pending->work = group.allreduce(pending->buffer, {.op = comm::ReduceOp::Sum});
    return pending;
  }
};

TEST(CommHooks, UserHookIsUsedByTheReducer) {
  CommHookRegistry::add("sum_then_scale",
                        {[] { return std::make_unique<SumThenScale>(); }, "test hook"});
  EXPECT_TRUE(CommHookRegistry::contains("sum_then_scale"));
  expect_all_ok(run_ranks(2, [](int rank, int size, std::shared_ptr<comm::Store> s) {
    auto pg = group_of(rank, size, s);
    std::vector<Tensor> params = {Tensor::zeros({5}, DType::F64).set_requires_grad(true),
                                  Tensor::zeros({4, 3}, DType::F64).set_requires_grad(true)};
    std::vector<Tensor> grads = {Tensor::full({5}, rank + 1.0, DType::F64),
                                 Tensor::full({4, 3}, 10.0 * (rank + 1), DType::F64)};
    // Tiny buckets: one per parameter.
    Reducer reducer(
        params, pg,
        {.bucket_cap_mb = 1e-6, .first_bucket_mb = 1e-6, .comm_hook = "sum_then_scale"});
    ASSERT_EQ(reducer.bucket_assignment().size(), 2u);
    std::vector<Tensor> got = reduce_once(reducer, params, grads);
    EXPECT_EQ(launches, 2);
    for (double v : got[0].to_vector<double>())
      EXPECT_EQ(v, 1.5);
    for (double v : got[1].to_vector<double>())
      EXPECT_EQ(v, 15.0);
  }));
  EXPECT_TRUE(CommHookRegistry::remove("sum_then_scale"));
}

// The verbs before 2026-12-03 still work.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
TEST(CommHooks, TheOldVerbsStillWork) {
  register_comm_hook(
      "sum_then_scale_old", [] { return std::make_unique<SumThenScale>(); }, "test hook");
  bool listed = false;
  for (auto& [name, description] : available_comm_hooks())
    listed |= name == "sum_then_scale_old" && description == "test hook";
  EXPECT_TRUE(listed);
  EXPECT_EQ(make_comm_hook("sum_then_scale_old")->name(), "sum_then_scale");
  EXPECT_TRUE(remove_comm_hook("sum_then_scale_old"));
  EXPECT_THROW(make_comm_hook("sum_then_scale_old"), Error);
}
#pragma GCC diagnostic pop

void check_compression(const std::string& hook, DType wire, double rel_tol) {
  expect_all_ok(run_ranks(3, [&](int rank, int size, std::shared_ptr<comm::Store> s) {
    auto pg = group_of(rank, size, s);
    const int64_t n = 1000;
    Tensor p = Tensor::zeros({n}).set_requires_grad(true);
    Tensor q = Tensor::zeros({10, 7}).set_requires_grad(true);
    Tensor gp = Tensor::from_vector(values_for(rank, n), {n}).to(DType::F32);
    Tensor gq = Tensor::from_vector(values_for(rank + 5, 70), {10, 7}).to(DType::F32);
    Reducer reducer({p, q}, pg, {.first_bucket_mb = 1e-6, .comm_hook = hook});
    std::vector<Tensor> got = reduce_once(reducer, {p, q}, {gp, gq});
    // Reference: f32 allreduce of the same gradients.
    Tensor want_p = gp.clone(), want_q = gq.clone();
    pg->allreduce(want_p, {.op = comm::ReduceOp::Avg})->wait();
    pg->allreduce(want_q, {.op = comm::ReduceOp::Avg})->wait();
    // The result is exactly representable in the wire dtype.
    EXPECT_EQ(got[0].to(wire).to(DType::F32).to_vector<float>(), got[0].to_vector<float>());
    auto compare = [&](const Tensor& a, const Tensor& b) {
      std::vector<float> x = a.to_vector<float>(), y = b.to_vector<float>();
      // Inputs rounded once, the sum rounded once or per step: a few ulps of the largest
      // input, relative to the inputs' magnitude (the average may cancel).
      for (size_t i = 0; i < x.size(); ++i) {
        double scale = 0;
        for (int r = 0; r < size; ++r)
          scale = std::max(scale, std::abs(values_for(r, x.size())[i]));
        ASSERT_NEAR(x[i], y[i], rel_tol * scale + 1e-30) << hook << " element " << i;
      }
    };
    compare(got[0], want_p);
    expect_same_on_all_ranks(*pg, got[0]);
    expect_same_on_all_ranks(*pg, got[1]);
    // Not a plain f32 allreduce: the wire rounding is visible.
    EXPECT_NE(got[0].to_vector<float>(), want_p.to_vector<float>());
  }));
}

TEST(CommHooks, Bf16CompressMatchesF32WithinBf16Precision) {
  check_compression("bf16_compress", DType::BF16, 4 * 0x1.0p-8);
}

TEST(CommHooks, Fp16CompressMatchesF32WithinF16Precision) {
  check_compression("fp16_compress", DType::F16, 4 * 0x1.0p-11);
}

// --- PowerSGD ------------------------------------------------------------------------------

struct PowerSGDCase {
  std::vector<Tensor> params;
  std::unique_ptr<Reducer> reducer;
};

PowerSGDCase powersgd_case(std::shared_ptr<comm::ProcessGroup> pg, const PowerSGDOptions& o) {
  static int serial = 0;
  std::string name = "powersgd_test_" + std::to_string(serial++);
  CommHookRegistry::add(name, {[o] { return make_powersgd_hook(o); }, "test"});
  PowerSGDCase c;
  // A 16 x 12 matrix (compressed), a bias (plain), a 2 x 2 matrix (not worth compressing).
  c.params = {Tensor::zeros({16, 12}, DType::F64).set_requires_grad(true),
              Tensor::zeros({12}, DType::F64).set_requires_grad(true),
              Tensor::zeros({2, 2}, DType::F64).set_requires_grad(true)};
  c.reducer = std::make_unique<Reducer>(c.params, pg, ReducerOptions{.comm_hook = name});
  CommHookRegistry::remove(name);
  return c;
}

Tensor random_matrix(int64_t rows, int64_t cols, int seed) {
  std::vector<double> v(rows * cols);
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = std::fmod(std::abs(std::sin(12.9898 * i + 78.233 * seed)) * 43758.5453, 1.0) - 0.5;
  return Tensor::from_vector(v, {rows, cols});
}

double max_abs_diff(const Tensor& a, const Tensor& b) {
  std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < x.size(); ++i)
    worst = std::max(worst, std::abs(x[i] - y[i]));
  return worst;
}

TEST(CommHooks, PowerSGDWarmUpIsPlainAllreduceThenExactOnRankRGradients) {
  expect_all_ok(run_ranks(3, [](int rank, int size, std::shared_ptr<comm::Store> s) {
    auto pg = group_of(rank, size, s);
    PowerSGDCase c = powersgd_case(pg, {.matrix_approximation_rank = 2, .start_powersgd_iter = 2});
    // Each rank's matrix gradient is c_rank U V^T: the average is exactly rank 2.
    Tensor u = random_matrix(16, 2, 1), v = random_matrix(12, 2, 2);
    Tensor low = matmul(u, transpose(v, 0, 1));
    std::vector<Tensor> grads = {mul(low, rank + 1.0),
                                 reshape(random_matrix(12, 1, 3 + rank), {12}),
                                 random_matrix(2, 2, 7 + rank)};
    std::vector<Tensor> full = {random_matrix(16, 12, 11 + rank), grads[1], grads[2]};
    std::vector<Tensor> plain_params;
    for (const Tensor& p : c.params)
      plain_params.push_back(Tensor::zeros(p.shape(), DType::F64).set_requires_grad(true));
    Reducer plain(plain_params, pg);
    for (int step = 0; step < 2; ++step) {
      // Warm-up: bitwise the plain allreduce, even for a full-rank matrix.
      std::vector<Tensor> got = reduce_once(*c.reducer, c.params, full);
      std::vector<Tensor> want = reduce_once(plain, plain_params, full);
      for (size_t k = 0; k < full.size(); ++k)
        EXPECT_EQ(got[k].to_vector<double>(), want[k].to_vector<double>()) << step << " " << k;
      for (size_t k = 0; k < full.size(); ++k) {
        c.params[k].set_grad(Tensor());
        plain_params[k].set_grad(Tensor());
      }
    }
    // Compressed from now on; error feedback stays zero for an exactly rank-2 gradient.
    for (int step = 2; step < 4; ++step) {
      std::vector<Tensor> got = reduce_once(*c.reducer, c.params, grads);
      Tensor want_matrix = mul(low, (1.0 + 2.0 + 3.0) / size);
      EXPECT_LT(max_abs_diff(got[0], want_matrix), 1e-12) << step;
      for (size_t k = 1; k < grads.size(); ++k) {
        Tensor want = grads[k].clone();
        pg->allreduce(want, {.op = comm::ReduceOp::Avg})->wait();
        EXPECT_LT(max_abs_diff(got[k], want), 1e-14) << step << " " << k;
      }
      for (const Tensor& g : got)
        expect_same_on_all_ranks(*pg, g);
      for (Tensor& p : c.params)
        p.set_grad(Tensor());
    }
  }));
}

TEST(CommHooks, PowerSGDErrorFeedbackRecoversAFullRankGradientOnAverage) {
  expect_all_ok(run_ranks(2, [](int rank, int size, std::shared_ptr<comm::Store> s) {
    auto pg = group_of(rank, size, s);
    const int steps = 200;
    auto mean_error = [&](bool feedback) {
      PowerSGDCase c = powersgd_case(pg, {.matrix_approximation_rank = 2,
                                          .start_powersgd_iter = 0,
                                          .use_error_feedback = feedback,
                                          .seed = 7});
      std::vector<Tensor> grads = {random_matrix(16, 12, 20 + rank),
                                   Tensor::zeros({12}, DType::F64),
                                   Tensor::zeros({2, 2}, DType::F64)};
      Tensor want = grads[0].clone();
      pg->allreduce(want, {.op = comm::ReduceOp::Avg})->wait();
      Tensor total = Tensor::zeros({16, 12}, DType::F64);
      Tensor first;
      for (int step = 0; step < steps; ++step) {
        std::vector<Tensor> got = reduce_once(*c.reducer, c.params, grads);
        expect_same_on_all_ranks(*pg, got[0]);
        add_(total, got[0]);
        for (Tensor& p : c.params)
          p.set_grad(Tensor());
      }
      // Relative error of the mean of the transmitted (rank-1) gradients.
      return max_abs_diff(mul(total, 1.0 / steps), want) / max_abs_diff(want, mul(want, 0.0));
    };
    double with = mean_error(true), without = mean_error(false);
    // With feedback: sum of transmitted = steps * G - e_steps, so the mean error is O(1/steps).
    EXPECT_LT(with, 0.05) << "without: " << without;
    EXPECT_GT(without, 0.2) << "with: " << with;
  }));
}

}  // namespace
}  // namespace loom::strategies
