#include "strategies/checkpoint/tensor_index.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "core/atomic_file.h"
#include "core/regular_file.h"
#include "core/error.h"
#include "core/tags.h"
#include "tensor/safetensors.h"
#include "tensor/shape.h"

namespace loom::strategies::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kWholeChecksumPrefix = "loom.xxh3.";  // checked_file.h
constexpr const char* kIndexFormat = "loom-checkpoint-index";

uint64_t parse_hex(const std::string& text) {
  if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail("checksum '", text, "' is not 16 hex digits");
  return std::stoull(text, nullptr, 16);
}

// Integers read from JSON. nlohmann::json's get<int64_t>() and get<uint64_t>() convert a
// float (1e30, or an integer too long for 64 bits, which it parses as a float) with a C++
// cast, undefined out of range: these accept JSON integers only, in the type's range.
int64_t int64_of(const json& value) {
  if (!value.is_number_integer() ||
      (value.is_number_unsigned() && value.get<uint64_t>() > uint64_t{INT64_MAX})) {
    fail("expected an integer of 64 bits, got ", value.dump());
  }
  return value.get<int64_t>();
}

uint64_t uint64_of(const json& value) {
  if (!value.is_number_unsigned()) fail("expected a non-negative integer, got ", value.dump());
  return value.get<uint64_t>();
}

Shape shape_of(const json& value) {
  if (!value.is_array()) fail("expected an array of integers, got ", value.dump());
  Shape shape;
  for (const json& d : value)
    shape.push_back(int64_of(d));
  return shape;
}

// A shape read from a file: no negative dimension, and the product of the dimensions (zeros
// counted as 1, as strides count them) within int64, so that element counts, strides and
// indices computed from it cannot overflow (the rule safetensors.h applies to its shapes).
void check_shape(const Shape& shape, const std::string& what) {
  int64_t extent = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(extent, std::max<int64_t>(d, 1), &extent)) {
      tag::kCheckpoint.fail(what, ": shape ", shape_text(shape),
                            " has a negative dimension or 2^63 elements or more");
    }
  }
}

// The shards of every tensor must hold each element exactly once, in as many bytes as their
// elements need, with a checksum per block.
void check_tiling(const std::map<std::string, TensorEntry>& tensors, const std::string& origin) {
  for (const auto& [name, entry] : tensors) {
    struct Located {
      ShardRun run;
      const Shard* shard;
    };
    std::vector<Located> runs;
    for (const Shard& shard : entry.shards) {
      // The readers check 0 <= begin <= end <= the tensor's element count, and byte_begin <=
      // byte_end; an element count whose bytes overflow cannot match.
      uint64_t expected = 0;
      const bool overflow = __builtin_mul_overflow(static_cast<uint64_t>(shard.end - shard.begin),
                                                   dtype_size(entry.dtype), &expected);
      if (overflow || shard.byte_end - shard.byte_begin != expected) {
        tag::kCheckpoint.fail(origin, ": tensor '", name, "' shard in ", shard.file, " holds ",
                              shard.end - shard.begin, " elements in ",
                              shard.byte_end - shard.byte_begin, " bytes; expected ",
                              overflow ? std::string("2^64 or more") : std::to_string(expected));
      }
      const uint64_t bytes = shard.byte_end - shard.byte_begin;
      const uint64_t blocks = bytes / shard.block_bytes + (bytes % shard.block_bytes != 0 ? 1 : 0);
      if (shard.checksums.size() != blocks) {
        tag::kCheckpoint.fail(origin, ": tensor '", name, "' shard in ", shard.file, " has ",
                              shard.checksums.size(), " checksums for ", blocks, " block(s)");
      }
      for (const ShardRun& run : runs_of(shard, entry.shape))
        runs.push_back({run, &shard});
    }
    std::sort(runs.begin(), runs.end(),
              [](const Located& a, const Located& b) { return a.run.global < b.run.global; });
    int64_t at = 0;
    for (const Located& r : runs) {
      if (r.run.global != at) {
        tag::kCheckpoint.fail(
            origin, ": tensor '", name, "' has ",
            r.run.global > at ? "no shard for" : "two shards holding", " elements [",
            std::min(at, r.run.global), ", ", std::max(at, r.run.global), ") (next shard in ",
            r.shard->file, "); expected its shards to hold each of its ", numel_of(entry.shape),
            " elements once: a shard file is missing from the index, or the index is of "
            "another save");
      }
      at = r.run.global + r.run.length;
    }
    if (at != numel_of(entry.shape)) {
      tag::kCheckpoint.fail(origin, ": tensor '", name, "' of shape ", shape_text(entry.shape),
                            " has shards for its first ", at, " of ", numel_of(entry.shape),
                            " elements only; a shard file is missing from the index");
    }
  }
}

