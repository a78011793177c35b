#include "sim/cluster.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "core/tags.h"
#include "sim/cluster_presets.h"

namespace loom::sim {

RateCurve::RateCurve(std::vector<std::pair<double, double>> points) : points_(std::move(points)) {}

double RateCurve::at(double size) const {
  if (points_.empty()) return 0;
  if (size <= points_.front().first) return points_.front().second;
  if (size >= points_.back().first) return points_.back().second;
  const auto upper = std::upper_bound(points_.begin(), points_.end(), size,
                                      [](double s, const auto& point) { return s < point.first; });
  const auto& [x1, y1] = *upper;
  const auto& [x0, y0] = *(upper - 1);
  const double f = (std::log(size) - std::log(x0)) / (std::log(x1) - std::log(x0));
  return y0 + f * (y1 - y0);
}

namespace {

using nlohmann::json;

// Reads one description, naming the field of every error: "cluster dgx-h100: node.devices ...".
class Reader {
 public:
  explicit Reader(std::string origin) : origin_(std::move(origin)) {}

  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    tag::kLoomSim.fail("cluster ", origin_, ": ", field, " ", what,
                       " (docs/simulation.md, \"Cluster descriptions\", lists every field)");
  }

  const json& member(const json& object, const std::string& field, const std::string& key) const {
    if (!object.is_object()) fail(field, "must be a JSON object");
    const auto it = object.find(key);
    if (it == object.end()) fail(join(field, key), "is missing");
    return *it;
  }

  // A finite number, positive (or, with zero_ok, not negative).
  double number(const json& object, const std::string& field, const std::string& key,
                bool zero_ok = false) const {
    const json& value = member(object, field, key);
    const std::string name = join(field, key);
    if (!value.is_number()) fail(name, "must be a number, not " + value.dump());
    const double x = value.get<double>();
    if (!std::isfinite(x) || x < 0 || (x == 0 && !zero_ok)) {
      fail(name, std::string("must be ") + (zero_ok ? "0 or more" : "more than 0") + ", not " +
                     value.dump());
    }
    return x;
  }

  int count(const json& object, const std::string& field, const std::string& key,
            bool zero_ok = false) const {
    const double x = number(object, field, key, zero_ok);
    if (x != std::floor(x) || x > 1e9) fail(join(field, key), "must be a whole number");
    return static_cast<int>(x);
  }

  std::string text(const json& object, const std::string& field, const std::string& key) const {
    const json& value = member(object, field, key);
    if (!value.is_string() || value.get<std::string>().empty()) {
      fail(join(field, key), "must be a non-empty string");
    }
    return value.get<std::string>();
  }

  // [[size, rate], ...] with sizes increasing, each rate (0 or more with zero_ok, else above 0)
  // scaled by `unit`.
  RateCurve curve(const json& value, const std::string& field, double unit,
                  bool zero_ok = false) const {
    if (!value.is_array() || value.empty()) {
      fail(field, "must be a non-empty list of [size, rate] pairs");
    }
    std::vector<std::pair<double, double>> points;
    for (size_t i = 0; i < value.size(); ++i) {
      const std::string at = field + "[" + std::to_string(i) + "]";
      const json& p = value[i];
      if (!p.is_array() || p.size() != 2 || !p[0].is_number() || !p[1].is_number()) {
        fail(at, "must be a pair [size, rate] of numbers, not " + p.dump());
      }
      const double size = p[0].get<double>(), rate = p[1].get<double>();
      if (!(size > 0) || !(rate > 0 || (zero_ok && rate == 0)) || !std::isfinite(size) ||
          !std::isfinite(rate)) {
        fail(at, std::string("must have a size above 0 and a rate ") +
                     (zero_ok ? "of 0 or more" : "above 0") + ", not " + p.dump());
      }
      if (!points.empty() && size <= points.back().first) {
        fail(at, "has size " + p[0].dump() + ", not above the size before it: sizes increase");
      }
      points.emplace_back(size, rate * unit);
    }
    return RateCurve(std::move(points));
  }

