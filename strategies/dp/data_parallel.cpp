#include "strategies/dp/data_parallel.h"

#include <exception>
#include <thread>

#include "core/tags.h"
#include "tensor/ops.h"

namespace loom::strategies {

DataParallelStrategy::DataParallelStrategy(StrategyOptions options) : Strategy(std::move(options)) {
  if (compute_dtype_ != DType::F32) {
    tag::kDp.fail("precision '", options_.precision,
                  "' is not supported by dp yet; use '32-true', or ddp with mixed precision");
  }
  const std::string& devices = options_.devices;
  if (devices == "auto") return;
  size_t used = 0;
  try {
    replicas_ = std::stoi(devices, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != devices.size() || replicas_ < 1) {
    tag::kDp.fail("--devices '", devices, "': expected 'auto' or a number of replicas >= 1");
  }
}

void DataParallelStrategy::setup_module(nn::Module& module) {
  if (root_device().is_cuda()) {
    tag::kDp.fail("replicas run on CPU threads; for GPUs use strategy 'ddp' (one process per GPU)");
  }
  Strategy::setup_module(module);
  copies_.clear();
}

void DataParallelStrategy::teardown() {
  copies_.clear();
}

Tensor DataParallelStrategy::forward_backward(const LossOfRows& loss_of_rows, int64_t rows,
                                              double scale) {
  if (module_ == nullptr) tag::kDp.fail("forward_backward before setup_module()");
  if (rows < 1) tag::kDp.fail("forward_backward over ", rows, " rows; expected at least 1");
  const int64_t n = std::min<int64_t>(replicas_, rows);  // no replica gets an empty slice
  if (n > 1 && static_cast<int64_t>(copies_.size()) + 1 < n) {
    if (!factory_) {
      tag::kDp.fail(replicas_, " replicas but no replica factory: call set_replica_factory()");
    }
    while (static_cast<int64_t>(copies_.size()) + 1 < replicas_) {
      copies_.push_back(factory_());
      if (!copies_.back()) tag::kDp.fail("the replica factory returned null");
    }
  }
  // Broadcast: the replicas start from the master's current weights, without gradients.
  const nn::StateDict master_state = module_->state_dict();
  for (int64_t i = 1; i < n; ++i) {
    nn::Module& replica = *copies_[i - 1];
    replica.load_state_dict(master_state);
    for (const Tensor& p : replica.parameters())
      p.set_grad(Tensor());
  }
  std::vector<int64_t> begin(n + 1, 0);
  for (int64_t i = 0; i < n; ++i)
    begin[i + 1] = begin[i] + rows / n + (i < rows % n ? 1 : 0);
  std::vector<double> losses(n, 0.0);
  std::vector<std::exception_ptr> errors(n);
  auto run = [&](int64_t i) {
    try {
      nn::Module& m = i == 0 ? *module_ : *copies_[i - 1];
      Tensor loss = loss_of_rows(m, begin[i], begin[i + 1]);
      losses[i] = loss.item();
      const double weight = scale * static_cast<double>(begin[i + 1] - begin[i]) / rows;
      mul(loss, weight).backward();
    } catch (...) {
      errors[i] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (int64_t i = 1; i < n; ++i)
    threads.emplace_back(run, i);
  run(0);
  for (std::thread& t : threads)
    t.join();
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  // Reduce into the master, replicas in index order (deterministic rounding).
  const std::vector<Tensor> master = module_->parameters();
  for (int64_t i = 1; i < n; ++i) {
    const std::vector<Tensor> params = copies_[i - 1]->parameters();
    for (size_t j = 0; j < master.size(); ++j) {
      Tensor g = params[j].grad();
      if (!g.defined()) continue;
      Tensor mg = master[j].grad();
      if (mg.defined()) {
        add_(mg, g);
      } else {
        master[j].set_grad(g);  // a fresh tensor each step: the replica's grad is reset above
      }
    }
  }
  double total = 0;
  for (int64_t i = 0; i < n; ++i)
    total += losses[i] * static_cast<double>(begin[i + 1] - begin[i]) / rows;
  return Tensor::full({}, total, master.empty() ? DType::F64 : master[0].dtype());
}

}  // namespace loom::strategies