void add_shard(std::map<std::string, TensorEntry>& tensors, const std::string& name, DType dtype,
               const Shape& shape, Shard shard, const std::string& origin) {
  auto [it, fresh] = tensors.try_emplace(name);
  TensorEntry& entry = it->second;
  if (fresh) {
    entry.dtype = dtype;
    entry.shape = shape;
  } else if (entry.dtype != dtype || entry.shape != shape) {
    tag::kCheckpoint.fail(origin, ": tensor '", name, "' is ", dtype_name(dtype), " ",
                          shape_text(shape), " in ", shard.file, " but ", dtype_name(entry.dtype),
                          " ", shape_text(entry.shape), " in ", entry.shards.front().file,
                          "; the files are not of one save");
  }
  entry.shards.push_back(std::move(shard));
}

// Shards in one order whatever order they were found in: by first element, then by file and
// place, so that two lists of the same shards compare equal element by element.
void sort_shards(std::map<std::string, TensorEntry>& tensors) {
  for (auto& [name, entry] : tensors) {
    std::sort(entry.shards.begin(), entry.shards.end(), [](const Shard& a, const Shard& b) {
      return std::tie(a.begin, a.end, a.file, a.byte_begin) <
             std::tie(b.begin, b.end, b.file, b.byte_begin);
    });
  }
}

// A message without its leading tag ("[checkpoint] ", "[json.exception.parse_error.101] "),
// for one that another message quotes after its own tag.
std::string untagged(const std::string& message) {
  const size_t tag_end = message.find("] ");
  const bool tagged =
      message.starts_with("[checkpoint]") || message.starts_with("[json.exception.");
  return tagged && tag_end != std::string::npos ? message.substr(tag_end + 2) : message;
}

// A JSON value as a message quotes it, cut short.
std::string brief(const json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

// index.json's members, each read with its type checked; `where` names the JSON value in
// messages ("tensor 'wte.weight'", "tensor 'wte.weight', shard 0").
const json& member(const json& object, const char* key, const std::string& where) {
  if (!object.is_object())
    fail(where, " is a JSON ", object.type_name(), " (", brief(object), "); expected an object");
  auto found = object.find(key);
  if (found == object.end()) fail(where, " has no \"", key, "\"");
  return *found;
}

std::string string_member(const json& object, const char* key, const std::string& where) {
  const json& value = member(object, key, where);
  if (!value.is_string()) fail(where, ": \"", key, "\" is ", brief(value), "; expected a string");
  return value.get<std::string>();
}

// The array `key` of `object`; of `size` values unless size is 0.
const json& array_member(const json& object, const char* key, const std::string& where,
                         size_t size = 0) {
  const json& value = member(object, key, where);
  if (!value.is_array() || (size != 0 && value.size() != size)) {
    if (size == 0) fail(where, ": \"", key, "\" is ", brief(value), "; expected an array");
    fail(where, ": \"", key, "\" is ", brief(value), "; expected an array of ", size, " values");
  }
  return value;
}

// A file named by the index: a plain name in the checkpoint's directory, so that a damaged or
// hostile index cannot make a reader open a file elsewhere ("../x", "/etc/x").
void check_plain_file_name(const std::string& file) {
  if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
      file.find('\0') != std::string::npos) {
    fail("file '", file,
         "' is not the plain name of a file in the checkpoint's directory; "
         "expected a name such as rank-00000.safetensors, without '/'");
  }
}

