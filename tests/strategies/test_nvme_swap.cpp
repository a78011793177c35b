// NVMe offload's pieces: the swap file (round trips, nothing left behind even after SIGKILL,
// errors naming the path) and the sub-group pager (values survive, memory is released, at
// most buffer_count sub-groups in memory).

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>

#include "core/error.h"
#include "strategies/sharded/nvme_swap.h"
#include "strategies/sharded/swap_file.h"
#include "tensor/ops.h"
#include "test_support.h"

namespace loom::strategies::sharded {
namespace {

namespace fs = std::filesystem;

using loom::testing::error_of;
using loom::testing::TempDir;

TEST(SwapFile, WritesAndReadsBackAlignedAndUnalignedBuffers) {
  TempDir dir;
  SwapFile file(dir.path(), 1 << 20);
  EXPECT_EQ(dir.entries(), 0u) << "the swap file has no name in the directory";

  Tensor page = Tensor::from_vector<float>(std::vector<float>(1024, 0.0f), {1024});
  ASSERT_EQ(reinterpret_cast<uintptr_t>(page.storage()->data()) % SwapFile::kDirectAlignment, 0u)
      << "whole pages are page-aligned (tensor/allocator.h)";
  std::vector<float> values(1024);
  std::iota(values.begin(), values.end(), 0.5f);
  std::copy(values.begin(), values.end(), page.data<float>());
  const uint64_t at = file.allocate(page.nbytes());
  file.wait(file.write(at, page.data<float>(), page.nbytes()));
  std::fill(page.data<float>(), page.data<float>() + 1024, 0.0f);
  file.wait(file.read(at, page.data<float>(), page.nbytes()));
  EXPECT_EQ(page.to_vector<float>(), values);

  std::vector<char> odd(12345), back(12345);
  for (size_t i = 0; i < odd.size(); ++i)
    odd[i] = static_cast<char>(i * 7);
  const uint64_t at_odd = file.allocate(odd.size());
  EXPECT_EQ(at_odd % SwapFile::kDirectAlignment, 0u);
  // Two transfers in flight at once, waited in the other order.
  SwapFile::Ticket w = file.write(at_odd, odd.data(), odd.size());
  SwapFile::Ticket r = file.read(at, page.data<float>(), page.nbytes());
  file.wait(r);
  file.wait(w);
  file.wait(file.read(at_odd, back.data(), back.size()));
  EXPECT_EQ(back, odd);
  EXPECT_EQ(file.bytes_written(), page.nbytes() + odd.size());
  EXPECT_NE(file.mode(), "");
}

TEST(SwapFile, GrowsPastItsReservation) {
  TempDir dir;
  SwapFile file(dir.path(), 0);
  std::vector<double> a(5000, 1.25), b(5000);
  const uint64_t at = file.allocate(a.size() * sizeof(double));
  EXPECT_EQ(file.size(), 40960u);  // 40000 bytes, rounded up to whole pages
  file.wait(file.write(at, a.data(), a.size() * sizeof(double)));
  file.wait(file.read(at, b.data(), b.size() * sizeof(double)));
  EXPECT_EQ(a, b);
}

TEST(SwapFile, NothingIsLeftBehindAfterSigkill) {
  TempDir dir;
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    SwapFile file(dir.path(), 1 << 20);
    std::vector<char> bytes(4096, 'x');
    file.wait(file.write(file.allocate(bytes.size()), bytes.data(), bytes.size()));
    const char one = 1;
    (void)!::write(ready[1], &one, 1);
    ::pause();  // killed here, with the file open
    ::_exit(0);
  }
  char signal_byte = 0;
  ASSERT_EQ(::read(ready[0], &signal_byte, 1), 1);
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(ready[0]);
  ::close(ready[1]);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(dir.entries(), 0u);
}

TEST(SwapFile, BadPathsAndFullDisksAreNamed) {
  TempDir dir;
  const std::string missing = dir.path() / "absent";
  std::string e = error_of([&] { SwapFile f(missing, 0); });
  EXPECT_NE(e.find(missing), std::string::npos) << e;
  EXPECT_NE(e.find("create the directory"), std::string::npos) << e;

  const std::string file_path = dir.path() / "a_file";
  std::ofstream(file_path) << "x";
  e = error_of([&] { SwapFile f(file_path, 0); });
  EXPECT_NE(e.find("is not a directory"), std::string::npos) << e;

  e = error_of([&] { SwapFile f("", 0); });
  EXPECT_NE(e.find("no nvme_path"), std::string::npos) << e;

  // More than any disk here has: refused before anything is written, with both figures.
  e = error_of([&] { SwapFile f(dir.path(), size_t{1} << 60); });
  EXPECT_NE(e.find("free but NVMe offload needs"), std::string::npos) << e;
  EXPECT_NE(e.find(dir.path()), std::string::npos) << e;
  fs::remove(file_path);
  EXPECT_EQ(dir.entries(), 0u);
}

// Three sub-groups through two buffers, two steps, with "optimizer state" appearing at the
// first release as AdamW's does: values survive the round trips, and between steps nothing
// is in memory.
TEST(OptimizerSwap, PagesSubGroupsThroughBoundedMemory) {
  TempDir dir;
  OptimizerSwap swap(dir.path(), 2, 0);
  std::vector<Tensor> masters, states;
  for (int g = 0; g < 3; ++g) {
    masters.push_back(Tensor::full({1024}, static_cast<double>(g), DType::F32));
    states.push_back(Tensor::zeros({1024}, DType::F32));
    EXPECT_EQ(swap.add(masters.back()), static_cast<size_t>(g));
    EXPECT_FALSE(masters.back().storage()->materialized());
  }
  for (int step = 1; step <= 2; ++step) {
    swap.begin_step();
    for (size_t g = 0; g < 3; ++g) {
      swap.acquire(g);
      ASSERT_TRUE(masters[g].storage()->materialized());
      EXPECT_EQ(masters[g].to_vector<float>()[1023], static_cast<float>(g + (step - 1) * 10));
      if (step == 1) states[g].storage()->materialize();
      EXPECT_EQ(states[g].to_vector<float>()[0], static_cast<float>(step - 1));
      add_(masters[g], Tensor::full({1024}, 10.0, DType::F32));
      add_(states[g], Tensor::full({1024}, 1.0, DType::F32));
      swap.release(g, {states[g]});
      size_t resident = 0;
      for (const Tensor& m : masters)
        resident += m.storage()->materialized();
      EXPECT_LE(resident, 2u) << "buffer_count bounds what is in memory";
    }
    swap.end_step();
    for (size_t g = 0; g < 3; ++g) {
      EXPECT_FALSE(masters[g].storage()->materialized());
      EXPECT_FALSE(states[g].storage()->materialized());
    }
  }
  EXPECT_EQ(swap.sub_group_count(), 3u);
}

}  // namespace
}  // namespace loom::strategies::sharded
