// kernels/cuda/embedding.cu under the emulator against kernels/cpu/embedding: the lookup, and
// the sorted, atomic-free gradient (bitwise the CPU's: each row's sum formed in the CPU's
// order, in f32, rounded to the storage type and added to a nonzero gradient once), on packed
// and unpacked widths, with heavily repeated indices, in f32, bf16 and f16, of a whole table
// and of a part of one (tensor parallelism's vocabulary-parallel rows, where other ranks'
// indices select nothing); an index out of range traps.

#include "kernels/cuda/embedding.h"

#include "emulation_test_util.h"
#include "kernels/cpu/embedding.h"

namespace loom::cuda_emulation::testing {
namespace {

namespace gpu = loom::kernels::cuda;
namespace cpu = loom::kernels::cpu;

struct Case {
  int64_t count, width, vocab;
};
// Widths with and without 16-byte packs; few distinct indices (long runs) and many.
// A vocabulary past 2^16 (its keys need more than 16 sort bits), indices drawn from the top.
const Case kCases[] = {{1, 1, 1},      {7, 3, 5},   {40, 8, 3}, {100, 16, 1000},
                       {300, 33, 50},  {65, 64, 2}, {64, 4, 70000}};

// With `part`, the weight is rows [vocab, 2 vocab) of a table of 3 vocab rows, and indices
// fall anywhere in the table.
template <typename T>
void check_embedding(bool part) {
  std::mt19937_64 rng(79);
  for (const auto& c : kCases) {
    SCOPED_TRACE("count " + std::to_string(c.count) + " width " + std::to_string(c.width) +
                 " vocab " + std::to_string(c.vocab));
    const size_t table = static_cast<size_t>(c.vocab * c.width),
                 rows = static_cast<size_t>(c.count * c.width);
    std::vector<int64_t> indices(static_cast<size_t>(c.count));
    std::uniform_int_distribution<int64_t> pick(c.vocab > 65536 ? c.vocab - 40 : 0,
                                                part ? 3 * c.vocab - 1 : c.vocab - 1);
    for (auto& i : indices) i = pick(rng);
    const loom::kernels::Part held{.first = part ? c.vocab : 0, .part = part};
    const auto weight = random_values<T>(table, rng);
    const auto dout = random_values<T>(rows, rng);
    const auto dweight0 = random_values<T>(table, rng);  // accumulated into
    const auto ww = widen_all(weight), dw = widen_all(dout);
    std::vector<Wide<T>> want_out(rows), sums(table, 0);
    cpu::embedding_forward(indices.data(), ww.data(), want_out.data(), c.count, c.width, c.vocab,
                           held);
    // Each row's sum, formed from zero in the CPU's order, rounded to T, added to the row once.
    cpu::embedding_backward(indices.data(), dw.data(), sums.data(), c.count, c.width, c.vocab,
                            held);
    std::vector<T> want_grad(table);
    for (size_t i = 0; i < table; ++i) {
      const Wide<T> sum = static_cast<Wide<T>>(to_double(from_double<T>(sums[i])));
      want_grad[i] = from_double<T>(static_cast<Wide<T>>(to_double(dweight0[i])) + sum);
    }
    for_each_schedule([&] {
      std::vector<T> out = random_values<T>(rows, rng);  // other ranks' rows must be written
      std::vector<T> grad = dweight0;
      gpu::embedding_forward(dtype_of<T>(), indices.data(), weight.data(), out.data(), c.count,
                             c.width, c.vocab, nullptr, held);
      EXPECT_EQ(max_relative_error(out, want_out), 0.0);
      std::vector<uint64_t> workspace(gpu::embedding_backward_workspace(c.count) / 8 + 64);
      // 256-byte aligned, as from cudaMalloc.
      void* aligned = workspace.data();
      size_t space = workspace.size() * 8;
      ASSERT_NE(std::align(256, gpu::embedding_backward_workspace(c.count), aligned, space), nullptr);
      gpu::embedding_backward(dtype_of<T>(), indices.data(), dout.data(), grad.data(), c.count,
                              c.width, c.vocab, aligned, nullptr, held);
      EXPECT_TRUE(bitwise_equal(grad, want_grad));
    });
  }
}

TEST(EmulatedEmbedding, LookupAndSortedGradientF32) { check_embedding<float>(false); }
TEST(EmulatedEmbedding, LookupAndSortedGradientBf16) { check_embedding<__nv_bfloat16>(false); }
TEST(EmulatedEmbedding, LookupAndSortedGradientF16) { check_embedding<__half>(false); }
TEST(EmulatedEmbedding, PartOfATableF32) { check_embedding<float>(true); }
TEST(EmulatedEmbedding, PartOfATableBf16) { check_embedding<__nv_bfloat16>(true); }

TEST(EmulatedEmbedding, AnIndexOutOfRangeTraps) {
  const std::vector<int64_t> indices = {0, 4, 1};
  const std::vector<float> weight(4 * 8, 1.0f);
  std::vector<float> out(3 * 8);
  EXPECT_THROW(gpu::embedding_forward(DType::F32, indices.data(), weight.data(), out.data(), 3, 8,
                                      4, nullptr),
               loom::Error);
  EXPECT_EQ(device_error(), cudaErrorLaunchFailure);
  clear_device_error();
}

}  // namespace
}  // namespace loom::cuda_emulation::testing
