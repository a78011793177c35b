#include "tools/loom_perf/options.h"

#include <cctype>
#include <cmath>

#include "core/error.h"

namespace loom::perf {

size_t parse_bytes(std::string_view text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits]))) {
    ++digits;
  }
  if (digits == 0 || digits > 18) {
    fail("bad size '", text, "': expected a number of bytes with an optional K, M or G suffix");
  }
  size_t value = std::stoull(std::string(text.substr(0, digits)));
  std::string suffix;
  for (char c : text.substr(digits))
    suffix += static_cast<char>(std::toupper(c));
  if (suffix.ends_with("IB")) {
    suffix.resize(suffix.size() - 2);
  } else if (suffix.size() > 1 && suffix.ends_with("B")) {
    suffix.pop_back();
  }
  int shift = 0;
  if (suffix.empty() || suffix == "B") {
    shift = 0;
  } else if (suffix == "K") {
    shift = 10;
  } else if (suffix == "M") {
    shift = 20;
  } else if (suffix == "G") {
    shift = 30;
  } else {
    fail("bad size '", text, "': unknown suffix '", text.substr(digits), "' (use K, M or G)");
  }
  if (value > (SIZE_MAX >> shift)) fail("bad size '", text, "': too large");
  return value << shift;
}

DType parse_type_name(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr Alias kNcclNames[] = {
      {"float", DType::F32},   {"double", DType::F64},  {"half", DType::F16},
      {"int", DType::I32},     {"uint8", DType::U8},    {"bfloat16", DType::BF16},
      {"int32", DType::I32},   {"int64", DType::I64},   {"float32", DType::F32},
      {"float64", DType::F64}, {"float16", DType::F16}, {"char", DType::U8}};
  for (const Alias& alias : kNcclNames) {
    if (alias.name == name) return alias.dtype;
  }
  try {
    return parse_dtype(name);
  } catch (const Error&) {
    fail("unknown datatype '", name,
         "'; expected one of float, double, bfloat16, half, int32, int64, uint8 (or Loom's "
         "f32, f64, bf16, f16, i32, i64, u8)");
  }
}

std::string_view nccl_type_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "float";
    case DType::F64: return "double";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "half";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
    case DType::U8: return "uint8";
  }
  return "?";
}

comm::ReduceOp parse_reduce_op(std::string_view name) {
  using comm::ReduceOp;
  if (name == "sum") return ReduceOp::Sum;
  if (name == "prod") return ReduceOp::Prod;
  if (name == "min") return ReduceOp::Min;
  if (name == "max") return ReduceOp::Max;
  if (name == "avg") return ReduceOp::Avg;
  fail("unknown reduction '", name, "'; expected one of sum, prod, min, max, avg");
}

void check_options(const PerfOptions& o) {
  if (o.max_bytes < o.min_bytes) {
    fail("-e/--maxbytes ", o.max_bytes, " is below -b/--minbytes ", o.min_bytes,
         ": no size to measure");
  }
  // NaN fails every comparison and infinity makes the next size infinite: both are refused
  // explicitly, as is a factor that would not grow the size.
  if (o.step_bytes == 0 && !(std::isfinite(o.step_factor) && o.step_factor > 1.0)) {
    fail("-f/--stepfactor must be a finite number above 1, got ", o.step_factor,
         "; use -i/--stepbytes for additive steps");
  }
  if (collective_info(o.collective).reduces && o.op == comm::ReduceOp::Avg &&
      !is_floating(o.dtype)) {
    fail("-o avg needs a floating datatype, got ", nccl_type_name(o.dtype));
  }
  if (!(std::isfinite(o.compute_us) && o.compute_us >= 0)) {
    fail("--compute-us must be a finite number of microseconds, 0 or more, got ", o.compute_us);
  }
  if (o.compute_us > 0 && !o.wait_each) {
    fail("--compute-us needs -z 2: each call is issued, the rank computes, then waits for it");
  }
  if (!(o.timeout_s > 0 && o.timeout_s <= static_cast<double>(kMaxTimeoutSeconds))) {
    fail("--timeout must be a number of seconds above 0 and at most ", kMaxTimeoutSeconds,
         " (a year), got ", o.timeout_s);
  }
}

std::vector<size_t> size_list(const PerfOptions& options) {
  std::vector<size_t> sizes;
  size_t size = options.min_bytes;
  do {
    sizes.push_back(size);
    size_t next =
        options.step_bytes > 0
            ? size + options.step_bytes
            : static_cast<size_t>(std::floor(static_cast<double>(size) * options.step_factor));
    if (next <= size) break;  // step factor <= 1 or a zero minimum: one size only
    size = next;
  } while (size <= options.max_bytes);
  return sizes;
}

std::string join_command(int argc, char** argv) {
  std::string command;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    bool plain = !arg.empty() && arg.find_first_of(" \t\"'$\\;&|<>*?()") == std::string::npos;
    if (i > 0) command += ' ';
    if (plain) {
      command += arg;
    } else {
      command += '\'';
      for (char c : arg)
        command += c == '\'' ? std::string("'\\''") : std::string(1, c);
      command += '\'';
    }
  }
  return command;
}

}  // namespace loom::perf
