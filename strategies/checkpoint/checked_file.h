#pragma once
// Safetensors files whose every tensor carries a checksum (XXH3-64 of its bytes, in the
// metadata as "loom.xxh3.<tensor name>": 16 hex digits), verified when read, so that a
// flipped byte is an error naming the file and the tensor, never a silently different
// model. The files stay ordinary safetensors files (Python's safetensors and Hugging Face
// tools read them; they ignore the extra metadata).

#include <filesystem>

#include "tensor/safetensors.h"

namespace loom::strategies::checkpoint {

// safetensors::save (atomic, durable) with the checksums added to `metadata`.
void save_checked(const std::filesystem::path& path, const safetensors::TensorMap& tensors,
                  safetensors::Metadata metadata = {});

// safetensors::load, then every tensor checked against its checksum. Throws loom::Error
// naming the file and the tensor for a mismatch or a missing checksum.
safetensors::Contents load_checked(const std::filesystem::path& path);

}  // namespace loom::strategies::checkpoint