Shard parse_shard(const json& s, const TensorEntry& entry, const Index& index,
                  const std::string& where) {
  Shard shard;
  shard.file = string_member(s, "file", where);
  auto listed = index.file_bytes.find(shard.file);
  if (listed == index.file_bytes.end())
    fail(where, " is in ", shard.file, ", which \"files\" does not list");
  try {
    if (s.contains("sizes")) {
      shard.offsets = shape_of(member(s, "offsets", where));
      shard.sizes = shape_of(s.at("sizes"));
      const auto [first, count] = box_extent(shard.offsets, shard.sizes, entry.shape, where);
      shard.begin = first;
      shard.end = first + count;
    } else {
      const json& elements = array_member(s, "elements", where, 2);
      shard.begin = int64_of(elements[0]);
      shard.end = int64_of(elements[1]);
      if (shard.begin < 0 || shard.end < shard.begin || shard.end > numel_of(entry.shape)) {
        fail("elements [", shard.begin, ", ", shard.end, ") of a tensor of ",
             numel_of(entry.shape));
      }
    }
    const json& bytes = array_member(s, "bytes", where, 2);
    shard.byte_begin = uint64_of(bytes[0]);
    shard.byte_end = uint64_of(bytes[1]);
    shard.block_bytes = uint64_of(member(s, "block_bytes", where));
    if (shard.block_bytes == 0) fail("block_bytes 0; expected a positive block size");
    for (const json& sum : array_member(s, "xxh3", where)) {
      if (!sum.is_string()) fail("checksum ", sum.dump(), " is not a string of 16 hex digits");
      shard.checksums.push_back(parse_hex(sum.get<std::string>()));
    }
  } catch (const Error& e) {
    const std::string message = untagged(e.what());
    if (message.starts_with(where)) throw Error(message);  // it names the shard already
    fail(where, ": ", message);
  }
  // So that no shard claims more elements than its file can hold.
  if (shard.byte_begin > shard.byte_end || shard.byte_end > listed->second) {
    fail(where, " is at bytes [", shard.byte_begin, ", ", shard.byte_end, ") of ", shard.file,
         ", which has ", listed->second);
  }
  return shard;
}

TensorEntry parse_entry(const std::string& name, const json& t, const Index& index) {
  const std::string where = "tensor '" + name + "'";
  TensorEntry entry;
  const std::string dtype = string_member(t, "dtype", where);
  try {
    entry.dtype = parse_dtype(dtype);
    entry.shape = shape_of(member(t, "shape", where));
  } catch (const Error& e) {
    fail(where, ": ", e.what());
  }
  check_shape(entry.shape, where);
  const json& shards = array_member(t, "shards", where);
  for (size_t i = 0; i < shards.size(); ++i) {
    entry.shards.push_back(
        parse_shard(shards[i], entry, index, where + ", shard " + std::to_string(i)));
  }
  return entry;
}

// index.json as Index::write writes it: its format and version, "files" (plain names, sizes)
// and "tensors" (an object of entries), each value of its type.
Index parse_index(const json& in) {
  const json format = in.value("format", json("(none)"));
  const json version = in.value("version", json("(none)"));  // compared as JSON: any number
  if (format != kIndexFormat || version != 1) {
    fail("format ", format.dump(), " version ", version.dump(), "; expected \"", kIndexFormat,
         "\" version 1");
  }
  Index index;
  const json& files = member(in, "files", "the index");
  if (!files.is_object()) fail("\"files\" is a JSON ", files.type_name(), "; expected an object");
  for (const auto& [file, bytes] : files.items()) {
    check_plain_file_name(file);
    try {
      index.file_bytes[file] = uint64_of(bytes);
    } catch (const Error& e) {
      fail("\"files\": the size of ", file, ": ", e.what());
    }
  }
  const json& tensors = member(in, "tensors", "the index");
  if (!tensors.is_object()) {
    fail("\"tensors\" is a JSON ", tensors.type_name(),
         "; expected an object mapping each tensor's name to its entry");
  }
  for (const auto& [name, t] : tensors.items())
    index.tensors.emplace(name, parse_entry(name, t, index));
  return index;
}

