#include "strategies/parameter_sync.h"

#include <cstdint>

#include "core/error.h"
#include "core/tags.h"
#include "tensor/shape.h"

namespace loom::strategies {

namespace {

// FNV-1a over a parameter's name, shape and dtype.
int64_t fingerprint(const std::string& name, const Tensor& t) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* data, size_t n) {
    auto* bytes = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i)
      h = (h ^ bytes[i]) * 1099511628211ull;
  };
  mix(name.data(), name.size());
  for (int64_t d : t.shape())
    mix(&d, sizeof d);
  DType dtype = t.dtype();
  mix(&dtype, sizeof dtype);
  return static_cast<int64_t>(h);
}

}  // namespace

void verify_same_parameters(const std::vector<std::pair<std::string, Tensor>>& named,
                            comm::ProcessGroup& group) {
  const int64_t world = group.size();
  // On the parameters' device: an NCCL group moves only CUDA tensors.
  const Device device = named.empty() ? Device::cpu() : named[0].second.device();
  Tensor count = Tensor::full({1}, static_cast<double>(named.size()), DType::I64, device);
  Tensor counts = Tensor::empty({world}, DType::I64, device);
  group.all_gather(counts, count)->wait();
  // Meta tensors (a simulated rank, docs/simulation.md) hold no values to compare: the
  // exchanges run, the comparisons do not.
  const bool compare = !device.is_meta();
  std::vector<int64_t> all = compare ? counts.to_vector<int64_t>() : std::vector<int64_t>(world);
  for (int64_t r = 0; r < world; ++r) {
    if (all[r] != all[0]) {
      tag::kDdp.fail("the models differ across ranks: rank 0 has ", all[0], " parameters, rank ", r,
                     " has ", all[r]);
    }
  }
  std::vector<int64_t> mine;
  for (const auto& [name, t] : named)
    mine.push_back(fingerprint(name, t));
  Tensor local = Tensor::from_vector(mine, {static_cast<int64_t>(mine.size())}, device);
  Tensor gathered = Tensor::empty({world * local.numel()}, DType::I64, device);
  group.all_gather(gathered, local)->wait();
  if (!compare) return;
  std::vector<int64_t> prints = gathered.to_vector<int64_t>();
  for (size_t i = 0; i < named.size(); ++i) {
    for (int64_t r = 0; r < world; ++r) {
      if (prints[r * named.size() + i] != mine[i]) {
        tag::kDdp.fail("the models differ across ranks: parameter ", i, " '", named[i].first, "' (",
                       shape_str(named[i].second.shape()), " ", named[i].second.dtype(),
                       " on rank ", group.rank(), ") has another name, shape or dtype on rank ", r);
      }
    }
  }
}

void broadcast_parameters(const std::vector<Tensor>& params, comm::ProcessGroup& group) {
  std::vector<comm::WorkPtr> works;
  for (const Tensor& p : params) {
    Tensor data = p.detach();
    works.push_back(group.broadcast(data, {.root = 0}));
  }
  for (auto& w : works)
    w->wait();
}

}  // namespace loom::strategies
