#pragma once
// The meta device: tensors with shape, dtype and device but no bytes, on which the real model,
// autograd and optimizer code runs without computing anything, reporting what each op would
// cost instead. It is the simulator's device (issue 45, docs/simulation.md).
//
// Note [The meta device]
// An op on meta tensors takes the same path as on the CPU up to its kernel: it checks its
// inputs, allocates its outputs and temporaries (through the meta allocator, which counts the
// bytes by MemoryKind and holds none) and records its autograd node; then, where the CPU path
// would run its kernel, it reports an OpCost to the calling thread's MetaCostSink and returns.
// So peak memory by kind on meta is the CPU path's, byte for byte (tests/tensor/test_meta.cpp
// trains GPT-2 and Llama both ways and compares). Where a CUDA path allocates otherwise (flash
// attention keeps a [B, H, T] logsumexp instead of the [B, H, T, T] probabilities), meta
// follows the CPU's; that is said where it matters (docs/simulation.md).
//
// Values do not exist. A meta tensor copied to the CPU reads as zeros, so the data-dependent
// decisions of a step take fixed meta values: losses are finite (0), the loss scaler never
// skips, the gradient norm is 0 (nothing is clipped). Random fills draw nothing. Anything
// that asks a meta tensor for its bytes (Tensor::raw_data, data<T>) throws, naming the tensor:
// that is an op without a meta implementation, found by the tests rather than by a crash.
//
// Adding an op: where its CPU branch calls the kernel, first
//   if (reports_op_cost(out.device())) record_meta_op(name, class, flops, {reads}, {writes});
//   if (out.device().is_meta()) return out;  // (or whatever skips the kernel)
// with the FLOPs its kernel does (a multiply-add counts 2) and the shape a calibration by size
// needs (GEMM: m, n, k, batch).
//
// Note [Profiling CPU ops]
// The same reports come from the CPU path while the calling thread profiles its ops
// (OpProfileScope): each op reports its cost just before its kernel runs, and an OpProfile
// gives each op the time from its report to the next op's. So a real CPU step yields every
// op's work and time in context (its inputs as cold or warm as the step leaves them, the
// autograd and allocation between kernels included): the simulator's in-step calibration
// (tools/loom_sim/calibrate.cpp).

#include <array>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace loom {

// What limits an op, for the device model that turns its cost into time.
enum class OpClass : uint8_t {
  Gemm,           // matrix products (tensor cores, the GEMM kernel): FLOP-bound at size
  Attention,      // fused causal attention
  Elementwise,    // arithmetic and activations: bandwidth-bound
  Normalization,  // layer norm, RMS norm, softmax, cross-entropy: bandwidth-bound, row-wise
  Reduction,      // sums and norms
  Embedding,      // gathers and scatter-adds
  Copy,           // copies, casts and fills on one device
  Transfer,       // copies between devices (host and device memory, PCIe)
  Optimizer,      // fused optimizer updates
};
inline constexpr size_t kOpClassCount = 9;
// "gemm", "attention", "elementwise", "normalization", "reduction", "embedding", "copy",
// "transfer", "optimizer".
const char* op_class_name(OpClass op_class);

struct OpCost {
  const char* op = "";  // the op's or its backward's name ("matmul", "layer_norm_backward")
  OpClass op_class = OpClass::Elementwise;
  double flops = 0;  // floating-point operations; a multiply-add counts 2
  double bytes_read = 0;
  double bytes_written = 0;
  DType dtype = DType::F32;  // the compute dtype (the first input's)
  // The op's sizes, for calibration by size: GEMM m, n, k, batch; attention batch, heads,
  // time, head dim; otherwise the elements written and zeros.
  std::array<int64_t, 4> dims = {};
  // A CPU op reported while its thread reports CPU ops (CpuOpReports): on a simulated GPU
  // rank, host work such as the offloaded optimizer's.
  bool on_host = false;
};

// Receives the costs of the meta ops that the thread which installed it runs.
class MetaCostSink {
 public:
  virtual ~MetaCostSink() = default;
  virtual void record(const OpCost& cost) = 0;
  // Seconds of simulated time on the thread's compute stream, for a sink that keeps a clock
  // (sim::Timeline); none otherwise.
  virtual std::optional<double> simulated_now() const { return std::nullopt; }
};

// The calling thread's sink's simulated time (none: no sink, or one without a clock): what
// code that times its own work (pipeline balancing by time) reads on the meta device.
std::optional<double> simulated_now();

// Installs `sink` for the calling thread until destroyed, then restores the previous one.
// Without one, meta ops report to nobody.
class MetaCostScope {
 public:
  explicit MetaCostScope(MetaCostSink& sink);
  ~MetaCostScope();
  MetaCostScope(const MetaCostScope&) = delete;
  MetaCostScope& operator=(const MetaCostScope&) = delete;