  // {"bf16": value, ...} by dtype name.
  template <typename F>
  auto by_dtype(const json& object, const std::string& field, const std::string& key,
                F&& read) const {
    const json& value = member(object, field, key);
    const std::string name = join(field, key);
    if (!value.is_object() || value.empty()) fail(name, "must map dtype names (\"bf16\") to values");
    std::map<DType, decltype(read(value.begin().value(), name))> out;
    for (const auto& [dtype, entry] : value.items()) {
      DType parsed;
      try {
        parsed = parse_dtype(dtype);
      } catch (const Error&) {
        fail(name + "." + dtype, "is not a dtype (f32, bf16, f16)");
      }
      out[parsed] = read(entry, name + "." + dtype);
    }
    return out;
  }

 private:
  static std::string join(const std::string& field, const std::string& key) {
    return field.empty() ? key : field + "." + key;
  }
  std::string origin_;
};

}  // namespace

Cluster parse_cluster(const std::string& json_text, const std::string& origin) {
  const Reader r(origin);
  json doc;
  try {
    doc = json::parse(json_text);
  } catch (const json::parse_error& e) {
    tag::kLoomSim.fail("cluster ", origin, ": not valid JSON (", e.what(), ")");
  }
  constexpr double kTera = 1e12, kGiga = 1e9, kMicro = 1e-6;
  Cluster c;
  c.name = r.text(doc, "", "name");
  c.source = r.text(doc, "", "source");
  const json& device = r.member(doc, "", "device");
  c.device.name = r.text(device, "device", "name");
  c.device.memory_bytes = r.number(device, "device", "memory_gib") * 1024.0 * 1024.0 * 1024.0;
  c.device.peak_flops =
      r.by_dtype(device, "device", "peak_tflops", [&](const json& v, const std::string& f) {
        if (!v.is_number() || !(v.get<double>() > 0)) r.fail(f, "must be a number above 0");
        return v.get<double>() * kTera;
      });
  // device's rates, and device.shared's when given.
  const auto read_rates = [&](const json& object, const std::string& field, DeviceRates& into) {
    into.op_overhead_s = r.number(object, field, "op_overhead_us", true) * kMicro;
    const auto tflops_curve = [&](const json& v, const std::string& f) {
      return r.curve(v, f, kTera);
    };
    into.gemm_flops = r.by_dtype(object, field, "gemm_tflops", tflops_curve);
    into.attention_flops = r.by_dtype(object, field, "attention_tflops", tflops_curve);
    into.memory_bytes_per_s =
        r.curve(r.member(object, field, "memory_gbps"), field + ".memory_gbps", kGiga);
    const auto named_curves = [&](const char* key, double unit, auto& curves) {
      const auto ops = object.find(key);
      if (ops == object.end()) return;
      if (!ops->is_object()) r.fail(field + "." + key, "must map op names to curves");
      for (const auto& [op, points] : ops->items())
        curves[op] = r.curve(points, field + "." + key + "." + op, unit);
    };
    named_curves("ops_gbps", kGiga, into.op_bytes_per_s);
    named_curves("ops_tflops", kTera, into.op_flops_per_s);
    for (const auto& [dtype, peak] : c.device.peak_flops) {
      if (!into.gemm_flops.contains(dtype)) {
        r.fail(field + ".gemm_tflops." + dtype_name(dtype),
               "is missing: every dtype of device.peak_tflops needs its GEMM curve");
      }
      if (!into.attention_flops.contains(dtype)) {
        r.fail(field + ".attention_tflops." + dtype_name(dtype),
               "is missing: every dtype of device.peak_tflops needs its attention curve");
      }
    }
  };
  read_rates(device, "device", c.device);
  if (device.contains("code_path")) {
    const std::string path = r.text(device, "device", "code_path");
    if (path != "cpu" && path != "cuda")
      r.fail("device.code_path", "must be \"cpu\" or \"cuda\", not \"" + path + "\"");
    c.device.cuda_code_path = path == "cuda";
  }
  if (const auto shared = device.find("shared"); shared != device.end()) {
    auto rates = std::make_shared<DeviceRates>();
    read_rates(*shared, "device.shared", *rates);
    c.device.shared = std::move(rates);
  }
  const json& node = r.member(doc, "", "node");
  c.devices_per_node = r.count(node, "node", "devices");
  c.compute_slots = r.count(node, "node", "compute_slots");
  c.intra_node = {.bytes_per_s = r.number(node, "node", "busbw_gbps") * kGiga,
                  .latency_s = r.number(node, "node", "latency_us", true) * kMicro};
  // A call's core time by ranks per slot: a curve, or a number (the same at every count).
  const auto by_ranks_per_slot = [&](const char* field) {
    const json& value = node.at(field);
    return value.is_number() ? RateCurve({{1, r.number(node, "node", field, true) * kMicro}})
                             : r.curve(value, std::string("node.") + field, kMicro, true);
  };
  if (node.contains("comm_core_us")) c.comm_core_s = by_ranks_per_slot("comm_core_us");
  if (node.contains("comm_blocking_us")) {
    if (c.comm_core_s.empty()) r.fail("node.comm_blocking_us", "needs node.comm_core_us");
    c.comm_blocking_s = by_ranks_per_slot("comm_blocking_us");
  }
  if (const auto spread = node.find("compute_spread_us"); spread != node.end()) {
    if (c.comm_core_s.empty()) r.fail("node.compute_spread_us", "needs node.comm_core_us");
    c.compute_spread_s = r.curve(*spread, "node.compute_spread_us", kMicro, true);
  }
  const json& network = r.member(doc, "", "network");
  c.nics_per_node = r.count(network, "network", "nics_per_node", true);
  if (c.nics_per_node > 0) {
    c.nic = {.bytes_per_s = r.number(network, "network", "nic_gbps") * kGiga,
             .latency_s = r.number(network, "network", "latency_us", true) * kMicro};
    c.topology = r.text(network, "network", "topology");
    if (c.topology != "fat-tree" && c.topology != "rail") {
      r.fail("network.topology", "must be \"fat-tree\" or \"rail\", not \"" + c.topology + "\"");
    }
  }
  c.collective_base_latency_s = r.number(doc, "", "collective_base_latency_us", true) * kMicro;
  const json& host = r.member(doc, "", "host");
  c.pcie_bytes_per_s = r.number(host, "host", "pcie_gbps") * kGiga;
  if (const auto memory = host.find("memory_gbps"); memory != host.end())
    c.host_memory_bytes_per_s = r.curve(*memory, "host.memory_gbps", kGiga);
  if (const auto ops = host.find("ops_gbps"); ops != host.end()) {
    if (c.host_memory_bytes_per_s.empty()) r.fail("host.ops_gbps", "needs host.memory_gbps");
    if (!ops->is_object()) r.fail("host.ops_gbps", "must map op names to curves");
    for (const auto& [op, points] : ops->items())
      c.host_op_bytes_per_s[op] = r.curve(points, "host.ops_gbps." + op, kGiga);
  }
  if (!c.comm_core_s.empty() && !c.host_memory_bytes_per_s.empty()) {
    r.fail("node.comm_core_us",
           "applies to a CPU cluster, whose cores both compute and communicate (one without "
           "host.memory_gbps); a GPU's communication runs beside its compute");
  }
  return c;
}