// Every file the index lists has the size it recorded.
void check_file_sizes(const Index& index, const fs::path& checkpoint) {
  for (const auto& [file, bytes] : index.file_bytes) {
    std::error_code ec;
    const uint64_t size = fs::file_size(checkpoint / file, ec);
    if (ec) {
      tag::kCheckpoint.fail((checkpoint / file).string(), ", listed in ", kIndexFile,
                            ", is missing (", ec.message(), "); the checkpoint is incomplete");
    }
    if (size != bytes) {
      tag::kCheckpoint.fail((checkpoint / file).string(), " is ", size, " bytes; ", kIndexFile,
                            " recorded ", bytes, " (truncated or replaced after the save)");
    }
  }
}

std::string shard_text(const Shard& s) {
  std::ostringstream text;
  text << s.file;
  if (s.sizes.empty()) {
    text << " elements [" << s.begin << ", " << s.end << ")";
  } else {
    text << " box " << shape_text(s.offsets) << " + " << shape_text(s.sizes);
  }
  text << " at bytes [" << s.byte_begin << ", " << s.byte_end << ") in blocks of " << s.block_bytes;
  return text.str();
}

bool same_place(const Shard& a, const Shard& b) {
  return a.file == b.file && a.begin == b.begin && a.end == b.end && a.offsets == b.offsets &&
         a.sizes == b.sizes && a.byte_begin == b.byte_begin && a.byte_end == b.byte_end &&
         a.block_bytes == b.block_bytes;
}

// What differs between shard `i` of a tensor in the index (`listed`) and in the headers
// (`held`), either of them absent; empty when they are the same.
std::string shard_difference(const std::vector<Shard>& listed, const std::vector<Shard>& held,
                             size_t i) {
  std::ostringstream out;
  if (i >= listed.size() || i >= held.size() || !same_place(listed[i], held[i])) {
    out << "shard " << i << " is " << (i < listed.size() ? shard_text(listed[i]) : "absent")
        << " in the index but " << (i < held.size() ? shard_text(held[i]) : "absent")
        << " in the files' headers";
    return out.str();
  }
  const std::vector<uint64_t>& a = listed[i].checksums;
  const std::vector<uint64_t>& b = held[i].checksums;
  for (size_t block = 0; block < std::max(a.size(), b.size()); ++block) {
    if (block < a.size() && block < b.size() && a[block] == b[block]) continue;
    out << "shard " << i << " (" << shard_text(listed[i]) << ") has checksum "
        << (block < a.size() ? checksum_text(a[block]) : "(none)") << " for block " << block
        << " in the index but " << (block < b.size() ? checksum_text(b[block]) : "(none)")
        << " in the header of " << held[i].file;
    return out.str();
  }
  return {};
}

// Note [The index is checked against the headers]: index.json is written from its files'
// headers (Index::of_files), so a reader takes it only when the headers still give exactly
// it: every tensor once, of the same dtype and shape, in the same shards with the same
// checksums. Reading the headers is cheap (they are a small part of the files) and catches
// an edited or damaged index, a damaged header, and a file replaced by another save's.
void check_against_headers(const Index& index, const fs::path& checkpoint,
                           const std::string& origin) {
  std::vector<std::string> files;
  for (const auto& [file, bytes] : index.file_bytes)
    files.push_back(file);
  const Index headers = Index::of_files(checkpoint, files);
  for (const auto& [name, held] : headers.tensors) {
    if (index.tensors.count(name) == 0) {
      tag::kCheckpoint.fail(
          origin, " does not list tensor '", name, "', which ", held.shards.front().file,
          " holds; expected every tensor of its files once (the "
          "index was damaged or edited: restore it, or resume from an earlier checkpoint)");
    }
  }
  for (const auto& [name, listed] : index.tensors) {
    auto held = headers.tensors.find(name);
    if (held == headers.tensors.end()) {
      tag::kCheckpoint.fail(
          origin, " lists tensor '", name, "', which none of its files holds",
          "; expected only the tensors of its files (the index was damaged or edited)");
    }
    const TensorEntry& h = held->second;
    if (listed.dtype != h.dtype || listed.shape != h.shape) {
      tag::kCheckpoint.fail(origin, " says tensor '", name, "' is ", dtype_name(listed.dtype), " ",
                            shape_text(listed.shape), "; the header of ", h.shards.front().file,
                            " says ", dtype_name(h.dtype), " ", shape_text(h.shape),
                            " (the index or the file was damaged or edited)");
    }
    for (size_t i = 0; i < std::max(listed.shards.size(), h.shards.size()); ++i) {
      const std::string difference = shard_difference(listed.shards, h.shards, i);
      if (difference.empty()) continue;
      tag::kCheckpoint.fail(
          origin, ": tensor '", name, "': ", difference,
          "; expected the index written with these files (the index or a file was damaged, "
          "edited or replaced)");
    }
  }
}

}  // namespace

