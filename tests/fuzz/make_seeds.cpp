// Writes the project-made seeds of tests/fuzz/corpus/ (the JSON configs of
// corpus/deepspeed_config/ are written by hand):
//
//   build/asan/tests/fuzz/fuzz_make_seeds tests/fuzz/corpus
//
// safetensors/      files save() writes (every dtype, metadata, empty and zero-size tensors)
//                   and the checkpoint fixture's files, plus a few broken on purpose
// tcp_store/        what a TCPStore client sends on a connection: the Hello with the proof
//                   for the harness's secret and nonce, then requests (MessageWriter)
// checkpoint_index/ index.json of the checkpoint fixture (Index::of_files, Index::write)
// tensor_index/     the fixture's rank 0 file, a one-rank save and a full model file
//
// Deterministic: running it again rewrites the same bytes.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "comm/store/tcp_auth.h"
#include "comm/store/tcp_protocol.h"
#include "strategies/checkpoint/checked_file.h"
#include "strategies/checkpoint/distributed_state.h"
#include "strategies/checkpoint/tensor_index.h"
#include "tensor/safetensors.h"
#include "tests/fuzz/checkpoint_fixture.h"

namespace {

namespace fs = std::filesystem;
using namespace loom;
namespace ckpt = strategies::checkpoint;

void write(const fs::path& path, std::string_view bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) fail("cannot write ", path.string());
}

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void copy_bytes(const fs::path& from, const fs::path& to) {
  write(to, read(from));
}

void safetensors_seeds(const fs::path& out, const fs::path& fixture) {
  const fs::path dir = out / "safetensors";
  auto save = [&](const std::string& name, const safetensors::TensorMap& tensors,
                  const safetensors::Metadata& metadata = {}) {
    const std::vector<std::byte> bytes = safetensors::serialize(tensors, metadata);
    write(dir / name, {reinterpret_cast<const char*>(bytes.data()), bytes.size()});
  };
  save("empty.safetensors", {});
  save("metadata-only.safetensors", {}, {{"format", "pt"}, {"note", "no tensors"}});
  save("dtypes.safetensors",
       {{"f64", Tensor::from_vector<double>({1.5, -2}, {2})},
        {"f32", Tensor::from_vector<float>({1, 2, 3, 4, 5, 6}, {2, 3})},
        {"f16", Tensor::ones({3}, DType::F16)},
        {"bf16", Tensor::ones({2, 1}, DType::BF16)},
        {"i64", Tensor::from_vector<int64_t>({-1, 7}, {2})},
        {"i32", Tensor::from_vector<int32_t>({3}, {1, 1, 1})},
        {"u8", Tensor::from_vector<uint8_t>({0, 255}, {2})}},
       {{"format", "pt"}});
  save("scalar-and-empty.safetensors",
       {{"scalar", Tensor::from_vector<float>({3.25f}, {})},
        {"empty", Tensor::zeros({0, 4})},
        {"empty_too", Tensor::zeros({2, 0, 3}, DType::I64)}});
  for (const char* file : {"rank-00000.safetensors", "rank-00001.safetensors", "model.safetensors"})
    copy_bytes(fixture / file, dir / ("fixture-" + std::string(file)));

  // Broken on purpose: cut short, a header length past the end, a header that is not an
  // object, tensors that overlap.
  const std::string valid = read(dir / "dtypes.safetensors");
  write(dir / "broken-truncated.safetensors", std::string_view(valid).substr(0, valid.size() - 3));
  std::string long_header = valid;
  long_header[6] = '\x01';
  write(dir / "broken-header-length.safetensors", long_header);
  auto with_header = [](std::string header, std::string_view data) {
    std::string bytes(8, '\0');
    for (int i = 0; i < 8; ++i)
      bytes[i] = static_cast<char>((static_cast<uint64_t>(header.size()) >> (8 * i)) & 0xFF);
    return bytes + header + std::string(data);
  };
  write(dir / "broken-not-object.safetensors", with_header("[1, 2]", ""));
  write(dir / "broken-overlap.safetensors",
        with_header(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                    R"("b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}})",
                    "abc"));
}

