#include "tensor/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/regular_file.h"
#include "core/tags.h"

namespace loom::safetensors {
namespace {

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

// The format is little-endian (the length prefix and every element). Loom copies element
// bytes as they are in memory, which is only correct on a little-endian host.
static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

constexpr std::string_view kMetadataKey = "__metadata__";
constexpr std::string_view kSupportedDtypes = "Loom reads F64, F32, F16, BF16, I64, I32, U8";
constexpr std::string_view kInMemoryOrigin = "(in-memory buffer)";

// Every message: "[safetensors] <file>: <problem>".
template <typename... Parts>
[[noreturn]] void fail_at(std::string_view origin, const Parts&... parts) {
  tag::kSafetensors.fail(origin, ": ", parts...);
}

std::string_view format_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::U8: return "U8";
  }
  tag::kSafetensors.fail("dtype ", static_cast<int>(dtype), " has no safetensors name");
}

std::optional<DType> parse_format_dtype(std::string_view name) {
  for (DType dtype :
       {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8}) {
    if (name == format_dtype_name(dtype)) return dtype;
  }
  return std::nullopt;
}

// Dtypes the format defines but Loom has no tensor type for.
bool is_unsupported_format_dtype(std::string_view name) {
  static constexpr std::string_view kNames[] = {
      "BOOL",    "I8",      "I16",     "U16",     "U32", "U64", "F8_E5M2",
      "F8_E4M3", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",  "C64",
  };
  return std::find(std::begin(kNames), std::end(kNames), name) != std::end(kNames);
}

// A JSON value as it appears in the header, cut short for messages.
std::string brief(const json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

// A JSON number that is an integer >= 0; nullopt for anything else (floats, negatives,
// strings, ...).
std::optional<uint64_t> as_non_negative_integer(const json& value) {
  if (value.is_number_unsigned()) return value.get<uint64_t>();
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    return static_cast<uint64_t>(value.get<int64_t>());
  }
  return std::nullopt;
}

std::string offsets_str(uint64_t begin, uint64_t end) {
  std::string text = "[";  // built step by step: GCC 12 warns (-Wrestrict) on "lit" + string&&
  text += std::to_string(begin);
  text += ", ";
  text += std::to_string(end);
  text += "]";
  return text;
}

// One validated header entry.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin;
  uint64_t end;
};

// Parses the header text, rejecting invalid JSON, non-objects and duplicate keys (which
// nlohmann::json would otherwise resolve silently by keeping one of them).
json parse_header_json(std::string_view text, std::string_view origin) {
  std::vector<std::set<std::string>> open_objects;  // keys seen in each enclosing object
  std::string entry_name;                           // the current top-level key
  std::optional<std::string> duplicate;
  auto track_keys = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start: open_objects.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (open_objects.empty()) break;
        if (open_objects.size() == 1) entry_name = key;
        if (!open_objects.back().insert(key).second && !duplicate) {
          duplicate = open_objects.size() == 1
                          ? "key '" + key + "' appears twice at the top level of the header"
                          : "key '" + key + "' appears twice inside the entry '" + entry_name + "'";
        }
        break;
      }
      default: break;
    }
    return true;
  };

  json header;
  try {
    header = json::parse(text.begin(), text.end(), track_keys);
  } catch (const json::exception& error) {  // parse_error; out_of_range for 1e400
    fail_at(origin, "header is not valid JSON (", error.what(),
            "); expected a UTF-8 JSON object of ", text.size(), " bytes");
  }
  if (!header.is_object()) {
    fail_at(origin, "header is a JSON ", header.type_name(), " (", brief(header),
            "); expected a JSON object mapping tensor names to entries");
  }
  if (duplicate) fail_at(origin, *duplicate, "; expected every key to be unique");
  return header;
}

Metadata parse_metadata(const json& value, std::string_view origin) {
  if (!value.is_object()) {
    fail_at(origin, "\"__metadata__\" is a JSON ", value.type_name(), " (", brief(value),
            "); expected an object with string values");
  }
  Metadata metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      fail_at(origin, "\"__metadata__\" key '", key, "' has a ", item.type_name(), " value (",
              brief(item), "); expected a string");
    }
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

