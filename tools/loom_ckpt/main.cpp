// loom-ckpt: looks into and converts Loom's checkpoints (train_gpt's and Fabric's;
// docs/checkpoints.md), through their index.json.
//
//   loom-ckpt inspect CKPT       step, strategy, world size, format; files; per tensor its
//                                dtype, shape and shards (file[first, end) for a run of
//                                elements, file[offsets]+[sizes] for a box)
//   loom-ckpt verify CKPT        meta.json (as inspect reads it; a train_gpt checkpoint's step
//                                against its directory's name and its optimizer's step count),
//                                the index against the files
//                                (sizes, and every header: names, dtypes, shapes, shards,
//                                offsets) and every checksum of every shard; exit 1 naming
//                                the first bad one
//   loom-ckpt diff A B           per tensor, the largest absolute difference (exit 1 when any
//                                differ); A and B may have any formats and world sizes
//   loom-ckpt convert SRC DST --to full
//                                the weights into DST/model.safetensors (whole, Hugging Face
//                                layout), the rest of the state into one rank file
//   loom-ckpt convert SRC DST --to sharded --world-size N [--strategy NAME]
//                                every tensor split evenly over N rank files
//
// CKPT is a step directory (DIR/step-00000040), a checkpoint root (DIR: its newest committed
// step) or a Fabric save. DST must not exist; it is written as a committed checkpoint. Every
// subcommand refuses what train_gpt's and Fabric's readers refuse: an index its files'
// headers do not give (tensor_index.h), and for inspect and convert a meta.json of another
// format or version, or with a field of the wrong type or range.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string_view>

#include "core/error.h"
#include "nn/gpt_io.h"
#include "strategies/checkpoint/checked_file.h"
#include "strategies/checkpoint/checkpoint_reader.h"
#include "strategies/checkpoint/directory.h"
#include "strategies/checkpoint/distributed_state.h"
#include "tools/train_gpt/train_state.h"

