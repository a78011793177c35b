#include "strategies/checkpoint/distributed_state.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "core/atomic_file.h"
#include "core/regular_file.h"
#include "core/error.h"
#include "core/tags.h"
#include "strategies/checkpoint/directory.h"
#include "tensor/ops.h"

namespace loom::strategies::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr const char* kStatePrefix = "optim.state.";

Tensor elements(const Tensor& flat, int64_t begin, int64_t length) {
  return Tensor::make_view(flat, {length}, {1}, flat.offset() + begin);
}

Tensor flattened(const Tensor& t) {
  const Tensor c = t.contiguous();
  return c.reshape({c.numel()});
}

// Appends this replica's even share of the part [begin, begin + values.numel()) of `name`.
void add_share(std::vector<TensorPiece>& out, const std::string& name, const Shape& shape,
               int64_t begin, const Tensor& values, std::pair<int, int> replica) {
  const auto [index, count] = replica;
  const int64_t n = values.numel();
  const int64_t lo = n * index / count, hi = n * (index + 1) / count;
  if (lo >= hi) return;
  out.push_back({name, shape, begin + lo, elements(values, lo, hi - lo).to(Device::cpu()).clone()});
}

// "state.<g>.<i>.<entry>" -> (g, i, entry); nullopt for other keys.
struct StateKey {
  size_t group, index;
  std::string entry;
};
std::optional<StateKey> parse_state_key(const std::string& key) {
  unsigned long g = 0, i = 0;
  int used = 0;
  if (std::sscanf(key.c_str(), "state.%lu.%lu.%n", &g, &i, &used) != 2 || used == 0)
    return std::nullopt;
  return StateKey{g, i, key.substr(used)};
}

// The whole shape of every parameter (a tensor-parallel rank holds parts of some).
std::map<std::string, Shape> parameter_shapes(const Strategy& strategy, const nn::Module& module) {
  std::map<std::string, Shape> shapes;
  for (const auto& [name, p] : module.named_parameters())
    shapes.emplace(name, strategy.parameter_shape(name, p));
  return shapes;
}

// The box `sizes` at `offsets` of a tensor, as a view.
Tensor box_of(Tensor t, const Shape& offsets, const Shape& sizes) {
  for (size_t d = 0; d < sizes.size(); ++d)
    t = t.narrow(static_cast<int64_t>(d), offsets[d], sizes[d]);
  return t;
}

Tensor scalar_of(const Tensor& t) {
  return flattened(t.to(Device::cpu())).reshape({});
}

}  // namespace

std::string rank_file(int rank) {
  char name[48];
  std::snprintf(name, sizeof name, "rank-%05d.safetensors", rank);
  return name;
}

std::vector<TensorPiece> state_pieces(Strategy& strategy, const nn::Module& module,
                                      const optim::Optimizer* optimizer, bool parameters,
                                      const std::map<std::string, Tensor>& extra) {
  std::vector<TensorPiece> pieces;
  const std::map<std::string, Shape> shapes = parameter_shapes(strategy, module);
  const std::pair<int, int> replica = strategy.replica_of_held();
  const bool chief = strategy.is_global_zero();
  auto whole = [&](const std::string& name, const Tensor& value) {
    if (chief) add_share(pieces, name, value.shape(), 0, flattened(value), {0, 1});
  };
  if (parameters) {
    for (const ParameterPart& part : strategy.held_parameters()) {
      if (part.sizes.empty()) {
        add_share(pieces, part.name, shapes.at(part.name), part.begin, part.values, replica);
      } else if (replica.first == 0) {  // a box: written whole by the first replica
        pieces.push_back({part.name, shapes.at(part.name), 0,
                          part.values.to(Device::cpu()).clone(), part.offsets, part.sizes});
      }
    }
  }
  if (optimizer != nullptr) {
    const OptimizerLayout layout = strategy.optimizer_layout(*optimizer);
    for (const auto& [key, value] : strategy.optimizer_state(*optimizer)) {
      const std::optional<StateKey> state = parse_state_key(key);
      if (!state) {
        whole("optim." + key, value);  // step_count, param_groups.<g>.<field>
        continue;
      }
      const std::vector<OptimizerPart>& parts = layout.at(state->group).at(state->index);
      const Tensor host = value.to(Device::cpu()).contiguous();
      const Tensor flat = flattened(host);
      for (const OptimizerPart& part : parts) {
        if (!strategy.writes_state_of(part.param)) continue;  // another rank's copy
        const std::string name = kStatePrefix + part.param + "." + state->entry;
        const bool box = !part.sizes.empty();
        if (optimizer->is_scalar_state(state->entry)) {
          // One number per parameter: from the holder of its first element.
          const bool first = box ? std::all_of(part.offsets.begin(), part.offsets.end(),
                                               [](int64_t o) { return o == 0; })
                                 : part.begin == 0;
          if (first && replica.first == 0) add_share(pieces, name, {}, 0, flat, {0, 1});
          continue;
        }
        if (box) {
          if (replica.first != 0) continue;
          const Tensor values = box_of(host, part.local_offsets, part.sizes).contiguous();
          pieces.push_back({name, shapes.at(part.param), 0, values.reshape({values.numel()}),
                            part.offsets, part.sizes});
          continue;
        }
        add_share(pieces, name, shapes.at(part.param), part.begin,
                  elements(flat, part.offset, part.length),
                  part.sole_holder ? std::pair{0, 1} : replica);
      }
    }
  }
  if (const LossScaler* scaler = strategy.loss_scaler()) {
    const LossScaler::State s = scaler->state();
    whole("scaler.scale", Tensor::from_vector<double>({s.scale}, {}));
    whole("scaler.clean_steps", Tensor::from_vector<int64_t>({s.clean_steps}, {}));
    whole("scaler.skipped", Tensor::from_vector<int64_t>({s.skipped}, {}));
  }
  for (const auto& [name, value] : extra)
    whole(name, value);
  return pieces;
}