// Validates one tensor entry on its own: field types, dtype, shape, and that its offsets lie
// inside a buffer of `buffer_size` bytes and hold exactly numel * dtype_size bytes.
Entry parse_entry(const std::string& name, const json& value, uint64_t buffer_size,
                  std::string_view origin) {
  const std::string where = "tensor '" + name + "': ";
  constexpr std::string_view kFields = "\"dtype\", \"shape\" and \"data_offsets\"";
  if (!value.is_object()) {
    fail_at(origin, where, "entry is a JSON ", value.type_name(), " (", brief(value),
            "); expected an object with ", kFields);
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(field)) {
      fail_at(origin, where, "entry has no \"", field, "\" (", brief(value), "); expected ",
              kFields);
    }
  }

  Entry entry{.name = name, .dtype = DType::F32, .shape = {}, .begin = 0, .end = 0};

  const json& dtype = value["dtype"];
  if (!dtype.is_string()) {
    fail_at(origin, where, "\"dtype\" is a JSON ", dtype.type_name(), " (", brief(dtype),
            "); expected a string such as \"F32\"");
  }
  const auto& dtype_name = dtype.get_ref<const std::string&>();
  if (auto parsed = parse_format_dtype(dtype_name)) {
    entry.dtype = *parsed;
  } else if (is_unsupported_format_dtype(dtype_name)) {
    fail_at(origin, where, "unsupported dtype ", dtype_name, "; ", kSupportedDtypes);
  } else {
    fail_at(origin, where, "unknown dtype '", dtype_name, "'; ", kSupportedDtypes);
  }

  const json& shape = value["shape"];
  if (!shape.is_array()) {
    fail_at(origin, where, "\"shape\" is a JSON ", shape.type_name(), " (", brief(shape),
            "); expected an array of non-negative integers");
  }
  for (size_t d = 0; d < shape.size(); ++d) {
    std::optional<uint64_t> size = as_non_negative_integer(shape[d]);
    if (!size) {
      fail_at(origin, where, "shape ", brief(shape), " has dimension ", d, " = ", brief(shape[d]),
              "; expected a non-negative integer");
    }
    if (*size > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      fail_at(origin, where, "shape ", brief(shape), " has dimension ", d, " = ", *size,
              "; expected at most ", std::numeric_limits<int64_t>::max());
    }
    entry.shape.push_back(static_cast<int64_t>(*size));
  }

  const json& offsets = value["data_offsets"];
  std::optional<uint64_t> begin, end;
  if (offsets.is_array() && offsets.size() == 2) {
    begin = as_non_negative_integer(offsets[0]);
    end = as_non_negative_integer(offsets[1]);
  }
  if (!begin || !end) {
    fail_at(origin, where, "\"data_offsets\" is ", brief(offsets),
            "; expected [begin, end] with two non-negative integers");
  }
  entry.begin = *begin;
  entry.end = *end;
  if (entry.begin > entry.end) {
    fail_at(origin, where, "data_offsets ", offsets_str(entry.begin, entry.end),
            " has begin > end; expected begin <= end");
  }
  if (entry.end > buffer_size) {
    fail_at(origin, where, "data_offsets ", offsets_str(entry.begin, entry.end),
            " end past the data buffer, which has ", buffer_size, " bytes");
  }

  // numel * dtype_size with overflow checks: a hostile shape must not wrap around to a
  // byte count that happens to match the offsets. Zero dimensions count as 1 in `extent`,
  // because Loom computes strides that way in int64 even for an empty tensor.
  uint64_t extent = 1;
  bool overflow = false;
  for (int64_t size : entry.shape) {
    overflow = overflow || __builtin_mul_overflow(extent, std::max<uint64_t>(size, 1), &extent);
  }
  overflow = overflow || extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  const bool has_zero = std::find(entry.shape.begin(), entry.shape.end(), 0) != entry.shape.end();
  const uint64_t numel = has_zero ? 0 : extent;
  uint64_t expected_bytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel, dtype_size(entry.dtype), &expected_bytes);
  const uint64_t actual_bytes = entry.end - entry.begin;
  if (overflow) {
    fail_at(origin, where, "shape ", shape_str(entry.shape), " of dtype ", dtype_name,
            " is too large: the product of its dimensions must stay below 2^63 and its size ",
            "below 2^64 bytes; data_offsets ", offsets_str(entry.begin, entry.end), " give ",
            actual_bytes, " bytes");
  }
  if (expected_bytes != actual_bytes) {
    fail_at(origin, where, "shape ", shape_str(entry.shape), " of dtype ", dtype_name, " needs ",
            expected_bytes, " bytes (", numel, " elements x ", dtype_size(entry.dtype),
            " bytes), but data_offsets ", offsets_str(entry.begin, entry.end), " give ",
            actual_bytes, " bytes");
  }
  return entry;
}

