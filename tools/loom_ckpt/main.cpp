// loom-ckpt: looks into train_gpt's checkpoints (docs/checkpoints.md).
//
//   loom-ckpt inspect CHECKPOINT        step, strategy, world size, files, tensors and shapes
//   loom-ckpt verify CHECKPOINT         every file's every checksum; exit 1 on the first bad one
//   loom-ckpt diff A B                  per tensor of the model and optimizer files, the
//                                       largest absolute difference (exit 1 when any differ)
//
// CHECKPOINT is a step directory (DIR/step-00000040) or a checkpoint root (DIR: its newest
// committed step). Converting between the full and the sharded formats waits for the sharded
// format (issue 10).

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "strategies/checkpoint/checked_file.h"
#include "strategies/checkpoint/directory.h"
#include "tensor/error.h"

namespace {

namespace fs = std::filesystem;
using namespace loom;
using strategies::checkpoint::Directory;

// A step directory, or a root's newest committed one.
fs::path resolve(const std::string& given) {
  fs::path path(given);
  if (Directory::is_committed(path)) return path;
  if (auto latest = Directory(path).latest()) return *latest;
  fail("loom-ckpt: ", given, " is neither a committed checkpoint (a step-N directory with ",
       Directory::kMarker, ") nor a directory holding one");
}

std::vector<fs::path> tensor_files(const fs::path& checkpoint) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(checkpoint))
    if (entry.path().extension() == ".safetensors") files.push_back(entry.path());
  std::sort(files.begin(), files.end());
  return files;
}

std::string shape_text(const Tensor& t) {
  std::string s = "[";
  for (size_t i = 0; i < t.shape().size(); ++i)
    s += (i ? ", " : "") + std::to_string(t.shape()[i]);
  return s + "]";
}

int inspect(const fs::path& checkpoint) {
  std::ifstream in(checkpoint / "meta.json");
  const nlohmann::json meta = nlohmann::json::parse(in);
  std::printf("checkpoint %s\n  step %lld, strategy %s on %d rank(s), optimizer %s%s\n  model %s\n",
              checkpoint.string().c_str(), meta.at("step").get<long long>(),
              meta.at("strategy").get<std::string>().c_str(), meta.at("world_size").get<int>(),
              meta.at("optimizer").get<std::string>().c_str(),
              meta.at("sharded_optimizer").get<bool>() ? " (state sharded by rank)" : "",
              meta.at("model").dump().c_str());
  for (const fs::path& file : tensor_files(checkpoint)) {
    const safetensors::Contents c = safetensors::load(file);
    int64_t elements = 0;
    for (const auto& [name, t] : c.tensors)
      elements += t.numel();
    std::printf("  %s: %zu tensors, %lld elements, %lld bytes\n", file.filename().c_str(),
                c.tensors.size(), static_cast<long long>(elements),
                static_cast<long long>(fs::file_size(file)));
    for (const auto& [name, t] : c.tensors)
      std::printf("    %-40s %-5s %s\n", name.c_str(), std::string(dtype_name(t.dtype())).c_str(),
                  shape_text(t).c_str());
  }
  return 0;
}

int verify(const fs::path& checkpoint) {
  size_t tensors = 0;
  for (const fs::path& file : tensor_files(checkpoint))
    tensors += strategies::checkpoint::load_checked(file).tensors.size();  // throws when bad
  std::printf("%s: %zu tensors in %zu files, every checksum matches\n", checkpoint.string().c_str(),
              tensors, tensor_files(checkpoint).size());
  return 0;
}

int diff(const fs::path& a, const fs::path& b) {
  bool differ = false;
  for (const fs::path& file : tensor_files(a)) {
    const fs::path other = b / file.filename();
    if (!fs::exists(other)) {
      std::printf("%s: only in %s\n", file.filename().c_str(), a.string().c_str());
      differ = true;
      continue;
    }
    const auto x = strategies::checkpoint::load_checked(file).tensors;
    const auto y = strategies::checkpoint::load_checked(other).tensors;
    for (const auto& [name, t] : x) {
      auto found = y.find(name);
      if (found == y.end() || found->second.shape() != t.shape()) {
        std::printf("%s %s: %s\n", file.filename().c_str(), name.c_str(),
                    found == y.end() ? "missing in B" : "shapes differ");
        differ = true;
        continue;
      }
      const std::vector<double> u = t.to_vector<double>(), v = found->second.to_vector<double>();
      double worst = 0;
      for (size_t i = 0; i < u.size(); ++i)
        worst = std::max(worst, std::abs(u[i] - v[i]));
      if (worst != 0 || !std::equal(u.begin(), u.end(), v.begin())) differ = true;
      std::printf("%s %-40s max |a - b| %.3g\n", file.filename().c_str(), name.c_str(), worst);
    }
  }
  std::printf("%s\n", differ ? "the checkpoints differ" : "the checkpoints are equal");
  return differ ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"loom-ckpt: inspect, verify and compare train_gpt checkpoints"};
  app.require_subcommand(1);
  std::string one, two;
  auto* inspect_cmd = app.add_subcommand("inspect", "step, strategy, files, tensors and shapes");
  inspect_cmd->add_option("checkpoint", one, "a step directory or a checkpoint root")->required();
  auto* verify_cmd = app.add_subcommand("verify", "check every tensor's checksum");
  verify_cmd->add_option("checkpoint", one, "a step directory or a checkpoint root")->required();
  auto* diff_cmd = app.add_subcommand("diff", "largest absolute difference per tensor");
  diff_cmd->add_option("a", one, "a step directory or a checkpoint root")->required();
  diff_cmd->add_option("b", two, "a step directory or a checkpoint root")->required();
  CLI11_PARSE(app, argc, argv);
  try {
    if (*inspect_cmd) return inspect(resolve(one));
    if (*verify_cmd) return verify(resolve(one));
    return diff(resolve(one), resolve(two));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom-ckpt: %s\n", e.what());
    return 1;
  }
}