void write_index(const fs::path& staging, int world_size) {
  std::vector<std::string> files;
  if (fs::exists(staging / kModelFile)) files.push_back(kModelFile);
  for (int r = 0; r < world_size; ++r)
    files.push_back(rank_file(r));
  Index::of_files(staging, files).write(staging);
}

void save_checkpoint(Strategy& strategy, const nn::Module& module,
                     const optim::Optimizer* optimizer, const fs::path& path,
                     const std::map<std::string, Tensor>& extra, const std::string& meta_json) {
  const bool chief = strategy.is_global_zero();
  const fs::path staging = path.string() + ".partial";
  strategy.barrier();
  if (chief) {
    fs::remove_all(staging);
    fs::create_directories(staging);
  }
  strategy.barrier();
  write_pieces(staging / rank_file(strategy.rank()),
               state_pieces(strategy, module, optimizer, /*parameters=*/true, extra));
  strategy.barrier();
  if (chief) {
    write_index(staging, strategy.world_size());
    write_file_atomically(staging / kMetaFile, meta_json + "\n", tag::kCheckpoint);
    commit_directory(staging, path);
  }
  strategy.barrier();
}

std::map<std::string, Tensor> load_checkpoint(Strategy& strategy, const nn::Module& module,
                                              optim::Optimizer* optimizer, const fs::path& path,
                                              const std::string& extra_prefix) {
  if (!Directory::is_committed(path)) {
    tag::kCheckpoint.fail(path.string(), " is not a committed checkpoint (no ", Directory::kMarker,
                          "): its save did not finish, or it is not a checkpoint");
  }
  CheckpointReader reader(path);
  check_model(reader, strategy, module);
  load_parameters(strategy, reader);
  if (optimizer != nullptr) load_optimizer(strategy, *optimizer, reader);
  std::map<std::string, Tensor> extra;
  for (const auto& [name, entry] : reader.index().tensors) {
    if (name.rfind(extra_prefix, 0) == 0) extra.emplace(name.substr(extra_prefix.size()), reader.read(name));
  }
  return extra;
}

void check_model(const CheckpointReader& checkpoint, const Strategy& strategy,
                 const nn::Module& module) {
  for (const auto& [name, p] : module.named_parameters()) {
    const Shape whole = strategy.parameter_shape(name, p);
    if (!checkpoint.contains(name)) {
      tag::kCheckpoint.fail(checkpoint.path().string(), " has no parameter '", name,
                            "': it is a checkpoint of another model");
    }
    const TensorEntry& e = checkpoint.entry(name);
    const DType dtype = strategy.parameter_dtype(p);
    if (e.shape != whole || e.dtype != dtype) {
      tag::kCheckpoint.fail(checkpoint.path().string(), ": parameter '", name, "' is ",
                            dtype_name(e.dtype), " ", shape_str(e.shape),
                            " there; this model's is ", dtype_name(dtype), " ",
                            shape_str(whole), ": it is a checkpoint of another model");
    }
  }
}