std::vector<std::string> cluster_presets() {
  std::vector<std::string> names;
  for (const ClusterPreset& preset : built_in_cluster_presets()) names.emplace_back(preset.name);
  return names;
}

Cluster load_cluster(const std::string& preset_or_path) {
  for (const ClusterPreset& preset : built_in_cluster_presets()) {
    if (preset_or_path == preset.name) return parse_cluster(preset.json, preset.name);
  }
  if (preset_or_path.find('/') == std::string::npos &&
      preset_or_path.find(".json") == std::string::npos) {
    std::string names;
    for (const std::string& name : cluster_presets()) names += (names.empty() ? "" : ", ") + name;
    tag::kLoomSim.fail("--cluster ", preset_or_path, ": no such preset (presets: ", names,
                       "; or give a path to a JSON file)");
  }
  std::ifstream in(preset_or_path);
  if (!in) tag::kLoomSim.fail("--cluster ", preset_or_path, ": cannot read the file");
  std::stringstream text;
  text << in.rdbuf();
  return parse_cluster(text.str(), preset_or_path);
}

DType compute_dtype(const std::string& precision) {
  if (precision.starts_with("bf16")) return DType::BF16;
  if (precision.starts_with("16")) return DType::F16;
  return DType::F32;
}

}  // namespace loom::sim
