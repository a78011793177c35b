#include "strategies/checkpoint/checked_file.h"

#include <xxhash.h>

#include <cstdio>

#include "core/error.h"
#include "core/tags.h"

namespace loom::strategies::checkpoint {

namespace {

constexpr const char* kPrefix = "loom.xxh3.";

std::string checksum_of(const Tensor& tensor) {
  const Tensor host = tensor.to(Device::cpu()).contiguous();
  const uint64_t hash = XXH3_64bits(host.raw_data(), host.nbytes());
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return hex;
}

}  // namespace

void save_checked(const std::filesystem::path& path, const safetensors::TensorMap& tensors,
                  safetensors::Metadata metadata) {
  for (const auto& [name, tensor] : tensors)
    metadata[kPrefix + name] = checksum_of(tensor);
  safetensors::save(path, tensors, metadata);
}

safetensors::Contents load_checked(const std::filesystem::path& path) {
  safetensors::Contents contents = safetensors::load(path);
  for (const auto& [name, tensor] : contents.tensors) {
    auto found = contents.metadata.find(kPrefix + name);
    if (found == contents.metadata.end()) {
      tag::kCheckpoint.fail(path.string(), ": tensor '", name,
                            "' has no checksum; expected a file written by a Loom checkpoint");
    }
    const std::string actual = checksum_of(tensor);
    if (actual != found->second) {
      tag::kCheckpoint.fail(
          path.string(), ": tensor '", name, "' is corrupt (checksum ", actual, ", recorded ",
          found->second,
          "); the file was damaged after it was written: restore it or resume from an "
          "earlier checkpoint");
    }
  }
  return contents;
}

}  // namespace loom::strategies::checkpoint