json parse_json_object(std::istream& in, const std::string& origin) {
  struct Container {
    std::string name;  // the key it is the value of, or its array's ("" at the top)
    bool object;
    std::set<std::string> keys;
  };
  std::vector<Container> open;
  std::string last_key;
  std::optional<std::string> duplicate;
  auto name_of_next = [&] {
    return open.empty() ? std::string() : open.back().object ? last_key : open.back().name;
  };
  auto track_keys = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    using Event = json::parse_event_t;
    if (event == Event::object_start || event == Event::array_start) {
      open.push_back({name_of_next(), event == Event::object_start, {}});
    } else if ((event == Event::object_end || event == Event::array_end) && !open.empty()) {
      open.pop_back();
    } else if (event == Event::key && !open.empty()) {
      last_key = parsed.get<std::string>();
      if (!open.back().keys.insert(last_key).second && !duplicate) {
        duplicate = "key '" + last_key + "' appears twice" +
                    (open.back().name.empty() ? std::string(" at the top level")
                                              : " in the object of '" + open.back().name + "'");
      }
    }
    return true;
  };
  json value;
  try {
    value = json::parse(in, track_keys);
  } catch (const std::exception& e) {  // json::parse_error, or a read error of the stream
    tag::kCheckpoint.fail(origin, " is not valid JSON (", untagged(e.what()),
                          "); expected a JSON object");
  }
  if (!value.is_object()) {
    tag::kCheckpoint.fail(origin, " is a JSON ", value.type_name(), "; expected a JSON object");
  }
  if (duplicate) {
    tag::kCheckpoint.fail(origin, ": ", *duplicate,
                          "; expected each key once (the file was damaged or edited)");
  }
  return value;
}

Index Index::of_files(const fs::path& checkpoint, const std::vector<std::string>& files) {
  Index index;
  for (const std::string& file : files) {
    const fs::path path = checkpoint / file;
    const safetensors::Header header = safetensors::read_header(path);
    index.file_bytes[file] = header.file_size;
    auto pieces = header.metadata.find(kPiecesMetadataKey);
    if (pieces == header.metadata.end()) {  // whole tensors with per-tensor checksums
      for (const safetensors::HeaderEntry& e : header.tensors) {
        auto sum = header.metadata.find(kWholeChecksumPrefix + e.name);
        if (sum == header.metadata.end()) {
          tag::kCheckpoint.fail(path.string(), ": tensor '", e.name,
                                "' has no checksum; "
                                "expected a file written by a Loom checkpoint");
        }
        Shard shard;
        shard.file = file;
        shard.end = numel_of(e.shape);
        shard.byte_begin = e.begin;
        shard.byte_end = e.end;
        shard.block_bytes = std::max<uint64_t>(e.end - e.begin, 1);
        try {
          if (e.end > e.begin) shard.checksums.push_back(parse_hex(sum->second));
        } catch (const Error& error) {
          tag::kCheckpoint.fail(path.string(), ": tensor '", e.name, "': ", error.what());
        }
        add_shard(index.tensors, e.name, e.dtype, e.shape, std::move(shard), path.string());
      }
      continue;
    }
    json described;
    uint64_t block = 0;
    try {
      described = json::parse(pieces->second);
      block = std::stoull(header.metadata.at(kBlockBytesMetadataKey));
    } catch (const std::exception& e) {
      tag::kCheckpoint.fail(path.string(), ": its metadata '", kPiecesMetadataKey, "' or '", kBlockBytesMetadataKey,
                            "' is unreadable: ", e.what());
    }
    if (block == 0) tag::kCheckpoint.fail(path.string(), ": block size 0");
    for (const safetensors::HeaderEntry& e : header.tensors) {
      if (!described.contains(e.name)) {
        tag::kCheckpoint.fail(path.string(), ": tensor '", e.name, "' is not described in its '",
                              kPiecesMetadataKey, "' metadata");
      }
      try {
        const json& d = described.at(e.name);
        if (e.shape.size() != 1) fail("stored piece is not 1-D");
        const Shape shape = shape_of(d.at("shape"));
        check_shape(shape, path.string());
        Shard shard;
        shard.file = file;
        if (d.contains("sizes")) {
          shard.offsets = shape_of(d.at("offsets"));
          shard.sizes = shape_of(d.at("sizes"));
          const auto [first, count] = box_extent(shard.offsets, shard.sizes, shape, path.string());
          if (count != e.shape[0]) fail("its box holds ", count, " elements, the stored tensor ", e.shape[0]);
          shard.begin = first;
          shard.end = first + count;
        } else {
          shard.begin = int64_of(d.at("begin"));
          if (shard.begin < 0 || e.shape[0] > numel_of(shape) - shard.begin) {
            fail("its ", e.shape[0], " elements from element ", shard.begin,
                 " leave the tensor's ", numel_of(shape));
          }
          shard.end = shard.begin + e.shape[0];
        }
        shard.byte_begin = e.begin;
        shard.byte_end = e.end;
        shard.block_bytes = block;
        for (const json& sum : d.at("xxh3"))
          shard.checksums.push_back(parse_hex(sum.get<std::string>()));
        add_shard(index.tensors, d.at("tensor").get<std::string>(), e.dtype, shape,
                  std::move(shard), path.string());
      } catch (const std::exception& error) {
        tag::kCheckpoint.fail(path.string(), ": the description of '", e.name,
                              "' is malformed: ", untagged(error.what()));
      }
    }
  }
  sort_shards(index.tensors);
  check_tiling(index.tensors, checkpoint.string());
  return index;
}