void load_parameters(Strategy& strategy, CheckpointReader& checkpoint) {
  strategy.load_parameter_parts(
      {.run = [&](const std::string& name, int64_t begin,
                  Tensor& out) { checkpoint.read_into(name, begin, out); },
       .box = [&](const std::string& name, const Shape& offsets, const Shape& sizes,
                  Tensor& out) { checkpoint.read_box(name, offsets, sizes, out); }});
}

void load_optimizer(Strategy& strategy, optim::Optimizer& optimizer, CheckpointReader& checkpoint) {
  const std::string origin = checkpoint.path().string();
  std::map<std::string, Tensor> state;
  if (!checkpoint.contains("optim.step_count")) {
    tag::kCheckpoint.fail(origin, " holds no optimizer state; it was saved without an optimizer");
  }
  state["step_count"] = checkpoint.read("optim.step_count");
  const auto& groups = optimizer.param_groups();
  const std::string beyond = "optim.param_groups." + std::to_string(groups.size()) + ".lr";
  if (checkpoint.contains(beyond)) {
    tag::kCheckpoint.fail(origin, " holds more optimizer groups than this optimizer's ",
                          groups.size(),
                          "; build the optimizer with the groups of the run that saved it");
  }
  const OptimizerLayout layout = strategy.optimizer_layout(optimizer);
  const auto& index = checkpoint.index().tensors;
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const char* field : {"lr", "weight_decay"}) {
      const std::string key = "param_groups." + std::to_string(g) + "." + field;
      state[key] = checkpoint.read("optim." + key);
    }
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const Tensor& tensor = groups[g].params[i];
      const std::vector<OptimizerPart>& parts = layout[g][i];
      if (parts.empty()) continue;
      // The entries the checkpoint has for the first part's parameter; every part's must too.
      const std::string prefix = kStatePrefix + parts[0].param + ".";
      std::set<std::string> entries;
      for (auto it = index.lower_bound(prefix); it != index.end() && it->first.rfind(prefix, 0) == 0; ++it) {
        const std::string entry = it->first.substr(prefix.size());
        if (entry.find('.') == std::string::npos) entries.insert(entry);
      }
      const std::string key = "state." + std::to_string(g) + "." + std::to_string(i) + ".";
      for (const std::string& entry : entries) {
        if (optimizer.is_scalar_state(entry)) {
          state[key + entry] = scalar_of(checkpoint.read(prefix + entry));
          continue;
        }
        // Padding (NVMe sub-groups) stays zero, as the optimizer keeps it.
        Tensor value = Tensor::zeros({tensor.numel()}, tensor.dtype(), Device::cpu());
        for (const OptimizerPart& part : parts) {
          const std::string name = kStatePrefix + part.param + "." + entry;
          if (part.sizes.empty()) {
            Tensor into = elements(value, part.offset, part.length);
            checkpoint.read_into(name, part.begin, into);
            continue;
          }
          int64_t count = 1;
          for (int64_t d : part.sizes)
            count *= d;
          Tensor box = Tensor::empty({count}, tensor.dtype(), Device::cpu());
          checkpoint.read_box(name, part.offsets, part.sizes, box);
          Tensor shaped = value.reshape(tensor.shape());
          copy_into_box(shaped, part.local_offsets, part.sizes, box);
        }
        state[key + entry] = value.reshape(tensor.shape());
      }
    }
  }
  optimizer.load_state_dict(state);

  LossScaler* mine = strategy.loss_scaler();
  const bool saved = checkpoint.contains("scaler.scale");
  if (saved && mine == nullptr) {
    tag::kCheckpoint.fail(origin,
                          " holds a loss scaler (16-mixed) but this run's precision "
                          "has none; resume with precision 16-mixed");
  }
  if (mine != nullptr) {
    if (!saved)
      tag::kCheckpoint.fail(origin, " has no loss scaler state; it was not saved under 16-mixed");
    LossScaler::State s;
    s.scale = checkpoint.read("scaler.scale").item();
    s.clean_steps = static_cast<int>(checkpoint.read("scaler.clean_steps").item());
    s.skipped = static_cast<int64_t>(checkpoint.read("scaler.skipped").item());
    mine->restore(s);
  }
}

