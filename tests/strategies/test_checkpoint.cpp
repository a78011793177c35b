// Checkpoint files and directories (strategies/checkpoint/): checksums catch a flipped byte
// and name the file and tensor; an index its files' headers do not give is refused; meta.json
// fields are read with their types and ranges; a save interrupted at any point leaves nothing
// a reader takes for a checkpoint; pruning keeps the newest.

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "strategies/checkpoint/checked_file.h"
#include "strategies/checkpoint/checkpoint_reader.h"
#include "strategies/checkpoint/directory.h"
#include "strategies/checkpoint/distributed_state.h"
#include "strategies/checkpoint/tensor_index.h"
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

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Expects `message` to contain every one of `needles`.
void expect_contains(const std::string& message, const std::vector<std::string>& needles) {
  for (const std::string& needle : needles)
    EXPECT_NE(message.find(needle), std::string::npos) << "no \"" << needle << "\" in: " << message;
}

// Note [The index is checked against the headers]: a reader takes index.json only when its
// files' headers give exactly it, and only as the writer writes it; each of these edits (and a
// damaged header) is refused naming the file and what differs.
TEST(TensorIndex, ReadersRefuseAnIndexItsFilesDoNotGive) {
  TempDir dir;
  std::vector<float> values(16);
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>(i);
  write_pieces(dir.path() / "a.safetensors",
               {{"w", {4, 4}, 0, Tensor::from_vector<float>(values, {16})},
                {"b", {}, 0, Tensor::from_vector<float>({7}, {1})}},
               32);
  Index::of_files(dir.path(), {"a.safetensors"}).write(dir.path());
  const fs::path index = dir.path() / kIndexFile;
  const std::string good = read_text(index);
  EXPECT_EQ(Index::read(dir.path()).tensors.size(), 2u);

  // The index edited: `edit` applied to its JSON.
  auto refusal = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json changed = nlohmann::json::parse(good);
    edit(changed);
    write(index, changed.dump(1));
    return error_of([&] { Index::read(dir.path()); });
  };
  expect_contains(refusal([](nlohmann::json& ix) { ix["tensors"].erase("b"); }),
                  {index.string(), "does not list tensor 'b', which a.safetensors holds"});
  expect_contains(refusal([](nlohmann::json& ix) { ix["tensors"] = nlohmann::json::object(); }),
                  {index.string(), "does not list tensor"});
  expect_contains(refusal([](nlohmann::json& ix) { ix["tensors"] = nlohmann::json::array(); }),
                  {index.string(), "\"tensors\" is a JSON array; expected an object"});
  expect_contains(refusal([](nlohmann::json& ix) { ix["tensors"]["x"] = ix["tensors"]["b"]; }),
                  {"lists tensor 'x', which none of its files holds"});
  expect_contains(refusal([](nlohmann::json& ix) { ix["tensors"]["w"]["shape"] = {16}; }),
                  {"says tensor 'w' is f32 [16]; the header of a.safetensors says f32 [4,4]"});
  expect_contains(refusal([](nlohmann::json& ix) {
                    ix["tensors"]["w"]["shape"] = {-4, -4};
                  }),
                  {index.string(), "tensor 'w': shape [-4,-4] has a negative dimension"});
  expect_contains(
      refusal([](nlohmann::json& ix) {
        ix["tensors"]["w"]["shards"][0]["xxh3"][1] = "0000000000000000";
      }),
      {"tensor 'w': shard 0", "has checksum 0000000000000000 for block 1 in the index but"});
  expect_contains(
      refusal([](nlohmann::json& ix) { ix["tensors"]["w"]["shards"][0]["elements"] = {0}; }),
      {"tensor 'w', shard 0: \"elements\" is [0]; expected an array of 2 values"});

  // Files outside the checkpoint's directory, however the index names them.
  for (const std::string outside : {"../a.safetensors", "/etc/passwd", "..", ""}) {
    expect_contains(refusal([&](nlohmann::json& ix) {
                      ix["files"][outside] = ix["files"]["a.safetensors"];
                      for (auto& [name, entry] : ix["tensors"].items())
                        entry["shards"][0]["file"] = outside;
                      ix["files"].erase("a.safetensors");
                    }),
                    {"file '" + outside + "' is not the plain name of a file in the checkpoint"});
  }

  // A key twice: a parser would keep one of the values silently.
  std::string twice = good;
  const std::string tensors = "\"tensors\": {";
  twice.insert(twice.find(tensors) + tensors.size(), "\"w\": {\"dtype\": \"f32\"},");
  write(index, twice);
  expect_contains(error_of([&] { Index::read(dir.path()); }),
                  {index.string(), "key 'w' appears twice in the object of 'tensors'"});

  // The index as written, but a damaged header: the safetensors reader names the file.
  write(index, good);
  flip_byte(dir.path() / "a.safetensors", 9);
  expect_contains(error_of([&] { Index::read(dir.path()); }),
                  {"[safetensors] ", "a.safetensors: header is not valid JSON"});
}

