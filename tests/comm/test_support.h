#pragma once
// Small helpers shared by the test suites: a temporary directory that removes itself, and the
// message of the loom::Error a call throws.

#include <stdlib.h>

#include <filesystem>
#include <functional>
#include <iterator>
#include <string>

#include "core/error.h"

namespace loom::testing {

// A fresh directory under the system's temporary directory ("<prefix>-XXXXXX"), removed with
// its contents when the object goes.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "loom-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) == nullptr) throw Error("mkdtemp failed for " + pattern);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  size_t entries() const {
    return static_cast<size_t>(std::distance(std::filesystem::directory_iterator(path_), {}));
  }
  bool empty() const { return entries() == 0; }

 private:
  std::filesystem::path path_;
};

// What `f` throws as loom::Error, or "no error".
inline std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace loom::testing