namespace {

namespace fs = std::filesystem;
using namespace loom;
using namespace loom::strategies::checkpoint;

// A step directory, or a root's newest committed one.
fs::path resolve(const std::string& given) {
  fs::path path(given);
  if (Directory::is_committed(path)) return path;
  if (auto latest = Directory(path).latest()) return *latest;
  fail(given, " is neither a committed checkpoint (a directory with ",
       Directory::kMarker, ") nor a directory holding one");
}

// Fabric::save's meta.json (strategies/fabric.cpp): format, version, strategy, world size.
constexpr const char* kFabricFormat = "loom-fabric-state";
constexpr int64_t kFabricVersion = 2;

// meta.json, checked as the checkpoint's own reader checks it: train_gpt's every field
// (train_gpt::check_train_meta), Fabric's format and version; the fields inspect shows are then
// of their types. With `state`, a train_gpt checkpoint's step and optimizer are checked against
// the state it reads too (train_gpt::check_train_step), so that a stale meta.json is neither
// verified nor converted.
nlohmann::json read_meta(const fs::path& checkpoint, CheckpointReader* state = nullptr) {
  const CheckpointMeta meta(checkpoint);
  const std::string format = meta.text("format", {train_gpt::kCheckpointFormat, kFabricFormat});
  if (format == train_gpt::kCheckpointFormat) {
    const train_gpt::TrainMeta train = train_gpt::check_train_meta(meta);
    if (state != nullptr) train_gpt::check_train_step(train, *state);
  } else {
    meta.integer("version", kFabricVersion, kFabricVersion);
    meta.text("strategy");
    meta.integer("world_size", 1, std::numeric_limits<int>::max());
  }
  return meta.json();
}

std::string shape_text(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i)
    s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Model parameters are the names without a state prefix (distributed_state.h).
bool is_parameter(const std::string& name) {
  for (const char* prefix : {"optim.", "scaler.", "train.", "tensors."})
    if (name.rfind(prefix, 0) == 0) return false;
  return true;
}

int inspect(const fs::path& checkpoint) {
  const nlohmann::json meta = read_meta(checkpoint);
  const Index index = Index::read(checkpoint);
  std::printf("checkpoint %s\n  ", checkpoint.string().c_str());
  if (meta.contains("step")) std::printf("step %lld, ", meta.at("step").get<long long>());
  std::printf("strategy %s on %d rank(s)", meta.at("strategy").get<std::string>().c_str(),
              meta.at("world_size").get<int>());
  if (meta.contains("optimizer"))
    std::printf(", optimizer %s", meta.at("optimizer").get<std::string>().c_str());
  if (meta.contains("checkpoint_format"))
    std::printf(", %s format", meta.at("checkpoint_format").get<std::string>().c_str());
  std::printf("\n");
  if (meta.contains("model")) std::printf("  model %s\n", meta.at("model").dump().c_str());
  for (const auto& [file, bytes] : index.file_bytes)
    std::printf("  %s: %llu bytes\n", file.c_str(), static_cast<unsigned long long>(bytes));
  for (const auto& [name, entry] : index.tensors) {
    std::printf("    %-44s %-5s %-12s", name.c_str(), std::string(dtype_name(entry.dtype)).c_str(),
                shape_text(entry.shape).c_str());
    for (const Shard& s : entry.shards) {
      if (s.sizes.empty()) {
        std::printf(" %s[%lld,%lld)", s.file.c_str(), static_cast<long long>(s.begin),
                    static_cast<long long>(s.end));
      } else {
        std::printf(" %s%s+%s", s.file.c_str(), shape_text(s.offsets).c_str(),
                    shape_text(s.sizes).c_str());
      }
    }
    std::printf("\n");
  }
  return 0;
}

int verify(const fs::path& checkpoint) {
  // The index, its tiling, the files' sizes and every header against the index (Index::read),
  // then meta.json: every field's type and range, and its step and optimizer against the state.
  CheckpointReader reader(checkpoint);
  read_meta(checkpoint, &reader);
  size_t shards = 0;
  for (const auto& [name, entry] : reader.index().tensors) {
    reader.read(name);  // every block of every shard; throws naming the first bad one
    shards += entry.shards.size();
  }
  std::printf(
      "%s: meta.json is valid; %zu tensors in %zu shards of %zu files, every header matches "
      "the index, "
      "every checksum matches\n",
      checkpoint.string().c_str(), reader.index().tensors.size(), shards,
      reader.index().file_bytes.size());
  return 0;
}

int diff(const fs::path& a, const fs::path& b) {
  CheckpointReader x(a), y(b);
  bool differ = false;
  for (const auto& [name, entry] : x.index().tensors) {
    if (!y.contains(name) || y.entry(name).shape != entry.shape) {
      std::printf("%-44s %s\n", name.c_str(), y.contains(name) ? "shapes differ" : "missing in B");
      differ = true;
      continue;
    }
    const std::vector<double> u = x.read(name).to_vector<double>();
    const std::vector<double> v = y.read(name).to_vector<double>();
    double worst = 0;
    for (size_t i = 0; i < u.size(); ++i)
      worst = std::max(worst, std::abs(u[i] - v[i]));
    if (worst != 0 || !std::equal(u.begin(), u.end(), v.begin())) differ = true;
    std::printf("%-44s max |a - b| %.3g\n", name.c_str(), worst);
  }
  for (const auto& [name, entry] : y.index().tensors) {
    if (!x.contains(name)) {
      std::printf("%-44s missing in A\n", name.c_str());
      differ = true;
    }
  }
  std::printf("%s\n", differ ? "the checkpoints differ" : "the checkpoints are equal");
  return differ ? 1 : 0;
}

// Writes DST.partial, then commits it as DST.
int convert(const fs::path& source, const fs::path& target, const std::string& to, int world,
            const std::string& strategy) {
  if (fs::exists(target)) fail("loom-ckpt convert: ", target.string(), " exists; give a new directory");
  if (to == "sharded" && world < 1) fail("loom-ckpt convert --to sharded needs --world-size N >= 1");
  CheckpointReader reader(source);
  nlohmann::json meta = read_meta(source, &reader);
  const fs::path staging = target.string() + ".partial";
  fs::remove_all(staging);
  fs::create_directories(staging);
  const int files = to == "full" ? 1 : world;
  std::vector<std::vector<TensorPiece>> pieces(files);
  safetensors::TensorMap weights;
  for (const auto& [name, entry] : reader.index().tensors) {
    const Tensor whole = reader.read(name);
    if (to == "full" && is_parameter(name)) {
      weights.emplace(name, whole);
      continue;
    }
    const Tensor flat = whole.reshape({whole.numel()});
    const int64_t n = flat.numel();
    for (int r = 0; r < files; ++r) {
      const int64_t lo = n * r / files, hi = n * (r + 1) / files;
      if (lo < hi)
        pieces[r].push_back({name, entry.shape, lo, Tensor::make_view(flat, {hi - lo}, {1}, lo)});
    }
  }
  if (to == "full") {
    safetensors::Metadata metadata;
    if (meta.contains("model")) {  // checked by read_meta: train_gpt's model sizes
      nn::GPTConfig c;
      const nlohmann::json& m = meta.at("model");
      c.layers = m.at("layers"), c.heads = m.at("heads"), c.embd = m.at("embd");
      c.context = m.at("context"), c.vocab_size = m.at("vocab_size");
      metadata = nn::gpt_metadata(c);
    }
    save_checked(staging / kModelFile, weights, metadata);
  }
  for (int r = 0; r < files; ++r)
    write_pieces(staging / rank_file(r), pieces[r]);
  write_index(staging, files);
  meta["world_size"] = files;
  if (!strategy.empty()) meta["strategy"] = strategy;
  if (meta.contains("checkpoint_format")) meta["checkpoint_format"] = to;
  std::ofstream(staging / "meta.json") << meta.dump(1) << "\n";
  commit_directory(staging, target);
  std::printf("%s: %zu tensors from %s, %s%s\n", target.string().c_str(),
              reader.index().tensors.size(), source.string().c_str(),
              to == "full" ? "weights in model.safetensors" : "sharded over ",
              to == "full" ? "" : (std::to_string(files) + " rank file(s)").c_str());
  return 0;
}

}  // namespace

