#pragma once
// A small distributed checkpoint for the checkpoint harnesses, written by the project's own
// writers: what two ranks of a save hold (strategies/checkpoint/distributed_state.h), in
// rank-00000.safetensors and rank-00001.safetensors (write_pieces), and a full model file
// (save_checked, whole tensors with per-tensor checksums). Blocks of 8 bytes, so that most
// shards have several checksums. The seeds of corpus/checkpoint_index/ and
// corpus/tensor_index/ are these files and their index.json (Index::of_files, Index::write);
// the harnesses write the same bytes once per process, so the seeds' file sizes and
// checksums hold.
//
//   w                 F32 [2, 3]  a run [0, 4) on rank 0, [4, 6) on rank 1
//   tp                F32 [2, 4]  a box per rank: columns 0-1 on rank 0, 2-3 on rank 1
//   optim.step_count  I64 []      whole, on rank 0
//   bf                BF16 [5]    whole, on rank 1

#include <filesystem>
#include <vector>

#include "core/error.h"
#include "strategies/checkpoint/checked_file.h"
#include "strategies/checkpoint/checkpoint_reader.h"
#include "strategies/checkpoint/distributed_state.h"
#include "strategies/checkpoint/tensor_index.h"
#include "tensor/tensor.h"
#include "tests/fuzz/fuzz_support.h"

namespace loom::fuzz {

inline constexpr uint64_t kFixtureBlockBytes = 8;
inline constexpr const char* kFixtureModelFile = "model.safetensors";

inline void write_checkpoint_fixture(const std::filesystem::path& directory) {
  namespace ckpt = strategies::checkpoint;
  auto f32 = [](std::vector<float> values) {
    const int64_t n = static_cast<int64_t>(values.size());
    return Tensor::from_vector<float>(values, {n});
  };
  const std::vector<ckpt::TensorPiece> rank0 = {
      {.name = "w", .shape = {2, 3}, .begin = 0, .values = f32({1, 2, 3, 4})},
      {.name = "tp",
       .shape = {2, 4},
       .values = f32({10, 11, 14, 15}),
       .offsets = {0, 0},
       .sizes = {2, 2}},
      {.name = "optim.step_count",
       .shape = {},
       .values = Tensor::from_vector<int64_t>({7}, {1})},
  };
  const std::vector<ckpt::TensorPiece> rank1 = {
      {.name = "w", .shape = {2, 3}, .begin = 4, .values = f32({5, 6})},
      {.name = "tp",
       .shape = {2, 4},
       .values = f32({12, 13, 16, 17}),
       .offsets = {0, 2},
       .sizes = {2, 2}},
      {.name = "bf", .shape = {5}, .values = Tensor::ones({5}, DType::BF16)},
  };
  ckpt::write_pieces(directory / ckpt::rank_file(0), rank0, kFixtureBlockBytes);
  ckpt::write_pieces(directory / ckpt::rank_file(1), rank1, kFixtureBlockBytes);
  ckpt::save_checked(directory / kFixtureModelFile,
                     {{"wte", Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {3, 2})},
                      {"ln.bias", Tensor::zeros({2}, DType::F16)}});
}

// This process's copy of the fixture, written on first use into its scratch directory.
inline const std::filesystem::path& fixture_directory() {
  static const std::filesystem::path directory = [] {
    std::filesystem::path path = scratch_directory() / "checkpoint";
    std::filesystem::create_directories(path);
    write_checkpoint_fixture(path);
    return path;
  }();
  return directory;
}

// Reads every tensor of an accepted checkpoint as its loaders do: whole (read, through
// read_into), and then as one box over its whole shape (read_box). Errors are loom::Error
// (checkpoint_reader.h), each ending only the read that raised it.
inline void read_every_tensor(strategies::checkpoint::CheckpointReader& reader) {
  for (const auto& [name, entry] : reader.index().tensors) {
    try {
      const Tensor whole = reader.read(name);
      Tensor box = Tensor::empty({whole.numel()}, entry.dtype);
      reader.read_box(name, Shape(entry.shape.size(), 0), entry.shape, box);
    } catch (const Error&) {
    }
  }
}

}  // namespace loom::fuzz
