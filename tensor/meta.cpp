#include "tensor/meta.h"

#include <chrono>
#include <span>

namespace loom {

namespace {
thread_local MetaCostSink* current_sink = nullptr;

void accumulate(MetaCostTotals::Sum& sum, const OpCost& cost) {
  ++sum.ops;
  sum.flops += cost.flops;
  sum.bytes_read += cost.bytes_read;
  sum.bytes_written += cost.bytes_written;
}
}  // namespace

const char* op_class_name(OpClass op_class) {
  switch (op_class) {
    case OpClass::Gemm: return "gemm";
    case OpClass::Attention: return "attention";
    case OpClass::Elementwise: return "elementwise";
    case OpClass::Normalization: return "normalization";
    case OpClass::Reduction: return "reduction";
    case OpClass::Embedding: return "embedding";
    case OpClass::Copy: return "copy";
    case OpClass::Transfer: return "transfer";
    case OpClass::Optimizer: return "optimizer";
  }
  return "unknown";
}

MetaCostScope::MetaCostScope(MetaCostSink& sink) : previous_(current_sink) {
  current_sink = &sink;
}

MetaCostScope::~MetaCostScope() {
  current_sink = previous_;
}

std::optional<double> simulated_now() {
  return current_sink == nullptr ? std::nullopt : current_sink->simulated_now();
}

namespace {
// record_meta_op's, over its operands where the caller keeps them (no copies: the meta device
// reports every op of a simulated step).
void record_cost(const char* op, OpClass op_class, double flops, std::span<const Tensor> reads,
                 std::span<const Tensor> writes, std::array<int64_t, 4> dims) {
  if (current_sink == nullptr) return;
  OpCost cost;
  cost.op = op;
  cost.op_class = op_class;
  cost.flops = flops;
  for (const Tensor& t : reads)
    cost.bytes_read += static_cast<double>(t.nbytes());
  for (const Tensor& t : writes)
    cost.bytes_written += static_cast<double>(t.nbytes());
  if (!reads.empty()) cost.dtype = reads.front().dtype();
  const Tensor* first =
      !writes.empty() ? &writes.front() : !reads.empty() ? &reads.front() : nullptr;
  cost.on_host = first != nullptr && first->device().is_cpu();
  if (dims == std::array<int64_t, 4>{} && !writes.empty()) dims[0] = writes.front().numel();
  cost.dims = dims;
  current_sink->record(cost);
}
}  // namespace

void record_meta_op(const char* op, OpClass op_class, double flops,
                    std::initializer_list<Tensor> reads, std::initializer_list<Tensor> writes,
                    std::array<int64_t, 4> dims) {
  record_cost(op, op_class, flops, {reads.begin(), reads.size()},
              {writes.begin(), writes.size()}, dims);
}

void record_meta_op(const char* op, OpClass op_class, double flops,
                    const std::vector<Tensor>& reads, const std::vector<Tensor>& writes,
                    std::array<int64_t, 4> dims) {
  record_cost(op, op_class, flops, reads, writes, dims);
}

void MetaCostTotals::record(const OpCost& cost) {
  accumulate(total_, cost);
  accumulate(by_class_[static_cast<size_t>(cost.op_class)], cost);
  accumulate(by_op_[cost.op], cost);
}

namespace {
int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

void OpProfile::record(const OpCost& cost) {
  const int64_t now = steady_ns();
  if (open_) entries_.back().seconds = static_cast<double>(now - last_ns_) * 1e-9;
  entries_.push_back({.cost = cost});
  open_ = true;
  last_ns_ = now;
}

void OpProfile::finish() {
  if (open_) entries_.back().seconds = static_cast<double>(steady_ns() - last_ns_) * 1e-9;
  open_ = false;
}

CpuOpReports::CpuOpReports() : was_reporting_(detail::profiling_cpu_ops) {
  detail::profiling_cpu_ops = true;
}

CpuOpReports::~CpuOpReports() {
  detail::profiling_cpu_ops = was_reporting_;
}

OpProfileScope::OpProfileScope(OpProfile& profile) : profile_(profile), scope_(profile) {}

OpProfileScope::~OpProfileScope() {
  profile_.finish();
}

}  // namespace loom