CheckpointMeta::CheckpointMeta(const fs::path& checkpoint) : path_(checkpoint / kMetaFile) {
  if (!fs::exists(path_)) {
    tag::kCheckpoint.fail(
        checkpoint.string(), " has no ", kMetaFile,
        " (or it cannot be read); expected a checkpoint written by train_gpt or Fabric");
  }
  std::istringstream in(read_regular_file(path_, tag::kCheckpoint, "meta.json (JSON)"));
  json_ = std::make_unique<nlohmann::json>(parse_json_object(in, path_.string()));
}

CheckpointMeta::~CheckpointMeta() = default;

const nlohmann::json* CheckpointMeta::find(const std::string& field) const {
  const nlohmann::json* value = json_.get();
  for (size_t begin = 0; value != nullptr;) {
    const size_t end = std::min(field.find('.', begin), field.size());
    if (!value->is_object()) return nullptr;
    auto found = value->find(field.substr(begin, end - begin));
    value = found == value->end() ? nullptr : &*found;
    if (end == field.size()) break;
    begin = end + 1;
  }
  return value;
}

const nlohmann::json& CheckpointMeta::at(const std::string& field,
                                         const std::string& expected) const {
  if (const nlohmann::json* value = find(field)) return *value;
  const size_t dot = field.rfind('.');
  if (dot != std::string::npos) {  // "model.heads": is "model" there, and an object?
    const std::string parent = field.substr(0, dot);
    if (!at(parent, "an object").is_object()) {
      refuse(parent, "an object with \"" + field.substr(dot + 1) + "\"");
    }
  }
  tag::kCheckpoint.fail(path_.string(), " has no \"", field, "\"; expected ", expected);
}

bool CheckpointMeta::has(const std::string& field) const {
  return find(field) != nullptr;
}

void CheckpointMeta::refuse(const std::string& field, const std::string& expected) const {
  const nlohmann::json* value = find(field);
  std::string shown = value != nullptr ? value->dump() : "absent";
  if (shown.size() > 60) shown = shown.substr(0, 57) + "...";
  tag::kCheckpoint.fail(path_.string(), ": \"", field, "\" is ", shown, "; expected ", expected);
}

std::string CheckpointMeta::text(const std::string& field,
                                 const std::vector<std::string>& choices) const {
  std::string expected = "a string";
  if (!choices.empty()) {
    expected = "one of";
    for (size_t i = 0; i < choices.size(); ++i)
      expected += (i == 0 ? " \"" : ", \"") + choices[i] + "\"";
  }
  const nlohmann::json& value = at(field, expected);
  if (!value.is_string()) refuse(field, expected);
  std::string result = value.get<std::string>();
  if (!choices.empty() && std::find(choices.begin(), choices.end(), result) == choices.end())
    refuse(field, expected);
  return result;
}

int64_t CheckpointMeta::integer(const std::string& field, int64_t min, int64_t max) const {
  std::ostringstream expected;
  constexpr int64_t kLowest = std::numeric_limits<int64_t>::min();
  constexpr int64_t kLargest = std::numeric_limits<int64_t>::max();
  if (min == max) {
    expected << "the integer " << min;
  } else if (min == kLowest && max == kLargest) {
    expected << "an integer";
  } else if (max == kLargest) {
    expected << "an integer >= " << min;
  } else {
    expected << "an integer from " << min << " to " << max;
  }
  const nlohmann::json& value = at(field, expected.str());
  // nlohmann's get<int64_t>() converts a float (1e30) with a C++ cast, undefined out of range:
  // only JSON integers within int64 are taken.
  const bool fits = value.is_number_integer() &&
                    !(value.is_number_unsigned() && value.get<uint64_t>() > uint64_t{kLargest});
  if (!fits || value.get<int64_t>() < min || value.get<int64_t>() > max)
    refuse(field, expected.str());
  return value.get<int64_t>();
}

uint64_t CheckpointMeta::unsigned_integer(const std::string& field) const {
  const std::string expected = "an integer from 0 to 2^64 - 1";
  const nlohmann::json& value = at(field, expected);
  if (!value.is_number_unsigned()) refuse(field, expected);
  return value.get<uint64_t>();
}

}  // namespace loom::strategies::checkpoint