// The format requires the tensors to tile the data buffer exactly: no overlaps, no unused
// bytes (the same rule as the reference implementation). Entries are sorted by offsets.
void check_layout(std::vector<Entry>& entries, uint64_t buffer_size, std::string_view origin) {
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t cursor = 0;
  const Entry* previous = nullptr;
  for (const Entry& entry : entries) {
    if (entry.begin < cursor) {
      fail_at(origin, "tensors '", previous->name, "' (data_offsets ",
              offsets_str(previous->begin, previous->end), ") and '", entry.name,
              "' (data_offsets ", offsets_str(entry.begin, entry.end),
              ") overlap; expected each tensor to have its own bytes");
    }
    if (entry.begin > cursor) {
      fail_at(origin, "bytes [", cursor, ", ", entry.begin, ") of the data buffer belong to no ",
              "tensor (a hole before '", entry.name,
              "'); expected the tensors to cover the buffer without gaps");
    }
    cursor = entry.end;
    previous = &entry;
  }
  if (cursor != buffer_size) {
    fail_at(origin, "the last ", buffer_size - cursor, " bytes of the data buffer ([", cursor, ", ",
            buffer_size, ")) belong to no tensor; expected the tensors to cover the ", buffer_size,
            "-byte buffer exactly");
  }
}

std::vector<std::byte> serialize_to(const TensorMap& tensors, const Metadata& metadata,
                                    std::string_view origin) {
  NoGradGuard no_grad;
  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json object = ordered_json::object();
    for (const auto& [key, value] : metadata)
      object[key] = value;
    header[std::string(kMetadataKey)] = std::move(object);
  }

  // Host copies in name order; their bytes are laid out back to back in the same order.
  std::vector<Tensor> hosts;
  hosts.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name == kMetadataKey) {
      fail_at(origin,
              "tensor name \"__metadata__\" is reserved for the metadata object; "
              "expected any other name");
    }
    if (!tensor.defined()) {
      fail_at(origin, "tensor '", name,
              "' is undefined (default-constructed or moved-from); expected a tensor with data");
    }
    Tensor host;
    try {
      host = tensor.detach().to(Device::cpu()).contiguous();
    } catch (const Error& error) {
      fail_at(origin, "tensor '", name, "' (", tensor.str(),
              ") cannot be copied to the CPU: ", error.what());
    }
    const uint64_t nbytes = host.nbytes();
    ordered_json entry = ordered_json::object();
    entry["dtype"] = format_dtype_name(host.dtype());
    entry["shape"] = host.shape();
    entry["data_offsets"] = ordered_json::array({offset, offset + nbytes});
    header[name] = std::move(entry);
    offset += nbytes;
    hosts.push_back(std::move(host));
  }

  std::string text;
  try {
    text = header.dump();
  } catch (const ordered_json::type_error& error) {
    fail_at(origin, "a tensor name or metadata string is not valid UTF-8 (", error.what(),
            "); expected UTF-8 text");
  }
  // Pad with spaces so that the data buffer starts 8-byte aligned, as the reference writer
  // does; readers skip trailing whitespace in the JSON.
  text.append((8 - text.size() % 8) % 8, ' ');

  std::vector<std::byte> bytes(8 + text.size() + offset);
  const uint64_t header_size = text.size();
  std::memcpy(bytes.data(), &header_size, 8);
  std::memcpy(bytes.data() + 8, text.data(), text.size());
  std::byte* data = bytes.data() + 8 + text.size();
  for (const Tensor& host : hosts) {
    if (host.nbytes() == 0) continue;
    std::memcpy(data, host.raw_data(), host.nbytes());
    data += host.nbytes();
  }
  return bytes;
}

// Unmaps a read-only file mapping; never throws.
class Mapping {
 public:
  Mapping(void* data, size_t size) : data_(data), size_(size) {}
  ~Mapping() {
    if (data_ != MAP_FAILED) ::munmap(data_, size_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

 private:
  void* data_;
  size_t size_;
};

// The header of a file whose data buffer has `buffer_size` bytes, fully validated; entries
// sorted by offset.
std::pair<Metadata, std::vector<Entry>> parse_header(std::string_view text, uint64_t buffer_size,
                                                     std::string_view origin) {
  const json header = parse_header_json(text, origin);
  Metadata metadata;
  std::vector<Entry> entries;
  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      metadata = parse_metadata(value, origin);
    } else {
      entries.push_back(parse_entry(name, value, buffer_size, origin));
    }
  }
  check_layout(entries, buffer_size, origin);
  return {std::move(metadata), std::move(entries)};
}

}  // namespace