void Index::write(const fs::path& checkpoint) const {
  json tensors_json = json::object();
  for (const auto& [name, entry] : tensors) {
    json shards = json::array();
    for (const Shard& s : entry.shards) {
      json sums = json::array();
      for (uint64_t c : s.checksums)
        sums.push_back(checksum_text(c));
      json shard = {{"file", s.file},
                    {"bytes", {s.byte_begin, s.byte_end}},
                    {"block_bytes", s.block_bytes},
                    {"xxh3", std::move(sums)}};
      if (s.sizes.empty()) {
        shard["elements"] = {s.begin, s.end};
      } else {
        shard["offsets"] = s.offsets;
        shard["sizes"] = s.sizes;
      }
      shards.push_back(std::move(shard));
    }
    tensors_json[name] = {{"dtype", std::string(dtype_name(entry.dtype))},
                          {"shape", entry.shape},
                          {"shards", std::move(shards)}};
  }
  const json out = {{"format", kIndexFormat},
                    {"version", 1},
                    {"files", file_bytes},
                    {"tensors", std::move(tensors_json)}};
  write_file_atomically(checkpoint / kIndexFile, out.dump(1) + "\n", tag::kCheckpoint);
}

Index Index::read(const fs::path& checkpoint) {
  const fs::path path = checkpoint / kIndexFile;
  const std::string origin = path.string();
  if (!fs::exists(path)) {
    tag::kCheckpoint.fail(checkpoint.string(), " has no ", kIndexFile,
                          "; expected a checkpoint written by Loom (docs/checkpoints.md)");
  }
  std::istringstream stream(read_regular_file(path, tag::kCheckpoint, "checkpoint index (JSON)"));
  const json in = parse_json_object(stream, origin);
  Index index;
  try {
    index = parse_index(in);
  } catch (const std::exception& e) {
    tag::kCheckpoint.fail(origin, " is unreadable: ", untagged(e.what()));
  }
  sort_shards(index.tensors);
  check_tiling(index.tensors, origin);
  check_file_sizes(index, checkpoint);
  check_against_headers(index, checkpoint, origin);
  return index;
}

const TensorEntry& Index::at(const std::string& name, const fs::path& checkpoint) const {
  auto found = tensors.find(name);
  if (found == tensors.end()) {
    tag::kCheckpoint.fail(checkpoint.string(), " has no tensor '", name,
                          "'; it was saved from another model or optimizer");
  }
  return found->second;
}

}  // namespace loom::strategies::checkpoint