 private:
  MetaCostSink* previous_;
};

namespace detail {
inline thread_local bool profiling_cpu_ops = false;  // CpuOpReports'
inline thread_local bool meta_follows_cuda = false;  // MetaCudaPathScope's
}  // namespace detail

// Where the CPU's and CUDA's code paths of an op allocate differently, meta follows the CPU's,
// or CUDA's while a MetaCudaPathScope is alive on the calling thread (a simulated GPU rank:
// docs/simulation.md, "The meta device"). Built so far: causal attention, whose CUDA kernels
// keep an f32 logsumexp (the CPU's keeps the operands' dtype); autocast, which computes attention and
// f16 in the low dtype on CUDA and emulates them on the CPU (tensor/autocast.h).
inline bool meta_follows_cuda() { return detail::meta_follows_cuda; }
// Whether an op on `device` takes CUDA's code path: on a GPU, or on meta following it. Every
// other device takes the CPU's.
inline bool takes_cuda_path(const Device& device) {
  return device.is_cuda() || (device.is_meta() && meta_follows_cuda());
}

class MetaCudaPathScope {
 public:
  MetaCudaPathScope() : previous_(std::exchange(detail::meta_follows_cuda, true)) {}
  ~MetaCudaPathScope() { detail::meta_follows_cuda = previous_; }
  MetaCudaPathScope(const MetaCudaPathScope&) = delete;
  MetaCudaPathScope& operator=(const MetaCudaPathScope&) = delete;

 private:
  bool previous_;
};

// Whether an op on `device` reports its cost at its kernel site: always on meta, and on the
// CPU while the calling thread reports its CPU ops (CpuOpReports; Note [Profiling CPU ops]).
inline bool reports_op_cost(const Device& device) {
  return device.is_meta() || (detail::profiling_cpu_ops && device.is_cpu());
}

// Reports op `op` of class `op_class` doing `flops` to the calling thread's sink, its bytes
// read and written being the sizes of `reads` and `writes` (each tensor's elements, touched
// once), its dtype the first read's, its dims `dims` (by default: the elements written).
void record_meta_op(const char* op, OpClass op_class, double flops,
                    std::initializer_list<Tensor> reads, std::initializer_list<Tensor> writes,
                    std::array<int64_t, 4> dims = {});
// The same, for an op whose operands are known at run time.
void record_meta_op(const char* op, OpClass op_class, double flops,
                    const std::vector<Tensor>& reads, const std::vector<Tensor>& writes,
                    std::array<int64_t, 4> dims = {});

// A sink that adds costs up, by op class and by op name.
class MetaCostTotals final : public MetaCostSink {
 public:
  struct Sum {
    int64_t ops = 0;
    double flops = 0;
    double bytes_read = 0;
    double bytes_written = 0;
  };
  void record(const OpCost& cost) override;
  const Sum& total() const { return total_; }
  const Sum& of(OpClass op_class) const { return by_class_[static_cast<size_t>(op_class)]; }
  // Every op name seen, with its sum.
  const std::map<std::string, Sum>& by_op() const { return by_op_; }

 private:
  Sum total_;
  std::array<Sum, kOpClassCount> by_class_{};
  std::map<std::string, Sum> by_op_;
};

// Every op of one thread's CPU run with its cost and time (Note [Profiling CPU ops]): an op's
// time runs from its report to the next report or to finish().
class OpProfile final : public MetaCostSink {
 public:
  struct Entry {
    OpCost cost;
    double seconds = 0;
  };
  void record(const OpCost& cost) override;
  // Closes the last op at now (an OpProfileScope does at its end).
  void finish();
  const std::vector<Entry>& entries() const { return entries_; }
 private:
  std::vector<Entry> entries_;
  bool open_ = false;    // the last entry's op has not ended
  int64_t last_ns_ = 0;  // its report, steady clock
};

// The calling thread's CPU ops report their costs (OpCost::on_host) to its sink, as meta ops
// do, until destroyed (and still compute): a simulated rank's host work (docs/simulation.md).
class CpuOpReports {
 public:
  CpuOpReports();
  ~CpuOpReports();
  CpuOpReports(const CpuOpReports&) = delete;
  CpuOpReports& operator=(const CpuOpReports&) = delete;

 private:
  bool was_reporting_;
};

// Profiles the calling thread's CPU ops into `profile` until destroyed: they report to it as
// meta ops report to their sink (and still compute).
class OpProfileScope {
 public:
  explicit OpProfileScope(OpProfile& profile);
  ~OpProfileScope();
  OpProfileScope(const OpProfileScope&) = delete;
  OpProfileScope& operator=(const OpProfileScope&) = delete;

 private:
  OpProfile& profile_;
  MetaCostScope scope_;
  CpuOpReports reports_;
};

}  // namespace loom
