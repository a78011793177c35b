// Checkpoint files and directories (strategies/checkpoint/): checksums catch a flipped byte
// and name the file and tensor; a save interrupted at any point leaves nothing a reader takes
// for a checkpoint; pruning keeps the newest.

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "strategies/checkpoint/checked_file.h"
#include "strategies/checkpoint/checkpoint_reader.h"
#include "strategies/checkpoint/tensor_index.h"
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

// Flips one bit of the byte at `offset` of `file`.
void flip_byte(const fs::path& file, uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c ^= 1;
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

// A [6, 100] f32 tensor in two shards of two files, with 64-byte checksum blocks.
TEST(TensorIndex, RangesReadOnlyTheBlocksTheyOverlapAndCheckThem) {
  TempDir dir;
  std::vector<float> values(600);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>(i);
  const Tensor whole = Tensor::from_vector<float>(values, {600});
  auto part = [&](int64_t begin, int64_t length) {
    return Tensor::make_view(whole, {length}, {1}, begin);
  };
  write_pieces(dir.path() / "a.safetensors", {{"w", {6, 100}, 0, part(0, 250)},
                                              {"b", {}, 0, Tensor::from_vector<float>({7}, {1})}},
               64);
  write_pieces(dir.path() / "b.safetensors", {{"w", {6, 100}, 250, part(250, 350)}}, 64);
  Index::of_files(dir.path(), {"a.safetensors", "b.safetensors"}).write(dir.path());

  CheckpointReader reader(dir.path());
  EXPECT_EQ(reader.entry("w").shards.size(), 2u);
  Tensor out = Tensor::empty({20}, DType::F32, Device::cpu());
  reader.read_into("w", 240, out);  // across both shards
  for (int64_t i = 0; i < 20; ++i)
    EXPECT_EQ(out.to_vector<float>()[i], static_cast<float>(240 + i));
  EXPECT_LE(reader.bytes_read(), 4 * 64u) << "one or two 64-byte blocks on each side";
  EXPECT_EQ(reader.read("w").to_vector<float>(), values);
  EXPECT_EQ(reader.read("b").item(), 7.0);

  // A flipped byte in the second shard's last block: a read of its first elements does not
  // touch it, a read of the whole tensor names the file and the tensor.
  const Shard& second = reader.entry("w").shards[1];
  flip_byte(dir.path() / "b.safetensors", second.byte_end - 1);
  CheckpointReader damaged(dir.path());
  Tensor head = Tensor::empty({10}, DType::F32, Device::cpu());
  damaged.read_into("w", 250, head);
  EXPECT_EQ(head.to_vector<float>()[0], 250.0f);
  const std::string e = error_of([&] { damaged.read("w"); });
  EXPECT_NE(e.find("b.safetensors: tensor 'w' is corrupt"), std::string::npos) << e;

  // Index and files must agree.
  EXPECT_NE(error_of([&] { Index::of_files(dir.path(), {"a.safetensors"}); })
                .find("tensor 'w' of shape [6,100] has shards for its first 250 of 600"),
            std::string::npos);
  write_pieces(dir.path() / "c.safetensors", {{"w", {6, 100}, 200, part(200, 100)}});
  EXPECT_NE(error_of([&] { Index::of_files(dir.path(), {"a.safetensors", "c.safetensors"}); })
                .find("has two shards holding elements [200, 250)"),
            std::string::npos);
  write_pieces(dir.path() / "d.safetensors", {{"w", {600}, 250, part(250, 350)}});
  EXPECT_NE(error_of([&] { Index::of_files(dir.path(), {"a.safetensors", "d.safetensors"}); })
                .find("is f32 [600] in d.safetensors but f32 [6,100] in a.safetensors"),
            std::string::npos);
}

// Boxes (what tensor-parallel ranks hold): a [6, 100] tensor as two blocks of columns, read
// back by flat ranges that cross rows and blocks; boxes that overlap or leave the tensor are
// refused.
TEST(TensorIndex, BoxesOfColumnsReadAsRuns) {
  TempDir dir;
  std::vector<float> values(600);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>(i);
  const Tensor whole = Tensor::from_vector<float>(values, {6, 100});
  auto columns = [&](int64_t first, int64_t count) {
    return whole.narrow(1, first, count).contiguous().reshape({6 * count});
  };
  write_pieces(dir.path() / "tp0.safetensors", {{"w", {6, 100}, 0, columns(0, 40), {0, 0}, {6, 40}}}, 64);
  write_pieces(dir.path() / "tp1.safetensors", {{"w", {6, 100}, 0, columns(40, 60), {0, 40}, {6, 60}}}, 64);
  Index::of_files(dir.path(), {"tp0.safetensors", "tp1.safetensors"}).write(dir.path());
  CheckpointReader reader(dir.path());
  EXPECT_EQ(reader.read("w").to_vector<float>(), values);
  Tensor out = Tensor::empty({150}, DType::F32, Device::cpu());
  reader.read_into("w", 130, out);  // rows 1 to 2, both blocks
  for (int64_t i = 0; i < 150; ++i)
    ASSERT_EQ(out.to_vector<float>()[i], static_cast<float>(130 + i));
  EXPECT_EQ(runs_of(reader.entry("w").shards[0], {6, 100}).size(), 6u);

  write_pieces(dir.path() / "tp2.safetensors", {{"w", {6, 100}, 0, columns(30, 70), {0, 30}, {6, 70}}});
  EXPECT_NE(error_of([&] { Index::of_files(dir.path(), {"tp0.safetensors", "tp2.safetensors"}); })
                .find("has two shards holding elements [30, 40)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              write_pieces(dir.path() / "bad.safetensors",
                           {{"w", {6, 100}, 0, Tensor::zeros({420}, DType::F32), {0, 40}, {6, 70}}});
            }).find("leaves the tensor's shape [6,100]"),
            std::string::npos);
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