// meta.json's fields are read with their types and ranges checked, every error naming the
// file, the field, the value and what is expected (nlohmann's own messages name none).
TEST(CheckpointMeta, FieldsAreReadWithTheirTypesAndRanges) {
  TempDir dir;
  const fs::path meta = dir.path() / kMetaFile;
  expect_contains(error_of([&] { CheckpointMeta m(dir.path()); }), {"has no meta.json"});
  for (const std::string text : {"{ nope", "", "[]", "{\"a\": 1, \"a\": 2}"}) {
    write(meta, text);
    expect_contains(error_of([&] { CheckpointMeta m(dir.path()); }),
                    {meta.string(), text == "[]"               ? "is a JSON array"
                                    : text.starts_with("{\"a") ? "key 'a' appears twice"
                                                               : "is not valid JSON"});
  }
  write(meta, R"({"format": "x", "step": -5, "big": 1e30, "name": 5, "huge": 18446744073709551615,
                  "kind": "zip", "model": {"heads": 0, "layers": 2}})");
  const CheckpointMeta m(dir.path());
  EXPECT_EQ(m.integer("model.layers", 1, 10), 2);
  EXPECT_EQ(m.text("format"), "x");
  EXPECT_EQ(m.unsigned_integer("huge"), UINT64_MAX);
  EXPECT_TRUE(m.has("model.heads"));
  EXPECT_FALSE(m.has("model.embd"));
  auto refusal = [&](const std::function<void()>& read) { return error_of(read); };
  const std::string at = meta.string() + ": ";
  expect_contains(refusal([&] { m.integer("step", 0, INT64_MAX); }),
                  {at + "\"step\" is -5; expected an integer >= 0"});
  expect_contains(refusal([&] { m.integer("big", 0, INT64_MAX); }),
                  {at + "\"big\" is 1e+30; expected an integer >= 0"});
  expect_contains(refusal([&] { m.integer("huge", 0, INT64_MAX); }), {"\"huge\" is 1844674"});
  expect_contains(refusal([&] { m.integer("format", 2, 2); }),
                  {at + "\"format\" is \"x\"; expected the integer 2"});
  expect_contains(refusal([&] { m.text("name"); }), {at + "\"name\" is 5; expected a string"});
  expect_contains(refusal([&] {
                    m.text("kind", {"full", "sharded"});
                  }),
                  {at + "\"kind\" is \"zip\"; expected one of \"full\", \"sharded\""});
  expect_contains(refusal([&] { m.integer("model.heads", 1, 8); }),
                  {at + "\"model.heads\" is 0; expected an integer from 1 to 8"});
  expect_contains(refusal([&] { m.integer("model.embd", 1, 8); }),
                  {meta.string() + " has no \"model.embd\"; expected an integer from 1 to 8"});
  expect_contains(refusal([&] { m.integer("format.x", 1, 8); }),
                  {at + "\"format\" is \"x\"; expected an object with \"x\""});
  expect_contains(refusal([&] { m.unsigned_integer("step"); }), {"\"step\" is -5"});
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