void tcp_store_seeds(const fs::path& out) {
  using namespace comm::tcp;
  // The harness's secret and nonce (fuzz_tcp_store.cpp).
  const std::string proof = hello_proof("loom-fuzz-secret", "0123456789abcdef0123456789abcdef");
  auto frame = [](MessageWriter&& message) {
    const comm::Bytes bytes = std::move(message).frame();
    return std::string(bytes.begin(), bytes.end());
  };
  const std::string hello = frame(std::move(MessageWriter(kHello).integer(kProtocolVersion).field(proof)));
  const fs::path dir = out / "tcp_store";
  write(dir / "hello", hello);
  write(dir / "hello-wrong-proof",
        frame(std::move(MessageWriter(kHello).integer(kProtocolVersion).field(std::string(32, 'x')))));
  write(dir / "set-get", hello + frame(std::move(MessageWriter(kSet).field("key").field("value"))) +
                             frame(std::move(MessageWriter(kGet).field("key").integer(1000))));
  write(dir / "add", hello + frame(std::move(MessageWriter(kSet).field("n").field("41"))) +
                         frame(std::move(MessageWriter(kAdd).field("n").integer(1))) +
                         frame(std::move(MessageWriter(kAdd).field("fresh").integer(-5))));
  write(dir / "compare-set",
        hello + frame(std::move(MessageWriter(kCompareSet).field("k").field("").field("v1"))) +
            frame(std::move(MessageWriter(kCompareSet).field("k").field("v1").field("v2"))));
  write(dir / "wait-check-remove",
        hello + frame(std::move(MessageWriter(kWait).integer(10).field("a").field("b"))) +
            frame(std::move(MessageWriter(kCheck).field("a").field("b").field("c"))) +
            frame(std::move(MessageWriter(kRemove).field("a"))));
}

void checkpoint_seeds(const fs::path& out, const fs::path& fixture) {
  const std::string model = loom::fuzz::kFixtureModelFile;
  const std::string rank0 = ckpt::rank_file(0), rank1 = ckpt::rank_file(1);
  ckpt::Index::of_files(fixture, {model, rank0, rank1}).write(fixture);
  copy_bytes(fixture / ckpt::kIndexFile, out / "checkpoint_index" / "index-model-and-ranks.json");
  ckpt::Index::of_files(fixture, {rank0, rank1}).write(fixture);
  copy_bytes(fixture / ckpt::kIndexFile, out / "checkpoint_index" / "index-ranks.json");
  ckpt::Index::of_files(fixture, {model}).write(fixture);
  copy_bytes(fixture / ckpt::kIndexFile, out / "checkpoint_index" / "index-model.json");

  const fs::path dir = out / "tensor_index";
  copy_bytes(fixture / rank0, dir / "rank-00000-of-2.safetensors");
  copy_bytes(fixture / model, dir / "model.safetensors");
  // A save of one rank: every tensor whole in its file.
  const fs::path single = fixture / "single.safetensors";
  ckpt::write_pieces(single,
                     {{.name = "w", .shape = {2, 2}, .values = Tensor::ones({4})},
                      {.name = "optim.step_count",
                       .shape = {},
                       .values = Tensor::from_vector<int64_t>({3}, {1})}},
                     loom::fuzz::kFixtureBlockBytes);
  copy_bytes(single, dir / "rank-00000-of-1.safetensors");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR (tests/fuzz/corpus)\n", argv[0]);
    return 2;
  }
  const fs::path out = argv[1];
  const fs::path fixture = fs::temp_directory_path() / "loom-fuzz-seeds";
  fs::remove_all(fixture);
  fs::create_directories(fixture);
  try {
    loom::fuzz::write_checkpoint_fixture(fixture);
    safetensors_seeds(out, fixture);
    tcp_store_seeds(out);
    checkpoint_seeds(out, fixture);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "%s\n", error.what());
    fs::remove_all(fixture);
    return 1;
  }
  fs::remove_all(fixture);
  return 0;
}
