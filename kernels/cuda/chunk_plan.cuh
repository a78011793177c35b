#pragma once
// Note [Multi-tensor launches]
// A model has hundreds of parameter tensors, many of them small (biases, norms); one launch per
// tensor would cost more in launch latency than the work itself. As in apex's
// multi_tensor_apply, the host cuts every tensor into chunks of a fixed number of elements and
// packs, per launch, the buffer addresses of up to kMaxChunkTensors tensors (the caller's
// table) plus a (tensor slot, chunk) pair for each of up to kMaxChunkBlocks blocks (a
// ChunkPlan, part of that table) into the kernel's parameters (read through
// __grid_constant__, so indexing them costs no local-memory copy). The tables use the
// 32,764 bytes of parameters CUDA 12.1 allows (Volta and later, driver 530 or newer), not
// apex's classic 4 KB: GPT-2 small's 148 tensors in 1,995 chunks then take one launch per
// kernel instead of seven (issue 46's optimizer budget, five launches for the whole step). Block b takes
// chunk block_chunk[b] of the tensor in slot block_tensor[b]. When either fills up the host
// launches and starts a new table, carrying a tensor whose chunks are not all issued yet over
// as the new table's first slot. The blocks of all launches together take every chunk once, in
// tensor order and chunk order, so that a kernel writing one value per block (the gradient
// norm's partial sums) can place it by the block's rank in that order, and the result never
// depends on how the work was cut. Each table starts zeroed, so a launch's parameters hold
// its own tensors' addresses and nothing else (no earlier launch's, no stack bytes): a stray
// read of an unused slot finds a null pointer, and the emulated device's count of the bytes a
// launch's arguments name (tests/cuda_emulation/runtime/work_log.h) names only those tensors.
// Users: multi_tensor_adamw (optimizer.cu), multi_tensor_sum_of_squares (reduce.cu),
// multi_tensor_scale (elementwise.cu) and multi_tensor_cast (copy.cu).

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cuda/common.cuh"

namespace loom::kernels::cuda {

constexpr int kMaxChunkTensors = 256;
constexpr int kMaxChunkBlocks = 2560;
// The most bytes of parameters a kernel may take (CUDA 12.1+; every table asserts it).
constexpr size_t kMaxKernelParameterBytes = 32764;

// Which chunk of which tensor slot each block of one launch takes.
struct ChunkPlan {
  int32_t block_chunk[kMaxChunkBlocks];
  uint8_t block_tensor[kMaxChunkBlocks];
};
static_assert(kMaxChunkTensors <= 256, "block_tensor is a uint8_t");

// Plans the launches over `count` tensors whose sizes size(k) gives (tensors of size 0 are
// skipped), in chunks of `chunk` elements: before each launch, `table` (the caller's, with a
// ChunkPlan member `plan` that holds the blocks) has been zeroed and set_slot(slot, k) has
// stored tensor k's buffers in its slot `slot`; launch(blocks) is then called. Tensors whose
// chunk count does not fit an int32 are the caller's to refuse.
template <typename Table, typename Size, typename SetSlot, typename Launch>
void for_each_chunk_plan(Table& table, int count, int64_t chunk, Size&& size, SetSlot&& set_slot,
                         Launch&& launch) {
  static_assert(std::is_trivially_copyable_v<Table>, "a kernel parameter table is plain bytes");
  std::memset(&table, 0, sizeof(table));
  ChunkPlan& plan = table.plan;
  int slots = 0, blocks = 0;
  for (int k = 0; k < count; ++k) {
    const int64_t n = size(k);
    if (n == 0) continue;
    set_slot(slots, k);
    ++slots;
    const int64_t chunks = ceil_div(n, chunk);
    for (int64_t c = 0; c < chunks; ++c) {
      plan.block_tensor[blocks] = static_cast<uint8_t>(slots - 1);
      plan.block_chunk[blocks] = static_cast<int32_t>(c);
      ++blocks;
      const bool last_chunk = c == chunks - 1;
      if (blocks < kMaxChunkBlocks && !(slots == kMaxChunkTensors && last_chunk)) continue;
      launch(blocks);
      blocks = 0;
      std::memset(&table, 0, sizeof(table));
      if (last_chunk) {
        slots = 0;
      } else {  // this tensor goes on in the next table, as its first slot
        set_slot(0, k);
        slots = 1;
      }
    }
  }
  if (blocks > 0) launch(blocks);
}

}  // namespace loom::kernels::cuda
