// NVMe offload's pieces: the swap file (round trips, nothing left behind even after SIGKILL,
// errors naming the path) and the sub-group pager (values survive, memory is released, at
// most buffer_count sub-groups in memory).

#include <fcntl.h>
#include <gtest/gtest.h>
#include <liburing.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <memory>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <string>

#include "core/error.h"
#include "core/fault_points.h"
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

// What this machine allows, found out by the test itself: io_uring (a seccomp profile or
// kernel.io_uring_disabled can refuse it) and O_DIRECT in `dir` (tmpfs refuses it).
bool io_uring_allowed() {
  io_uring ring{};
  if (io_uring_queue_init(4, &ring, 0) != 0) return false;
  io_uring_queue_exit(&ring);
  return true;
}
bool direct_io_allowed(const fs::path& dir) {
  const fs::path probe = dir / "probe";
  const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) ::close(fd);
  fs::remove(probe);
  return fd >= 0;
}

// Where the kernel and the file system allow it, the swap file runs through io_uring with
// O_DIRECT, and aligned transfers bypass the page cache: asserted, so that a failing
// io_uring_queue_init cannot silently fall back while every test passes.
TEST(SwapFile, UsesIoUringWithDirectIoWhereAllowed) {
  TempDir dir;
  if (!io_uring_allowed()) GTEST_SKIP() << "io_uring is refused on this machine";
  if (!direct_io_allowed(dir.path())) GTEST_SKIP() << "O_DIRECT is refused in " << dir.path();
  SwapFile file(dir.path(), 1 << 20);
  EXPECT_EQ(file.mode(), "io_uring, O_DIRECT for aligned transfers");
  Tensor page = Tensor::from_vector<float>(std::vector<float>(1024, 2.5f), {1024});
  const uint64_t at = file.allocate(page.nbytes());
  file.wait(file.write(at, page.data<float>(), page.nbytes()));
  EXPECT_EQ(file.bytes_direct(), page.nbytes());
}

// The fallback, forced through the fault point nvme.ring (Note [Fault points]): said once on
// stderr with the reason, named by mode(), and the bytes still round-trip.
TEST(SwapFile, FallsBackToPreadPwriteAndSaysWhy) {
  TempDir dir;
  fault::set_hook([](std::string_view point) { return point == "nvme.ring" ? EPERM : 0; });
  ::testing::internal::CaptureStderr();
  std::unique_ptr<SwapFile> file;
  try {
    file = std::make_unique<SwapFile>(dir.path(), 1 << 20);
  } catch (...) {
    fault::set_hook(nullptr);
    throw;
  }
  fault::set_hook(nullptr);
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(said.find("io_uring is unavailable here (Operation not permitted): the swap file under '" +
                      dir.path().string() + "' is read and written with pread/pwrite"),
            std::string::npos)
      << said;
  EXPECT_EQ(file->mode().rfind("pread/pwrite (io_uring unavailable: Operation not permitted)", 0), 0u)
      << file->mode();
  std::vector<char> out(10000), back(10000);
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = static_cast<char>(i * 13);
  const uint64_t at = file->allocate(out.size());
  file->wait(file->write(at, out.data(), out.size()));
  file->wait(file->read(at, back.data(), back.size()));
  EXPECT_EQ(back, out);
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
