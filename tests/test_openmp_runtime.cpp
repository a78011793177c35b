// The OpenMP runtime under Loom's f32 products (oneDNN's: GNU's libgomp, whatever compiler
// built Loom; kernels/cpu/gemm.cpp) leaves nothing behind a process that used it.

#include <gtest/gtest.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tensor/ops.h"

namespace loom {
namespace {

namespace fs = std::filesystem;

// The whole numbers in a name: "__KMP_REGISTERED_LIB_4242_0" -> {"4242", "0"}.
std::vector<std::string> numbers_in(const std::string& name) {
  std::vector<std::string> numbers;
  std::string current;
  for (const char c : name + " ") {
    if (std::isdigit(static_cast<unsigned char>(c))) {
      current += c;
    } else if (!current.empty()) {
      numbers.push_back(current);
      current.clear();
    }
  }
  return numbers;
}

// A process that ran a matrix product and ended without its exit handlers (as a forked rank
// ends with _exit, or a killed one) leaves no file in /dev/shm naming it. LLVM's OpenMP
// runtime, which clang builds linked until 2026-11-28, keeps /dev/shm/__KMP_REGISTERED_LIB_
// <pid>_0 per process and removes it only in its exit handler.
TEST(OpenMpRuntime, AProcessThatEndsAbruptlyLeavesNothingInDevShm) {
  if (!fs::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm on this machine";
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child is a fresh run of this binary
  // Where the child writes its pid: named by the parent, and passed in the environment (the
  // child runs this test's body again up to the statement, with a pid of its own).
  constexpr const char* kPidFileVariable = "LOOM_TEST_OPENMP_CHILD_PID_FILE";
  const char* given = std::getenv(kPidFileVariable);
  const fs::path pid_file = given != nullptr
                                ? fs::path(given)
                                : fs::temp_directory_path() /
                                      ("loom-openmp-child-of-" + std::to_string(getpid()) + ".pid");
  setenv(kPidFileVariable, pid_file.c_str(), /*overwrite=*/1);
  EXPECT_EXIT(
      {
        std::ofstream(pid_file) << getpid() << "\n";
        const Tensor a = Tensor::from_vector<float>({1, 2, 3, 4}, {2, 2});
        const bool right = matmul(a, a).to_vector<float>() == std::vector<float>({7, 10, 15, 22});
        _exit(right ? 0 : 1);
      },
      testing::ExitedWithCode(0), "");
  std::string child;
  std::ifstream(pid_file) >> child;
  fs::remove(pid_file);
  unsetenv(kPidFileVariable);
  ASSERT_FALSE(child.empty()) << "the child did not write its pid to " << pid_file;
  for (const fs::directory_entry& entry : fs::directory_iterator("/dev/shm")) {
    const std::string name = entry.path().filename().string();
    for (const std::string& number : numbers_in(name))
      EXPECT_NE(number, child) << "/dev/shm/" << name << " was left by process " << child;
  }
}

}  // namespace
}  // namespace loom