// CLI11 answers an unknown subcommand with "A subcommand is required": name it instead.
bool is_known_subcommand(int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return true;  // none (CLI11 says so), or an option
  for (std::string_view known : {"inspect", "verify", "diff", "convert"})
    if (known == argv[1]) return true;
  std::fprintf(stderr,
               "loom-ckpt: unknown subcommand '%s'; expected one of inspect, verify, diff, "
               "convert (loom-ckpt --help describes them)\n",
               argv[1]);
  return false;
}

int main(int argc, char** argv) {
  if (!is_known_subcommand(argc, argv)) return 2;
  CLI::App app{"loom-ckpt: inspect, verify, compare and convert Loom checkpoints"};
  app.require_subcommand(1);
  std::string one, two, to, strategy;
  int world = 0;
  auto* inspect_cmd = app.add_subcommand("inspect", "step, strategy, files, tensors and shards");
  inspect_cmd->add_option("checkpoint", one, "a step directory or a checkpoint root")->required();
  auto* verify_cmd = app.add_subcommand("verify", "check the index and every checksum");
  verify_cmd->add_option("checkpoint", one, "a step directory or a checkpoint root")->required();
  auto* diff_cmd = app.add_subcommand("diff", "largest absolute difference per tensor");
  diff_cmd->add_option("a", one, "a step directory or a checkpoint root")->required();
  diff_cmd->add_option("b", two, "a step directory or a checkpoint root")->required();
  auto* convert_cmd = app.add_subcommand("convert", "rewrite as the full or the sharded format");
  convert_cmd->add_option("source", one, "a step directory or a checkpoint root")->required();
  convert_cmd->add_option("target", two, "the new checkpoint directory")->required();
  convert_cmd->add_option("--to", to, "full or sharded")
      ->required()
      ->check(CLI::IsMember({"full", "sharded"}));
  convert_cmd->add_option("--world-size", world, "rank files of the sharded format");
  convert_cmd->add_option("--strategy", strategy, "the strategy to record in meta.json");
  CLI11_PARSE(app, argc, argv);
  try {
    if (*inspect_cmd) return inspect(resolve(one));
    if (*verify_cmd) return verify(resolve(one));
    if (*diff_cmd) return diff(resolve(one), resolve(two));
    return convert(resolve(one), two, to, world, strategy);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loom-ckpt: %s\n", e.what());
    return 1;
  }
}