Contents parse(std::span<const std::byte> bytes, const std::string& origin) {
  if (bytes.size() < 8) {
    fail_at(origin, "file is ", bytes.size(),
            " bytes, shorter than the 8-byte header length prefix; expected a safetensors file");
  }
  uint64_t header_size = 0;
  std::memcpy(&header_size, bytes.data(), 8);
  const uint64_t available = bytes.size() - 8;  // no overflow: compared, never added
  if (header_size > available) {
    fail_at(origin, "header length ", header_size, " bytes runs past the end of the file (",
            bytes.size(), " bytes, so at most ", available,
            " bytes after the 8-byte prefix); expected a safetensors file");
  }
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), header_size);
  const std::span<const std::byte> buffer = bytes.subspan(8 + header_size);

  Contents contents;
  std::vector<Entry> entries;
  std::tie(contents.metadata, entries) = parse_header(text, buffer.size(), origin);

  // Everything is valid; only now allocate and copy.
  for (const Entry& entry : entries) {
    Tensor tensor = Tensor::empty(entry.shape, entry.dtype, Device::cpu());
    const size_t nbytes = entry.end - entry.begin;
    if (nbytes > 0) std::memcpy(tensor.raw_data(), buffer.data() + entry.begin, nbytes);
    contents.tensors.emplace(entry.name, std::move(tensor));
  }
  return contents;
}

Contents load(const std::filesystem::path& path) {
  const std::string origin = path.string();
  uint64_t bytes = 0;
  const FileDescriptor file = open_regular_file(path, tag::kSafetensors, "safetensors file", bytes);
  const auto size = static_cast<size_t>(bytes);
  if (size == 0) return parse({}, origin);
  // A private read-only mapping: the tensors are copied out before it is unmapped. save()
  // replaces files by rename, so a concurrent save never truncates a file being loaded.
  void* data = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.get(), 0);
  if (data == MAP_FAILED) {
    fail_at(origin, "mmap of ", size, " bytes failed: ", errno_text(errno));
  }
  Mapping mapping(data, size);
  return parse(std::span(static_cast<const std::byte*>(data), size), origin);
}

Header read_header(const std::filesystem::path& path) {
  const std::string origin = path.string();
  uint64_t size = 0;
  const FileDescriptor file = open_regular_file(path, tag::kSafetensors, "safetensors file", size);
  auto read_exactly = [&](void* into, uint64_t bytes, uint64_t at) {
    uint64_t done = 0;
    while (done < bytes) {
      const ssize_t n = ::pread(file.get(), static_cast<char*>(into) + done, bytes - done,
                                static_cast<off_t>(at + done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail_at(origin, "reading the header failed: ", n < 0 ? errno_text(errno) : "end of file");
      done += static_cast<uint64_t>(n);
    }
  };
  if (size < 8) {
    fail_at(origin, "file is ", size,
            " bytes, shorter than the 8-byte header length prefix; expected a safetensors file");
  }
  uint64_t header_size = 0;
  read_exactly(&header_size, 8, 0);
  if (header_size > size - 8) {
    fail_at(origin, "header length ", header_size, " bytes runs past the end of the file (",
            size, " bytes, so at most ", size - 8,
            " bytes after the 8-byte prefix); expected a safetensors file");
  }
  std::string text(header_size, '\0');
  read_exactly(text.data(), header_size, 8);
  Header header;
  header.data_start = 8 + header_size;
  header.file_size = size;
  auto [metadata, entries] = parse_header(text, size - header.data_start, origin);
  header.metadata = std::move(metadata);
  for (Entry& e : entries) {
    header.tensors.push_back({std::move(e.name), e.dtype, std::move(e.shape),
                              header.data_start + e.begin, header.data_start + e.end});
  }
  return header;
}

std::vector<std::byte> serialize(const TensorMap& tensors, const Metadata& metadata) {
  return serialize_to(tensors, metadata, kInMemoryOrigin);
}

void save(const std::filesystem::path& path, const TensorMap& tensors, const Metadata& metadata) {
  const std::vector<std::byte> bytes = serialize_to(tensors, metadata, path.string());
  write_file_atomically(path, bytes, tag::kSafetensors);
}

}  // namespace loom::safetensors
