// Checkpoint files and directories (strategies/checkpoint/): checksums catch a flipped byte
// and name the file and tensor; a save interrupted at any point leaves nothing a reader takes
// for a checkpoint; pruning keeps the newest.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "strategies/checkpoint/checked_file.h"
#include "strategies/checkpoint/directory.h"
#include "tensor/error.h"
#include "test_support.h"

namespace loom::strategies::checkpoint {
namespace {

namespace fs = std::filesystem;

using loom::testing::error_of;
using loom::testing::TempDir;

TEST(CheckedFile, RoundTripsAndNamesACorruptTensor) {
  TempDir dir;
  const fs::path file = dir.path() / "state.safetensors";
  save_checked(file, {{"a", Tensor::from_vector<float>({1, 2, 3}, {3})},
                      {"b", Tensor::from_vector<int64_t>({7}, {})}},
               {{"note", "kept"}});
  safetensors::Contents back = load_checked(file);
  EXPECT_EQ(back.tensors.at("a").to_vector<float>(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(back.metadata.at("note"), "kept");
  EXPECT_EQ(back.metadata.at("loom.xxh3.a").size(), 16u);

  // Flip one bit of the last byte: tensor "b"'s data (tensors are stored in name order).
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c ^= 1;
    f.seekp(-1, std::ios::end);
    f.write(&c, 1);
  }
  const std::string e = error_of([&] { load_checked(file); });
  EXPECT_NE(e.find(file.string()), std::string::npos) << e;
  EXPECT_NE(e.find("tensor 'b' is corrupt"), std::string::npos) << e;

  // A plain safetensors file is not taken for a checkpoint file.
  safetensors::save(file, {{"a", Tensor::from_vector<float>({1}, {1})}});
  EXPECT_NE(error_of([&] { load_checked(file); }).find("has no checksum"), std::string::npos);
}

void write(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
}

TEST(CheckpointDirectory, OnlyCommittedCheckpointsCountAndPruneKeepsTheNewest) {
  TempDir dir;
  Directory ckpt(dir.path() / "run");
  EXPECT_FALSE(ckpt.latest().has_value());
  for (int64_t step : {10, 20, 30}) {
    ckpt.prepare(step);
    write(ckpt.staging(step) / "model.safetensors", "x");
    ckpt.commit(step);
  }
  // A save interrupted before its rename, and one after the rename but before the marker.
  ckpt.prepare(40);
  write(ckpt.staging(40) / "model.safetensors", "partial");
  fs::create_directory(ckpt.committed_path(50));
  write(ckpt.committed_path(50) / "model.safetensors", "unmarked");
  ASSERT_TRUE(ckpt.latest().has_value());
  EXPECT_EQ(*ckpt.latest(), ckpt.committed_path(30));
  EXPECT_EQ(step_of(*ckpt.latest()), 30);
  EXPECT_EQ(ckpt.committed().size(), 3u);

  ckpt.prune(2);
  EXPECT_EQ(ckpt.committed(), (std::vector<fs::path>{ckpt.committed_path(20),
                                                      ckpt.committed_path(30)}));
  EXPECT_FALSE(fs::exists(ckpt.staging(40)));
  EXPECT_FALSE(fs::exists(ckpt.committed_path(50)));
  EXPECT_TRUE(fs::exists(ckpt.committed_path(30) / Directory::kMarker));

  // A root that cannot be created is named.
  write(dir.path() / "file", "x");
  Directory bad(dir.path() / "file" / "run");
  const std::string e = error_of([&] { bad.prepare(1); });
  EXPECT_NE(e.find("cannot create the checkpoint directory"), std::string::npos) << e;
}

}  // namespace
}  // namespace loom::strategies::checkpoint
